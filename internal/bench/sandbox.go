package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/evalbox/evalbox/pkg/client"
)

type sandboxOpts struct {
	runtimes     []string
	templatesDir string
	n            int
	pool         int
	idle         int
	bigMB        int
}

func sandboxCommand() *cobra.Command {
	var o sandboxOpts
	cmd := &cobra.Command{
		Use:   "sandbox",
		Short: "Sandbox lifecycle latencies, exec round trip, file transfer and idle memory, per runtime",
		Long: `Starts evalbox serve (this binary) on a temporary data dir with a warm pool per
runtime, then measures through the REST API, one runtime after the other:
cold create, pool claim, delete, exec of true, 1 MB and 100 MB upload and download,
and host memory per idle sandbox (PSS and RSS of its processes). Prints a
Markdown table.

Its server runs sandboxes with --pids 256 and --memory-overcommit 4, so that
the pools and --idle sandboxes fit the host's capacity together (on a host
whose kernel.pid_max is 32768, about 50 such gVisor sandboxes fit).`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runSandbox(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.runtimes, "runtimes", []string{client.RuntimeGVisor, client.RuntimeNamespaces}, "runtimes to measure")
	f.StringVar(&o.templatesDir, "templates-dir", "/var/lib/evalbox/templates", "template directory (built by evalbox template init)")
	f.IntVar(&o.n, "n", 100, "samples per latency")
	f.IntVar(&o.pool, "pool", 8, "warm pool size per runtime")
	f.IntVar(&o.idle, "idle", 20, "idle sandboxes for the memory measurement")
	f.IntVar(&o.bigMB, "big-mb", 100, "size of the large transfer in MB")
	return cmd
}

type row struct {
	runtime, metric string
	s               sample
	extra           string
}

// runRows measures each runtime with bench and prints the rows as a
// Markdown table under a title line (bench name, host, date, n).
func runRows(w io.Writer, name string, runtimes []string, n int, bench func(rt string) ([]row, error)) error {
	var rows []row
	for _, rt := range runtimes {
		r, err := bench(rt)
		rows = append(rows, r...)
		if err != nil {
			return fmt.Errorf("%s: %w", rt, err)
		}
	}
	host, _ := os.Hostname()
	fmt.Fprintf(w, "evalbox bench %s — %s, %d cores, %s, n=%d\n\n", name, host, runtime.NumCPU(), time.Now().UTC().Format("2006-01-02"), n)
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "| runtime\t| metric\t| n\t| p50 ms\t| p99 ms\t| note\t|")
	fmt.Fprintln(tw, "|---\t|---\t|---\t|---\t|---\t|---\t|")
	for _, r := range rows {
		p50, p99 := "", ""
		if len(r.s) > 0 {
			p50, p99 = ms(r.s.pct(50)), ms(r.s.pct(99))
		}
		fmt.Fprintf(tw, "| %s\t| %s\t| %d\t| %s\t| %s\t| %s\t|\n", r.runtime, r.metric, len(r.s), p50, p99, r.extra)
	}
	return tw.Flush()
}

func runSandbox(ctx context.Context, w io.Writer, o sandboxOpts) error {
	var pools []string
	for _, rt := range o.runtimes {
		pools = append(pools, fmt.Sprintf("base:%s=%d", rt, o.pool))
	}
	// Every pooled, running and idle sandbox reserves its pids and memory
	// limits from the host's budget: the idle-memory measurement holds a
	// pool of each runtime and --idle sandboxes at once. Sized as an
	// operator sizes a dense host: sandboxes that run `true` need few pids,
	// and idle ones use a fraction of their memory limits.
	s, err := startServer(ctx, o.templatesDir, "--pool", strings.Join(pools, ","), "--pids", "256", "--memory-overcommit", "4")
	if err != nil {
		return err
	}
	defer s.stop()
	return runRows(w, "sandbox", o.runtimes, o.n, func(rt string) ([]row, error) { return benchRuntime(ctx, s, rt, o) })
}

