package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// Sandbox rows are client.Sandbox values: the table has exactly its fields
// (but TrafficToken, of which it keeps the hash). Metadata, EnvKeys,
// NetworkRules, Ports and SecretNames are stored as JSON; EnvKeys and
// SecretNames hold names only, never values. Metadata reads back as a
// non-nil map, EnvKeys and SecretNames sorted.

const sandboxCols = `id, team_id, template, template_digest, runtime, runtime_version, state,
	cpu, memory_mb, disk_mb, network, metadata, env_keys, from_pool,
	created_at, expires_at, ended_at, end_reason, node_id, network_rules, ports, traffic_token_hash,
	paused_at, snapshot, secret_names, tariff, long_running, cpu_abuse_warned_at, cpu_throttled_at`

// SandboxFilter selects sandboxes in ListSandboxes.
type SandboxFilter struct {
	// Metadata pairs must all match exactly.
	Metadata map[string]string
	// States, if not empty, keeps only sandboxes in one of these states.
	States []string
	// Limit caps the number returned; 0 means no cap.
	Limit int
}

// InsertSandbox stores a sandbox and returns it as stored. An empty ID gets
// a new "sb_…" id, an empty State "running" and a zero CreatedAt the current
// time. A duplicate id is ErrConflict; an unknown team is ErrNotFound.
func (s *Store) InsertSandbox(ctx context.Context, sb client.Sandbox) (client.Sandbox, error) {
	return s.InsertSandboxInSlot(ctx, sb, "")
}

