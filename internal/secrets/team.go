package secrets

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/evalbox/evalbox/internal/store"
)

// TeamStore keeps teams' sealed secrets (internal/store does).
type TeamStore interface {
	PutTeamSecret(ctx context.Context, teamID, name string, sealed []byte, at time.Time) (bool, error)
	ListTeamSecrets(ctx context.Context, teamID string) ([]store.TeamSecret, error)
	GetTeamSecret(ctx context.Context, teamID, name string) (store.TeamSecret, error)
	DeleteTeamSecret(ctx context.Context, teamID, name string) error
	EachTeamSecret(ctx context.Context, fn func(store.TeamSecret) error) error
	ResealTeamSecret(ctx context.Context, teamID, name string, old, sealed []byte) (bool, error)
}

// ErrNotFound is a secret the team does not have.
var ErrNotFound = errors.New("secrets: no such secret")

// Vault is the teams' stored secrets: sealed by the keyring on the way in,
// opened only on the way into a sandbox (Resolve). Nothing it returns or
// logs holds a value but Resolve's answer.
type Vault struct {
	keys  *Keyring
	store TeamStore
	log   *slog.Logger
}

// NewVault returns the vault of store's secrets under keys.
func NewVault(keys *Keyring, st TeamStore, log *slog.Logger) *Vault {
	if log == nil {
		log = slog.Default()
	}
	return &Vault{keys: keys, store: st, log: log}
}

// teamBinding is the additional data of a team's secret: the value opens
// only as that team's secret of that name.
func teamBinding(teamID, name string) []byte {
	return []byte("team-secret\x00" + teamID + "\x00" + name)
}

// Put stores the team's secret name (new reports whether it is a new name).
func (v *Vault) Put(ctx context.Context, teamID, name, value string) (bool, error) {
	sealed, err := v.keys.Seal([]byte(value), teamBinding(teamID, name))
	if err != nil {
		return false, err
	}
	return v.store.PutTeamSecret(ctx, teamID, name, sealed, time.Now())
}

// List returns the team's secrets, names and times only.
func (v *Vault) List(ctx context.Context, teamID string) ([]store.TeamSecret, error) {
	return v.store.ListTeamSecrets(ctx, teamID)
}

// Delete removes the team's secret name (ErrNotFound: none).
func (v *Vault) Delete(ctx context.Context, teamID, name string) error {
	if err := v.store.DeleteTeamSecret(ctx, teamID, name); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("%w: %s", ErrNotFound, name)
		}
		return err
	}
	return nil
}

// Resolve opens the team's secrets of these names. A name the team does not
// have is ErrNotFound (the error names it; no value is ever in an error).
func (v *Vault) Resolve(ctx context.Context, teamID string, names []string) (map[string]string, error) {
	out := make(map[string]string, len(names))
	for _, name := range names {
		ts, err := v.store.GetTeamSecret(ctx, teamID, name)
		if errors.Is(err, store.ErrNotFound) {
			return nil, fmt.Errorf("%w: %s", ErrNotFound, name)
		}
		if err != nil {
			return nil, err
		}
		val, err := v.keys.Open(ts.Sealed, teamBinding(teamID, name))
		if err != nil {
			return nil, fmt.Errorf("secrets: team secret %s: %w", name, err)
		}
		out[name] = string(val)
	}
	return out, nil
}

// Reseal seals again, under the current key, every stored secret sealed
// with an older one (after Rotate), and returns how many it resealed. A
// secret put meanwhile is left as the put made it.
func (v *Vault) Reseal(ctx context.Context) (int, error) {
	n := 0
	err := v.store.EachTeamSecret(ctx, func(ts store.TeamSecret) error {
		if !v.keys.NeedsReseal(ts.Sealed) {
			return nil
		}
		b := teamBinding(ts.TeamID, ts.Name)
		val, err := v.keys.Open(ts.Sealed, b)
		if err != nil {
			// Not fatal to the others: the operator sees which one.
			v.log.Error("a team secret does not open; left as it is", "team", ts.TeamID, "secret", ts.Name, "err", err)
			return nil
		}
		sealed, err := v.keys.Seal(val, b)
		if err != nil {
			return err
		}
		ok, err := v.store.ResealTeamSecret(ctx, ts.TeamID, ts.Name, ts.Sealed, sealed)
		if err != nil {
			return err
		}
		if ok {
			n++
		}
		return nil
	})
	return n, err
}
