// Package evalrun runs eval runs as server-side jobs: the problems and
// samples are stored with the run, every sample is judged, and each verdict
// is recorded as it comes, so a run survives the client leaving and a
// restarted server resumes it without re-running finished trials.
//
// A run's mode says how samples run. Trial mode (the default) judges every
// sample in its own fresh sandbox (internal/trial). Batch mode cuts the
// unfinished samples, in the run's seeded order, into slices and runs each
// slice in one fresh sandbox through internal/eval's harness, which runs
// each sample's program as an unprivileged user in its own process group
// with its own timeout and kills what it leaves behind; its result lines
// are judged by the same code as a trial's exec, and recorded as they
// come. It costs one sandbox per slice instead of one per sample, and
// isolates less: the samples of a slice share the sandbox, so a sample can
// tamper with the later samples of its slice through files it leaves in
// world-writable places (files they read, or that fill the sandbox's
// memory or disk); no process of it outlives it. A slice that ends with samples unjudged (sandbox died, agent lost,
// harness killed) is not a verdict on them: the sample that was running is
// judged alone in trial mode, the rest run again as a batch, and after
// batchAttempts each runs alone, so one hostile sample costs only its own
// isolation, and persistent infra failures end as infra_error, never
// failed.
//
// A problem is checked in assert mode (its test program runs beside the
// candidate) or I/O mode (the sandbox prints the entry point's results and
// the expected values are compared outside it); see internal/eval.
package evalrun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/eval"
	"github.com/evalbox/evalbox/internal/judge"
	"github.com/evalbox/evalbox/internal/meter"
	"github.com/evalbox/evalbox/internal/outbuf"
	"github.com/evalbox/evalbox/internal/quota"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/internal/trial"
	"github.com/evalbox/evalbox/pkg/client"
)

// Limits of a run's input and settings.
const (
	MaxSamples     = 200_000
	MaxTimeout     = 600.0
	DefaultTimeout = 3.0
	// programPath is where a trial's program is written and run from, in
	// both modes: a directory only root may write to, so that the
	// program's own directory (the first entry of its sys.path) holds no
	// module a sample could have planted.
	programPath = eval.ProgramPath
	// sampleUser runs the samples: not root, so that a sample cannot
	// kill its sandbox's agent (gVisor lets root signal its init) and
	// turn its own failure into an infra error.
	sampleUser = "65534"
)

// Store is the state the service keeps runs in.
type Store interface {
	InsertEval(ctx context.Context, r store.EvalRow) (client.EvalRun, error)
	GetEval(ctx context.Context, teamID, id string) (client.EvalRun, error)
	EvalInput(ctx context.Context, teamID, id string) ([]byte, error)
	ListEvals(ctx context.Context, teamID string) ([]client.EvalRun, error)
	ListEvalsByState(ctx context.Context, state string) ([]client.EvalRun, error)
	FinishEval(ctx context.Context, teamID, id, state, errText string, sum *client.EvalSummary) error
	FinishOwnedEval(ctx context.Context, teamID, id, owner, state, errText string, sum *client.EvalSummary) error
	PutEvalTrial(ctx context.Context, teamID, runID, owner string, r client.EvalResult, env store.TrialEnv) (bool, error)
	ClaimEval(ctx context.Context, id, owner string, now, until time.Time) (bool, error)
	RenewEval(ctx context.Context, id, owner string, until time.Time) (bool, error)
	ReleaseEval(ctx context.Context, id, owner string) error
	ListClaimableEvals(ctx context.Context, now time.Time) ([]client.EvalRun, error)
	EvalTrials(ctx context.Context, teamID, runID string, fn func(client.EvalResult) error) error
	EvalCounts(ctx context.Context, teamID, runID string) (map[string]int, error)
	EvalEnv(ctx context.Context, teamID, runID string) (store.TrialEnv, error)
	EvalTimes(ctx context.Context, teamID, runID string, fn func(store.TrialTimes) error) error
	DeleteEval(ctx context.Context, teamID, id string) error
}