// insertSandboxSQL inserts a row of sandboxArgs.
const insertSandboxSQL = `INSERT INTO sandboxes (` + sandboxCols + `)
	VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

// sandboxArgs fills sb's defaults (InsertSandbox's) and returns it with the
// values of sandboxCols.
func sandboxArgs(sb client.Sandbox) (client.Sandbox, []any, error) {
	if sb.TeamID == "" {
		return client.Sandbox{}, nil, errors.New("store: insert sandbox: empty team")
	}
	if sb.ID == "" {
		sb.ID = NewID("sb")
	}
	if sb.State == "" {
		sb.State = client.StateRunning
	}
	if sb.CreatedAt.IsZero() {
		sb.CreatedAt = now()
	}
	sb.CreatedAt, sb.ExpiresAt = norm(sb.CreatedAt), norm(sb.ExpiresAt)
	if sb.EndedAt != nil {
		t := norm(*sb.EndedAt)
		sb.EndedAt = &t
	}
	if sb.PausedAt != nil {
		t := norm(*sb.PausedAt)
		sb.PausedAt = &t
	}
	for _, p := range []**time.Time{&sb.CPUAbuseWarnedAt, &sb.CPUThrottledAt} {
		if *p != nil {
			t := norm(**p)
			*p = &t
		}
	}
	if sb.Metadata == nil {
		sb.Metadata = map[string]string{}
	}
	meta, err := json.Marshal(sb.Metadata)
	if err != nil {
		return client.Sandbox{}, nil, fmt.Errorf("store: insert sandbox: %w", err)
	}
	var envKeys, secretNames []byte
	if sb.EnvKeys, envKeys, err = namesJSON(sb.EnvKeys); err != nil {
		return client.Sandbox{}, nil, fmt.Errorf("store: insert sandbox: %w", err)
	}
	if sb.SecretNames, secretNames, err = namesJSON(sb.SecretNames); err != nil {
		return client.Sandbox{}, nil, fmt.Errorf("store: insert sandbox: %w", err)
	}
	rules, err := rulesJSON(sb.NetworkRules)
	if err != nil {
		return client.Sandbox{}, nil, fmt.Errorf("store: insert sandbox: %w", err)
	}
	sb.Ports = normPorts(sb.Ports)
	ports, err := json.Marshal(sb.Ports)
	if err != nil {
		return client.Sandbox{}, nil, fmt.Errorf("store: insert sandbox: %w", err)
	}
	sb.TrafficToken = ""
	return sb, []any{sb.ID, sb.TeamID, sb.Template, sb.TemplateDigest, sb.Runtime, sb.RuntimeVersion, sb.State,
		sb.CPU, sb.MemoryMB, sb.DiskMB, sb.Network, string(meta), string(envKeys), boolInt(sb.FromPool),
		toDB(sb.CreatedAt), toDB(sb.ExpiresAt), nullTime(sb.EndedAt), sb.EndReason, sb.NodeID,
		rules, string(ports), sb.TrafficTokenHash, nullTime(sb.PausedAt), sb.Snapshot, string(secretNames), sb.Tariff,
		boolInt(sb.LongRunning), nullTime(sb.CPUAbuseWarnedAt), nullTime(sb.CPUThrottledAt)}, nil
}

// namesJSON is the stored form of a list of names (EnvKeys, SecretNames):
// sorted, a copy, nil when empty.
func namesJSON(names []string) ([]string, []byte, error) {
	if len(names) == 0 {
		return nil, []byte("[]"), nil
	}
	names = slices.Clone(names)
	slices.Sort(names)
	b, err := json.Marshal(names)
	return names, b, err
}

// rulesJSON is the stored form of a sandbox's rule lists: ” for none.
func rulesJSON(r *client.NetworkRuleLists) (string, error) {
	if r == nil {
		return "", nil
	}
	c := client.NetworkRuleLists{Allow: r.Allow, Deny: r.Deny}
	if c.Allow == nil {
		c.Allow = []string{}
	}
	if c.Deny == nil {
		c.Deny = []string{}
	}
	b, err := json.Marshal(c)
	return string(b), err
}

// normPorts sorts port settings by port; an empty list is nil.
func normPorts(ps []client.PortSpec) []client.PortSpec {
	if len(ps) == 0 {
		return nil
	}
	ps = slices.Clone(ps)
	slices.SortFunc(ps, func(a, b client.PortSpec) int { return a.Port - b.Port })
	return ps
}

// GetSandbox returns the team's sandbox with this id; another team's is
// ErrNotFound.
func (s *Store) GetSandbox(ctx context.Context, teamID, id string) (client.Sandbox, error) {
	sb, err := scanSandbox(s.queryRow(ctx,
		`SELECT `+sandboxCols+` FROM sandboxes WHERE id = ? AND team_id = ?`, id, teamID))
	if err != nil {
		return client.Sandbox{}, fmt.Errorf("store: get sandbox %s: %w", id, err)
	}
	return sb, nil
}

// GetSandboxAnyTeam returns the sandbox with this id, whichever team's (for
// the port URLs that a traffic token or a public port opens, whose caller
// names no team).
func (s *Store) GetSandboxAnyTeam(ctx context.Context, id string) (client.Sandbox, error) {
	sb, err := scanSandbox(s.queryRow(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id = ?`, id))
	if err != nil {
		return client.Sandbox{}, fmt.Errorf("store: get sandbox %s: %w", id, err)
	}
	return sb, nil
}

// SetNetwork sets the network mode and rule lists (nil unless the mode is
// rules) of the team's running sandbox. An ended sandbox is ErrNotRunning;
// another team's is ErrNotFound.
func (s *Store) SetNetwork(ctx context.Context, teamID, id, mode string, rules *client.NetworkRuleLists) error {
	js, err := rulesJSON(rules)
	if err != nil {
		return fmt.Errorf("store: set network of %s: %w", id, err)
	}
	return s.updateRunning(ctx, "set network of", teamID, id, `network = ?, network_rules = ?`, mode, js)
}

// SetPorts replaces the port settings of the team's running sandbox.
func (s *Store) SetPorts(ctx context.Context, teamID, id string, ports []client.PortSpec) error {
	js, err := json.Marshal(normPorts(ports))
	if err != nil {
		return fmt.Errorf("store: set ports of %s: %w", id, err)
	}
	if string(js) == "null" {
		js = []byte("[]")
	}
	return s.updateRunning(ctx, "set ports of", teamID, id, `ports = ?`, string(js))
}

