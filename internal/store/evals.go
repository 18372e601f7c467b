package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// EvalRow is an eval run as stored: the API's EvalRun (without progress)
// plus its input (the problems and samples as JSON).
type EvalRow struct {
	Run   client.EvalRun
	Input []byte
	// Owner, if set, holds the new run's lease until LeaseUntil (the
	// replica that starts it; see ClaimEval).
	Owner      string
	LeaseUntil time.Time
}

// evalSettings is the settings column.
type evalSettings struct {
	K           []int   `json:"k"`
	Timeout     float64 `json:"timeout"`
	Template    string  `json:"template"`
	Runtime     string  `json:"runtime"`
	Concurrency int     `json:"concurrency"`
	Seed        int64   `json:"seed"`
	Language    string  `json:"language,omitempty"`
}

// trialDetail is what eval_trials.tests holds of a whole program's
// verdict (JSON; ” for the Python trial programs).
type trialDetail struct {
	Language    string                  `json:"language,omitempty"`
	Compile     *client.EvalCompile     `json:"compile,omitempty"`
	TestsPassed int                     `json:"tests_passed,omitempty"`
	TestsTotal  int                     `json:"tests_total,omitempty"`
	Tests       []client.EvalTestResult `json:"tests,omitempty"`
}

// InsertEval records a new eval run with its input; the run gets its id
// and creation time here.
func (s *Store) InsertEval(ctx context.Context, r EvalRow) (client.EvalRun, error) {
	run := r.Run
	run.ID = NewID("ev")
	run.CreatedAt = now()
	set, err := json.Marshal(evalSettings{K: run.K, Timeout: run.Timeout, Template: run.Template,
		Runtime: run.Runtime, Concurrency: run.Concurrency, Seed: run.Seed, Language: run.Language})
	if err != nil {
		return client.EvalRun{}, err
	}
	if run.Mode == "" {
		run.Mode = client.EvalModeTrial
	}
	var until int64
	if r.Owner != "" {
		until = toDB(r.LeaseUntil)
	}
	_, err = s.exec(ctx, `INSERT INTO eval_runs (id, team_id, state, settings, input, tasks, samples, created_at, mode, slice, owner, lease_until)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, run.ID, run.TeamID, run.State, string(set), r.Input, run.Tasks, run.Samples, toDB(run.CreatedAt),
		run.Mode, run.Slice, r.Owner, until)
	if err != nil {
		return client.EvalRun{}, s.mapConstraint(err, "team")
	}
	return run, nil
}

const evalCols = `id, team_id, state, error, settings, tasks, samples, summary, created_at, finished_at, mode, slice`

func scanEval(sc scanner) (client.EvalRun, error) {
	var (
		r                 client.EvalRun
		settings, summary string
		created           int64
		finished          sql.NullInt64
	)
	if err := sc.Scan(&r.ID, &r.TeamID, &r.State, &r.Error, &settings, &r.Tasks, &r.Samples, &summary, &created, &finished, &r.Mode, &r.Slice); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return r, ErrNotFound
		}
		return r, err
	}
	var set evalSettings
	if err := json.Unmarshal([]byte(settings), &set); err != nil {
		return r, fmt.Errorf("eval %s settings: %w", r.ID, err)
	}
	r.K, r.Timeout, r.Template, r.Runtime, r.Concurrency, r.Seed = set.K, set.Timeout, set.Template, set.Runtime, set.Concurrency, set.Seed
	r.Language = set.Language
	if summary != "" {
		r.Summary = &client.EvalSummary{}
		if err := json.Unmarshal([]byte(summary), r.Summary); err != nil {
			return r, fmt.Errorf("eval %s summary: %w", r.ID, err)
		}
	}
	r.CreatedAt, r.FinishedAt = fromDB(created), timePtr(finished)
	return r, nil
}

// GetEval returns a team's eval run (without progress counts).
func (s *Store) GetEval(ctx context.Context, teamID, id string) (client.EvalRun, error) {
	return scanEval(s.queryRow(ctx, `SELECT `+evalCols+` FROM eval_runs WHERE id = ? AND team_id = ?`, id, teamID))
}

// EvalInput returns a team's eval run's input.
func (s *Store) EvalInput(ctx context.Context, teamID, id string) ([]byte, error) {
	var in []byte
	err := s.queryRow(ctx, `SELECT input FROM eval_runs WHERE id = ? AND team_id = ?`, id, teamID).Scan(&in)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	return in, err
}

// ListEvals returns a team's eval runs, newest first.
func (s *Store) ListEvals(ctx context.Context, teamID string) ([]client.EvalRun, error) {
	return s.queryEvals(ctx, `SELECT `+evalCols+` FROM eval_runs WHERE team_id = ? ORDER BY created_at DESC`, teamID)
}

// ListEvalsByState returns every team's eval runs in a state (recovery).
func (s *Store) ListEvalsByState(ctx context.Context, state string) ([]client.EvalRun, error) {
	return s.queryEvals(ctx, `SELECT `+evalCols+` FROM eval_runs WHERE state = ? ORDER BY created_at`, state)
}

func (s *Store) queryEvals(ctx context.Context, q string, arg string) ([]client.EvalRun, error) {
	rows, err := s.query(ctx, q, arg)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []client.EvalRun
	for rows.Next() {
		r, err := scanEval(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// FinishEval ends a running eval run in state with its error and summary,
// whoever leases it (a cancel). It returns ErrConflict when the run was no
// longer running (e.g. it was cancelled meanwhile).
func (s *Store) FinishEval(ctx context.Context, teamID, id, state, errText string, sum *client.EvalSummary) error {
	return s.finishEval(ctx, teamID, id, "", false, state, errText, sum)
}

// FinishOwnedEval is FinishEval for the replica that ran the run: it ends
// it only while owner holds its lease (ErrLeaseLost otherwise; ErrConflict
// when it was no longer running), and drops the lease.
func (s *Store) FinishOwnedEval(ctx context.Context, teamID, id, owner, state, errText string, sum *client.EvalSummary) error {
	return s.finishEval(ctx, teamID, id, owner, true, state, errText, sum)
}

func (s *Store) finishEval(ctx context.Context, teamID, id, owner string, owned bool, state, errText string, sum *client.EvalSummary) error {
	summary := ""
	if sum != nil {
		b, err := json.Marshal(sum)
		if err != nil {
			return err
		}
		summary = string(b)
	}
	q := `UPDATE eval_runs SET state = ?, error = ?, summary = ?, finished_at = ?, owner = '', lease_until = 0
		WHERE id = ? AND team_id = ? AND state = ?`
	args := []any{state, errText, summary, toDB(now()), id, teamID, client.EvalStateRunning}
	if owned {
		q += ` AND owner = ?`
		args = append(args, owner)
	}
	res, err := s.exec(ctx, q, args...)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n > 0 {
		return nil
	}
	if owned {
		var st, got string
		err := s.queryRow(ctx, `SELECT state, owner FROM eval_runs WHERE id = ? AND team_id = ?`, id, teamID).Scan(&st, &got)
		if err == nil && st == client.EvalStateRunning && got != owner {
			return ErrLeaseLost
		}
	}
	return ErrConflict
}

// TrialEnv is where a trial ran: its last sandbox and that sandbox's
// template digest and runtime, and how long it took.
type TrialEnv struct {
	SandboxID, TemplateDigest, Runtime, RuntimeVersion string
	Times                                              TrialTimes
}

// TrialTimes is where a trial's time went: the phases of its completed
// attempt, the whole trial (every attempt) and its attempts (0 when not
// recorded).
type TrialTimes struct {
	Create, Write, Run, Delete, Trial time.Duration
	Attempts                          int
}

// ErrLeaseLost: the eval run is not (or no longer) leased to the caller:
// another replica took it over, or it ended.
var ErrLeaseLost = errors.New("eval run lease lost")

// PutEvalTrial records a finished trial of a run that owner holds the
// lease of (” for a run nobody leased). A sample has one verdict: when
// one is already stored, it is kept and PutEvalTrial returns false (a
// replica that took the run over and judged the sample again). A run
// another replica owns is ErrLeaseLost, and nothing is written.
func (s *Store) PutEvalTrial(ctx context.Context, teamID, runID, owner string, r client.EvalResult, env TrialEnv) (bool, error) {
	tt := env.Times
	var detail []byte
	if d := (trialDetail{Language: r.Language, Compile: r.Compile, TestsPassed: r.TestsPassed, TestsTotal: r.TestsTotal, Tests: r.Tests}); d.Language != "" || d.Compile != nil || d.Tests != nil {
		var err error
		if detail, err = json.Marshal(d); err != nil {
			return false, fmt.Errorf("store: record trial %d of %s: %w", r.CompletionID, runID, err)
		}
	}
	// One statement: the owner check and the insert see one version of
	// the run's row. (Its primary key keeps the first verdict should a
	// takeover commit between a check and an insert.)
	res, err := s.exec(ctx, `INSERT INTO eval_trials (run_id, team_id, completion_id, task_id, status, detail, result,
		duration_ms, sandbox_id, template_digest, runtime, runtime_version,
		create_us, write_us, run_us, delete_us, trial_us, attempts, tests)
		SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?
		WHERE EXISTS (SELECT 1 FROM eval_runs WHERE id = ? AND team_id = ? AND owner = ?)
		ON CONFLICT (run_id, completion_id) DO NOTHING`,
		runID, teamID, r.CompletionID, r.TaskID, r.Status, r.Detail, r.Result, r.DurationMs,
		env.SandboxID, env.TemplateDigest, env.Runtime, env.RuntimeVersion,
		tt.Create.Microseconds(), tt.Write.Microseconds(), tt.Run.Microseconds(), tt.Delete.Microseconds(), tt.Trial.Microseconds(), tt.Attempts, string(detail),
		runID, teamID, owner)
	if err != nil {
		return false, fmt.Errorf("store: record trial %d of %s: %w", r.CompletionID, runID, s.mapConstraint(err, "eval run"))
	}
	if n, err := res.RowsAffected(); err != nil {
		return false, fmt.Errorf("store: record trial %d of %s: %w", r.CompletionID, runID, err)
	} else if n == 1 {
		return true, nil
	}
	// Nothing written: a verdict was there, or the run is not owner's.
	var got string
	err = s.queryRow(ctx, `SELECT owner FROM eval_runs WHERE id = ? AND team_id = ?`, runID, teamID).Scan(&got)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, fmt.Errorf("store: record trial %d of %s: eval run %w", r.CompletionID, runID, ErrNotFound)
	case err != nil:
		return false, fmt.Errorf("store: record trial %d of %s: %w", r.CompletionID, runID, err)
	case got != owner:
		return false, fmt.Errorf("store: record trial %d of %s: %w (owned by %q)", r.CompletionID, runID, ErrLeaseLost, got)
	}
	return false, nil
}

// ClaimEval leases a running eval run to owner until until, if nobody
// holds it, owner already does, or its lease ended before now. It reports
// whether owner holds it now: of replicas claiming one run at once,
// exactly one does.
func (s *Store) ClaimEval(ctx context.Context, id, owner string, now, until time.Time) (bool, error) {
	res, err := s.exec(ctx, `UPDATE eval_runs SET owner = ?, lease_until = ?
		WHERE id = ? AND state = ? AND (owner = '' OR owner = ? OR lease_until < ?)`,
		owner, toDB(until), id, client.EvalStateRunning, owner, toDB(now))
	if err != nil {
		return false, fmt.Errorf("store: claim eval %s: %w", id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("store: claim eval %s: %w", id, err)
	}
	return n == 1, nil
}

// RenewEval extends owner's lease of a running run to until. It reports
// false when the run is no longer owner's (taken over) or no longer
// running (finished, cancelled): owner must stop working on it.
func (s *Store) RenewEval(ctx context.Context, id, owner string, until time.Time) (bool, error) {
	res, err := s.exec(ctx, `UPDATE eval_runs SET lease_until = ? WHERE id = ? AND owner = ? AND state = ?`,
		toDB(until), id, owner, client.EvalStateRunning)
	if err != nil {
		return false, fmt.Errorf("store: renew eval %s: %w", id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("store: renew eval %s: %w", id, err)
	}
	return n == 1, nil
}

// ReleaseEval gives up owner's lease of a run (its replica stops), so
// that another replica may take it at once.
func (s *Store) ReleaseEval(ctx context.Context, id, owner string) error {
	if _, err := s.exec(ctx, `UPDATE eval_runs SET owner = '', lease_until = 0 WHERE id = ? AND owner = ?`, id, owner); err != nil {
		return fmt.Errorf("store: release eval %s: %w", id, err)
	}
	return nil
}

// EvalLease returns who holds a run's lease and until when (” and zero:
// nobody).
func (s *Store) EvalLease(ctx context.Context, id string) (owner string, until time.Time, err error) {
	var us int64
	err = s.queryRow(ctx, `SELECT owner, lease_until FROM eval_runs WHERE id = ?`, id).Scan(&owner, &us)
	if errors.Is(err, sql.ErrNoRows) {
		return "", time.Time{}, fmt.Errorf("store: lease of eval %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return "", time.Time{}, fmt.Errorf("store: lease of eval %s: %w", id, err)
	}
	if us != 0 {
		until = fromDB(us)
	}
	return owner, until, nil
}

// ListClaimableEvals returns the running runs of every team that nobody
// leases or whose lease ended before now, oldest first: what a replica
// takes over.
func (s *Store) ListClaimableEvals(ctx context.Context, now time.Time) ([]client.EvalRun, error) {
	rows, err := s.query(ctx, `SELECT `+evalCols+` FROM eval_runs WHERE state = ? AND (owner = '' OR lease_until < ?)
		ORDER BY created_at`, client.EvalStateRunning, toDB(now))
	if err != nil {
		return nil, fmt.Errorf("store: claimable evals: %w", err)
	}
	defer rows.Close()
	var out []client.EvalRun
	for rows.Next() {
		r, err := scanEval(rows)
		if err != nil {
			return nil, fmt.Errorf("store: claimable evals: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// EvalTimes calls fn with the recorded times of each finished trial of a
// team's run, in completion id order; trials without recorded times are
// skipped.
func (s *Store) EvalTimes(ctx context.Context, teamID, runID string, fn func(TrialTimes) error) error {
	rows, err := s.query(ctx, `SELECT create_us, write_us, run_us, delete_us, trial_us, attempts FROM eval_trials
		WHERE run_id = ? AND team_id = ? AND attempts > 0 ORDER BY completion_id`, runID, teamID)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var t TrialTimes
		var us [5]int64
		if err := rows.Scan(&us[0], &us[1], &us[2], &us[3], &us[4], &t.Attempts); err != nil {
			return err
		}
		for i, d := range []*time.Duration{&t.Create, &t.Write, &t.Run, &t.Delete, &t.Trial} {
			*d = time.Duration(us[i]) * time.Microsecond
		}
		if err := fn(t); err != nil {
			return err
		}
	}
	return rows.Err()
}

// EvalEnv returns the environment of one of a run's trials that ran in a
// sandbox (zero when none did), without its Times.
func (s *Store) EvalEnv(ctx context.Context, teamID, runID string) (TrialEnv, error) {
	var e TrialEnv
	err := s.queryRow(ctx, `SELECT sandbox_id, template_digest, runtime, runtime_version FROM eval_trials
		WHERE run_id = ? AND team_id = ? AND sandbox_id != '' ORDER BY completion_id LIMIT 1`, runID, teamID).
		Scan(&e.SandboxID, &e.TemplateDigest, &e.Runtime, &e.RuntimeVersion)
	if errors.Is(err, sql.ErrNoRows) {
		return TrialEnv{}, nil
	}
	return e, err
}

// EvalTrials calls fn for each finished trial of a team's run, in
// completion id order.
func (s *Store) EvalTrials(ctx context.Context, teamID, runID string, fn func(client.EvalResult) error) error {
	rows, err := s.query(ctx, `SELECT completion_id, task_id, status, detail, result, duration_ms, tests FROM eval_trials
		WHERE run_id = ? AND team_id = ? ORDER BY completion_id`, runID, teamID)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var r client.EvalResult
		var detail string
		if err := rows.Scan(&r.CompletionID, &r.TaskID, &r.Status, &r.Detail, &r.Result, &r.DurationMs, &detail); err != nil {
			return err
		}
		r.Passed = r.Status == "passed"
		if detail != "" {
			var d trialDetail
			if err := json.Unmarshal([]byte(detail), &d); err != nil {
				return fmt.Errorf("eval %s trial %d: %w", runID, r.CompletionID, err)
			}
			r.Language, r.Compile, r.TestsPassed, r.TestsTotal, r.Tests = d.Language, d.Compile, d.TestsPassed, d.TestsTotal, d.Tests
		}
		if err := fn(r); err != nil {
			return err
		}
	}
	return rows.Err()
}

// EvalCounts returns a team's run's finished trials by status.
func (s *Store) EvalCounts(ctx context.Context, teamID, runID string) (map[string]int, error) {
	rows, err := s.query(ctx, `SELECT status, COUNT(*) FROM eval_trials WHERE run_id = ? AND team_id = ? GROUP BY status`, runID, teamID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var st string
		var n int
		if err := rows.Scan(&st, &n); err != nil {
			return nil, err
		}
		out[st] = n
	}
	return out, rows.Err()
}

// DeleteEval removes a team's eval run that is no longer running, with
// its trials. A running run is ErrConflict, an unknown one ErrNotFound.
//
// The run's row is read FOR UPDATE: a trial recorded meanwhile (its
// foreign key check waits for that lock) fails as recorded for an unknown
// run instead of landing between the two DELETEs, where it would make the
// second fail.
func (s *Store) DeleteEval(ctx context.Context, teamID, id string) error {
	return s.inTx(ctx, func(tx *txn) error {
		var state string
		err := tx.queryRow(ctx, `SELECT state FROM eval_runs WHERE id = ? AND team_id = ?`+s.d.lockClause(), id, teamID).Scan(&state)
		if errors.Is(err, sql.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return fmt.Errorf("store: delete eval %s: %w", id, err)
		}
		if state == client.EvalStateRunning {
			return ErrConflict
		}
		if _, err := tx.exec(ctx, `DELETE FROM eval_trials WHERE run_id = ? AND team_id = ?`, id, teamID); err != nil {
			return fmt.Errorf("store: delete eval %s: %w", id, err)
		}
		if _, err := tx.exec(ctx, `DELETE FROM eval_runs WHERE id = ? AND team_id = ?`, id, teamID); err != nil {
			return fmt.Errorf("store: delete eval %s: %w", id, err)
		}
		return nil
	})
}

// EvalInputBytes returns the bytes of the inputs of a team's eval runs:
// what they count against its storage limit.
func (s *Store) EvalInputBytes(ctx context.Context, teamID string) (int64, error) {
	var n int64
	// length() of a BLOB reads the record's header, not the blob (of a
	// BYTEA, its varlena header).
	err := s.queryRow(ctx, `SELECT COALESCE(SUM(length(input)), 0) FROM eval_runs WHERE team_id = ?`, teamID).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("store: eval input bytes of %s: %w", teamID, err)
	}
	return n, nil
}