// Storage accounts for what teams store (internal/quota): a run's input
// counts against its team's storage until the run is deleted.
type Storage interface {
	Reserve(ctx context.Context, teamID string, n int64) (*quota.Reservation, error)
}

// Sandboxes is the sandbox service: trials run in its sandboxes, and a
// run's concurrency is bounded by the team's limits.
type Sandboxes interface {
	trial.Sandboxes
	Team(ctx context.Context, teamID string) (client.Team, error)
	DeleteByMetadata(ctx context.Context, teamID string, md map[string]string) ([]string, error)
}

// runMeta is the metadata key of a run's sandboxes: its id.
const runMeta = "eval_run"

// Leases says how API replicas sharing the store share its runs. A run is
// run by the replica that holds its lease (the store's owner and
// lease_until): the one that created it, or one that claimed it when it
// was free or its lease had run out. The holder renews its lease every
// TTL/3 and drops it when the run ends or the replica shuts down; every
// replica looks for runs to take over every TTL/3. A replica whose renewal
// fails (another took the run over, or it was cancelled) or that could
// not renew before its lease ran out stops the run's workers, and the
// store refuses its verdicts once the lease is another's.
type Leases struct {
	// Owner names this replica in the leases (default "local").
	Owner string
	// TTL is how long a lease outlives its holder's last renewal: how
	// long a run of a replica that died waits before another takes it
	// over (0: DefaultLeaseTTL).
	TTL time.Duration
	// Exclusive says that no other server uses the store (SQLite):
	// Recover then resumes every running run at once, whoever's lease it
	// has (a previous process's).
	Exclusive bool
}

// DefaultLeaseTTL is the default Leases.TTL.
const DefaultLeaseTTL = 15 * time.Second

// Service runs eval runs.
type Service struct {
	leases  Leases
	st      Store
	sb      Sandboxes
	storage Storage // nil: no limit
	trials  *trial.Runner
	judges  *judge.Judge
	log     *slog.Logger
	// output is the server's budget for held command output: each trial
	// and slice leases what it may hold before it starts.
	output *outbuf.Budget
	m      *metrics // metrics.go

	ctx  context.Context // ends at Close
	stop context.CancelFunc
	wg   sync.WaitGroup

	// draining closes at Drain: event streams end, runs go on.
	draining  chan struct{}
	drainOnce sync.Once

	// progressEvery paces the progress events of Follow.
	progressEvery time.Duration

	mu      sync.Mutex
	running map[string]*liveRun

	// scans holds what batch slices found a sample may write to, per
	// team, template digest and runtime.
	scans scanCache
	// hostHarness is set by tests whose "sandboxes" are host processes:
	// the harness then neither scans nor restores the host's writable
	// places, and makes its directories below /tmp (the fake sandbox's).
	hostHarness bool
	// meterRules bill the cost in run summaries (MeterWith).
	meterRules meter.Rules
}

// New returns the service. Call Recover once at start and Close at the end.
// output bounds the command output its trials hold (nil: no bound);
// storage (nil: none) bounds what a team's runs store; leases says how it
// shares runs with other replicas.
func New(st Store, sb Sandboxes, output *outbuf.Budget, storage Storage, leases Leases, log *slog.Logger) *Service {
	if log == nil {
		log = slog.Default()
	}
	if leases.Owner == "" {
		leases.Owner = "local"
	}
	if leases.TTL <= 0 {
		leases.TTL = DefaultLeaseTTL
	}
	ctx, stop := context.WithCancel(context.Background())
	return &Service{leases: leases, st: st, sb: sb, storage: storage, trials: trial.New(sb, log), judges: judge.New(sb, log), log: log, output: output, m: newMetrics(), ctx: ctx, stop: stop,
		draining: make(chan struct{}), progressEvery: progressEvery, running: map[string]*liveRun{}}
}