// SetPaused records that the team's running sandbox was paused at t, or
// resumed (nil).
func (s *Store) SetPaused(ctx context.Context, teamID, id string, t *time.Time) error {
	at := norm(time.Now())
	if t != nil {
		at = norm(*t)
		t = &at
	}
	err := s.inTx(ctx, func(tx *txn) error {
		res, err := tx.exec(ctx, `UPDATE sandboxes SET paused_at = ? WHERE id = ? AND team_id = ? AND state = ?`,
			nullTime(t), id, teamID, client.StateRunning)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return s.whyNotRunning(ctx, teamID, id)
		}
		// Metered from now on as paused (disk only), or running again.
		return switchSegment(ctx, tx, id, t != nil, at)
	})
	if err != nil {
		return fmt.Errorf("store: set paused of %s: %w", id, err)
	}
	return nil
}

// SetTrafficTokenHash replaces the hash of the team's running sandbox's
// traffic token.
func (s *Store) SetTrafficTokenHash(ctx context.Context, teamID, id, hash string) error {
	return s.updateRunning(ctx, "set traffic token of", teamID, id, `traffic_token_hash = ?`, hash)
}

// updateRunning sets columns of the team's running sandbox (as SetExpiry).
func (s *Store) updateRunning(ctx context.Context, what, teamID, id, set string, args ...any) error {
	args = append(args, id, teamID, client.StateRunning)
	res, err := s.exec(ctx, `UPDATE sandboxes SET `+set+` WHERE id = ? AND team_id = ? AND state = ?`, args...)
	if err == nil {
		var n int64
		if n, err = res.RowsAffected(); err == nil && n == 0 {
			err = s.whyNotRunning(ctx, teamID, id)
		}
	}
	if err != nil {
		return fmt.Errorf("store: %s %s: %w", what, id, err)
	}
	return nil
}

// ListSandboxes returns the team's sandboxes that match f, newest first.
func (s *Store) ListSandboxes(ctx context.Context, teamID string, f SandboxFilter) ([]client.Sandbox, error) {
	var q strings.Builder
	args := make([]any, 0, 1+len(f.States)+2*len(f.Metadata)+1)
	q.WriteString(`SELECT ` + sandboxCols + ` FROM sandboxes WHERE team_id = ?`)
	args = append(args, teamID)
	if len(f.States) > 0 {
		q.WriteString(` AND state IN (?` + strings.Repeat(`, ?`, len(f.States)-1) + `)`)
		for _, st := range f.States {
			args = append(args, st)
		}
	}
	// json_each matches any key text exactly (json_extract paths would need
	// quoting); metadata values are always JSON strings.
	each := s.d.jsonEach("sandboxes.metadata")
	for k, v := range f.Metadata {
		q.WriteString(` AND EXISTS (SELECT 1 FROM ` + each + ` m WHERE m.key = ? AND m.value = ?)`)
		args = append(args, k, v)
	}
	q.WriteString(` ORDER BY created_at DESC, id DESC`)
	if f.Limit > 0 {
		q.WriteString(` LIMIT ?`)
		args = append(args, f.Limit)
	}
	out, err := s.querySandboxes(ctx, q.String(), args...)
	if err != nil {
		return nil, fmt.Errorf("store: list sandboxes: %w", err)
	}
	return out, nil
}

// SetExpiry sets when the team's running sandbox expires. An ended sandbox
// is ErrNotRunning; another team's is ErrNotFound.
//
// The state is checked by the UPDATE itself, not by a read before it: a
// sandbox that a concurrent MarkEnded ends (another replica's, on
// PostgreSQL) is never given a new expiry.
func (s *Store) SetExpiry(ctx context.Context, teamID, id string, t time.Time) error {
	res, err := s.exec(ctx, `UPDATE sandboxes SET expires_at = ? WHERE id = ? AND team_id = ? AND state = ?`,
		toDB(t), id, teamID, client.StateRunning)
	if err == nil {
		var n int64
		if n, err = res.RowsAffected(); err == nil && n == 0 {
			err = s.whyNotRunning(ctx, teamID, id)
		}
	}
	if err != nil {
		return fmt.Errorf("store: set expiry of %s: %w", id, err)
	}
	return nil
}

