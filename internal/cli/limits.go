package cli

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/evalbox/evalbox/internal/limits"
)

// newLimitsCmd prints the table of internal/limits: every limit the server
// enforces, its default and its flag. docs/limits.md's table is its
// --markdown output (TestLimitsMarkdownIsDocs).
func newLimitsCmd() *cobra.Command {
	var markdown bool
	cmd := &cobra.Command{
		Use:   "limits [--markdown]",
		Short: "Print the limits the server enforces, their defaults and flags",
		Long: `Print every limit evalbox serve enforces: its scope, its default (this binary's),
the serve flag that sets it and what it bounds. Team limits are also set per team
(evalbox teams update). --markdown prints the table of docs/limits.md.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if markdown {
				_, err := io.WriteString(out(cmd), limits.Markdown())
				return err
			}
			t := newTable(out(cmd), "LIMIT", "SCOPE", "DEFAULT", "FLAG", "BOUNDS")
			for _, l := range limits.All() {
				flag := "-"
				if l.Flag != "" {
					flag = "--" + l.Flag
				}
				t.row(l.Name, l.Scope, l.Value(), flag, l.Bounds)
			}
			return t.flush()
		},
	}
	cmd.Flags().BoolVar(&markdown, "markdown", false, "print the table as Markdown (docs/limits.md's)")
	return cmd
}
