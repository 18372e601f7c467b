package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// Audit rows are client.AuditEvent values: who did what (the team and key
// of the request, or none for a refused unauthenticated one), from which
// address, to what, and how it ended. They never hold a request's body.

const auditCols = `id, at, team_id, key_id, key_name, admin, remote_addr, action, target, status, code`

// AuditFilter selects audit rows in ListAudit. Zero fields select all.
type AuditFilter struct {
	TeamID string
	Action string
	// Since (inclusive) and Until (exclusive) bound the rows' times.
	Since, Until time.Time
	// Limit bounds the rows returned (0: DefaultAuditLimit; at most
	// MaxAuditLimit).
	Limit int
	// Cursor continues a listing after its last row (ListAudit's next).
	Cursor string
}

// Bounds of AuditFilter.Limit.
const (
	DefaultAuditLimit = 100
	MaxAuditLimit     = 1000
)

// ErrBadCursor: AuditFilter.Cursor is not one ListAudit handed out.
var ErrBadCursor = errors.New("store: invalid cursor")

// InsertAudit stores one audit row. An empty ID gets a new "aud_…" id and
// a zero At the current time.
func (s *Store) InsertAudit(ctx context.Context, e client.AuditEvent) (client.AuditEvent, error) {
	if e.Action == "" {
		return client.AuditEvent{}, errors.New("store: insert audit: empty action")
	}
	if e.ID == "" {
		e.ID = NewID("aud")
	}
	if e.At.IsZero() {
		e.At = now()
	}
	e.At = norm(e.At)
	_, err := s.exec(ctx, `INSERT INTO audit (`+auditCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		e.ID, toDB(e.At), e.TeamID, e.KeyID, e.KeyName, boolInt(e.Admin), e.RemoteAddr, e.Action, e.Target, e.Status, e.Code)
	if err != nil {
		return client.AuditEvent{}, fmt.Errorf("store: insert audit: %w", s.mapConstraint(err, "audit"))
	}
	return e, nil
}

// ListAudit returns the rows f selects, newest first, and the cursor of
// the next page ("" after the last).
func (s *Store) ListAudit(ctx context.Context, f AuditFilter) ([]client.AuditEvent, string, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = DefaultAuditLimit
	}
	limit = min(limit, MaxAuditLimit)
	var where []string
	var args []any
	if f.TeamID != "" {
		where, args = append(where, "team_id = ?"), append(args, f.TeamID)
	}
	if f.Action != "" {
		where, args = append(where, "action = ?"), append(args, f.Action)
	}
	if !f.Since.IsZero() {
		where, args = append(where, "at >= ?"), append(args, toDB(f.Since))
	}
	if !f.Until.IsZero() {
		where, args = append(where, "at < ?"), append(args, toDB(f.Until))
	}
	if f.Cursor != "" {
		at, id, err := parseAuditCursor(f.Cursor)
		if err != nil {
			return nil, "", err
		}
		where, args = append(where, "(at < ? OR (at = ? AND id < ?))"), append(args, at, at, id)
	}
	q := `SELECT ` + auditCols + ` FROM audit`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	// One row more than asked says whether there is a next page.
	q += ` ORDER BY at DESC, id DESC LIMIT ?`
	args = append(args, limit+1)
	rows, err := s.query(ctx, q, args...)
	if err != nil {
		return nil, "", fmt.Errorf("store: list audit: %w", err)
	}
	defer rows.Close()
	out := []client.AuditEvent{}
	for rows.Next() {
		var e client.AuditEvent
		var at, admin int64
		if err := rows.Scan(&e.ID, &at, &e.TeamID, &e.KeyID, &e.KeyName, &admin, &e.RemoteAddr, &e.Action, &e.Target, &e.Status, &e.Code); err != nil {
			return nil, "", fmt.Errorf("store: list audit: %w", err)
		}
		e.At, e.Admin = fromDB(at), admin != 0
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, "", fmt.Errorf("store: list audit: %w", err)
	}
	next := ""
	if len(out) > limit {
		out = out[:limit]
		last := out[limit-1]
		next = strconv.FormatInt(toDB(last.At), 10) + "." + last.ID
	}
	return out, next, nil
}

// parseAuditCursor reads a cursor of ListAudit: the last row's time
// (microseconds) and id.
func parseAuditCursor(c string) (int64, string, error) {
	us, id, ok := strings.Cut(c, ".")
	at, err := strconv.ParseInt(us, 10, 64)
	if !ok || err != nil || at < 0 {
		return 0, "", ErrBadCursor
	}
	if _, ok := IDBytes("aud", id); !ok {
		return 0, "", ErrBadCursor
	}
	return at, id, nil
}

// DeleteAuditBefore deletes the rows older than t (the retention sweep)
// and returns how many went.
func (s *Store) DeleteAuditBefore(ctx context.Context, t time.Time) (int64, error) {
	res, err := s.exec(ctx, `DELETE FROM audit WHERE at < ?`, toDB(t))
	if err != nil {
		return 0, fmt.Errorf("store: delete audit: %w", err)
	}
	return res.RowsAffected()
}