// whyNotRunning tells a sandbox that an UPDATE of the team's running
// sandbox missed: ErrNotFound (unknown, or another team's) or
// ErrNotRunning. A sandbox never returns to running, so this later read
// cannot contradict the UPDATE.
func (s *Store) whyNotRunning(ctx context.Context, teamID, id string) error {
	var state string
	err := s.queryRow(ctx, `SELECT state FROM sandboxes WHERE id = ? AND team_id = ?`, id, teamID).Scan(&state)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return ErrNotFound
	case err != nil:
		return err
	case state == client.StateRunning:
		// Rows are never made running again: only a concurrent insert of
		// this id could get here, and ids are random.
		return fmt.Errorf("sandbox %s is running but was not updated", id)
	}
	return ErrNotRunning
}

// MarkEnded moves a running sandbox to state (deleted, expired, lost) with
// a reason and end time. It reports whether it changed the row: false if
// the sandbox had already ended (or does not exist), so of several racing
// callers exactly one wins.
func (s *Store) MarkEnded(ctx context.Context, id, state, reason string, at time.Time) (bool, error) {
	if state == client.StateRunning || state == "" {
		return false, fmt.Errorf("store: mark %s ended: invalid end state %q", id, state)
	}
	at = norm(at)
	ended, err := s.endRow(ctx, id, state, at,
		`UPDATE sandboxes SET state = ?, end_reason = ?, ended_at = ? WHERE id = ? AND state = ?`,
		state, reason, toDB(at), id, client.StateRunning)
	if err != nil {
		return false, fmt.Errorf("store: mark %s ended: %w", id, err)
	}
	return ended, nil
}

// MarkExpired ends a running sandbox whose expiry is at or before now as
// expired (reason "timeout"), in one statement: of a reaper and a
// concurrent SetExpiry that moves the expiry past now, the expiry wins if
// it committed first. It reports whether it ended the row.
func (s *Store) MarkExpired(ctx context.Context, id string, now time.Time) (bool, error) {
	now = norm(now)
	ended, err := s.endRow(ctx, id, client.StateExpired, now,
		`UPDATE sandboxes SET state = ?, end_reason = ?, ended_at = ? WHERE id = ? AND state = ? AND expires_at <= ?`,
		client.StateExpired, "timeout", toDB(now), id, client.StateRunning, toDB(now))
	if err != nil {
		return false, fmt.Errorf("store: expire %s: %w", id, err)
	}
	return ended, nil
}

// endRow runs update (which ends sandbox id's running row) and, when it
// ended it, closes the sandbox's usage in the same transaction.
func (s *Store) endRow(ctx context.Context, id, state string, at time.Time, update string, args ...any) (bool, error) {
	ended := false
	err := s.inTx(ctx, func(tx *txn) error {
		res, err := tx.exec(ctx, update, args...)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil || n != 1 {
			return err
		}
		ended = true
		return closeSegment(ctx, tx, id, state, at)
	})
	return ended && err == nil, err
}

// ListByState returns the sandboxes of all teams in this state, oldest
// first (e.g. the running ones, to recover them after a restart).
func (s *Store) ListByState(ctx context.Context, state string) ([]client.Sandbox, error) {
	out, err := s.querySandboxes(ctx,
		`SELECT `+sandboxCols+` FROM sandboxes WHERE state = ? ORDER BY created_at, id`, state)
	if err != nil {
		return nil, fmt.Errorf("store: list %s sandboxes: %w", state, err)
	}
	return out, nil
}

// ListRunningOn returns the running sandboxes of all teams on a node,
// oldest first (to drain a node that was lost).
func (s *Store) ListRunningOn(ctx context.Context, nodeID string) ([]client.Sandbox, error) {
	out, err := s.querySandboxes(ctx,
		`SELECT `+sandboxCols+` FROM sandboxes WHERE node_id = ? AND state = ? ORDER BY created_at, id`, nodeID, client.StateRunning)
	if err != nil {
		return nil, fmt.Errorf("store: list sandboxes on node %s: %w", nodeID, err)
	}
	return out, nil
}

