// Package bench holds `evalbox bench`: benchmarks that start their own
// `evalbox serve` (this binary) on a temporary data dir and measure it
// through the REST API, as a user would, side by side for each runtime.
package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/evalbox/evalbox/pkg/client"
)

// Command returns the `evalbox bench` command tree.
func Command() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmark evalbox on this machine (starts its own server)",
	}
	cmd.AddCommand(sandboxCommand(), templatesCommand(), humanevalCommand(), soakCommand(), networkCommand(), snapshotsCommand(), judgeCommand())
	return cmd
}

// server is a `evalbox serve` subprocess on a temporary data dir.
type server struct {
	cmd     *exec.Cmd
	dataDir string
	c       *client.Client
	exited  chan error
}

func startServer(ctx context.Context, templatesDir string, extra ...string) (*server, error) {
	dir, err := os.MkdirTemp("", "evalbox-bench-")
	if err != nil {
		return nil, err
	}
	s, err := startServerIn(ctx, dir, templatesDir, extra...)
	if err != nil {
		_ = os.RemoveAll(dir)
	}
	return s, err
}

// startServerIn starts a server on data dir dir (a restart when it holds
// an earlier server's state).
func startServerIn(ctx context.Context, dir, templatesDir string, extra ...string) (*server, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	logf, err := os.OpenFile(filepath.Join(dir, "serve.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	args := append([]string{"serve", "--data-dir", dir, "--listen", addr, "--templates-dir", templatesDir,
		"--max-sandboxes", "1000", "--max-execs", "1000"}, extra...)
	s := &server{cmd: exec.Command(exe, args...), dataDir: dir, exited: make(chan error, 1)}
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { s.exited <- s.cmd.Wait() }()
	for {
		select {
		case err := <-s.exited:
			b, _ := os.ReadFile(filepath.Join(dir, "serve.log"))
			return nil, fmt.Errorf("server exited (%v): %s", err, lastLines(string(b), 5))
		case <-ctx.Done():
			s.shutdown()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		key, err := os.ReadFile(filepath.Join(dir, "admin.key"))
		if err != nil || len(key) == 0 {
			continue
		}
		c := client.New("http://"+addr, strings.TrimSpace(string(key)))
		if _, err := c.Health(ctx); err == nil {
			s.c = c
			return s, nil
		}
	}
}

// stop shuts the server down and removes its data dir.
func (s *server) stop() {
	s.shutdown()
	_ = os.RemoveAll(s.dataDir)
}

// shutdown shuts the server down gracefully (SIGTERM; SIGKILL to its
// process group after a minute) and keeps its data dir.
func (s *server) shutdown() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(60 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// sample is a set of latencies.
type sample []time.Duration

func (s sample) pct(p float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	c := append(sample(nil), s...)
	sort.Slice(c, func(i, j int) bool { return c[i] < c[j] })
	i := int(p/100*float64(len(c)) + 0.5)
	if i >= len(c) {
		i = len(c) - 1
	}
	if i > 0 && p < 100 {
		i--
	}
	return c[i]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond)) }

// timeIt runs f and returns its duration.
func timeIt(f func() error) (time.Duration, error) {
	start := time.Now()
	err := f()
	return time.Since(start), err
}

// zeroReader yields n zero bytes.
type zeroReader struct{ n int64 }

func (z *zeroReader) Read(p []byte) (int, error) {
	if z.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > z.n {
		p = p[:z.n]
	}
	clear(p)
	z.n -= int64(len(p))
	return len(p), nil
}
