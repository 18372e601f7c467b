package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// Metered usage: one segment per stretch of a sandbox's life in which it
// was running (or paused: Paused), with the shape and the prices of its
// tariff as they were at its create. The store opens the first segment in
// the transaction that inserts the sandbox's row, switches segments in the
// one that records a pause or a resume, and closes the last in the one
// that ends the row, so that no sandbox is ever unmetered or metered
// twice. Between those, the meter's tick (AccrueUsage) advances the open
// segments' AccruedUntil: what a crash of every server loses is at most
// one tick, since a sandbox found lost at a restart is closed where the
// last tick left it, never at the restart.

// UsageSegment is one stretch of a sandbox's metered life.
type UsageSegment struct {
	SandboxID, TeamID, Template, Tariff, EvalRun string
	Seq                                          int
	CPU                                          float64
	MemoryMB, DiskMB                             int
	// Prices per second, nano-units (Tariff's).
	PriceVCPUSecond, PriceGiBSecond, PriceDiskGiBSecond int64
	Paused                                              bool
	StartedAt, AccruedUntil                             time.Time
	// EndedAt is nil while the segment is open.
	EndedAt *time.Time
}

// End is where the segment's metered time ends: its end, or while it is
// open the last tick.
func (u UsageSegment) End() time.Time {
	if u.EndedAt != nil {
		return *u.EndedAt
	}
	return u.AccruedUntil
}

// evalRunMeta is the metadata key of an eval run's trial sandboxes
// (internal/evalrun's): their usage is grouped by it.
const evalRunMeta = "eval_run"

// openSegment inserts sb's first segment (running, or paused when it is
// inserted paused), priced by its tariff's row; a tariff deleted meanwhile
// (or none) prices it at zero.
func openSegment(ctx context.Context, tx *txn, sb client.Sandbox) error {
	var pv, pg, pd int64
	err := tx.queryRow(ctx, `SELECT price_vcpu_second, price_gib_second, price_disk_gib_second FROM tariffs WHERE name = ?`,
		sb.Tariff).Scan(&pv, &pg, &pd)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	start := sb.CreatedAt
	_, err = tx.exec(ctx, `INSERT INTO usage_segments (sandbox_id, seq, team_id, template, tariff, eval_run, cpu, memory_mb, disk_mb,
		price_vcpu_second, price_gib_second, price_disk_gib_second, paused, started_at, accrued_until, ended_at)
		VALUES (?, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		sb.ID, sb.TeamID, sb.Template, sb.Tariff, sb.Metadata[evalRunMeta], sb.CPU, sb.MemoryMB, sb.DiskMB, pv, pg, pd,
		boolInt(sb.PausedAt != nil), toDB(start), toDB(start), nullTime(sb.EndedAt))
	return err
}

// switchSegment closes id's open segment at at and opens the next one,
// paused or running, from at.
func switchSegment(ctx context.Context, tx *txn, id string, paused bool, at time.Time) error {
	if _, err := tx.exec(ctx, `UPDATE usage_segments SET ended_at = ?, accrued_until = ? WHERE sandbox_id = ? AND ended_at IS NULL`,
		toDB(at), toDB(at), id); err != nil {
		return err
	}
	_, err := tx.exec(ctx, `INSERT INTO usage_segments (sandbox_id, seq, team_id, template, tariff, eval_run, cpu, memory_mb, disk_mb,
		price_vcpu_second, price_gib_second, price_disk_gib_second, paused, started_at, accrued_until, ended_at)
		SELECT sandbox_id, seq + 1, team_id, template, tariff, eval_run, cpu, memory_mb, disk_mb,
		price_vcpu_second, price_gib_second, price_disk_gib_second, ?, ?, ?, NULL
		FROM usage_segments WHERE sandbox_id = ? AND seq = (SELECT MAX(seq) FROM usage_segments WHERE sandbox_id = ?)`,
		boolInt(paused), toDB(at), toDB(at), id, id)
	return err
}

// closeSegment closes id's open segment: at at, or, for a sandbox found
// lost (its end unknown: it may have died with the servers), where the
// last tick left it.
func closeSegment(ctx context.Context, tx *txn, id, state string, at time.Time) error {
	if state != client.StateLost {
		if _, err := tx.exec(ctx, `UPDATE usage_segments SET accrued_until = ? WHERE sandbox_id = ? AND ended_at IS NULL AND accrued_until < ?`,
			toDB(at), id, toDB(at)); err != nil {
			return err
		}
	}
	_, err := tx.exec(ctx, `UPDATE usage_segments SET ended_at = accrued_until WHERE sandbox_id = ? AND ended_at IS NULL`, id)
	return err
}

// AccrueUsage advances every open segment to now (the meter's tick) and
// returns how many it advanced. Any replica may tick: a segment is only
// ever moved forward.
func (s *Store) AccrueUsage(ctx context.Context, now time.Time) (int64, error) {
	res, err := s.exec(ctx, `UPDATE usage_segments SET accrued_until = ? WHERE ended_at IS NULL AND accrued_until < ?`,
		toDB(norm(now)), toDB(norm(now)))
	if err != nil {
		return 0, fmt.Errorf("store: accrue usage: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("store: accrue usage: %w", err)
	}
	return n, nil
}

// UsageSegments returns the segments of the team's sandboxes ("" team:
// every team's) that overlap [from, to), by sandbox and sequence.
func (s *Store) UsageSegments(ctx context.Context, teamID string, from, to time.Time) ([]UsageSegment, error) {
	q := `SELECT ` + segmentCols + ` FROM usage_segments WHERE started_at < ? AND COALESCE(ended_at, accrued_until) >= ?`
	args := []any{toDB(to), toDB(from)}
	if teamID != "" {
		q += ` AND team_id = ?`
		args = append(args, teamID)
	}
	return s.scanSegments(ctx, q+` ORDER BY sandbox_id, seq`, args...)
}

const segmentCols = `sandbox_id, seq, team_id, template, tariff, eval_run, cpu, memory_mb, disk_mb,
	price_vcpu_second, price_gib_second, price_disk_gib_second, paused, started_at, accrued_until, ended_at`

func (s *Store) scanSegments(ctx context.Context, q string, args ...any) ([]UsageSegment, error) {
	rows, err := s.query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: usage: %w", err)
	}
	defer rows.Close()
	var out []UsageSegment
	for rows.Next() {
		var u UsageSegment
		var paused, started, accrued int64
		var ended sql.NullInt64
		if err := rows.Scan(&u.SandboxID, &u.Seq, &u.TeamID, &u.Template, &u.Tariff, &u.EvalRun, &u.CPU, &u.MemoryMB, &u.DiskMB,
			&u.PriceVCPUSecond, &u.PriceGiBSecond, &u.PriceDiskGiBSecond, &paused, &started, &accrued, &ended); err != nil {
			return nil, fmt.Errorf("store: usage: %w", err)
		}
		u.Paused, u.StartedAt, u.AccruedUntil = paused != 0, fromDB(started), fromDB(accrued)
		if ended.Valid {
			t := fromDB(ended.Int64)
			u.EndedAt = &t
		}
		out = append(out, u)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: usage: %w", err)
	}
	return out, nil
}