// ListExpired returns the running sandboxes of all teams whose expiry is at
// or before now, soonest expiry first.
func (s *Store) ListExpired(ctx context.Context, now time.Time) ([]client.Sandbox, error) {
	out, err := s.querySandboxes(ctx,
		`SELECT `+sandboxCols+` FROM sandboxes WHERE state = ? AND expires_at <= ? ORDER BY expires_at, id`,
		client.StateRunning, toDB(now))
	if err != nil {
		return nil, fmt.Errorf("store: list expired sandboxes: %w", err)
	}
	return out, nil
}

// CountByState returns how many of the team's sandboxes are in state.
func (s *Store) CountByState(ctx context.Context, teamID, state string) (int, error) {
	var n int
	err := s.queryRow(ctx,
		`SELECT COUNT(*) FROM sandboxes WHERE team_id = ? AND state = ?`, teamID, state).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("store: count %s sandboxes: %w", state, err)
	}
	return n, nil
}

func (s *Store) querySandboxes(ctx context.Context, query string, args ...any) ([]client.Sandbox, error) {
	rows, err := s.query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []client.Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sb)
	}
	return out, rows.Err()
}

func scanSandbox(sc scanner) (client.Sandbox, error) {
	var sb client.Sandbox
	var meta, envKeys, secretNames, rules, ports string
	var created, expires, fromPool int64
	var ended, paused, cpuWarned, cpuThrottled sql.NullInt64
	var longRunning int64
	err := sc.Scan(&sb.ID, &sb.TeamID, &sb.Template, &sb.TemplateDigest, &sb.Runtime, &sb.RuntimeVersion, &sb.State,
		&sb.CPU, &sb.MemoryMB, &sb.DiskMB, &sb.Network, &meta, &envKeys, &fromPool,
		&created, &expires, &ended, &sb.EndReason, &sb.NodeID, &rules, &ports, &sb.TrafficTokenHash,
		&paused, &sb.Snapshot, &secretNames, &sb.Tariff, &longRunning, &cpuWarned, &cpuThrottled)
	if errors.Is(err, sql.ErrNoRows) {
		return client.Sandbox{}, ErrNotFound
	}
	if err != nil {
		return client.Sandbox{}, err
	}
	if err := json.Unmarshal([]byte(meta), &sb.Metadata); err != nil {
		return client.Sandbox{}, fmt.Errorf("sandbox %s metadata: %w", sb.ID, err)
	}
	if sb.Metadata == nil {
		sb.Metadata = map[string]string{}
	}
	if err := json.Unmarshal([]byte(envKeys), &sb.EnvKeys); err != nil {
		return client.Sandbox{}, fmt.Errorf("sandbox %s env keys: %w", sb.ID, err)
	}
	if len(sb.EnvKeys) == 0 {
		sb.EnvKeys = nil
	}
	if err := json.Unmarshal([]byte(secretNames), &sb.SecretNames); err != nil {
		return client.Sandbox{}, fmt.Errorf("sandbox %s secret names: %w", sb.ID, err)
	}
	if len(sb.SecretNames) == 0 {
		sb.SecretNames = nil
	}
	if rules != "" {
		sb.NetworkRules = &client.NetworkRuleLists{}
		if err := json.Unmarshal([]byte(rules), sb.NetworkRules); err != nil {
			return client.Sandbox{}, fmt.Errorf("sandbox %s network rules: %w", sb.ID, err)
		}
	}
	if err := json.Unmarshal([]byte(ports), &sb.Ports); err != nil {
		return client.Sandbox{}, fmt.Errorf("sandbox %s ports: %w", sb.ID, err)
	}
	if len(sb.Ports) == 0 {
		sb.Ports = nil
	}
	sb.FromPool = fromPool != 0
	sb.CreatedAt, sb.ExpiresAt, sb.EndedAt, sb.PausedAt = fromDB(created), fromDB(expires), timePtr(ended), timePtr(paused)
	sb.LongRunning, sb.CPUAbuseWarnedAt, sb.CPUThrottledAt = longRunning != 0, timePtr(cpuWarned), timePtr(cpuThrottled)
	return sb, nil
}