// input is what a run stores of its request.
type input struct {
	Problems []client.EvalProblem `json:"problems"`
	Samples  []client.EvalSample  `json:"samples"`
	// Options are nil in a run stored before it had them: its template
	// was every trial's, as asked for or the default python.
	Options *options `json:"options,omitempty"`
}

func badRequest(format string, args ...any) error {
	return &apierr.Error{Code: client.CodeBadRequest, Message: fmt.Sprintf(format, args...)}
}

// validate checks a request's input, fills in its defaults and returns
// its judging options.
func validate(req *client.CreateEvalRequest) (options, error) {
	if err := validateRequest(req); err != nil {
		return options{}, err
	}
	return validateJudging(req)
}

// validateRequest checks a request's problems, samples and settings.
func validateRequest(req *client.CreateEvalRequest) error {
	switch {
	case len(req.Problems) == 0:
		return badRequest("problems is empty")
	case len(req.Samples) == 0:
		return badRequest("samples is empty")
	case len(req.Samples) > MaxSamples:
		return &apierr.Error{Code: client.CodePayloadTooLarge, Message: fmt.Sprintf("%d samples; at most %d per run", len(req.Samples), MaxSamples)}
	case req.Timeout < 0 || req.Timeout > MaxTimeout:
		return badRequest("timeout must be in [0, %g] seconds (0: %g), got %g", MaxTimeout, DefaultTimeout, req.Timeout)
	case req.Concurrency < 0:
		return badRequest("concurrency must be positive, got %d", req.Concurrency)
	}
	tasks := make(map[string]bool, len(req.Problems))
	for i, p := range req.Problems {
		switch {
		case p.TaskID == "":
			return badRequest("problems[%d]: no task_id", i)
		case tasks[p.TaskID]:
			return badRequest("problems[%d]: task_id %q appears twice", i, p.TaskID)
		}
		if err := checkProblem(i, p); err != nil {
			return err
		}
		tasks[p.TaskID] = true
	}
	for i, s := range req.Samples {
		switch {
		case !tasks[s.TaskID]:
			return badRequest("samples[%d]: task_id %q is not in the problems", i, s.TaskID)
		case (s.Completion == nil) == (s.Solution == nil):
			return badRequest("samples[%d]: give exactly one of completion and solution", i)
		}
	}
	if len(req.K) == 0 {
		req.K = []int{1}
	}
	for _, k := range req.K {
		if k < 1 {
			return badRequest("k must be positive, got %d", k)
		}
	}
	slices.Sort(req.K)
	req.K = slices.Compact(req.K)
	if req.Timeout == 0 {
		req.Timeout = DefaultTimeout
	}
	return validateMode(req)
}

