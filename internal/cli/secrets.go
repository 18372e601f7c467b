package cli

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/evalbox/evalbox/internal/secrets"
	"github.com/evalbox/evalbox/pkg/client"
)

// maxSecretInput bounds what `secrets set` reads from stdin (the server
// refuses a value over 32 KiB with a clear error).
const maxSecretInput = 1 << 20

func newSecretsCmd(a *app) *cobra.Command {
	cmd := groupCommand(&cobra.Command{
		Use:   "secrets",
		Short: "Manage the team's stored secrets (given to sandboxes with --secret-ref)",
	})

	set := &cobra.Command{
		Use:   "set NAME",
		Short: "Store a secret of the team, its value read from stdin",
		Long: `Store a secret of the caller's team, or replace its value. The value is read
from stdin (one trailing newline is dropped), never from the command line,
where the process list would show it. Sandboxes get it as the environment
variable NAME with: evalbox sandbox create --secret-ref NAME.`,
		Example: `  printf %s "$OPENAI_API_KEY" | evalbox secrets set OPENAI_API_KEY`,
		Args:    args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, names []string) error {
			b, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), maxSecretInput+1))
			if err != nil {
				return fmt.Errorf("reading the value from stdin: %w", err)
			}
			if len(b) > maxSecretInput {
				return usagef(cmd, "the value on stdin is over %d bytes", maxSecretInput)
			}
			b = bytes.TrimSuffix(b, []byte("\n"))
			b = bytes.TrimSuffix(b, []byte("\r"))
			if len(b) == 0 {
				return usagef(cmd, "no value on stdin (pipe the secret in)")
			}
			_, err = a.client().PutSecret(cmd.Context(), names[0], string(b))
			return err
		},
	}

	var listJSON bool
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the team's secrets (names only: values are never shown)",
		Args:    args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			list, err := a.client().ListSecrets(cmd.Context())
			if err != nil {
				return err
			}
			if listJSON {
				if list == nil {
					list = []client.TeamSecret{}
				}
				return printJSON(out(cmd), client.TeamSecretList{Secrets: list})
			}
			t := newTable(out(cmd), "NAME", "CREATED", "UPDATED")
			for _, s := range list {
				t.row(s.Name, timeCell(s.CreatedAt), timeCell(s.UpdatedAt))
			}
			return t.flush()
		},
	}
	ls.Flags().BoolVar(&listJSON, "json", false, "print the list as JSON")

	rm := &cobra.Command{
		Use:     "rm NAME...",
		Aliases: []string{"delete"},
		Short:   "Delete secrets of the team (sandboxes that have them keep them)",
		Args:    args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, names []string) error {
			c := a.client()
			for _, n := range names {
				if err := c.DeleteSecret(cmd.Context(), n); err != nil {
					return err
				}
			}
			return nil
		},
	}

	var keys string
	rotate := &cobra.Command{
		Use:   "rotate-key --keys PATH",
		Short: "Add a new key to the server's secrets keyring (run on the server's host)",
		Long: `Add a key to the keyring file that seals the teams' stored secrets
(<data-dir>/secrets.keys, or serve --secrets-keys) and make it the one that
seals from now on. The older keys stay, so that every replica can still open
what they sealed; at its next start each server reseals the stored secrets
under the new key. Run it with the servers' keyring file (all replicas share
one), then restart the servers.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if keys == "" {
				return usagef(cmd, "--keys is required")
			}
			if _, err := os.Stat(keys); err != nil {
				return fmt.Errorf("--keys: %w", err)
			}
			k, err := secrets.Load(keys)
			if err != nil {
				return err
			}
			id, err := k.Rotate()
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(out(cmd), "key %d now seals; restart the servers to reseal the stored secrets\n", id)
			return err
		},
	}
	rotate.Flags().StringVar(&keys, "keys", "", "the keyring file (required)")

	var initKeys string
	initCmd := &cobra.Command{
		Use:   "init-keys --keys PATH",
		Short: "Make a new secrets keyring file (for API replicas that share one, e.g. a Kubernetes Secret)",
		Long: `Make a new keyring file (mode 0600) for serve --secrets-keys. A single server
makes its own at the first start (<data-dir>/secrets.keys); API replicas that
share one database need one keyring, made once with this command and mounted
by each (docs/deploy-kubernetes.md). An existing file is left alone.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if initKeys == "" {
				return usagef(cmd, "--keys is required")
			}
			if _, err := os.Lstat(initKeys); err == nil {
				return usagef(cmd, "--keys: %s exists; it is left as it is", initKeys)
			}
			_, err := secrets.Load(initKeys)
			return err
		},
	}
	initCmd.Flags().StringVar(&initKeys, "keys", "", "the keyring file to make (required)")

	cmd.AddCommand(set, ls, rm, rotate, initCmd)
	return cmd
}

// secretsFromEnv returns the --secret NAMEs' values, each taken from the
// CLI's own environment variable of that name (never from the command
// line, where the process list would show it).
func secretsFromEnv(cmd *cobra.Command, names []string) (map[string]string, error) {
	if len(names) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(names))
	for _, n := range names {
		if strings.Contains(n, "=") {
			return nil, usagef(cmd, "--secret takes a NAME whose value is in this shell's environment, not NAME=VALUE (the process list would show the value)")
		}
		v, ok := os.LookupEnv(n)
		if !ok {
			return nil, usagef(cmd, "--secret %s: no environment variable %s to take the value from", n, n)
		}
		out[n] = v
	}
	return out, nil
}
