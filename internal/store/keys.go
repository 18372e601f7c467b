package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// Key is a row of api_keys. Only the hash of the secret is stored.
type Key struct {
	ID        string
	TeamID    string
	Name      string
	Prefix    string // first characters of the secret, for display
	Hash      string // see auth.HashKey
	Admin     bool
	CreatedAt time.Time
	RevokedAt *time.Time
}

// API returns the key as the REST API shows it (without secret or hash).
func (k Key) API() client.APIKey {
	return client.APIKey{
		ID:        k.ID,
		TeamID:    k.TeamID,
		Name:      k.Name,
		Prefix:    k.Prefix,
		Admin:     k.Admin,
		CreatedAt: k.CreatedAt,
		RevokedAt: k.RevokedAt,
	}
}

const keyCols = `id, team_id, name, prefix, hash, admin, created_at, revoked_at`

// InsertKey stores a key and returns it as stored. An empty ID gets a new
// "key_…" id and a zero CreatedAt the current time. A duplicate hash or id
// is ErrConflict; an unknown team is ErrNotFound.
func (s *Store) InsertKey(ctx context.Context, k Key) (Key, error) {
	if k.Hash == "" || k.TeamID == "" {
		return Key{}, errors.New("store: insert key: empty hash or team")
	}
	if k.ID == "" {
		k.ID = NewID("key")
	}
	if k.CreatedAt.IsZero() {
		k.CreatedAt = now()
	}
	k.CreatedAt = norm(k.CreatedAt)
	if k.RevokedAt != nil {
		t := norm(*k.RevokedAt)
		k.RevokedAt = &t
	}
	_, err := s.exec(ctx,
		`INSERT INTO api_keys (`+keyCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
		k.ID, k.TeamID, k.Name, k.Prefix, k.Hash, boolInt(k.Admin), toDB(k.CreatedAt), nullTime(k.RevokedAt))
	if err != nil {
		return Key{}, fmt.Errorf("store: insert key: %w", s.mapConstraint(err, "team"))
	}
	return k, nil
}

// KeyByHash returns the non-revoked key with this hash and its team. A
// revoked or unknown key is ErrNotFound.
func (s *Store) KeyByHash(ctx context.Context, hash string) (Key, client.Team, error) {
	row := s.queryRow(ctx, `SELECT k.id, k.team_id, k.name, k.prefix, k.hash, k.admin, k.created_at, k.revoked_at,
		t.id, t.name, t.created_at, t.max_sandboxes, t.max_concurrent_execs, t.max_storage_mb,
		t.requests_per_minute, t.creates_per_minute
		FROM api_keys k JOIN teams t ON t.id = k.team_id
		WHERE k.hash = ? AND k.revoked_at IS NULL`, hash)
	var k Key
	var t client.Team
	var kCreated, tCreated, admin int64
	var revoked sql.NullInt64
	err := row.Scan(&k.ID, &k.TeamID, &k.Name, &k.Prefix, &k.Hash, &admin, &kCreated, &revoked,
		&t.ID, &t.Name, &tCreated, &t.Limits.MaxSandboxes, &t.Limits.MaxConcurrentExec, &t.Limits.MaxStorageMB,
		&t.Limits.RequestsPerMinute, &t.Limits.CreatesPerMinute)
	if errors.Is(err, sql.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return Key{}, client.Team{}, fmt.Errorf("store: key by hash: %w", err)
	}
	k.Admin, k.CreatedAt, k.RevokedAt, t.CreatedAt = admin != 0, fromDB(kCreated), timePtr(revoked), fromDB(tCreated)
	return k, t, nil
}

// ListKeys returns the keys of a team, or of all teams when teamID is "",
// revoked ones included, oldest first.
func (s *Store) ListKeys(ctx context.Context, teamID string) ([]Key, error) {
	var rows *sql.Rows
	var err error
	if teamID == "" {
		rows, err = s.query(ctx, `SELECT `+keyCols+` FROM api_keys ORDER BY created_at, id`)
	} else {
		rows, err = s.query(ctx, `SELECT `+keyCols+` FROM api_keys WHERE team_id = ? ORDER BY created_at, id`, teamID)
	}
	if err != nil {
		return nil, fmt.Errorf("store: list keys: %w", err)
	}
	defer rows.Close()
	var out []Key
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list keys: %w", err)
		}
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list keys: %w", err)
	}
	return out, nil
}

// RevokeKey marks the team's key revoked and returns it; teamID "" (an
// admin) matches a key of any team. Revoking an already revoked key keeps
// its first revocation time. A key of another team is ErrNotFound. Callers
// that cache authentication must then drop their cache (see
// auth.Authenticator.Invalidate).
func (s *Store) RevokeKey(ctx context.Context, teamID, id string) (Key, error) {
	k, err := scanKey(s.writeRow(ctx,
		`UPDATE api_keys SET revoked_at = COALESCE(revoked_at, ?)
		WHERE id = ? AND (? = '' OR team_id = ?) RETURNING `+keyCols,
		toDB(time.Now()), id, teamID, teamID))
	if err != nil {
		return Key{}, fmt.Errorf("store: revoke key %s: %w", id, err)
	}
	return k, nil
}

func scanKey(sc scanner) (Key, error) {
	var k Key
	var created, admin int64
	var revoked sql.NullInt64
	err := sc.Scan(&k.ID, &k.TeamID, &k.Name, &k.Prefix, &k.Hash, &admin, &created, &revoked)
	if errors.Is(err, sql.ErrNoRows) {
		return Key{}, ErrNotFound
	}
	if err != nil {
		return Key{}, err
	}
	k.Admin, k.CreatedAt, k.RevokedAt = admin != 0, fromDB(created), timePtr(revoked)
	return k, nil
}