// Create records a run and starts it.
func (s *Service) Create(ctx context.Context, teamID string, req client.CreateEvalRequest) (client.EvalRun, error) {
	opts, err := validate(&req)
	if err != nil {
		return client.EvalRun{}, err
	}
	if sl, ok := s.sb.(ServiceLimits); ok {
		if err := checkServiceLimits(req, opts, sl); err != nil {
			return client.EvalRun{}, err
		}
	}
	team, err := s.sb.Team(ctx, teamID)
	if err != nil {
		return client.EvalRun{}, err
	}
	limit := min(team.Limits.MaxSandboxes, team.Limits.MaxConcurrentExec)
	if limit <= 0 {
		return client.EvalRun{}, &apierr.Error{Code: client.CodeTooManySandboxes, Message: fmt.Sprintf("team %s may not run sandboxes (its limits are 0)", team.Name)}
	}
	if sandboxesPerTrial(req.Problems) == 2 {
		// A sample judged by a checker program holds its own sandbox
		// while the checker's is made: a trial at a time for every two
		// sandboxes the team may have, else the trials would wait on one
		// another's.
		if limit < 2 {
			return client.EvalRun{}, &apierr.Error{Code: client.CodeTooManySandboxes,
				Message: fmt.Sprintf("a checker program runs in a sandbox of its own, beside the sample's: the team %s needs a limit of at least 2 sandboxes and execs, it has %d", team.Name, limit)}
		}
		limit /= 2
	}
	if req.Concurrency == 0 {
		req.Concurrency = min(limit, 4*runtime.NumCPU())
	}
	req.Concurrency = min(req.Concurrency, limit, len(req.Samples))
	in, err := json.Marshal(input{Problems: req.Problems, Samples: req.Samples, Options: &opts})
	if err != nil {
		return client.EvalRun{}, err
	}
	tasks := map[string]bool{}
	for _, s := range req.Samples {
		tasks[s.TaskID] = true
	}
	var run client.EvalRun
	insert := func() error {
		var err error
		run, err = s.st.InsertEval(ctx, store.EvalRow{Input: in, Owner: s.leases.Owner, LeaseUntil: time.Now().Add(s.leases.TTL), Run: client.EvalRun{
			TeamID: teamID, State: client.EvalStateRunning, K: req.K, Timeout: req.Timeout, Template: req.Template,
			Runtime: req.Runtime, Concurrency: req.Concurrency, Seed: req.Seed, Tasks: len(tasks), Samples: len(req.Samples),
			Mode: req.Mode, Slice: req.Slice, Language: req.Language,
		}})
		return err
	}
	if s.storage == nil {
		err = insert()
	} else {
		// The input is stored only if the team's storage can hold it.
		var res *quota.Reservation
		if res, err = s.storage.Reserve(ctx, teamID, int64(len(in))); err == nil {
			err = res.Persist(int64(len(in)), insert)
		}
	}
	var qe *quota.StorageError
	if errors.As(err, &qe) {
		return client.EvalRun{}, &apierr.Error{Code: client.CodeStorageQuotaExceeded,
			Message: fmt.Sprintf("the run's input is %d bytes: %v (templates, uploads and build contexts being processed, eval inputs); delete eval runs (DELETE /v1/evals/{id}) or templates, or ask an admin to raise the team's max_storage_mb", len(in), qe)}
	}
	if err != nil {
		return client.EvalRun{}, err
	}
	s.start(run)
	run.Counts = map[string]int{}
	return run, nil
}

// Recover resumes the runs a previous server left running whose lease is
// free or ran out (every running run when the store is this server's
// alone), and from then on takes over those of replicas that stop renewing
// theirs.
func (s *Service) Recover(ctx context.Context) error {
	now := time.Now()
	if s.leases.Exclusive {
		// Every lease is a previous process's: as good as ended.
		now = now.Add(100 * 365 * 24 * time.Hour)
	}
	if err := s.takeOver(ctx, now); err != nil {
		return fmt.Errorf("evalrun: recover: %w", err)
	}
	s.wg.Go(s.takeOverLoop)
	return nil
}

// takeOver claims and starts the running runs whose lease ended before now
// (or that nobody leases) and that this process does not run.
func (s *Service) takeOver(ctx context.Context, now time.Time) error {
	runs, err := s.st.ListClaimableEvals(ctx, now)
	if err != nil {
		return err
	}
	for _, r := range runs {
		s.mu.Lock()
		_, mine := s.running[r.ID]
		s.mu.Unlock()
		if mine {
			continue // stopping after it lost its lease: claimed again once it stopped
		}
		ok, err := s.st.ClaimEval(ctx, r.ID, s.leases.Owner, now, time.Now().Add(s.leases.TTL))
		if err != nil {
			return err
		}
		if !ok {
			continue // another replica was first
		}
		// The trials in flight under the previous lease are judged again
		// here: their sandboxes (a replica that died leaves them running on
		// a fleet's nodes) hold the team's slots for nothing.
		if ids, err := s.sb.DeleteByMetadata(ctx, r.TeamID, map[string]string{runMeta: r.ID}); err != nil {
			s.log.Warn("eval run: deleting the sandboxes of its previous lease", "run", r.ID, "err", err)
		} else if len(ids) > 0 {
			s.log.Info("eval run: deleted the sandboxes of its previous lease", "run", r.ID, "sandboxes", len(ids))
		}
		s.log.Info("eval run resumed", "run", r.ID, "team", r.TeamID, "owner", s.leases.Owner)
		s.start(r)
	}
	return nil
}

