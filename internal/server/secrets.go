package server

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/evalbox/evalbox/internal/secrets"
	"github.com/evalbox/evalbox/internal/store"
)

// SecretsKeysFile is the keyring's file in the data dir, by default.
const SecretsKeysFile = "secrets.keys"

// openVault loads the keyring of the teams' secrets (making it at the first
// start) and reseals, under its current key, the secrets an older key
// sealed (after `evalbox secrets rotate-key`).
func openVault(ctx context.Context, cfg Config, st *store.Store, log *slog.Logger) (*secrets.Vault, error) {
	path := cfg.SecretsKeys
	if path == "" {
		path = filepath.Join(cfg.DataDir, SecretsKeysFile)
		if st.Backend() == "postgres" {
			// Each replica would make its own: what one seals, the
			// others could not open.
			log.Warn("the secrets keyring is this replica's own file; API replicas that share the database need the same one (--secrets-keys)",
				"file", path)
		}
	}
	keys, err := secrets.Load(path)
	if err != nil {
		return nil, fmt.Errorf("server: --secrets-keys: %w", err)
	}
	vault := secrets.NewVault(keys, st, log)
	n, err := vault.Reseal(ctx)
	if err != nil {
		return nil, fmt.Errorf("server: resealing team secrets: %w", err)
	}
	if n > 0 {
		log.Info("resealed team secrets under the current key", "secrets", n, "key", keys.Current())
	}
	return vault, nil
}
