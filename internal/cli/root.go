// Package cli is the evalbox command line: `evalbox serve` and the API
// commands (`evalbox sandbox …`, `keys`, `teams`, `template`, `health`).
//
// cmd/evalbox/main.go calls Execute. The server is wired in through
// ServeFunc, so that this package does not depend on it; other command trees
// (e.g. `evalbox bench`) are passed to Execute as extra commands.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/evalbox/evalbox/pkg/client"
	"github.com/spf13/cobra"
)

// Version is the version the CLI reports (set at link time with
// -ldflags "-X github.com/evalbox/evalbox/internal/cli.Version=…").
var Version = "dev"

// Exit statuses of the evalbox command.
const (
	ExitOK          = 0
	ExitError       = 1 // the API answered an error, or it could not be reached
	ExitUsage       = 2 // unknown command or flag, bad argument
	ExitTimedOut    = 124
	exitSignalBase  = 128
	exitInterrupted = exitSignalBase + int(syscall.SIGINT)
)

const exitStatusHelp = `Exit status:
  0    success
  1    the API answered an error, or could not be reached
  2    usage error (unknown command or flag, bad argument)
  sandbox exec: the command's own exit status, 124 when it timed out,
  128+N when it was killed by signal N; 130 when interrupted (Ctrl-C).`

// Execute runs the evalbox command with os.Args and exits with its status.
// extra commands (e.g. the `bench` tree) are added to the root first.
func Execute(extra ...*cobra.Command) {
	root := NewRoot()
	root.AddCommand(extra...)
	os.Exit(Main(context.Background(), root, os.Args[1:]))
}

// Main runs root with args and returns the exit status. SIGINT and SIGTERM
// cancel the context the commands run with (a second signal kills the
// process as usual). An error is printed as one line on root's stderr:
// "evalbox: <code>: <message>".
func Main(ctx context.Context, root *cobra.Command, args []string) int {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	context.AfterFunc(ctx, stop)

	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	code, msg := exitStatus(err)
	if msg != "" {
		fmt.Fprintf(root.ErrOrStderr(), "evalbox: %s\n", oneLine(msg))
	}
	return code
}

// exitError ends the command with a given status; msg (optional) is
// printed.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// usageError is a bad command line.
type usageError struct {
	err error
	cmd string // command path, for the hint
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usagef(cmd *cobra.Command, format string, a ...any) error {
	return &usageError{err: fmt.Errorf(format, a...), cmd: cmd.CommandPath()}
}

// exitStatus maps a command's error to its exit status and message.
func exitStatus(err error) (int, string) {
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code, ee.msg
	}
	var ue *usageError
	if errors.As(err, &ue) {
		return ExitUsage, fmt.Sprintf("%v (see '%s --help')", ue.err, ue.cmd)
	}
	if errors.Is(err, context.Canceled) {
		return exitInterrupted, "interrupted"
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		return ExitError, fmt.Sprintf("cannot reach the evalbox API (is `evalbox serve` running? see --api-url): %v",
			strings.TrimPrefix(err.Error(), "evalbox: "))
	}
	return ExitError, strings.TrimPrefix(err.Error(), "evalbox: ")
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// app holds the global flags shared by the API commands.
type app struct {
	apiURL string
	apiKey string
}

// client returns an API client from the flags, falling back to the
// environment.
func (a *app) client() *client.Client {
	u, k := a.apiURL, a.apiKey
	if u == "" {
		u = os.Getenv(client.EnvAPIURL)
	}
	if k == "" {
		k = os.Getenv(client.EnvAPIKey)
	}
	return client.New(u, k, client.WithUserAgent("evalbox-cli/"+Version))
}

// NewRoot returns the evalbox command tree.
func NewRoot() *cobra.Command {
	a := &app{}
	root := &cobra.Command{
		Use:   "evalbox",
		Short: "Self-hosted sandboxes for LLM evaluation and RL",
		Long: `evalbox runs untrusted code in isolated sandboxes for evaluation and RL.

The API commands talk to the server at --api-url (default $` + client.EnvAPIURL + `, else ` + client.DefaultBaseURL + `)
with the key --api-key (default $` + client.EnvAPIKey + `).

` + exitStatusHelp,
		Version:       Version,
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	groupCommand(root)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return &usageError{err: err, cmd: c.CommandPath()}
	})
	pf := root.PersistentFlags()
	pf.StringVar(&a.apiURL, "api-url", "", "API address (default $"+client.EnvAPIURL+", else "+client.DefaultBaseURL+")")
	pf.StringVar(&a.apiKey, "api-key", "", "API key (default $"+client.EnvAPIKey+")")

	root.AddCommand(
		newServeCmd(),
		newNodeCmd(),
		newSandboxCmd(a),
		newSnapshotCmd(a),
		newKeysCmd(a),
		newSecretsCmd(a),
		newTariffsCmd(a),
		newUsageCmd(a),
		newBalanceCmd(a),
		newTeamsCmd(a),
		newAuditCmd(a),
		newTemplateCmd(a),
		newEvalCmd(a),
		newShardCmd(a),
		newHealthCmd(a),
		newLimitsCmd(),
	)
	return root
}

// groupCommand makes c (a command that only holds subcommands) print its
// help when run alone and fail with a usage error on an unknown subcommand.
func groupCommand(c *cobra.Command) *cobra.Command {
	c.Args = func(cmd *cobra.Command, args []string) error {
		if len(args) > 0 {
			return usagef(cmd, "unknown command %q for %q", args[0], cmd.CommandPath())
		}
		return nil
	}
	c.RunE = func(cmd *cobra.Command, _ []string) error {
		return cmd.Help()
	}
	return c
}

// args wraps a cobra positional-argument check so that its failure is a
// usage error.
func args(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error {
		if err := check(cmd, a); err != nil {
			return &usageError{err: err, cmd: cmd.CommandPath()}
		}
		return nil
	}
}

// out is the command's standard output.
func out(cmd *cobra.Command) io.Writer { return cmd.OutOrStdout() }
