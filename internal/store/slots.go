package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// A team's active-sandbox limit is enforced here, in the database, so that
// API replicas sharing it never admit past it together. A create takes a
// slot (TakeSlot): in one transaction that locks the team's row, it counts
// the team's running sandboxes and the slots other creates hold, and, if
// they are under the team's max_sandboxes, inserts a slot row. The slot
// becomes the sandbox's row once the node started it (InsertSandboxInSlot:
// the row inserted and the slot deleted in one transaction), or is given
// back (ReleaseSlot); from then on the running row holds the team's slot
// until it ends.
//
// A slot names the replica that holds it and expires: its replica renews
// its slots (RenewSlots) while their creates run, and a slot past its
// expiry is deleted by the next TakeSlot of its team, so that a replica
// that died mid-create leaks its slots only until they expire.
//
// On PostgreSQL the team row's lock (SELECT … FOR UPDATE) serialises the
// admissions of one team across replicas; on SQLite the single writer
// does.

// ErrTeamLimit: the team's running sandboxes and slots held are at its
// max_sandboxes. Wrapped in a *LimitError.
var ErrTeamLimit = errors.New("team at its sandbox limit")

// ErrSlotLost: the slot a sandbox was started in is gone (it expired and
// another admission swept it): the sandbox may not be recorded.
var ErrSlotLost = errors.New("sandbox slot expired")

// LimitError is an ErrTeamLimit with the numbers.
type LimitError struct {
	Running, Starting, Limit int
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("team at its sandbox limit: %d running and %d starting of %d", e.Running, e.Starting, e.Limit)
}

func (e *LimitError) Unwrap() error { return ErrTeamLimit }

// TakeSlot takes one of the team's sandbox slots for replica, valid until
// now+ttl unless renewed, and returns its id. A team at its limit is a
// *LimitError (ErrTeamLimit); an unknown team ErrNotFound.
func (s *Store) TakeSlot(ctx context.Context, teamID, replica string, ttl time.Duration) (string, error) {
	id := NewID("slot")
	at := now()
	err := s.inTx(ctx, func(tx *txn) error {
		var limit int
		err := tx.queryRow(ctx, `SELECT max_sandboxes FROM teams WHERE id = ?`+s.d.lockClause(), teamID).Scan(&limit)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("team %w", ErrNotFound)
		}
		if err != nil {
			return err
		}
		if _, err := tx.exec(ctx, `DELETE FROM sandbox_slots WHERE team_id = ? AND expires_at <= ?`, teamID, toDB(at)); err != nil {
			return err
		}
		var running, starting int
		// The state is a literal, so that the partial index of running
		// rows (migration 9) serves every plan, a generic one too.
		if err := tx.queryRow(ctx, `SELECT COUNT(*) FROM sandboxes WHERE team_id = ? AND state = '`+client.StateRunning+`'`,
			teamID).Scan(&running); err != nil {
			return err
		}
		if err := tx.queryRow(ctx, `SELECT COUNT(*) FROM sandbox_slots WHERE team_id = ?`, teamID).Scan(&starting); err != nil {
			return err
		}
		if running+starting >= limit {
			return &LimitError{Running: running, Starting: starting, Limit: limit}
		}
		_, err = tx.exec(ctx, `INSERT INTO sandbox_slots (id, team_id, replica, created_at, expires_at) VALUES (?, ?, ?, ?, ?)`,
			id, teamID, replica, toDB(at), toDB(at.Add(ttl)))
		return err
	})
	if err != nil {
		return "", fmt.Errorf("store: take a sandbox slot of %s: %w", teamID, err)
	}
	return id, nil
}

// ReleaseSlot gives a slot back (its create failed). An unknown slot is
// not an error: it expired.
func (s *Store) ReleaseSlot(ctx context.Context, id string) error {
	if _, err := s.exec(ctx, `DELETE FROM sandbox_slots WHERE id = ?`, id); err != nil {
		return fmt.Errorf("store: release slot %s: %w", id, err)
	}
	return nil
}

// RenewSlots extends every slot replica holds to now+ttl.
func (s *Store) RenewSlots(ctx context.Context, replica string, ttl time.Duration) error {
	if _, err := s.exec(ctx, `UPDATE sandbox_slots SET expires_at = ? WHERE replica = ?`, toDB(now().Add(ttl)), replica); err != nil {
		return fmt.Errorf("store: renew slots of %s: %w", replica, err)
	}
	return nil
}

// CountSlots returns how many unexpired slots the team's creates hold.
func (s *Store) CountSlots(ctx context.Context, teamID string) (int, error) {
	var n int
	err := s.queryRow(ctx, `SELECT COUNT(*) FROM sandbox_slots WHERE team_id = ? AND expires_at > ?`, teamID, toDB(now())).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("store: count slots of %s: %w", teamID, err)
	}
	return n, nil
}

// InsertSandboxInSlot stores sb (running on node sb.NodeID) in place of the
// slot that admitted it, in one transaction: the team's count never sees
// both or neither. A slot that is gone (expired and swept) is
// ErrSlotLost, and nothing is stored. Otherwise as InsertSandbox. An
// empty slotID stores sb admitted without a slot (a database that is one
// server's alone: its own count is the authority).
func (s *Store) InsertSandboxInSlot(ctx context.Context, sb client.Sandbox, slotID string) (client.Sandbox, error) {
	sb, args, err := sandboxArgs(sb)
	if err != nil {
		return client.Sandbox{}, err
	}
	err = s.inTx(ctx, func(tx *txn) error {
		if slotID == "" {
			if _, err := tx.exec(ctx, insertSandboxSQL, args...); err != nil {
				return s.mapConstraint(err, "team")
			}
			return openSegment(ctx, tx, sb)
		}
		res, err := tx.exec(ctx, `DELETE FROM sandbox_slots WHERE id = ? AND team_id = ?`, slotID, sb.TeamID)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return ErrSlotLost
		}
		if _, err = tx.exec(ctx, insertSandboxSQL, args...); err != nil {
			return s.mapConstraint(err, "team")
		}
		return openSegment(ctx, tx, sb)
	})
	if err != nil {
		return client.Sandbox{}, fmt.Errorf("store: insert sandbox %s: %w", sb.ID, err)
	}
	return sb, nil
}

// ListRunningOnNode returns the running sandboxes of node nodeID, and
// those recorded before sandboxes had a node (node_id ”), oldest first:
// what a replica that restarted recovers.
func (s *Store) ListRunningOnNode(ctx context.Context, nodeID string) ([]client.Sandbox, error) {
	out, err := s.querySandboxes(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE state = ? AND node_id IN (?, '')
		ORDER BY created_at, id`, client.StateRunning, nodeID)
	if err != nil {
		return nil, fmt.Errorf("store: list running sandboxes of node %s: %w", nodeID, err)
	}
	return out, nil
}

// SandboxNode returns the node a sandbox was recorded on.
func (s *Store) SandboxNode(ctx context.Context, id string) (string, error) {
	var n string
	err := s.queryRow(ctx, `SELECT node_id FROM sandboxes WHERE id = ?`, id).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("store: node of sandbox %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("store: node of sandbox %s: %w", id, err)
	}
	return n, nil
}
