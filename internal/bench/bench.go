// Package bench holds `evalbox bench`: benchmarks of a running server.
package bench

import "github.com/spf13/cobra"

// Command returns the `evalbox bench` command tree.
func Command() *cobra.Command {
	return &cobra.Command{Use: "bench", Short: "Benchmark sandboxes against a running server"}
}