// takeOverLoop looks for runs to take over every TTL/3 until Close.
func (s *Service) takeOverLoop() {
	t := time.NewTicker(s.leases.TTL / 3)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(s.ctx, s.leases.TTL)
			if err := s.takeOver(ctx, time.Now()); err != nil && s.ctx.Err() == nil {
				s.log.Warn("eval runs: looking for runs to take over", "err", err)
			}
			cancel()
		}
	}
}

// keepLease renews the lease of the run live runs until ctx ends, and
// cancels the run (live.leaseLost set) once the lease is no longer this
// replica's: another took it over, the run was cancelled elsewhere, or no
// renewal succeeded before the lease ran out.
func (s *Service) keepLease(ctx context.Context, run client.EvalRun, live *liveRun) {
	until := time.Now().Add(s.leases.TTL)
	t := time.NewTicker(s.leases.TTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		next := time.Now().Add(s.leases.TTL)
		rctx, cancel := context.WithTimeout(ctx, s.leases.TTL/3)
		ok, err := s.st.RenewEval(rctx, run.ID, s.leases.Owner, next)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil && ok:
			until = next
			continue
		case err == nil:
			s.log.Warn("eval run: lease lost (taken over or ended elsewhere); stopping its trials", "run", run.ID, "owner", s.leases.Owner)
		case time.Now().Before(until):
			s.log.Warn("eval run: renewing its lease", "run", run.ID, "err", err)
			continue
		default:
			s.log.Warn("eval run: lease ran out before a renewal; stopping its trials", "run", run.ID, "err", err)
		}
		live.leaseLost.Store(true)
		live.cancel()
		return
	}
}

// record stores a verdict of a run under this replica's lease. It reports
// false when the sample already had one (kept). A lease lost stops the run
// (its context is cancelled) and is returned as an error.
func (s *Service) record(ctx context.Context, w *work, r client.EvalResult, env store.TrialEnv) (bool, error) {
	ok, err := s.st.PutEvalTrial(ctx, w.run.TeamID, w.run.ID, s.leases.Owner, r, env)
	if ok && err == nil {
		s.m.verdict(r.Status)
	}
	if errors.Is(err, store.ErrLeaseLost) {
		w.live.leaseLost.Store(true)
		w.live.cancel()
	}
	return ok, err
}

// Close stops the runs in progress (they stay running in the store and
// resume at the next Recover) and waits for their workers.
func (s *Service) Close() {
	s.Drain()
	s.stop()
	s.wg.Wait()
}

// Drain ends every event stream (Follow) with an error event saying the
// server is shutting down, so that they do not hold a graceful shutdown;
// the runs themselves go on until Close. Call it when shutdown starts.
func (s *Service) Drain() {
	s.drainOnce.Do(func() { close(s.draining) })
}

func (s *Service) start(run client.EvalRun) {
	ctx, cancel := context.WithCancel(s.ctx)
	live := newLiveRun(cancel)
	s.mu.Lock()
	s.running[run.ID] = live
	s.mu.Unlock()
	s.wg.Go(func() {
		defer func() {
			s.mu.Lock()
			delete(s.running, run.ID)
			s.mu.Unlock()
			live.stop()
			cancel()
			close(live.done)
		}()
		lctx, stopLease := context.WithCancel(ctx)
		leaseDone := make(chan struct{})
		go func() {
			defer close(leaseDone)
			s.keepLease(lctx, run, live)
		}()
		s.run(ctx, run, live)
		stopLease()
		<-leaseDone
		if s.ctx.Err() != nil && !live.leaseLost.Load() {
			// Shutting down: another replica may take the run at once.
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := s.st.ReleaseEval(rctx, run.ID, s.leases.Owner); err != nil {
				s.log.Warn("eval run: releasing its lease", "run", run.ID, "err", err)
			}
			cancel()
		}
	})
}

