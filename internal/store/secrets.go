package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
)

// ServerSecret returns the server's secret of that name: 32 random bytes,
// made by the first caller (of any replica) and the same for every later
// one. What is derived from it (the E2B layer's access tokens) holds as long
// as the database does.
func (s *Store) ServerSecret(ctx context.Context, name string) ([]byte, error) {
	var v []byte
	err := s.queryRow(ctx, `SELECT value FROM server_secrets WHERE name = ?`, name).Scan(&v)
	if err == nil {
		return v, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("store: server secret %s: %w", name, err)
	}
	fresh := make([]byte, 32)
	rand.Read(fresh)
	// Two replicas may make one at once: the first insert wins, and both
	// read it back.
	if _, err := s.exec(ctx, `INSERT INTO server_secrets (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING`, name, fresh); err != nil {
		return nil, fmt.Errorf("store: server secret %s: %w", name, err)
	}
	if err := s.writeRow(ctx, `SELECT value FROM server_secrets WHERE name = ?`, name).Scan(&v); err != nil {
		return nil, fmt.Errorf("store: server secret %s: %w", name, err)
	}
	return v, nil
}
