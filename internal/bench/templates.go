package bench

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/evalbox/evalbox/internal/template"
	"github.com/evalbox/evalbox/pkg/client"
)

type templatesOpts struct {
	runtimes     []string
	templatesDir string
	mirror       string
	cold         bool
	n            int
	bigMB        int
	perSandbox   int
}

func templatesCommand() *cobra.Command {
	var o templatesOpts
	cmd := &cobra.Command{
		Use:   "templates",
		Short: "Template builds (cold and cached), sizes, per-sandbox disk overhead, create latency vs template size",
		Long: `Measures templates, as a user would, through the REST API of its own evalbox serve:

  - with --cold, a cold build of each built-in (base, python, node) from the
    Debian mirror into a fresh template directory (minutes), its size, and
    the cached rebuild (the spec did not change);
  - a build spec (a run step and a copy step) built cold, then rebuilt with
    every layer cached, then with only its last step changed;
  - a template of --big-mb MB (a copy step of that much data), built from
    a generated build context;
  - cold create latency of sandboxes of base and of the big template, per
    runtime (it must not grow with the template's size: the root filesystem
    is shared read-only, each sandbox writes to its own memory-backed layer);
  - the host disk each sandbox of the big template takes (filesystem usage
    before and after starting --per-sandbox of them).

Prints a Markdown table.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runTemplates(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), o)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.runtimes, "runtimes", []string{client.RuntimeGVisor, client.RuntimeNamespaces}, "runtimes to measure")
	f.StringVar(&o.templatesDir, "templates-dir", "/var/lib/evalbox/templates", "template directory with the built-ins (without --cold)")
	f.StringVar(&o.mirror, "mirror", os.Getenv("EVALBOX_DEBIAN_MIRROR"), "Debian mirror for --cold (default: the host's apt sources)")
	f.BoolVar(&o.cold, "cold", false, "build the built-ins from scratch into a temporary directory first (minutes)")
	f.IntVar(&o.n, "n", 20, "samples per create latency")
	f.IntVar(&o.bigMB, "big-mb", 1024, "size of the big template's data in MB")
	f.IntVar(&o.perSandbox, "per-sandbox", 20, "sandboxes of the big template for the disk overhead")
	return cmd
}

// trow is one line of the templates table.
type trow struct {
	what, runtime string
	s             sample
	value, note   string
}

func runTemplates(ctx context.Context, w, progress io.Writer, o templatesOpts) error {
	var rows []trow
	logf := func(format string, a ...any) { fmt.Fprintf(progress, "bench: "+format+"\n", a...) }
	dir := o.templatesDir
	if o.cold {
		tmp, err := os.MkdirTemp("", "evalbox-bench-templates-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
		reg, err := template.Open(dir, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			return err
		}
		for _, name := range template.BuiltinNames() {
			logf("cold build of %s", name)
			var t *template.Template
			d, err := timeIt(func() (err error) { t, err = reg.EnsureBuiltin(ctx, name, o.mirror, nil); return err })
			if err != nil {
				return err
			}
			rows = append(rows, trow{what: "built-in " + name + ": cold build (mmdebstrap)", s: sample{d}, value: humanMB(t.SizeBytes)})
			d, err = timeIt(func() error { _, err := reg.EnsureBuiltin(ctx, name, o.mirror, nil); return err })
			if err != nil {
				return err
			}
			rows = append(rows, trow{what: "built-in " + name + ": cached rebuild (same spec)", s: sample{d}})
		}
	}
	s, err := startServer(ctx, dir)
	if err != nil {
		return err
	}
	defer s.stop()
	c := s.c
	if !o.cold {
		list, err := c.ListTemplates(ctx)
		if err != nil {
			return err
		}
		for _, t := range list {
			rows = append(rows, trow{what: "built-in " + t.Name + ": size", value: humanMB(t.SizeBytes)})
		}
	}

	// A build spec: cold, all cached, last step changed.
	ctxDir, err := os.MkdirTemp("", "evalbox-bench-context-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(ctxDir)
	if err := writeFiles(filepath.Join(ctxDir, "small"), 100, 10<<10); err != nil {
		return err
	}
	spec := func(last string) client.TemplateSpec {
		return client.TemplateSpec{From: "python", Network: client.NetworkNone, Steps: []client.TemplateStep{
			{Run: "python3 -m venv /opt/venv && /opt/venv/bin/python -c 'import sys; print(sys.version)'"},
			{Copy: &client.CopyStep{Src: "small", Dst: "/opt/data"}},
			{Env: map[string]string{"PATH": "/opt/venv/bin:/usr/local/bin:/usr/bin:/bin"}},
			{Run: last},
		}}
	}
	for _, b := range []struct {
		what, name, last string
	}{
		{"build spec (2 run + 1 copy steps): cold", "spec-a", "echo one > /opt/marker"},
		{"build spec: rebuild, every layer cached", "spec-b", "echo one > /opt/marker"},
		{"build spec: rebuild, last step changed", "spec-c", "echo two > /opt/marker"},
	} {
		logf("%s", b.what)
		var end *client.TemplateBuild
		d, err := timeIt(func() (err error) {
			end, err = buildWait(ctx, c, b.name, spec(b.last), ctxDir, "small")
			return err
		})
		if err != nil {
			return err
		}
		rows = append(rows, trow{what: b.what, s: sample{d}, note: fmt.Sprintf("%d cached, %d built", end.CachedSteps, end.BuiltSteps)})
	}

	// The big template.
	logf("writing a %d MB build context", o.bigMB)
	if err := writeFiles(filepath.Join(ctxDir, "big"), o.bigMB, 1<<20); err != nil {
		return err
	}
	logf("building the big template")
	d, err := timeIt(func() error {
		_, err := buildWait(ctx, c, "big", client.TemplateSpec{From: "base", Steps: []client.TemplateStep{
			{Copy: &client.CopyStep{Src: "big", Dst: "/big"}}}}, ctxDir, "big")
		return err
	})
	if err != nil {
		return err
	}
	big, err := c.GetTemplate(ctx, "big")
	if err != nil {
		return err
	}
	rows = append(rows, trow{what: fmt.Sprintf("big template (base + %d MB copy step): build incl. upload", o.bigMB), s: sample{d}, value: humanMB(big.SizeBytes)})

	for _, rt := range o.runtimes {
		for _, tpl := range []string{"base", "big"} {
			logf("create latency: %s on %s", tpl, rt)
			var lat sample
			for i := 0; i < o.n+2; i++ {
				var sb *client.Sandbox
				d, err := timeIt(func() (err error) {
					sb, err = c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: tpl, Runtime: rt, MemoryMB: 256})
					return err
				})
				if err != nil {
					return fmt.Errorf("create %s on %s: %w", tpl, rt, err)
				}
				if i >= 2 {
					lat = append(lat, d)
				}
				if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
					return err
				}
			}
			rows = append(rows, trow{what: "cold create from " + tpl, runtime: rt, s: lat})
		}
		logf("disk per sandbox: %d sandboxes of big on %s", o.perSandbox, rt)
		before, err := fsUsed(s.dataDir)
		if err != nil {
			return err
		}
		var ids []string
		for i := 0; i < o.perSandbox; i++ {
			sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "big", Runtime: rt, MemoryMB: 256})
			if err != nil {
				return err
			}
			ids = append(ids, sb.ID)
		}
		after, err := fsUsed(s.dataDir)
		if err != nil {
			return err
		}
		var state int64
		for _, id := range ids {
			n, _ := duBytes(filepath.Join(s.dataDir, "sandboxes", id))
			state += n
		}
		for _, id := range ids {
			if err := c.DeleteSandbox(ctx, id); err != nil {
				return err
			}
		}
		rows = append(rows, trow{what: "host disk per sandbox of the big template", runtime: rt,
			value: fmt.Sprintf("%.1f KiB", float64(after-before)/float64(len(ids))/1024),
			note:  fmt.Sprintf("filesystem delta over %d sandboxes; state dir %.1f KiB each; writes go to a memory-backed layer capped by disk_mb", len(ids), float64(state)/float64(len(ids))/1024)})
	}
	list, err := c.ListTemplatesUsage(ctx)
	if err != nil {
		return err
	}
	rows = append(rows, trow{what: "template store on disk (all of the above)", value: humanMB(list.DiskUsageBytes), note: "hard links shared between layers and templates counted once"})

	host, _ := os.Hostname()
	fmt.Fprintf(w, "evalbox bench templates — %s, %d cores, %s, n=%d\n\n", host, runtime.NumCPU(), time.Now().UTC().Format("2006-01-02"), o.n)
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "| what\t| runtime\t| n\t| p50 ms\t| p99 ms\t| size\t| note\t|")
	fmt.Fprintln(tw, "|---\t|---\t|---\t|---\t|---\t|---\t|---\t|")
	for _, r := range rows {
		p50, p99 := "", ""
		if len(r.s) > 0 {
			p50, p99 = ms(r.s.pct(50)), ms(r.s.pct(99))
		}
		n := ""
		if len(r.s) > 0 {
			n = fmt.Sprint(len(r.s))
		}
		fmt.Fprintf(tw, "| %s\t| %s\t| %s\t| %s\t| %s\t| %s\t| %s\t|\n", r.what, r.runtime, n, p50, p99, r.value, r.note)
	}
	return tw.Flush()
}

// buildWait builds spec as name with the context paths of ctxDir and
// waits for the end; a failed build is an error.
func buildWait(ctx context.Context, c *client.Client, name string, spec client.TemplateSpec, ctxDir string, paths ...string) (*client.TemplateBuild, error) {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(tarFiles(pw, ctxDir, paths)) }()
	b, err := c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: name, Spec: spec}, pr)
	pr.Close()
	if err != nil {
		return nil, err
	}
	end, err := c.FollowBuild(ctx, name, b.ID, nil)
	if err != nil {
		return nil, err
	}
	if end.State != client.BuildStateSucceeded {
		return nil, fmt.Errorf("build %s failed: %s", name, end.Error)
	}
	return end, nil
}

// writeFiles writes n files of size random bytes into dir.
func writeFiles(dir string, n, size int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	buf := make([]byte, size)
	for i := 0; i < n; i++ {
		if _, err := rand.Read(buf); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%05d", i)), buf, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// tarFiles writes the directories paths of root (flat directories of
// regular files) as a tar archive.
func tarFiles(w io.Writer, root string, paths []string) error {
	tw := tar.NewWriter(w)
	for _, p := range paths {
		entries, err := os.ReadDir(filepath.Join(root, p))
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Name: p + "/", Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
			return err
		}
		for _, e := range entries {
			f, err := os.Open(filepath.Join(root, p, e.Name()))
			if err != nil {
				return err
			}
			fi, err := f.Stat()
			if err == nil {
				err = tw.WriteHeader(&tar.Header{Name: p + "/" + e.Name(), Typeflag: tar.TypeReg, Mode: 0o644, Size: fi.Size(), ModTime: fi.ModTime()})
			}
			if err == nil {
				_, err = io.Copy(tw, f)
			}
			f.Close()
			if err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

// fsUsed is the used bytes of the filesystem holding path.
func fsUsed(path string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, err
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize, nil
}

// duBytes is the disk a directory tree takes.
func duBytes(root string) (int64, error) {
	var n int64
	err := filepath.Walk(root, func(_ string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			n += st.Blocks * 512
		}
		return nil
	})
	return n, err
}

func humanMB(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
