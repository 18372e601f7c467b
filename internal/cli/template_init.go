package cli

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/evalbox/evalbox/internal/template"
)

// newTemplateInitCmd builds the built-in templates locally (no server): the
// setup scripts run it so that the first `serve` starts at once.
func newTemplateInitCmd() *cobra.Command {
	var dir, mirror string
	var quiet bool
	cmd := &cobra.Command{
		Use:   "init [NAME...]",
		Short: "Build the built-in templates (base, python, node, code-interpreter, polyglot) into a template directory",
		Long: `Build the built-in templates from the host's Debian mirror with mmdebstrap
(run as root). A template whose build spec is unchanged is kept: re-running is
cheap. Without names, every built-in is built.`,
		RunE: func(cmd *cobra.Command, names []string) error {
			if len(names) == 0 {
				names = template.BuiltinNames()
			}
			for _, n := range names {
				if _, ok := template.Builtins[n]; !ok {
					return usagef(cmd, "%q is not a built-in template", n)
				}
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			reg, err := template.Open(dir, log)
			if err != nil {
				return err
			}
			buildLog := cmd.ErrOrStderr()
			if quiet {
				buildLog = nil
			}
			for _, n := range names {
				t, err := reg.EnsureBuiltin(cmd.Context(), n, mirror, buildLog)
				if err != nil {
					return err
				}
				fmt.Fprintf(out(cmd), "%s\t%s\t%s\n", t.Name, shortDigest(t.Digest), humanBytes(t.SizeBytes))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "templates-dir", filepath.Join(DefaultDataDir, "templates"), "template directory (as serve's --templates-dir)")
	cmd.Flags().StringVar(&mirror, "mirror", os.Getenv("EVALBOX_DEBIAN_MIRROR"), "Debian mirror (default: the host's apt sources)")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "do not stream the build log")
	return cmd
}