// withProgress adds a run's progress counts, and the retries so far of a
// run this process is running.
func (s *Service) withProgress(ctx context.Context, r client.EvalRun) (client.EvalRun, error) {
	counts, err := s.st.EvalCounts(ctx, r.TeamID, r.ID)
	if err != nil {
		return r, err
	}
	r.Counts, r.Done = counts, 0
	for _, n := range counts {
		r.Done += n
	}
	if r.State == client.EvalStateRunning {
		s.mu.Lock()
		if live := s.running[r.ID]; live != nil {
			r.Retries = int(live.retries.Load())
		}
		s.mu.Unlock()
	}
	return r, nil
}

// getRun reads a team's run; another team's run is not found.
func (s *Service) getRun(ctx context.Context, teamID, id string) (client.EvalRun, error) {
	r, err := s.st.GetEval(ctx, teamID, id)
	if errors.Is(err, store.ErrNotFound) {
		return r, &apierr.Error{Code: client.CodeNotFound, Message: fmt.Sprintf("eval run %s not found", id), Err: err}
	}
	return r, err
}

// Get returns a team's run with its progress.
func (s *Service) Get(ctx context.Context, teamID, id string) (client.EvalRun, error) {
	r, err := s.getRun(ctx, teamID, id)
	if err != nil {
		return r, err
	}
	return s.withProgress(ctx, r)
}

// List returns a team's runs, newest first, with their progress.
func (s *Service) List(ctx context.Context, teamID string) ([]client.EvalRun, error) {
	runs, err := s.st.ListEvals(ctx, teamID)
	if err != nil {
		return nil, err
	}
	for i := range runs {
		if runs[i], err = s.withProgress(ctx, runs[i]); err != nil {
			return nil, err
		}
	}
	return runs, nil
}

// Results calls fn with a team's run's finished results, in samples order.
func (s *Service) Results(ctx context.Context, teamID, id string, fn func(client.EvalResult) error) error {
	if _, err := s.getRun(ctx, teamID, id); err != nil {
		return err
	}
	return s.st.EvalTrials(ctx, teamID, id, fn)
}

