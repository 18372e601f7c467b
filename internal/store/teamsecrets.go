package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// TeamSecret is a team's stored secret. Sealed is its value sealed by
// internal/secrets: the store never sees a value.
type TeamSecret struct {
	TeamID    string
	Name      string
	Sealed    []byte
	CreatedAt time.Time
	UpdatedAt time.Time
}

// PutTeamSecret stores a team's secret, replacing the value of one of that
// name (its CreatedAt is kept). It reports whether the name was new. An
// unknown team is ErrNotFound.
func (s *Store) PutTeamSecret(ctx context.Context, teamID, name string, sealed []byte, at time.Time) (bool, error) {
	at = norm(at)
	res, err := s.exec(ctx, `UPDATE team_secrets SET sealed = ?, updated_at = ? WHERE team_id = ? AND name = ?`,
		sealed, toDB(at), teamID, name)
	if err != nil {
		return false, fmt.Errorf("store: put secret %s: %w", name, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return false, fmt.Errorf("store: put secret %s: %w", name, err)
	} else if n == 1 {
		return false, nil
	}
	res, err = s.exec(ctx, `INSERT INTO team_secrets (team_id, name, sealed, created_at, updated_at) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (team_id, name) DO UPDATE SET sealed = excluded.sealed, updated_at = excluded.updated_at`,
		teamID, name, sealed, toDB(at), toDB(at))
	if err != nil {
		return false, fmt.Errorf("store: put secret %s: %w", name, s.mapConstraint(err, "team"))
	}
	return true, nil
}

// ListTeamSecrets returns the team's secrets by name, without their sealed
// values.
func (s *Store) ListTeamSecrets(ctx context.Context, teamID string) ([]TeamSecret, error) {
	rows, err := s.query(ctx, `SELECT name, created_at, updated_at FROM team_secrets WHERE team_id = ? ORDER BY name`, teamID)
	if err != nil {
		return nil, fmt.Errorf("store: list secrets: %w", err)
	}
	defer rows.Close()
	var out []TeamSecret
	for rows.Next() {
		var ts TeamSecret
		var created, updated int64
		if err := rows.Scan(&ts.Name, &created, &updated); err != nil {
			return nil, fmt.Errorf("store: list secrets: %w", err)
		}
		ts.TeamID, ts.CreatedAt, ts.UpdatedAt = teamID, fromDB(created), fromDB(updated)
		out = append(out, ts)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list secrets: %w", err)
	}
	return out, nil
}

// GetTeamSecret returns one of the team's secrets with its sealed value;
// an unknown name (or another team's) is ErrNotFound.
func (s *Store) GetTeamSecret(ctx context.Context, teamID, name string) (TeamSecret, error) {
	ts := TeamSecret{TeamID: teamID, Name: name}
	var created, updated int64
	err := s.queryRow(ctx, `SELECT sealed, created_at, updated_at FROM team_secrets WHERE team_id = ? AND name = ?`,
		teamID, name).Scan(&ts.Sealed, &created, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return TeamSecret{}, fmt.Errorf("store: secret %s: %w", name, ErrNotFound)
	}
	if err != nil {
		return TeamSecret{}, fmt.Errorf("store: secret %s: %w", name, err)
	}
	ts.CreatedAt, ts.UpdatedAt = fromDB(created), fromDB(updated)
	return ts, nil
}

// DeleteTeamSecret removes one of the team's secrets; an unknown name is
// ErrNotFound.
func (s *Store) DeleteTeamSecret(ctx context.Context, teamID, name string) error {
	res, err := s.exec(ctx, `DELETE FROM team_secrets WHERE team_id = ? AND name = ?`, teamID, name)
	if err != nil {
		return fmt.Errorf("store: delete secret %s: %w", name, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("store: delete secret %s: %w", name, err)
	}
	if n == 0 {
		return fmt.Errorf("store: delete secret %s: %w", name, ErrNotFound)
	}
	return nil
}

// EachTeamSecret calls fn with every stored secret of every team, sealed
// values included (a key rotation's re-sealing). fn must not call the
// store: the rows are read first, then fn runs.
func (s *Store) EachTeamSecret(ctx context.Context, fn func(TeamSecret) error) error {
	rows, err := s.query(ctx, `SELECT team_id, name, sealed, created_at, updated_at FROM team_secrets ORDER BY team_id, name`)
	if err != nil {
		return fmt.Errorf("store: secrets: %w", err)
	}
	var all []TeamSecret
	for rows.Next() {
		var ts TeamSecret
		var created, updated int64
		if err := rows.Scan(&ts.TeamID, &ts.Name, &ts.Sealed, &created, &updated); err != nil {
			rows.Close()
			return fmt.Errorf("store: secrets: %w", err)
		}
		ts.CreatedAt, ts.UpdatedAt = fromDB(created), fromDB(updated)
		all = append(all, ts)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("store: secrets: %w", err)
	}
	for _, ts := range all {
		if err := fn(ts); err != nil {
			return err
		}
	}
	return nil
}

// ResealTeamSecret replaces a secret's sealed value if it is still old
// (a put since then wins). It reports whether it replaced it.
func (s *Store) ResealTeamSecret(ctx context.Context, teamID, name string, old, sealed []byte) (bool, error) {
	res, err := s.exec(ctx, `UPDATE team_secrets SET sealed = ? WHERE team_id = ? AND name = ? AND sealed = ?`,
		sealed, teamID, name, old)
	if err != nil {
		return false, fmt.Errorf("store: reseal secret %s: %w", name, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("store: reseal secret %s: %w", name, err)
	}
	return n == 1, nil
}
