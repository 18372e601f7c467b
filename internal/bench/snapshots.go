package bench

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/evalbox/evalbox/pkg/client"
)

type snapshotOpts struct {
	templatesDir string
	template     string
	n            int
	fork         int
	runtimes     []string
}

func snapshotsCommand() *cobra.Command {
	var o snapshotOpts
	cmd := &cobra.Command{
		Use:   "snapshots",
		Short: "Snapshot, restore, fork and pause/resume latencies, disk per snapshot, memory per restored sandbox",
		Long: `Starts evalbox serve (this binary) on a temporary data dir and measures through the
REST API, on each of --runtimes: a cold create (for comparison), a snapshot of a
running sandbox (it goes on), a create from that snapshot, a fork of --fork
sandboxes, and (gVisor: namespaces cannot pause) a pause and a resume of one sandbox
again and again; the disk per snapshot, and the host memory (PSS, RSS) of the
processes of the sandboxes a fork made. The source sandbox runs a Python process
that imported some of the standard library, so that a gVisor image holds a warm
interpreter (a namespaces snapshot holds the files only: its copies boot afresh).
Prints a Markdown table.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runSnapshots(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.templatesDir, "templates-dir", "/var/lib/evalbox/templates", "template directory (built by evalbox template init)")
	f.StringVar(&o.template, "template", "python", "template of the source sandbox")
	f.IntVar(&o.n, "n", 30, "samples per latency")
	f.IntVar(&o.fork, "fork", 8, "sandboxes per fork")
	f.StringSliceVar(&o.runtimes, "runtimes", []string{client.RuntimeGVisor, client.RuntimeNamespaces}, "runtimes to measure")
	return cmd
}

func runSnapshots(ctx context.Context, w io.Writer, o snapshotOpts) error {
	s, err := startServer(ctx, o.templatesDir, "--pids", "256", "--memory-overcommit", "4")
	if err != nil {
		return err
	}
	defer s.stop()
	return runRows(w, "snapshots", o.runtimes, o.n, func(rt string) ([]row, error) { return benchSnapshots(ctx, s, rt, o) })
}

func benchSnapshots(ctx context.Context, s *server, rt string, o snapshotOpts) ([]row, error) {
	c := s.c
	var rows []row
	create := func(req client.CreateSandboxRequest) (*client.Sandbox, time.Duration, error) {
		var sb *client.Sandbox
		d, err := timeIt(func() (err error) {
			sb, err = c.CreateSandbox(ctx, req)
			return err
		})
		return sb, d, err
	}
	var cold sample
	for i := 0; i < o.n; i++ {
		sb, d, err := create(client.CreateSandboxRequest{Template: o.template, Runtime: rt})
		if err != nil {
			return rows, fmt.Errorf("cold create: %w", err)
		}
		cold = append(cold, d)
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			return rows, err
		}
	}
	rows = append(rows, row{rt, "cold create (" + o.template + ")", cold, "for comparison"})

	src, _, err := create(client.CreateSandboxRequest{Template: o.template, Runtime: rt, Timeout: 3600})
	if err != nil {
		return rows, err
	}
	defer c.DeleteSandbox(context.WithoutCancel(ctx), src.ID)
	if _, err := c.StartProcess(ctx, src.ID, client.ExecRequest{
		Cmd: `python3 -c 'import json, re, collections, itertools, math, sys, time; sys.stdout.write("ready\n"); sys.stdout.flush(); time.sleep(86400)'`,
	}); err != nil {
		return rows, err
	}
	var snap, restore sample
	var size int64
	var keep *client.Snapshot
	for i := 0; i < o.n; i++ {
		var sn *client.Snapshot
		d, err := timeIt(func() (err error) {
			sn, err = c.Snapshot(ctx, src.ID)
			return err
		})
		if err != nil {
			return rows, fmt.Errorf("snapshot: %w", err)
		}
		snap = append(snap, d)
		size = sn.SizeBytes
		sb, d, err := create(client.CreateSandboxRequest{Snapshot: sn.ID})
		if err != nil {
			return rows, fmt.Errorf("create from a snapshot: %w", err)
		}
		restore = append(restore, d)
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			return rows, err
		}
		if i == o.n-1 {
			keep = sn
			break
		}
		if err := c.DeleteSnapshot(ctx, sn.ID); err != nil {
			return rows, err
		}
	}
	rows = append(rows, row{rt, "snapshot (the source goes on)", snap, fmt.Sprintf("%.1f kB on disk", float64(size)/1e3)},
		row{rt, "create from a snapshot", restore, restoreNote(rt)})
	defer c.DeleteSnapshot(context.WithoutCancel(ctx), keep.ID)

	// A fork of o.fork, a few times: the wall time of one, and the host
	// memory of what one made.
	var fork sample
	var pss, rss float64
	for i := 0; i < max(3, o.n/10); i++ {
		var res *client.ForkResult
		d, err := timeIt(func() (err error) {
			res, err = c.Fork(ctx, src.ID, client.ForkRequest{Count: o.fork})
			return err
		})
		if err != nil {
			return rows, fmt.Errorf("fork: %w", err)
		}
		fork = append(fork, d)
		ids := make([]string, 0, len(res.Sandboxes))
		for _, sb := range res.Sandboxes {
			ids = append(ids, sb.ID)
		}
		if i == 0 {
			pss, rss = memoryOf(ids)
		}
		for _, id := range ids {
			if err := c.DeleteSandbox(ctx, id); err != nil {
				return rows, err
			}
		}
	}
	rows = append(rows, row{rt, fmt.Sprintf("fork of %d (wall)", o.fork), fork,
		fmt.Sprintf("host memory per fork: PSS %.1f MiB, RSS %.1f MiB", pss/float64(o.fork)/(1<<20), rss/float64(o.fork)/(1<<20))})

	if rt != client.RuntimeGVisor {
		return rows, nil // no checkpoint: no pause
	}
	var pause, resume sample
	for i := 0; i < o.n; i++ {
		d, err := timeIt(func() error { _, err := c.Pause(ctx, src.ID); return err })
		if err != nil {
			return rows, fmt.Errorf("pause: %w", err)
		}
		pause = append(pause, d)
		d, err = timeIt(func() error { _, err := c.Resume(ctx, src.ID, client.ResumeRequest{}); return err })
		if err != nil {
			return rows, fmt.Errorf("resume: %w", err)
		}
		resume = append(resume, d)
	}
	if _, err := c.Exec(ctx, src.ID, client.ExecRequest{Cmd: "true"}); err != nil {
		return rows, fmt.Errorf("exec after the resumes: %w", err)
	}
	rows = append(rows, row{rt, "pause", pause, "memory to disk, host processes gone"}, row{rt, "resume", resume, "the same sandbox, again and again"})
	return rows, nil
}

func restoreNote(rt string) string {
	if rt == client.RuntimeGVisor {
		return "to an answering agent, processes restored"
	}
	return "to an answering agent, booted afresh on the files"
}