func benchRuntime(ctx context.Context, s *server, rt string, o sandboxOpts) ([]row, error) {
	c := s.c
	var rows []row
	// Cold create: a shape no pool holds.
	var cold, del sample
	for i := 0; i < o.n; i++ {
		var sb *client.Sandbox
		d, err := timeIt(func() (err error) {
			sb, err = c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: rt, MemoryMB: 256})
			return err
		})
		if err != nil {
			return rows, fmt.Errorf("cold create: %w", err)
		}
		cold = append(cold, d)
		d, err = timeIt(func() error { return c.DeleteSandbox(ctx, sb.ID) })
		if err != nil {
			return rows, fmt.Errorf("delete: %w", err)
		}
		del = append(del, d)
	}
	rows = append(rows, row{rt, "cold create", cold, ""}, row{rt, "delete", del, ""})

	// Pool claim: wait for a full pool, claim it empty, repeat.
	var claim sample
	for len(claim) < o.n {
		if err := waitPool(ctx, c, rt, o.pool); err != nil {
			return rows, err
		}
		var ids []string
		for i := 0; i < o.pool && len(claim) < o.n; i++ {
			var sb *client.Sandbox
			d, err := timeIt(func() (err error) {
				sb, err = c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: rt})
				return err
			})
			if err != nil {
				return rows, fmt.Errorf("claim: %w", err)
			}
			ids = append(ids, sb.ID)
			if sb.FromPool {
				claim = append(claim, d)
			}
		}
		for _, id := range ids {
			if err := c.DeleteSandbox(ctx, id); err != nil {
				return rows, err
			}
		}
	}
	rows = append(rows, row{rt, "pool claim (create from warm pool)", claim, ""})

	// Exec and files on one sandbox.
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: rt, DiskMB: 4 * o.bigMB})
	if err != nil {
		return rows, err
	}
	defer func() { _ = c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID) }()
	var execs sample
	for i := 0; i < o.n+5; i++ {
		var res *client.ExecResult
		d, err := timeIt(func() (err error) {
			res, err = c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"true"}})
			return err
		})
		if err != nil || res.ExitCode != 0 {
			return rows, fmt.Errorf("exec true: %v %+v", err, res)
		}
		if i >= 5 {
			execs = append(execs, d)
		}
	}
	rows = append(rows, row{rt, "exec `true` round trip", execs, ""})
	for _, size := range []int{1 << 20, o.bigMB << 20} {
		n := o.n / 5
		if size > 1<<20 {
			n = 3
		}
		up, down, err := transfer(ctx, c, sb.ID, size, n)
		if err != nil {
			return rows, err
		}
		label := fmt.Sprintf("%d MB", size>>20)
		rows = append(rows,
			row{rt, "upload " + label, up, mbps(size, up)},
			row{rt, "download " + label, down, mbps(size, down)})
	}

	// Idle memory.
	var ids []string
	for i := 0; i < o.idle; i++ {
		sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: rt, MemoryMB: 256})
		if err != nil {
			return rows, err
		}
		ids = append(ids, sb.ID)
	}
	time.Sleep(2 * time.Second)
	pss, rss := memoryOf(ids)
	for _, id := range ids {
		_ = c.DeleteSandbox(ctx, id)
	}
	rows = append(rows, row{rt, "idle memory per sandbox", nil,
		fmt.Sprintf("PSS %.1f MiB, RSS %.1f MiB (%d idle sandboxes)", pss/float64(len(ids))/(1<<20), rss/float64(len(ids))/(1<<20), len(ids))})
	return rows, nil
}

func waitPool(ctx context.Context, c *client.Client, rt string, target int) error {
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		pools, err := c.ListPools(ctx)
		if err != nil {
			return err
		}
		for _, p := range pools {
			if p.Template == "base" && p.Runtime == rt && p.Ready >= target {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("pool base:%s did not fill", rt)
}

func transfer(ctx context.Context, c *client.Client, id string, size, n int) (up, down sample, err error) {
	for i := 0; i < n; i++ {
		d, err := timeIt(func() error {
			_, err := c.WriteFile(ctx, id, "/work/blob", &zeroReader{n: int64(size)}, int64(size), 0o644)
			return err
		})
		if err != nil {
			return nil, nil, fmt.Errorf("upload: %w", err)
		}
		up = append(up, d)
		d, err = timeIt(func() error {
			rc, _, err := c.ReadFile(ctx, id, "/work/blob")
			if err != nil {
				return err
			}
			defer rc.Close()
			got, err := io.Copy(io.Discard, rc)
			if err == nil && got != int64(size) {
				err = fmt.Errorf("read %d of %d bytes", got, size)
			}
			return err
		})
		if err != nil {
			return nil, nil, fmt.Errorf("download: %w", err)
		}
		down = append(down, d)
	}
	return up, down, nil
}

func mbps(size int, s sample) string {
	return fmt.Sprintf("%.0f MB/s at p50", float64(size)/1e6/s.pct(50).Seconds())
}

// memoryOf sums PSS and RSS of the host processes of sandboxes ids (found
// by the cgroup they are in).
func memoryOf(ids []string) (pss, rss float64) {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		cg, err := os.ReadFile(filepath.Join(p, "cgroup"))
		if err != nil {
			continue
		}
		for _, id := range ids {
			if strings.Contains(string(cg), "/"+id+"\n") || strings.Contains(string(cg), "/"+id+"/") {
				ps, rs := smapsRollup(filepath.Join(p, "smaps_rollup"))
				pss += ps
				rss += rs
				break
			}
		}
	}
	return pss, rss
}

func smapsRollup(path string) (pss, rss float64) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "Pss:":
			pss = v * 1024
		case "Rss:":
			rss = v * 1024
		}
	}
	return pss, rss
}
