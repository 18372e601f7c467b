package main

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/agentproto"
)

// buildAgent builds the agent static into a temporary directory.
func buildAgent(tb testing.TB) string {
	tb.Helper()
	bin := filepath.Join(tb.TempDir(), "evalbox-agent")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// procConn is the host's end of the agent's stdin/stdout.
type procConn struct {
	w io.WriteCloser
	r io.ReadCloser
}

func (c procConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c procConn) Write(p []byte) (int, error) { return c.w.Write(p) }
func (c procConn) Close() error                { return errors.Join(c.w.Close(), c.r.Close()) }

// agentProc is a running agent binary and a client connected to it.
type agentProc struct {
	c       *agentproto.Client
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error        // set when exited is closed
	logs    bytes.Buffer // read it only after exited is closed
}

// startBinary runs the agent binary with args and connects to it.
func startBinary(tb testing.TB, bin string, args ...string) *agentProc {
	tb.Helper()
	a := &agentProc{cmd: exec.Command(bin, args...), exited: make(chan struct{})}
	stdin, err := a.cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := a.cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	a.cmd.Stderr = &a.logs
	if err := a.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	go func() {
		a.waitErr = a.cmd.Wait()
		close(a.exited)
	}()
	tb.Cleanup(func() {
		a.cmd.Process.Kill()
		select {
		case <-a.exited:
		case <-time.After(10 * time.Second):
			tb.Error("agent process not collected")
		}
	})
	if a.c, err = agentproto.Dial(procConn{w: stdin, r: stdout}); err != nil {
		tb.Fatal(err)
	}
	return a
}

func TestAgentBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the agent")
	}
	bin := buildAgent(t)
	assertStatic(t, bin)

	workdir := filepath.Join(t.TempDir(), "work")
	a := startBinary(t, bin, "--workdir", workdir, "--log-level", "debug")
	c, cmd := a.c, a.cmd
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("ping: %v", err)
	}

	var out bytes.Buffer
	exit, err := c.Exec(ctx, agentproto.ExecRequest{Shell: "pwd; echo $EVALBOX_PROC | wc -c"}, nil, &out, nil)
	if err != nil || exit.ExitCode != 0 || out.String() != workdir+"\n13\n" {
		t.Fatalf("exec: %+v %q %v", exit, out.String(), err)
	}

	// Signals keep their default disposition in children (the agent
	// handles SIGPIPE itself but must not pass on an ignored one).
	out.Reset()
	if _, err := c.Exec(ctx, agentproto.ExecRequest{Shell: "grep SigIgn /proc/self/status"}, nil, &out, nil); err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(strings.TrimPrefix(out.String(), "SigIgn:")) != "0000000000000000" {
		t.Fatalf("child inherits ignored signals: %q", out.String())
	}

	// Orphans are reparented to the agent (a subreaper) and reaped.
	out.Reset()
	if _, err := c.Exec(ctx, agentproto.ExecRequest{Shell: "(sleep 1 >/dev/null 2>&1 & echo $!) ; exit 0"}, nil, &out, nil); err != nil {
		t.Fatal(err)
	}
	orphan, _ := strconv.Atoi(strings.TrimSpace(out.String()))
	if ppid := parentOf(orphan); ppid != cmd.Process.Pid {
		t.Fatalf("orphan %d has parent %d, want the agent %d", orphan, ppid, cmd.Process.Pid)
	}
	for deadline := time.Now().Add(5 * time.Second); processExists(orphan); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("orphan %d not reaped (zombie of the agent?)", orphan)
		}
	}

	// A timeout kills a double-forked daemon, which (reparented to the
	// agent) is then reaped: no zombie is left.
	out.Reset()
	exit, err = c.Exec(ctx, agentproto.ExecRequest{
		Shell:     "(setsid sleep 1000 >/dev/null 2>&1 & echo $!); sleep 1000",
		TimeoutMs: 300,
	}, nil, &out, nil)
	if err != nil || exit.Status != agentproto.StatusTimedOut {
		t.Fatalf("timeout: %+v %v", exit, err)
	}
	daemon, _ := strconv.Atoi(strings.TrimSpace(out.String()))
	for deadline := time.Now().Add(5 * time.Second); processExists(daemon); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("daemon %d not killed and reaped", daemon)
		}
	}

	// Files over the real transport.
	p := filepath.Join(t.TempDir(), "f")
	data := bytes.Repeat([]byte("evalbox"), 300_000)
	if _, err := c.WriteFile(ctx, p, bytes.NewReader(data), agentproto.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	_, r, err := c.OpenFile(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes: %v", len(got), err)
	}

	// A background process still running when the connection closes is
	// killed, and the agent exits.
	bg, err := c.Start(ctx, agentproto.ExecRequest{Argv: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	select {
	case <-a.exited:
		if a.waitErr != nil {
			t.Fatalf("agent exit: %v\nlogs:\n%s", a.waitErr, a.logs.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("agent did not exit when its connection closed")
	}
	if processExists(bg.Pid) {
		t.Fatalf("background process %d outlived the agent", bg.Pid)
	}
	if !strings.Contains(a.logs.String(), "agent stopped") {
		t.Errorf("logs:\n%s", a.logs.String())
	}
}

// assertStatic checks that bin has no program interpreter and no dynamic
// libraries.
func assertStatic(t *testing.T, bin string) {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("agent binary is dynamically linked (has PT_INTERP)")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Fatalf("agent binary needs %v", libs)
	}
}

// TestAgentDeps checks that the agent, which ships into every sandbox,
// imports nothing but the standard library, x/sys, yamux and the agent
// packages.
func TestAgentDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	allowed := []string{
		"github.com/evalbox/evalbox/cmd/evalbox-agent",
		"github.com/evalbox/evalbox/internal/agent",
		"github.com/evalbox/evalbox/internal/agentproto",
		"github.com/hashicorp/yamux",
		"github.com/fsnotify/fsnotify", // OpWatch: inotify (it needs x/sys only)
		"github.com/fsnotify/fsnotify/internal",
	}
	for _, dep := range strings.Fields(string(out)) {
		if !slices.Contains(allowed, dep) && !strings.HasPrefix(dep, "golang.org/x/sys/") {
			t.Errorf("agent depends on %s", dep)
		}
	}
}

// parentOf returns the parent pid of pid (0 if unknown).
func parentOf(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	ppid, _ := strconv.Atoi(fields[1])
	return ppid
}

// processExists reports whether pid exists at all (a zombie counts).
func processExists(pid int) bool {
	return syscall.Kill(pid, 0) == nil
}

func BenchmarkAgentBinaryExecTrue(b *testing.B) {
	a := startBinary(b, buildAgent(b), "--workdir", b.TempDir())
	ctx := context.Background()
	req := agentproto.ExecRequest{Argv: []string{"true"}}
	for b.Loop() {
		exit, err := a.c.Exec(ctx, req, nil, nil, nil)
		if err != nil || exit.ExitCode != 0 {
			b.Fatal(exit, err)
		}
	}
}

// zeroReader yields n zero bytes.
type zeroReader struct{ n int64 }

func (z *zeroReader) Read(p []byte) (int, error) {
	if z.n == 0 {
		return 0, io.EOF
	}
	n := min(int64(len(p)), z.n)
	clear(p[:n])
	z.n -= n
	return int(n), nil
}

func BenchmarkAgentBinaryFileTransfer(b *testing.B) {
	const size = 100 << 20
	a := startBinary(b, buildAgent(b), "--workdir", b.TempDir())
	ctx := context.Background()
	p := filepath.Join(b.TempDir(), "f")
	b.Run("write", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			if _, err := a.c.WriteFile(ctx, p, &zeroReader{size}, agentproto.WriteOptions{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("read", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			_, r, err := a.c.OpenFile(ctx, p)
			if err != nil {
				b.Fatal(err)
			}
			n, err := io.Copy(io.Discard, r)
			r.Close()
			if err != nil || n != size {
				b.Fatal(n, err)
			}
		}
	})
}

// TestAgentUnixSocket drives the binary over a unix socket: a background
// process started on one connection is attached to from the next one.
func TestAgentUnixSocket(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the agent")
	}
	bin := buildAgent(t)
	sock := filepath.Join(t.TempDir(), "agent.sock")
	cmd := exec.Command(bin, "--workdir", t.TempDir(), "--listen", sock)
	var logs strings.Builder
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		// SIGTERM: the agent (not PID 1 here) stops and kills its processes.
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			t.Error("agent did not stop on SIGTERM")
		}
		if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket left behind: %v", err)
		}
	})
	dial := func() *agentproto.Client {
		t.Helper()
		var conn net.Conn
		var err error
		for i := 0; i < 200; i++ {
			if conn, err = net.Dial("unix", sock); err == nil {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("dial: %v\n%s", err, logs.String())
		}
		c, err := agentproto.Dial(conn)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c1 := dial()
	p, err := c1.Start(ctx, agentproto.ExecRequest{Shell: "sleep 0.3; echo done"})
	if err != nil {
		t.Fatal(err)
	}
	c1.Close()
	c2 := dial()
	defer c2.Close()
	var out strings.Builder
	exit, err := c2.Attach(ctx, p.ID, &out, io.Discard)
	if err != nil || exit.Status != agentproto.StatusExited || out.String() != "done\n" {
		t.Fatalf("attach from a new connection: %+v %q %v", exit, out.String(), err)
	}
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode: %v %v", fi, err)
	}
}
