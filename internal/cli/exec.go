package cli

import (
	"fmt"
	"io"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
	"github.com/spf13/cobra"
)

func newSandboxExecCmd(a *app) *cobra.Command {
	var (
		req           client.ExecRequest
		timeout       seconds
		env           []string
		stdin, asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "exec [flags] ID (-- COMMAND [ARG...] | --cmd 'SHELL COMMAND')",
		Short: "Run a command in a sandbox",
		Long: `Run a command in a sandbox and wait for it.

Its stdout and stderr are streamed to the CLI's stdout and stderr as they come,
and the CLI exits with the command's exit status: 124 when it timed out
(--timeout; the whole process tree is killed), 128+N when it was killed by
signal N. Ctrl-C closes the stream, which kills the command.

Put -- before the command when it has flags of its own. --cmd runs a shell
command line (/bin/sh -c). --stdin sends the CLI's stdin (read whole first).
With --json the output is buffered and the ExecResult printed as JSON; the
CLI then exits 0 whatever the command's status.`,
		Example: `  evalbox sandbox exec sb-1 -- python3 -c 'print(1)'
  evalbox sandbox exec --timeout 5 sb-1 --cmd 'pytest -q | tail -1'
  echo hi | evalbox sandbox exec --stdin sb-1 -- cat`,
		Args: args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			id := argv[0]
			req.Argv = argv[1:]
			if (req.Cmd == "") == (len(req.Argv) == 0) {
				return usagef(cmd, "give a command after the sandbox id (ID -- COMMAND…) or --cmd, not both")
			}
			var err error
			if req.Env, err = parseKV(cmd, "env", env); err != nil {
				return err
			}
			req.Timeout = time.Duration(timeout).Seconds()
			if stdin {
				b, err := io.ReadAll(cmd.InOrStdin())
				if err != nil {
					return fmt.Errorf("reading stdin: %w", err)
				}
				s := string(b)
				req.Stdin = &s
			}
			c := a.client()
			if asJSON {
				res, err := c.Exec(cmd.Context(), id, req)
				if err != nil {
					return err
				}
				return printJSON(out(cmd), res)
			}
			res, err := c.ExecStream(cmd.Context(), id, req, out(cmd), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if res.StdoutTruncated {
				fmt.Fprintln(cmd.ErrOrStderr(), "evalbox: warning: stdout was truncated at the server's output cap")
			}
			if res.StderrTruncated {
				fmt.Fprintln(cmd.ErrOrStderr(), "evalbox: warning: stderr was truncated at the server's output cap")
			}
			return execExit(res, time.Duration(timeout))
		},
	}
	f := cmd.Flags()
	f.StringVarP(&req.Cmd, "cmd", "c", "", "run this shell command line (/bin/sh -c) instead of an argv")
	f.Var(&timeout, "timeout", "kill the command's tree after this long (seconds or a duration; default none)")
	f.StringVarP(&req.Cwd, "cwd", "w", "", "working directory (default: the template's)")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	f.StringVarP(&req.User, "user", "u", "", "user name or uid (default: the template's)")
	f.BoolVarP(&stdin, "stdin", "i", false, "send the CLI's stdin to the command")
	f.Int64Var(&req.MaxOutputBytes, "max-output-bytes", 0, "cap on stdout and on stderr, each (default: the server's)")
	f.BoolVar(&asJSON, "json", false, "buffer the output and print the ExecResult as JSON")
	return cmd
}

// execExit turns a command's result into the CLI's exit status.
func execExit(res *client.ExecResult, timeout time.Duration) error {
	switch res.Status {
	case client.StatusExited:
		if res.ExitCode == 0 {
			return nil
		}
		return &exitError{code: res.ExitCode}
	case client.StatusTimedOut:
		msg := "command timed out"
		if timeout > 0 {
			msg += " after " + timeout.String()
		}
		return &exitError{code: ExitTimedOut, msg: msg}
	case client.StatusKilled:
		sig := res.Signal
		if sig <= 0 {
			sig = 9
		}
		return &exitError{code: exitSignalBase + sig, msg: fmt.Sprintf("command killed by signal %d", sig)}
	case client.StatusError:
		return &exitError{code: ExitError, msg: "exec failed: " + res.Error}
	}
	return &exitError{code: ExitError, msg: fmt.Sprintf("command ended with unexpected status %q", res.Status)}
}
