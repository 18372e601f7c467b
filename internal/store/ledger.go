package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// Ledger kinds.
const (
	LedgerTopUp  = client.LedgerTopUp
	LedgerAdjust = client.LedgerAdjust
	LedgerCharge = client.LedgerCharge
)

// LedgerEntry is a row of a team's ledger: money in (a top-up, an
// adjustment of either sign) or out (a charge: an ended sandbox's metered
// cost, negative), in nano-units.
type LedgerEntry struct {
	ID, TeamID, Kind string
	Amount           int64
	// SandboxID is a charge's sandbox ("" otherwise).
	SandboxID string
	// Note and Actor are a top-up's or adjustment's (the admin key's id).
	Note, Actor string
	At          time.Time
}

// AddLedger appends a top-up or an adjustment to a team's ledger (an
// unknown team is ErrNotFound).
func (s *Store) AddLedger(ctx context.Context, e LedgerEntry) (LedgerEntry, error) {
	if e.Kind != LedgerTopUp && e.Kind != LedgerAdjust {
		return LedgerEntry{}, fmt.Errorf("store: ledger: kind %q is not a top-up or an adjustment", e.Kind)
	}
	e.ID, e.At = NewID("led"), norm(time.Now())
	_, err := s.exec(ctx, `INSERT INTO ledger (id, team_id, kind, amount, sandbox_id, note, actor, at) VALUES (?, ?, ?, ?, NULL, ?, ?, ?)`,
		e.ID, e.TeamID, e.Kind, e.Amount, e.Note, e.Actor, toDB(e.At))
	if err != nil {
		return LedgerEntry{}, fmt.Errorf("store: ledger: %w", s.mapConstraint(err, "team"))
	}
	return e, nil
}

// LedgerSum is the sum of a team's ledger: its top-ups and adjustments
// less its charges.
func (s *Store) LedgerSum(ctx context.Context, teamID string) (int64, error) {
	var sum sql.NullInt64
	if err := s.queryRow(ctx, `SELECT SUM(amount) FROM ledger WHERE team_id = ?`, teamID).Scan(&sum); err != nil {
		return 0, fmt.Errorf("store: ledger of %s: %w", teamID, err)
	}
	return sum.Int64, nil
}

// ListLedger returns a team's latest ledger entries, newest first.
func (s *Store) ListLedger(ctx context.Context, teamID string, limit int) ([]LedgerEntry, error) {
	rows, err := s.query(ctx, `SELECT id, team_id, kind, amount, COALESCE(sandbox_id, ''), note, actor, at FROM ledger
		WHERE team_id = ? ORDER BY at DESC, id DESC LIMIT ?`, teamID, limit)
	if err != nil {
		return nil, fmt.Errorf("store: ledger of %s: %w", teamID, err)
	}
	defer rows.Close()
	var out []LedgerEntry
	for rows.Next() {
		var e LedgerEntry
		var at int64
		if err := rows.Scan(&e.ID, &e.TeamID, &e.Kind, &e.Amount, &e.SandboxID, &e.Note, &e.Actor, &at); err != nil {
			return nil, fmt.Errorf("store: ledger of %s: %w", teamID, err)
		}
		e.At = fromDB(at)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: ledger of %s: %w", teamID, err)
	}
	return out, nil
}

// UnchargedSegments returns the segments of the sandboxes whose usage is
// closed and not charged yet (all their segments ended), by sandbox and
// sequence.
func (s *Store) UnchargedSegments(ctx context.Context, limit int) ([]UsageSegment, error) {
	return s.scanSegments(ctx, `SELECT `+segmentCols+` FROM usage_segments WHERE sandbox_id IN (
		SELECT sandbox_id FROM usage_segments WHERE charged = 0 AND ended_at IS NOT NULL
		AND sandbox_id NOT IN (SELECT sandbox_id FROM usage_segments WHERE ended_at IS NULL)
		GROUP BY sandbox_id ORDER BY sandbox_id LIMIT ?) ORDER BY sandbox_id, seq`, limit)
}

// UnbilledSegments returns the segments of the team's sandboxes ("" team:
// every team's) not charged yet: the running ones, and the ended ones the
// meter has not charged (Charge marks them in the transaction that writes
// the charge, so that a sandbox's cost is always in exactly one of the two).
func (s *Store) UnbilledSegments(ctx context.Context, teamID string) ([]UsageSegment, error) {
	q := `SELECT ` + segmentCols + ` FROM usage_segments WHERE charged = 0`
	args := []any{}
	if teamID != "" {
		q += ` AND team_id = ?`
		args = append(args, teamID)
	}
	return s.scanSegments(ctx, q+` ORDER BY sandbox_id, seq`, args...)
}

// Charge records an ended sandbox's cost (nano-units, ≥ 0) in its team's
// ledger and marks its usage charged, once: a second charge of the sandbox
// (another replica's) changes nothing. It reports whether it charged.
func (s *Store) Charge(ctx context.Context, teamID, sandboxID string, cost int64) (bool, error) {
	charged := false
	err := s.inTx(ctx, func(tx *txn) error {
		res, err := tx.exec(ctx, `INSERT INTO ledger (id, team_id, kind, amount, sandbox_id, note, actor, at) VALUES (?, ?, ?, ?, ?, '', '', ?)
			ON CONFLICT (sandbox_id) DO NOTHING`, NewID("led"), teamID, LedgerCharge, -cost, sandboxID, toDB(norm(time.Now())))
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		charged = n == 1
		_, err = tx.exec(ctx, `UPDATE usage_segments SET charged = 1 WHERE sandbox_id = ?`, sandboxID)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("store: charge %s: %w", sandboxID, s.mapConstraint(err, "team"))
	}
	return charged, nil
}