// Delete removes a team's run that has ended, with its input and results.
// A running run is a conflict; a cancelled one whose worker is still
// stopping is waited for (a little).
func (s *Service) Delete(ctx context.Context, teamID, id string) error {
	run, err := s.getRun(ctx, teamID, id)
	if err != nil {
		return err
	}
	if run.State == client.EvalStateRunning {
		return &apierr.Error{Code: client.CodeConflict, Message: fmt.Sprintf("eval run %s is running; cancel it first", id)}
	}
	s.mu.Lock()
	live := s.running[id]
	s.mu.Unlock()
	if live != nil {
		// Cancelled: its worker is stopping its trials.
		select {
		case <-live.done:
		case <-time.After(30 * time.Second):
			return &apierr.Error{Code: client.CodeConflict, Message: fmt.Sprintf("eval run %s is still stopping; try again", id)}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	err = s.st.DeleteEval(ctx, teamID, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return &apierr.Error{Code: client.CodeNotFound, Message: fmt.Sprintf("eval run %s not found", id)}
	case errors.Is(err, store.ErrConflict):
		return &apierr.Error{Code: client.CodeConflict, Message: fmt.Sprintf("eval run %s is running; cancel it first", id)}
	case err != nil:
		return err
	}
	s.log.Info("eval run deleted", "run", id, "team", teamID)
	return nil
}

// Cancel stops a team's running run; its finished results stay.
func (s *Service) Cancel(ctx context.Context, teamID, id string) (client.EvalRun, error) {
	if _, err := s.getRun(ctx, teamID, id); err != nil {
		return client.EvalRun{}, err
	}
	err := s.st.FinishEval(ctx, teamID, id, client.EvalStateCancelled, "cancelled", nil)
	if err != nil && !errors.Is(err, store.ErrConflict) {
		return client.EvalRun{}, err
	}
	if err == nil {
		s.m.runs.WithLabelValues(client.EvalStateCancelled).Inc()
	}
	s.mu.Lock()
	if live := s.running[id]; live != nil {
		live.cancel()
	}
	s.mu.Unlock()
	return s.Get(ctx, teamID, id)
}

// run judges the run's unfinished samples, then records its summary.
func (s *Service) run(ctx context.Context, run client.EvalRun, live *liveRun) {
	log := s.log.With("run", run.ID, "team", run.TeamID)
	started := time.Now()
	ran, retries, err := s.judge(ctx, run, live)
	if ctx.Err() != nil {
		log.Info("eval run stopped", "trials", ran)
		return
	}
	state, errText := client.EvalStateSucceeded, ""
	var sum *client.EvalSummary
	if err == nil {
		sum, err = s.summarize(ctx, run)
	}
	if err != nil {
		state, errText = client.EvalStateFailed, err.Error()
		var se *apierr.Error
		if errors.As(err, &se) {
			errText = se.Message
		}
	}
	if el := time.Since(started); sum != nil && ran > 0 {
		sum.TrialsPerSecond = float64(ran) / el.Seconds()
	}
	if sum != nil {
		sum.Retries = retries
	}
	switch err := s.st.FinishOwnedEval(context.WithoutCancel(ctx), run.TeamID, run.ID, s.leases.Owner, state, errText, sum); {
	case errors.Is(err, store.ErrLeaseLost):
		log.Warn("eval run: another replica took it over before its end was recorded")
		return
	case err != nil && !errors.Is(err, store.ErrConflict):
		log.Error("eval run: record end", "err", err)
	case err == nil:
		s.m.runs.WithLabelValues(state).Inc()
	}
	log.Info("eval run ended", "state", state, "trials", ran, "duration", time.Since(started))
}

// judge runs every sample without a recorded result, in the run's seeded
// order, and returns how many it ran and how many attempts were retries
// after infra failures. It stops at the first error that stops a trial
// from running at all (e.g. an unknown template). Its verdicts and retries
// also go to live's followers.
func (s *Service) judge(ctx context.Context, run client.EvalRun, live *liveRun) (ran, retries int, err error) {
	raw, err := s.st.EvalInput(ctx, run.TeamID, run.ID)
	if err != nil {
		return 0, 0, err
	}
	var in input
	if err := json.Unmarshal(raw, &in); err != nil {
		return 0, 0, fmt.Errorf("run input: %w", err)
	}
	problems := make(map[string]eval.Problem, len(in.Problems))
	for _, p := range in.Problems {
		problems[p.TaskID] = evalProblem(p)
	}
	done := make([]bool, len(in.Samples))
	err = s.st.EvalTrials(ctx, run.TeamID, run.ID, func(r client.EvalResult) error {
		if r.CompletionID >= 0 && r.CompletionID < len(done) {
			done[r.CompletionID] = true
		}
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	var todo []int
	for i := range in.Samples {
		if !done[i] {
			todo = append(todo, i)
		}
	}
	rng := rand.New(rand.NewPCG(uint64(run.Seed), 0x65766c))
	rng.Shuffle(len(todo), func(i, j int) { todo[i], todo[j] = todo[j], todo[i] })
	opts := options{TemplateSet: true}
	if in.Options != nil {
		opts = *in.Options
	}
	w := &work{run: run, samples: in.Samples, problems: problems, live: live, opts: opts}
	if run.Mode == client.EvalModeBatch {
		return s.judgeBatch(ctx, w, todo)
	}

	return fanOut(ctx, max(1, run.Concurrency), todo, func(ctx context.Context, i int) (int, int, error) {
		r, err := s.trialOne(ctx, w, i)
		if err != nil {
			return 0, 0, err
		}
		w.live.addRetries(r)
		return 1, r, nil
	})
}

// fanOut runs job on items, in order, by up to workers at a time, and sums
// the trials each ran and their retries. The first error stops the feed
// and cancels the jobs under way; it is returned with the sums so far.
func fanOut[T any](ctx context.Context, workers int, items []T, job func(context.Context, T) (ran, retries int, err error)) (ran, retries int, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan T)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	for range min(workers, len(items)) {
		wg.Go(func() {
			for it := range next {
				n, r, err := job(ctx, it)
				mu.Lock()
				ran, retries = ran+n, retries+r
				if err != nil && firstErr == nil {
					firstErr = err
					cancel()
				}
				mu.Unlock()
			}
		})
	}
feed:
	for _, it := range items {
		select {
		case next <- it:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	return ran, retries, firstErr
}

// summarize computes a finished run's summary from its recorded results.
func (s *Service) summarize(ctx context.Context, run client.EvalRun) (*client.EvalSummary, error) {
	var rs []eval.Result
	err := s.st.EvalTrials(ctx, run.TeamID, run.ID, func(r client.EvalResult) error {
		rs = append(rs, eval.Result{TaskID: r.TaskID, CompletionID: r.CompletionID, Status: eval.Status(r.Status)})
		return nil
	})
	if err != nil {
		return nil, err
	}
	env, err := s.st.EvalEnv(ctx, run.TeamID, run.ID)
	if err != nil {
		return nil, err
	}
	es := eval.Summarize(rs, run.K)
	sum := &client.EvalSummary{PassAtK: es.PassAtK, Counts: map[string]int{}, TemplateDigest: env.TemplateDigest,
		Runtime: env.Runtime, RuntimeVersion: env.RuntimeVersion, DurationMs: time.Since(run.CreatedAt).Milliseconds()}
	for st, n := range es.Counts {
		sum.Counts[string(st)] = n
	}
	if sum.Phases, err = s.phases(ctx, run); err != nil {
		return nil, err
	}
	if err := s.cost(ctx, run, sum); err != nil {
		return nil, err
	}
	return sum, nil
}

// usageStore is a Store that meters sandboxes (internal/store does).
type usageStore interface {
	UsageSegments(ctx context.Context, teamID string, from, to time.Time) ([]store.UsageSegment, error)
}

// MeterWith sets how the run summaries' cost is billed (the server's
// rules; default meter's).
func (s *Service) MeterWith(r meter.Rules) { s.meterRules = r }

// cost records in sum the tariffs and the metered cost of the run's
// sandboxes (all ended by now: their usage is closed).
func (s *Service) cost(ctx context.Context, run client.EvalRun, sum *client.EvalSummary) error {
	us, ok := s.st.(usageStore)
	if !ok {
		return nil
	}
	segs, err := us.UsageSegments(ctx, run.TeamID, run.CreatedAt.Add(-time.Minute), time.Now().Add(time.Minute))
	if err != nil {
		return err
	}
	mine := segs[:0]
	tariffs := map[string]bool{}
	for _, u := range segs {
		if u.EvalRun == run.ID {
			mine = append(mine, u)
			tariffs[u.Tariff] = true
		}
	}
	if len(mine) == 0 {
		return nil
	}
	_, total := meter.Report(mine, run.CreatedAt.Add(-time.Minute), time.Now().Add(time.Minute), meter.ByEvalRun, s.meterRules)
	sum.Tariff = strings.Join(slices.Sorted(maps.Keys(tariffs)), ",")
	sum.BilledSeconds, sum.Cost = total.Billed.Seconds(), meter.FormatMoney(total.Cost)
	return nil
}

// wire is a result line as the API sends it.
func wire(r eval.Result) client.EvalResult {
	return client.EvalResult{TaskID: r.TaskID, CompletionID: r.CompletionID, Status: string(r.Status), Detail: r.Detail,
		DurationMs: r.DurationMs, Passed: r.Passed, Result: r.Result}
}
