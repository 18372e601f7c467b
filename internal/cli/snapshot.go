package cli

import (
	"fmt"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
	"github.com/spf13/cobra"
)

// Snapshots, forks, pause and resume: `sandbox snapshot|fork|pause|resume`
// and the `snapshot` group (list, get, rm).

func newSandboxSnapshotCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "snapshot ID",
		Short: "Snapshot a running sandbox and print the snapshot's id",
		Long: `Snapshot a running sandbox (gVisor: its files, memory and processes) and print
the snapshot's id. The sandbox goes on. Create sandboxes from it with
"sandbox create --snapshot SNAPSHOT".`,
		Example: `  snap=$(evalbox sandbox snapshot "$id")
  evalbox sandbox create --snapshot "$snap"`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			sn, err := a.client().Snapshot(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(out(cmd), sn)
			}
			_, err = fmt.Fprintln(out(cmd), sn.ID)
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the snapshot as JSON")
	return cmd
}

func newSandboxForkCmd(a *app) *cobra.Command {
	var (
		req           client.ForkRequest
		timeout, wait seconds
		md            []string
		asJSON        bool
	)
	cmd := &cobra.Command{
		Use:   "fork ID",
		Short: "Make copies of a running sandbox and print their ids",
		Long: `Snapshot a running sandbox once and make -n sandboxes from it, each independent
of it and of the others; print their ids, one a line. All or none: when one
fails, the others are deleted. The snapshot is deleted after, unless
--keep-snapshot.`,
		Example: `  evalbox sandbox fork "$id" -n 8 --metadata run=r1`,
		Args:    args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			var err error
			if req.Metadata, err = parseKV(cmd, "metadata", md); err != nil {
				return err
			}
			if req.Count < 1 || req.Count > client.MaxForkCount {
				return usagef(cmd, "-n %d: want 1 to %d", req.Count, client.MaxForkCount)
			}
			req.Timeout = wholeSeconds(time.Duration(timeout))
			req.WaitSeconds = wholeSeconds(time.Duration(wait))
			res, err := a.client().Fork(cmd.Context(), argv[0], req)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(out(cmd), res)
			}
			for _, sb := range res.Sandboxes {
				if _, err := fmt.Fprintln(out(cmd), sb.ID); err != nil {
					return err
				}
			}
			if res.Snapshot != nil {
				_, err = fmt.Fprintf(cmd.ErrOrStderr(), "snapshot %s kept\n", res.Snapshot.ID)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.IntVarP(&req.Count, "count", "n", 1, fmt.Sprintf("how many sandboxes to make (1 to %d)", client.MaxForkCount))
	f.Var(&timeout, "timeout", "TTL of each in seconds or as a duration (default: the server's)")
	f.StringArrayVarP(&md, "metadata", "m", nil, "metadata KEY=VALUE of each (repeatable)")
	f.BoolVar(&req.KeepSnapshot, "keep-snapshot", false, "keep the snapshot the fork takes")
	f.Var(&wait, "wait", "queue each up to this long when the team is at its limit or the host has no room")
	f.BoolVar(&asJSON, "json", false, "print the sandboxes as JSON")
	return cmd
}

func newSandboxPauseCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "pause ID",
		Short: "Pause a running sandbox (its memory and processes go to disk)",
		Long: `Pause a running sandbox: its memory and processes go to disk and it takes no
CPU or memory until "sandbox resume". It keeps its TTL.`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			sb, err := a.client().Pause(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(out(cmd), sb)
			}
			_, err = fmt.Fprintf(out(cmd), "%s paused\n", sb.ID)
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the sandbox as JSON")
	return cmd
}

func newSandboxResumeCmd(a *app) *cobra.Command {
	var (
		wait   seconds
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "resume ID",
		Short: "Resume a paused sandbox",
		Args:  args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			sb, err := a.client().Resume(cmd.Context(), argv[0], client.ResumeRequest{WaitSeconds: wholeSeconds(time.Duration(wait))})
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(out(cmd), sb)
			}
			_, err = fmt.Fprintf(out(cmd), "%s running\n", sb.ID)
			return err
		},
	}
	cmd.Flags().Var(&wait, "wait", "wait up to this long for host capacity")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the sandbox as JSON")
	return cmd
}

func newSnapshotCmd(a *app) *cobra.Command {
	cmd := groupCommand(&cobra.Command{
		Use:   "snapshot",
		Short: "List and delete snapshots (take one with: sandbox snapshot ID)",
	})
	cmd.AddCommand(newSnapshotListCmd(a), newSnapshotGetCmd(a), newSnapshotRmCmd(a))
	return cmd
}

func newSnapshotListCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the team's snapshots, newest first",
		Args:    args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := a.client().ListSnapshots(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				if l == nil {
					l = []client.Snapshot{}
				}
				return printJSON(out(cmd), client.SnapshotList{Snapshots: l})
			}
			t := newTable(out(cmd), "ID", "SANDBOX", "TEMPLATE", "RUNTIME", "MEMORY", "SIZE", "CREATED")
			for _, sn := range l {
				t.row(sn.ID, sn.SandboxID, sn.Template, sn.Runtime, fmt.Sprint(sn.Memory), humanBytes(sn.SizeBytes), timeCell(sn.CreatedAt))
			}
			return t.flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the list as JSON")
	return cmd
}

func newSnapshotGetCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "get ID",
		Short: "Print a snapshot as JSON",
		Args:  args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			sn, err := a.client().GetSnapshot(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			return printJSON(out(cmd), sn)
		},
	}
	return cmd
}

func newSnapshotRmCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "rm ID...",
		Aliases: []string{"delete"},
		Short:   "Delete snapshots (sandboxes restored from them go on)",
		Args:    args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			for _, id := range argv {
				if err := a.client().DeleteSnapshot(cmd.Context(), id); err != nil {
					return err
				}
			}
			return nil
		},
	}
}
