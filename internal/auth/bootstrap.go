package auth

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/pkg/client"
)

const (
	// AdminKeyFile is the file, in the data dir, that holds the bootstrap
	// admin key (mode 0600).
	AdminKeyFile = "admin.key"
	// AdminTeam is the name of the team that owns the bootstrap admin key.
	AdminTeam = "admin"
)

// BootstrapStore is what EnsureAdmin needs; *store.Store implements it.
type BootstrapStore interface {
	KeyStore
	GetTeamByName(ctx context.Context, name string) (client.Team, error)
	CreateTeam(ctx context.Context, t client.Team) (client.Team, error)
	InsertKey(ctx context.Context, k store.Key) (store.Key, error)
}

// EnsureAdmin makes sure <dataDir>/admin.key holds a valid admin API key.
// Call it at server start, after opening the store.
//
// If the file holds a non-revoked admin key, it does nothing (and returns
// false). Otherwise — first start, file deleted, key revoked, database
// replaced — it creates the team "admin" with the given limits unless it
// exists, mints a new admin key for it, and writes the key to the file
// atomically (temp file + rename) with mode 0600, returning true. Earlier
// admin keys stay valid until revoked. Deleting the file and restarting
// is thus the way to recover a lost admin key: whoever can write the data
// dir controls the database anyway.
func EnsureAdmin(ctx context.Context, st BootstrapStore, dataDir string, limits client.Limits) (created bool, err error) {
	path := filepath.Join(dataDir, AdminKeyFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if secret := strings.TrimSpace(string(b)); wellFormed(secret) {
			k, _, err := st.KeyByHash(ctx, HashKey(secret))
			if err == nil && k.Admin {
				return false, nil
			}
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return false, fmt.Errorf("auth: check admin key: %w", err)
			}
		}
	case errors.Is(err, fs.ErrNotExist):
	default:
		return false, fmt.Errorf("auth: read admin key: %w", err)
	}

	team, err := st.GetTeamByName(ctx, AdminTeam)
	if errors.Is(err, store.ErrNotFound) {
		team, err = st.CreateTeam(ctx, client.Team{Name: AdminTeam, Limits: limits})
		if errors.Is(err, store.ErrConflict) {
			// Another server on the same database (a replica starting
			// with this one) created it since the lookup.
			team, err = st.GetTeamByName(ctx, AdminTeam)
		}
	}
	if err != nil {
		return false, fmt.Errorf("auth: admin team: %w", err)
	}
	secret, prefix, hash := NewKey()
	// The file is written before the key is stored: a failure in between
	// leaves a file with an unknown key, which the next start replaces.
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return false, fmt.Errorf("auth: write admin key: %w", err)
	}
	if err := writeFileAtomic(path, []byte(secret+"\n"), 0o600); err != nil {
		return false, fmt.Errorf("auth: write admin key: %w", err)
	}
	if _, err := st.InsertKey(ctx, store.Key{TeamID: team.ID, Name: "bootstrap admin", Prefix: prefix, Hash: hash, Admin: true}); err != nil {
		return false, fmt.Errorf("auth: store admin key: %w", err)
	}
	return true, nil
}

// writeFileAtomic replaces path with data: readers see the old or the new
// content, never a part, and the file never exists with a looser mode.
func writeFileAtomic(path string, data []byte, perm os.FileMode) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err = f.Chmod(perm); err != nil {
		return err
	}
	if _, err = f.Write(data); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(f.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
