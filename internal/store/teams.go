package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/evalbox/evalbox/pkg/client"
)

const teamCols = `id, name, created_at, max_sandboxes, max_concurrent_execs, max_storage_mb, requests_per_minute, creates_per_minute`

// CreateTeam inserts a team and returns it as stored. An empty ID gets a
// new "team_…" id and a zero CreatedAt the current time. A taken name is
// ErrConflict.
func (s *Store) CreateTeam(ctx context.Context, t client.Team) (client.Team, error) {
	if t.Name == "" {
		return client.Team{}, errors.New("store: create team: empty name")
	}
	if t.ID == "" {
		t.ID = NewID("team")
	}
	if t.CreatedAt.IsZero() {
		t.CreatedAt = now()
	}
	t.CreatedAt = norm(t.CreatedAt)
	_, err := s.exec(ctx,
		`INSERT INTO teams (`+teamCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
		t.ID, t.Name, toDB(t.CreatedAt), t.Limits.MaxSandboxes, t.Limits.MaxConcurrentExec, t.Limits.MaxStorageMB,
		t.Limits.RequestsPerMinute, t.Limits.CreatesPerMinute)
	if err != nil {
		return client.Team{}, fmt.Errorf("store: create team %q: %w", t.Name, s.mapConstraint(err, "team"))
	}
	return t, nil
}

// GetTeam returns the team with this id.
func (s *Store) GetTeam(ctx context.Context, id string) (client.Team, error) {
	t, err := scanTeam(s.queryRow(ctx, `SELECT `+teamCols+` FROM teams WHERE id = ?`, id))
	if err != nil {
		return client.Team{}, fmt.Errorf("store: get team %s: %w", id, err)
	}
	return t, nil
}

// GetTeamByName returns the team with this name.
func (s *Store) GetTeamByName(ctx context.Context, name string) (client.Team, error) {
	t, err := scanTeam(s.queryRow(ctx, `SELECT `+teamCols+` FROM teams WHERE name = ?`, name))
	if err != nil {
		return client.Team{}, fmt.Errorf("store: get team %q: %w", name, err)
	}
	return t, nil
}

// ListTeams returns all teams, oldest first.
func (s *Store) ListTeams(ctx context.Context) ([]client.Team, error) {
	rows, err := s.query(ctx, `SELECT `+teamCols+` FROM teams ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("store: list teams: %w", err)
	}
	defer rows.Close()
	var out []client.Team
	for rows.Next() {
		t, err := scanTeam(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list teams: %w", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list teams: %w", err)
	}
	return out, nil
}

// UpdateTeamLimits replaces a team's limits and returns the updated team.
func (s *Store) UpdateTeamLimits(ctx context.Context, id string, l client.Limits) (client.Team, error) {
	t, err := scanTeam(s.writeRow(ctx,
		`UPDATE teams SET max_sandboxes = ?, max_concurrent_execs = ?, max_storage_mb = ?, requests_per_minute = ?, creates_per_minute = ?
		WHERE id = ? RETURNING `+teamCols,
		l.MaxSandboxes, l.MaxConcurrentExec, l.MaxStorageMB, l.RequestsPerMinute, l.CreatesPerMinute, id))
	if err != nil {
		return client.Team{}, fmt.Errorf("store: update team %s: %w", id, err)
	}
	return t, nil
}

// scanner is a *sql.Row or *sql.Rows.
type scanner interface{ Scan(dest ...any) error }

func scanTeam(sc scanner) (client.Team, error) {
	var t client.Team
	var created int64
	err := sc.Scan(&t.ID, &t.Name, &created, &t.Limits.MaxSandboxes, &t.Limits.MaxConcurrentExec, &t.Limits.MaxStorageMB,
		&t.Limits.RequestsPerMinute, &t.Limits.CreatesPerMinute)
	if errors.Is(err, sql.ErrNoRows) {
		return client.Team{}, ErrNotFound
	}
	if err != nil {
		return client.Team{}, err
	}
	t.CreatedAt = fromDB(created)
	return t, nil
}
