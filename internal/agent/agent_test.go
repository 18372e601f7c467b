package agent_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/agent"
	"github.com/evalbox/evalbox/internal/agentproto"
)

// pipeConn is one end of a pair of kernel pipes, like the agent's
// stdin/stdout.
type pipeConn struct{ r, w *os.File }

func (c pipeConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c pipeConn) Write(p []byte) (int, error) { return c.w.Write(p) }
func (c pipeConn) Close() error                { return errors.Join(c.r.Close(), c.w.Close()) }

func pipePair(tb testing.TB) (host, guest pipeConn) {
	tb.Helper()
	r1, w1, err := os.Pipe()
	if err != nil {
		tb.Fatal(err)
	}
	r2, w2, err := os.Pipe()
	if err != nil {
		tb.Fatal(err)
	}
	return pipeConn{r: r1, w: w2}, pipeConn{r: r2, w: w1}
}

type testAgent struct {
	c       *agentproto.Client
	workdir string
	cancel  context.CancelFunc
	done    chan error
}

// startAgent runs agent.Serve in-process on one end of a pipe pair and
// returns a client on the other.
func startAgent(tb testing.TB, cfg agent.Config) *testAgent {
	tb.Helper()
	if cfg.Workdir == "" {
		cfg.Workdir = filepath.Join(tb.TempDir(), "work")
	}
	host, guest := pipePair(tb)
	ctx, cancel := context.WithCancel(context.Background())
	ta := &testAgent{workdir: cfg.Workdir, cancel: cancel, done: make(chan error, 1)}
	go func() { ta.done <- agent.Serve(ctx, guest, cfg) }()
	c, err := agentproto.Dial(host)
	if err != nil {
		tb.Fatal(err)
	}
	ta.c = c
	tb.Cleanup(func() {
		c.Close()
		select {
		case err := <-ta.done:
			if err != nil {
				tb.Errorf("Serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			tb.Error("Serve did not return after the connection closed")
		}
		cancel()
	})
	return ta
}

func ctxT(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

// exec runs a shell command and returns its output.
func (ta *testAgent) exec(tb testing.TB, req agentproto.ExecRequest) (agentproto.ExitInfo, string, string) {
	tb.Helper()
	var stdout, stderr bytes.Buffer
	exit, err := ta.c.Exec(ctxT(tb), req, nil, &stdout, &stderr)
	if err != nil {
		tb.Fatalf("Exec: %v", err)
	}
	return exit, stdout.String(), stderr.String()
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i > 0 && len(b) > i+2 && b[i+2] != 'Z' && b[i+2] != 'X'
}

// waitGone waits until pid is gone, failing the test after a while.
func waitGone(tb testing.TB, pid int) {
	tb.Helper()
	for deadline := time.Now().Add(5 * time.Second); alive(pid); {
		if time.Now().After(deadline) {
			tb.Fatalf("process %d still alive", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func agentErrCode(err error) string {
	var e *agentproto.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

func TestPing(t *testing.T) {
	ta := startAgent(t, agent.Config{})
	if err := ta.c.Ping(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(ta.workdir); err != nil || !fi.IsDir() {
		t.Fatalf("workdir not created: %v", err)
	}
}

func TestExecOutputAndExitCode(t *testing.T) {
	ta := startAgent(t, agent.Config{})
	exit, out, errOut := ta.exec(t, agentproto.ExecRequest{Shell: "echo out; echo err >&2; echo out2; exit 3"})
	if exit.Status != agentproto.StatusExited || exit.ExitCode != 3 {
		t.Fatalf("exit = %+v", exit)
	}
	if out != "out\nout2\n" || errOut != "err\n" {
		t.Fatalf("stdout %q stderr %q", out, errOut)
	}

	exit, out, _ = ta.exec(t, agentproto.ExecRequest{Argv: []string{"printf", "%s|", "a b", "c"}})
	if exit.Status != agentproto.StatusExited || exit.ExitCode != 0 || out != "a b|c|" {
		t.Fatalf("argv: exit %+v out %q", exit, out)
	}

	// The process is killed by a signal.
	exit, _, _ = ta.exec(t, agentproto.ExecRequest{Shell: "kill -9 $$"})
	if exit.Status != agentproto.StatusKilled || exit.Signal != 9 || exit.ExitCode != -1 {
		t.Fatalf("killed: exit %+v", exit)
	}
}

func TestExecCannotStart(t *testing.T) {
	ta := startAgent(t, agent.Config{})
	for name, req := range map[string]agentproto.ExecRequest{
		"no such binary":  {Argv: []string{"evalbox-no-such-binary"}},
		"no such path":    {Argv: []string{"/nonexistent/bin"}},
		"no such cwd":     {Argv: []string{"true"}, Cwd: "/nonexistent/dir"},
		"no such user":    {Argv: []string{"true"}, User: "evalbox-no-such-user"},
		"not executable":  {Argv: []string{"/etc/passwd"}},
		"shell and argv?": {Shell: "true", Argv: []string{"true"}},
	} {
		exit, err := ta.c.Exec(ctxT(t), req, nil, nil, nil)
		if name == "shell and argv?" {
			if agentErrCode(err) != agentproto.CodeBadRequest {
				t.Errorf("%s: err = %v", name, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if exit.Status != agentproto.StatusError || exit.Error == "" {
			t.Errorf("%s: exit %+v", name, exit)
		}
	}
}

func TestExecStdin(t *testing.T) {
	ta := startAgent(t, agent.Config{})
	in := make([]byte, 3<<20)
	io.ReadFull(randReader(9, int64(len(in))), in)
	var out bytes.Buffer
	exit, err := ta.c.Exec(ctxT(t), agentproto.ExecRequest{Argv: []string{"cat"}}, bytes.NewReader(in), &out, nil)
	if err != nil || exit.ExitCode != 0 {
		t.Fatalf("exit %+v err %v", exit, err)
	}
	if !bytes.Equal(out.Bytes(), in) {
		t.Fatalf("cat returned %d bytes, want %d identical", out.Len(), len(in))
	}

	// Without stdin the process reads /dev/null.
	_, stdout, _ := ta.exec(t, agentproto.ExecRequest{Shell: "wc -c"})
	if strings.TrimSpace(stdout) != "0" {
		t.Fatalf("wc -c without stdin = %q", stdout)
	}

	// The process may stop reading before the end of its input.
	exit, err = ta.c.Exec(ctxT(t), agentproto.ExecRequest{Shell: "head -c 10 >/dev/null; echo done"}, bytes.NewReader(in), &out, nil)
	if err != nil || exit.ExitCode != 0 {
		t.Fatalf("early stdin close: exit %+v err %v", exit, err)
	}
}

func TestExecEnvCwdUser(t *testing.T) {
	ta := startAgent(t, agent.Config{})
	t.Setenv("EVALBOX_TEST_BASE", "base")
	dir := t.TempDir()
	exit, out, _ := ta.exec(t, agentproto.ExecRequest{
		Shell: `echo "$FOO|$EVALBOX_TEST_BASE|$(pwd)|${EVALBOX_PROC:+marked}"`,
		Env:   map[string]string{"FOO": "bar", "EVALBOX_TEST_BASE": "over"},
		Cwd:   dir,
	})
	if exit.ExitCode != 0 || out != "bar|over|"+dir+"|marked\n" {
		t.Fatalf("exit %+v out %q", exit, out)
	}
	_, out, _ = ta.exec(t, agentproto.ExecRequest{Shell: "pwd"})
	if strings.TrimSpace(out) != ta.workdir {
		t.Fatalf("default cwd %q, want %q", out, ta.workdir)
	}
	if os.Geteuid() != 0 {
		t.Skip("switching users needs root")
	}
	for _, u := range []string{"nobody", "65534"} {
		_, out, _ = ta.exec(t, agentproto.ExecRequest{Shell: `echo "$(id -u) $(id -g) $HOME $USER"`, User: u, Cwd: "/"})
		if out != "65534 65534 /nonexistent nobody\n" {
			t.Fatalf("user %s: %q", u, out)
		}
	}
	_, out, _ = ta.exec(t, agentproto.ExecRequest{Shell: "id -u", User: "4242", Cwd: "/"})
	if out != "4242\n" {
		t.Fatalf("unknown numeric uid: %q", out)
	}

	// The default user applies when the request names none.
	tb := startAgent(t, agent.Config{User: "nobody", Workdir: filepath.Join(openTempDir(t), "w")})
	exit, out, _ = tb.exec(t, agentproto.ExecRequest{Shell: "id -un; touch x && echo writable"})
	if out != "nobody\nwritable\n" {
		t.Fatalf("default user: %q %+v", out, exit)
	}
}

func TestExecTimeoutKillsTree(t *testing.T) {
	ta := startAgent(t, agent.Config{})
	pidFile := filepath.Join(t.TempDir(), "daemon.pid")
	// The daemon leaves the process group (setsid) and is orphaned (the
	// subshell exits): only the marker finds it. It keeps stdout open.
	script := fmt.Sprintf(`echo partial; echo err >&2
(setsid sh -c 'echo $$ > %s; exec sleep 1000' &)
sleep 1000`, pidFile)
	start := time.Now()
	exit, out, errOut := ta.exec(t, agentproto.ExecRequest{Shell: script, TimeoutMs: 400})
	took := time.Since(start)
	if exit.Status != agentproto.StatusTimedOut || exit.ExitCode != -1 {
		t.Fatalf("exit %+v", exit)
	}
	if out != "partial\n" || errOut != "err\n" {
		t.Fatalf("partial output: stdout %q stderr %q", out, errOut)
	}
	// Not a timing check: the daemon holds stdout open for 1000 s, and
	// the exec must end at its timeout without waiting for it (a loaded
	// host took 6.8 s for this).
	if took > time.Minute || exit.DurationMs < 400 {
		t.Fatalf("took %v, duration %d ms", took, exit.DurationMs)
	}
	pid := readPid(t, pidFile)
	if alive(pid) {
		t.Fatalf("daemon %d survived the timeout", pid)
	}
}

func TestExecDaemonKeepsPipes(t *testing.T) {
	ta := startAgent(t, agent.Config{})
	start := time.Now()
	// The background sleep keeps stdout and stderr open after sh exits.
	exit, out, _ := ta.exec(t, agentproto.ExecRequest{Shell: "sleep 30 & echo $!"})
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("exec waited %v for a daemon holding its pipes", took)
	}
	if exit.Status != agentproto.StatusExited || exit.ExitCode != 0 {
		t.Fatalf("exit %+v", exit)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("output %q", out)
	}
	// A normal exit leaves the background job alone.
	if !alive(pid) {
		t.Fatal("background job killed on normal exit")
	}
	if err := killPid(pid); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
}

// openTempDir is a temporary directory that other users can enter.
func openTempDir(t *testing.T) string {
	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// slowWriter counts bytes and stalls on its first write, like a slow
// host-side consumer.
type slowWriter struct {
	n     int64
	stall time.Duration
}

func (w *slowWriter) Write(p []byte) (int, error) {
	if w.n == 0 {
		time.Sleep(w.stall)
	}
	w.n += int64(len(p))
	return len(p), nil
}

func TestExecSlowConsumerGetsAllOutput(t *testing.T) {
	ta := startAgent(t, agent.Config{})
	// A little more output than the stream window (4 MiB) holds, a
	// consumer that stalls longer than the pipe grace, and a daemon that
	// keeps the pipes open: the process exits with output left in its pipe
	// while the agent cannot forward it yet. Everything must arrive.
	const n = 4<<20 + 100_000
	w := &slowWriter{stall: 500 * time.Millisecond}
	var stderr bytes.Buffer
	exit, err := ta.c.Exec(ctxT(t), agentproto.ExecRequest{Shell: fmt.Sprintf("sleep 30 & echo $! >&2; head -c %d /dev/zero", n)}, nil, w, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if pid, err := strconv.Atoi(strings.TrimSpace(stderr.String())); err == nil {
		killPid(pid)
		waitGone(t, pid)
	} else {
		t.Errorf("daemon pid %q", stderr.String())
	}
	if exit.ExitCode != 0 || exit.StdoutTruncated || w.n != n {
		t.Fatalf("got %d of %d bytes, exit %+v", w.n, n, exit)
	}
}

func TestExecChattyDaemonDoesNotHang(t *testing.T) {
	ta := startAgent(t, agent.Config{})
	// yes keeps writing to the pipe after the shell has exited.
	start := time.Now()
	var stdout countWriter
	stdout.allowAny = true
	var stderr bytes.Buffer
	exit, err := ta.c.Exec(ctxT(t), agentproto.ExecRequest{Shell: "yes & echo $! >&2", MaxOutputBytes: 1 << 20}, nil, &stdout, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if pid, err := strconv.Atoi(strings.TrimSpace(stderr.String())); err == nil {
		killPid(pid)
		waitGone(t, pid)
	} else {
		t.Errorf("daemon pid %q", stderr.String())
	}
	if took := time.Since(start); took > 2*time.Second || exit.ExitCode != 0 {
		t.Fatalf("took %v, exit %+v", took, exit)
	}
}

func killPid(pid int) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	return p.Kill()
}

func TestExecOutputCap(t *testing.T) {
	ta := startAgent(t, agent.Config{})
	const n = 50_000_000
	start := time.Now()
	var stdout, stderr countWriter
	exit, err := ta.c.Exec(ctxT(t), agentproto.ExecRequest{
		Shell:          fmt.Sprintf("head -c %d /dev/zero; head -c %d /dev/zero >&2; echo end", n, n),
		MaxOutputBytes: 1 << 20,
	}, nil, &stdout, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if exit.Status != agentproto.StatusExited || !exit.StdoutTruncated || !exit.StderrTruncated {
		t.Fatalf("exit %+v", exit)
	}
	if stdout.n != 1<<20 || stderr.n != 1<<20 {
		t.Fatalf("got %d/%d bytes, want 1 MiB each", stdout.n, stderr.n)
	}
	t.Logf("50+50 MB capped at 1 MiB in %v", time.Since(start))

	// The default cap, and no truncation below it.
	tb := startAgent(t, agent.Config{DefaultMaxOutput: 4 << 20})
	stdout, stderr = countWriter{}, countWriter{}
	exit, err = tb.c.Exec(ctxT(t), agentproto.ExecRequest{Shell: fmt.Sprintf("head -c %d /dev/zero; head -c 1000 /dev/zero >&2", n)}, nil, &stdout, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if stdout.n != 4<<20 || !exit.StdoutTruncated || stderr.n != 1000 || exit.StderrTruncated {
		t.Fatalf("default cap: %d/%d bytes, exit %+v", stdout.n, stderr.n, exit)
	}
}

// countWriter counts bytes, which must be zeros unless allowAny.
type countWriter struct {
	n        int64
	allowAny bool
}

func (w *countWriter) Write(p []byte) (int, error) {
	for _, b := range p {
		if b != 0 && !w.allowAny {
			return 0, errors.New("unexpected byte")
		}
	}
	w.n += int64(len(p))
	return len(p), nil
}

// lineWriter signals each complete line it receives.
type lineWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	lines chan string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for {
		line, err := w.buf.ReadString('\n')
		if err != nil {
			w.buf.WriteString(line)
			return len(p), nil
		}
		w.lines <- strings.TrimSpace(line)
	}
}

func TestExecCancelKillsTree(t *testing.T) {
	ta := startAgent(t, agent.Config{})
	ctx, cancel := context.WithCancel(ctxT(t))
	out := &lineWriter{lines: make(chan string, 10)}
	errc := make(chan error, 1)
	go func() {
		_, err := ta.c.Exec(ctx, agentproto.ExecRequest{Shell: "sleep 1000 & echo $!; wait"}, nil, out, nil)
		errc <- err
	}()
	pid, err := strconv.Atoi(<-out.lines)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Exec after cancel: %v", err)
	}
	waitGone(t, pid)
	// The session survives a cancelled call.
	if err := ta.c.Ping(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

func TestExecSignal(t *testing.T) {
	ta := startAgent(t, agent.Config{})
	out := &lineWriter{lines: make(chan string, 10)}
	e, err := ta.c.OpenExec(ctxT(t), agentproto.ExecRequest{Shell: "trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.01; done"}, nil, out, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var exit agentproto.ExitInfo
	var werr error
	go func() {
		exit, werr = e.Wait()
		close(done)
	}()
	if line := <-out.lines; line != "ready" {
		t.Fatalf("first line %q", line)
	}
	if err := e.Signal(15); err != nil {
		t.Fatal(err)
	}
	<-done
	if werr != nil || exit.Status != agentproto.StatusExited || exit.ExitCode != 7 {
		t.Fatalf("exit %+v err %v", exit, werr)
	}
	if line := <-out.lines; line != "got-term" {
		t.Fatalf("after signal %q", line)
	}
}

func TestBackground(t *testing.T) {
	ta := startAgent(t, agent.Config{})
	ctx := ctxT(t)
	pi, err := ta.c.Start(ctx, agentproto.ExecRequest{Shell: "echo one; echo err >&2; sleep 0.3; echo two", Tag: "job"})
	if err != nil {
		t.Fatal(err)
	}
	if pi.ID == "" || pi.Pid <= 0 || !pi.Running || pi.Tag != "job" {
		t.Fatalf("start: %+v", pi)
	}
	// Attach while it runs: replay, then follow.
	var stdout, stderr bytes.Buffer
	exit, err := ta.c.Attach(ctx, pi.ID, &stdout, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if exit.Status != agentproto.StatusExited || stdout.String() != "one\ntwo\n" || stderr.String() != "err\n" {
		t.Fatalf("attach: exit %+v stdout %q stderr %q", exit, stdout.String(), stderr.String())
	}
	// Attach after the end replays everything.
	stdout.Reset()
	if _, err := ta.c.Attach(ctx, pi.ID, &stdout, nil); err != nil || stdout.String() != "one\ntwo\n" {
		t.Fatalf("re-attach: %q %v", stdout.String(), err)
	}
	if exit, err := ta.c.Wait(ctx, pi.ID); err != nil || exit.ExitCode != 0 {
		t.Fatalf("wait: %+v %v", exit, err)
	}

	// Signal a long-running one.
	long, err := ta.c.Start(ctx, agentproto.ExecRequest{Argv: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	procs, err := ta.c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(procs) != 2 || procs[0].ID != pi.ID || procs[0].Running || procs[0].Exit == nil || procs[1].ID != long.ID || !procs[1].Running {
		t.Fatalf("list: %+v", procs)
	}
	if err := ta.c.Signal(ctx, long.ID, 15); err != nil {
		t.Fatal(err)
	}
	exit, err = ta.c.Wait(ctx, long.ID)
	if err != nil || exit.Status != agentproto.StatusKilled || exit.Signal != 15 {
		t.Fatalf("wait after signal: %+v %v", exit, err)
	}
	// Signalling an ended process is not an error: nothing is left to signal.
	if err := ta.c.Signal(ctx, long.ID, 15); err != nil {
		t.Fatalf("signal after end: %v", err)
	}
	if err := ta.c.Signal(ctx, "nope", 15); agentErrCode(err) != agentproto.CodeNotFound {
		t.Fatalf("signal unknown: %v", err)
	}
	if _, err := ta.c.Wait(ctx, "nope"); agentErrCode(err) != agentproto.CodeNotFound {
		t.Fatalf("wait unknown: %v", err)
	}

	// A timeout applies to background processes too; a detached attach
	// leaves the process running.
	tp, err := ta.c.Start(ctx, agentproto.ExecRequest{Shell: "echo x; sleep 1000", TimeoutMs: 300})
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = ta.c.Attach(actx, tp.ID, nil, nil)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("detach: %v", err)
	}
	exit, err = ta.c.Wait(ctx, tp.ID)
	if err != nil || exit.Status != agentproto.StatusTimedOut {
		t.Fatalf("background timeout: %+v %v", exit, err)
	}

	// A process that cannot start is reported, not lost.
	bad, err := ta.c.Start(ctx, agentproto.ExecRequest{Argv: []string{"evalbox-no-such-binary"}})
	if err != nil || bad.Running || bad.Exit == nil || bad.Exit.Status != agentproto.StatusError {
		t.Fatalf("bad start: %+v %v", bad, err)
	}
}

// TestBackgroundStdin: a background process started with Stdin reads what
// OpStdin writes, in order, and EOF when it is closed; the writes that
// cannot be made say why.
func TestBackgroundStdin(t *testing.T) {
	ta := startAgent(t, agent.Config{})
	ctx := ctxT(t)
	pi, err := ta.c.Start(ctx, agentproto.ExecRequest{Shell: "while read l; do echo got $l; done; echo eof", Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"a", "b", "c"} {
		if err := ta.c.WriteStdin(ctx, pi.ID, []byte(l+"\n"), false); err != nil {
			t.Fatal(err)
		}
	}
	big := bytes.Repeat([]byte("x"), 3*agentproto.ChunkSize)
	if err := ta.c.WriteStdin(ctx, pi.ID, append(big, '\n'), true); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	exit, err := ta.c.Attach(ctx, pi.ID, &out, nil)
	if err != nil || exit.ExitCode != 0 {
		t.Fatalf("attach: %+v %v", exit, err)
	}
	if want := "got a\ngot b\ngot c\ngot " + string(big) + "\neof\n"; out.String() != want {
		t.Fatalf("output %q…, want %q…", out.String()[:min(40, out.Len())], want[:40])
	}
	if err := ta.c.WriteStdin(ctx, pi.ID, []byte("late\n"), false); agentErrCode(err) != agentproto.CodeNotFound {
		t.Fatalf("write after the end: %v", err)
	}
	// Without Stdin the process reads /dev/null: there is nothing to write to.
	np, err := ta.c.Start(ctx, agentproto.ExecRequest{Argv: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := ta.c.WriteStdin(ctx, np.ID, []byte("x"), false); agentErrCode(err) != agentproto.CodeBadRequest {
		t.Fatalf("write to a process without stdin: %v", err)
	}
	if err := ta.c.WriteStdin(ctx, "nope", []byte("x"), false); agentErrCode(err) != agentproto.CodeNotFound {
		t.Fatalf("write to an unknown process: %v", err)
	}
	// Closed, a second close is no error, a write is.
	cp, err := ta.c.Start(ctx, agentproto.ExecRequest{Shell: "cat; sleep 1000", Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := ta.c.WriteStdin(ctx, cp.ID, nil, true); err != nil {
		t.Fatal(err)
	}
	if err := ta.c.WriteStdin(ctx, cp.ID, nil, true); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if err := ta.c.WriteStdin(ctx, cp.ID, []byte("x"), false); agentErrCode(err) != agentproto.CodeBadRequest {
		t.Fatalf("write after close: %v", err)
	}
	for _, id := range []string{np.ID, cp.ID} {
		if err := ta.c.Signal(ctx, id, 9); err != nil {
			t.Fatal(err)
		}
	}
}

func TestBackgroundOutputCapAndOrder(t *testing.T) {
	ta := startAgent(t, agent.Config{})
	ctx := ctxT(t)
	// Many small writes are coalesced but keep their order per stream.
	pi, err := ta.c.Start(ctx, agentproto.ExecRequest{
		Shell:          "for i in $(seq 1 2000); do echo $i; done; head -c 3000000 /dev/zero",
		MaxOutputBytes: 2 << 20,
	})
	if err != nil {
		t.Fatal(err)
	}
	exit, err := ta.c.Wait(ctx, pi.ID)
	if err != nil || !exit.StdoutTruncated {
		t.Fatalf("exit %+v %v", exit, err)
	}
	var out bytes.Buffer
	if _, err := ta.c.Attach(ctx, pi.ID, &out, nil); err != nil {
		t.Fatal(err)
	}
	if out.Len() != 2<<20 {
		t.Fatalf("kept %d bytes, want %d", out.Len(), 2<<20)
	}
	var want strings.Builder
	for i := 1; i <= 2000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	if !strings.HasPrefix(out.String(), want.String()) {
		t.Fatal("background output out of order")
	}
}

// randReader is a fast deterministic source of incompressible bytes.
func randReader(seed uint64, n int64) io.Reader {
	return io.LimitReader(rand.NewChaCha8([32]byte{byte(seed)}), n)
}

func TestFileTransfer100MB(t *testing.T) {
	ta := startAgent(t, agent.Config{})
	ctx := ctxT(t)
	const size = 100 << 20
	p := filepath.Join(t.TempDir(), "sub", "big.bin")
	h := sha256.New()
	start := time.Now()
	fi, err := ta.c.WriteFile(ctx, p, io.TeeReader(randReader(1, size), h), agentproto.WriteOptions{Mode: 0o600, Parents: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("write 100 MB: %v", time.Since(start))
	if fi.Size != size || fi.Type != "file" || fi.Mode != 0o600 || fi.Path != p {
		t.Fatalf("write: %+v", fi)
	}
	want := h.Sum(nil)

	start = time.Now()
	fi, r, err := ta.c.OpenFile(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	h.Reset()
	n, err := io.Copy(h, r)
	r.Close()
	if err != nil || n != size || fi.Size != size {
		t.Fatalf("read %d bytes (stat %d): %v", n, fi.Size, err)
	}
	t.Logf("read 100 MB: %v", time.Since(start))
	if !bytes.Equal(h.Sum(nil), want) {
		t.Fatal("sha256 mismatch")
	}

	// Closing a reader early stops the transfer; the session goes on.
	_, r, err = ta.c.OpenFile(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(r, make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	r.Close()
	if err := ta.c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

// failingReader yields n bytes, then fails.
type failingReader struct {
	r io.Reader
}

var errSource = errors.New("source broke")

func (f failingReader) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if err == io.EOF {
		return n, errSource
	}
	return n, err
}

// cancelAfter yields zeros forever and calls cancel after n bytes.
type cancelAfter struct {
	n      int
	cancel context.CancelFunc
}

func (c *cancelAfter) Read(p []byte) (int, error) {
	clear(p)
	if c.n -= len(p); c.n <= 0 {
		c.cancel()
	}
	return len(p), nil
}

// dirEntries lists dir's names.
func dirEntries(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// waitEmpty waits until dir is empty (the agent cleans up after an abort
// asynchronously).
func waitEmpty(t *testing.T, dir string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		names := dirEntries(t, dir)
		if len(names) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("left behind: %v", names)
		}
	}
}

func TestWriteFileAbortedLeavesNothing(t *testing.T) {
	ta := startAgent(t, agent.Config{})
	ctx := ctxT(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "f")

	// The source fails midway.
	_, err := ta.c.WriteFile(ctx, p, failingReader{randReader(2, 10<<20)}, agentproto.WriteOptions{})
	if !errors.Is(err, errSource) {
		t.Fatalf("err = %v", err)
	}
	waitEmpty(t, dir)

	// Too large: refused with a dedicated code, nothing left.
	_, err = ta.c.WriteFile(ctx, p, randReader(3, 5<<20), agentproto.WriteOptions{MaxBytes: 1 << 20})
	if agentErrCode(err) != agentproto.CodeTooLarge {
		t.Fatalf("too large: %v", err)
	}
	if names := dirEntries(t, dir); len(names) != 0 {
		t.Fatalf("too large left %v", names)
	}

	// Cancelled midway (the source would go on forever).
	cctx, cancel := context.WithCancel(ctx)
	src := &cancelAfter{n: 1 << 20, cancel: cancel}
	_, err = ta.c.WriteFile(cctx, p, src, agentproto.WriteOptions{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	waitEmpty(t, dir)

	// Replacing a file keeps the old content until the new one is whole.
	if err := os.WriteFile(p, []byte("old"), 0o640); err != nil {
		t.Fatal(err)
	}
	_, err = ta.c.WriteFile(ctx, p, failingReader{strings.NewReader("new content")}, agentproto.WriteOptions{})
	if !errors.Is(err, errSource) {
		t.Fatal(err)
	}
	fi, err := ta.c.WriteFile(ctx, p, strings.NewReader("new"), agentproto.WriteOptions{})
	if err != nil || fi.Mode != 0o640 {
		t.Fatalf("replace: %+v %v (mode must be kept)", fi, err)
	}
	for deadline := time.Now().Add(5 * time.Second); len(dirEntries(t, dir)) != 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("left behind: %v", dirEntries(t, dir))
		}
	}
	if b, _ := os.ReadFile(p); string(b) != "new" {
		t.Fatalf("content %q", b)
	}
}

func TestFileOps(t *testing.T) {
	ta := startAgent(t, agent.Config{})
	ctx := ctxT(t)
	dir := t.TempDir()

	d := filepath.Join(dir, "a", "b")
	fi, err := ta.c.Mkdir(ctx, d, 0o700, true, "")
	if err != nil || fi.Type != "dir" || fi.Mode != 0o700 {
		t.Fatalf("mkdir -p: %+v %v", fi, err)
	}
	fi, err = ta.c.Mkdir(ctx, filepath.Join(dir, "sticky"), 0o1777, false, "")
	if err != nil || fi.Mode != 0o1777 {
		t.Fatalf("mkdir sticky: %+v %v", fi, err)
	}
	fi, err = ta.c.WriteFile(ctx, filepath.Join(dir, "suid"), strings.NewReader("#!/bin/sh\n"), agentproto.WriteOptions{Mode: 0o4750})
	if err != nil || fi.Mode != 0o4750 {
		t.Fatalf("write setuid: %+v %v", fi, err)
	}
	if _, err := ta.c.Mkdir(ctx, d, 0, true, ""); err != nil {
		t.Fatalf("mkdir -p existing: %v", err)
	}
	if _, err := ta.c.Mkdir(ctx, d, 0, false, ""); agentErrCode(err) != agentproto.CodeExists {
		t.Fatalf("mkdir existing: %v", err)
	}
	if _, err := ta.c.Mkdir(ctx, filepath.Join(dir, "x", "y"), 0, false, ""); agentErrCode(err) != agentproto.CodeNotFound {
		t.Fatalf("mkdir without parent: %v", err)
	}

	for _, name := range []string{"c.txt", "a.txt", "b.txt"} {
		if _, err := ta.c.WriteFile(ctx, filepath.Join(d, name), strings.NewReader(name), agentproto.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("a.txt", filepath.Join(d, "link")); err != nil {
		t.Fatal(err)
	}
	files, err := ta.c.ListDir(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, f.Name+":"+f.Type)
	}
	if got := strings.Join(names, ","); got != "a.txt:file,b.txt:file,c.txt:file,link:symlink" {
		t.Fatalf("list: %s", got)
	}
	if files[0].Size != 5 || files[0].Mode != 0o644 || files[0].Path != filepath.Join(d, "a.txt") || files[3].Target != "a.txt" {
		t.Fatalf("list entries: %+v", files)
	}

	// Stat does not follow a symlink; an upload replaces the link itself
	// (following it would let sandbox code redirect a root-owned write).
	fi, err = ta.c.Stat(ctx, filepath.Join(d, "link"))
	if err != nil || fi.Type != "symlink" || fi.Target != "a.txt" {
		t.Fatalf("stat link: %+v %v", fi, err)
	}
	if _, err := ta.c.WriteFile(ctx, filepath.Join(d, "link"), strings.NewReader("via link"), agentproto.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(d, "a.txt")); string(b) != "a.txt" {
		t.Fatalf("the upload went through the symlink: target now %q", b)
	}
	if fi, err := os.Lstat(filepath.Join(d, "link")); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("the link was not replaced by the upload: %v %v", fi, err)
	}
	if b, _ := os.ReadFile(filepath.Join(d, "link")); string(b) != "via link" {
		t.Fatalf("uploaded content: %q", b)
	}

	// Reading: a small file, an empty one, a procfs file of unknown size.
	_, r, err := ta.c.OpenFile(ctx, filepath.Join(d, "b.txt"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(r)
	r.Close()
	if err != nil || string(b) != "b.txt" {
		t.Fatalf("read: %q %v", b, err)
	}
	if _, err := ta.c.WriteFile(ctx, filepath.Join(d, "empty"), strings.NewReader(""), agentproto.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	fi, r, err = ta.c.OpenFile(ctx, filepath.Join(d, "empty"))
	if err != nil || fi.Size != 0 {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(r); err != nil || len(b) != 0 {
		t.Fatalf("empty: %q %v", b, err)
	}
	r.Close()
	_, r, err = ta.c.OpenFile(ctx, "/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(r); err != nil || !bytes.Contains(b, []byte("Pid:")) {
		t.Fatalf("procfs: %q %v", b, err)
	}
	r.Close()

	// Removal.
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ta.c.OpenFile(ctx, filepath.Join(dir, "fifo")); agentErrCode(err) != agentproto.CodeBadRequest {
		t.Fatalf("read fifo: %v", err)
	}

	if err := ta.c.Remove(ctx, filepath.Join(dir, "a"), false); agentErrCode(err) != agentproto.CodeExists {
		t.Fatalf("remove non-empty dir: %v", err)
	}
	if err := ta.c.Remove(ctx, filepath.Join(d, "c.txt"), false); err != nil {
		t.Fatal(err)
	}
	if err := ta.c.Remove(ctx, filepath.Join(dir, "a"), true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "a")); !os.IsNotExist(err) {
		t.Fatalf("tree still there: %v", err)
	}
	if err := ta.c.Remove(ctx, filepath.Join(dir, "a"), true); agentErrCode(err) != agentproto.CodeNotFound {
		t.Fatalf("remove missing: %v", err)
	}
}

func TestFileOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	ta := startAgent(t, agent.Config{User: "nobody"})
	ctx := ctxT(t)
	p := filepath.Join(t.TempDir(), "new", "f")
	if _, err := ta.c.WriteFile(ctx, p, strings.NewReader("x"), agentproto.WriteOptions{Parents: true}); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{p, filepath.Dir(p)} {
		var st syscall.Stat_t
		if err := syscall.Stat(q, &st); err != nil || st.Uid != 65534 || st.Gid != 65534 {
			t.Fatalf("%s owned by %d:%d (%v), want nobody", q, st.Uid, st.Gid, err)
		}
	}
	if _, err := ta.c.WriteFile(ctx, p, strings.NewReader("x"), agentproto.WriteOptions{User: "evalbox-no-such-user"}); agentErrCode(err) != agentproto.CodeBadRequest {
		t.Fatalf("unknown owner: %v", err)
	}
}

func TestPathErrors(t *testing.T) {
	ta := startAgent(t, agent.Config{})
	ctx := ctxT(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		call func() error
		code string
	}{
		{"relative stat", func() error { _, err := ta.c.Stat(ctx, "etc/passwd"); return err }, agentproto.CodeBadRequest},
		{"empty path", func() error { _, err := ta.c.Stat(ctx, ""); return err }, agentproto.CodeBadRequest},
		{"NUL", func() error { _, err := ta.c.Stat(ctx, "/etc/\x00passwd"); return err }, agentproto.CodeBadRequest},
		{"missing", func() error { _, err := ta.c.Stat(ctx, dir+"/nope"); return err }, agentproto.CodeNotFound},
		{"read missing", func() error { _, _, err := ta.c.OpenFile(ctx, dir+"/nope"); return err }, agentproto.CodeNotFound},
		{"read dir", func() error { _, _, err := ta.c.OpenFile(ctx, dir); return err }, agentproto.CodeIsDir},
		{"list file", func() error { _, err := ta.c.ListDir(ctx, file); return err }, agentproto.CodeNotDir},
		{"write over dir", func() error {
			_, err := ta.c.WriteFile(ctx, dir, strings.NewReader("x"), agentproto.WriteOptions{})
			return err
		}, agentproto.CodeIsDir},
		{"write without parent", func() error {
			_, err := ta.c.WriteFile(ctx, dir+"/no/such/f", strings.NewReader("x"), agentproto.WriteOptions{})
			return err
		}, agentproto.CodeNotFound},
		{"write under a file", func() error {
			_, err := ta.c.WriteFile(ctx, file+"/f", strings.NewReader("x"), agentproto.WriteOptions{})
			return err
		}, agentproto.CodeNotDir},
		{"write root", func() error {
			_, err := ta.c.WriteFile(ctx, "/", strings.NewReader("x"), agentproto.WriteOptions{})
			return err
		}, agentproto.CodeIsDir},
		{"mkdir over file", func() error { _, err := ta.c.Mkdir(ctx, file, 0, true, ""); return err }, agentproto.CodeExists},
		{"remove root", func() error { return ta.c.Remove(ctx, "/", true) }, agentproto.CodeBadRequest},
		{"remove root via dots", func() error { return ta.c.Remove(ctx, dir+"/../../../../../..", true) }, agentproto.CodeBadRequest},
	}
	for _, tc := range cases {
		if err := tc.call(); agentErrCode(err) != tc.code {
			t.Errorf("%s: err %v, want code %s", tc.name, err, tc.code)
		}
	}
	// ".." cannot climb above the root: /../../etc/hostname is /etc/hostname.
	fi, err := ta.c.Stat(ctx, "/../../etc/hostname")
	if err != nil || fi.Path != "/etc/hostname" {
		t.Fatalf("dots: %+v %v", fi, err)
	}
}

func TestSessionClosed(t *testing.T) {
	host, guest := pipePair(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agent.Serve(ctx, guest, agent.Config{Workdir: t.TempDir()}) }()
	c, err := agentproto.Dial(host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	out := &lineWriter{lines: make(chan string, 1)}
	errc := make(chan error, 1)
	go func() {
		_, err := c.Exec(context.Background(), agentproto.ExecRequest{Shell: "echo $$; exec sleep 1000"}, nil, out, nil)
		errc <- err
	}()
	pid, _ := strconv.Atoi(<-out.lines)
	bg, err := c.Start(context.Background(), agentproto.ExecRequest{Argv: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}

	// The agent goes away (as when its sandbox dies): it kills its
	// processes, and every call fails with ErrSessionClosed.
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Serve: %v", err)
	}
	guest.Close()
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("client did not notice the session end")
	}
	if err := <-errc; !errors.Is(err, agentproto.ErrSessionClosed) {
		t.Fatalf("exec in flight: %v", err)
	}
	if err := c.Ping(context.Background()); !errors.Is(err, agentproto.ErrSessionClosed) || !errors.Is(c.Err(), agentproto.ErrSessionClosed) {
		t.Fatalf("ping: %v", err)
	}
	for _, p := range []int{pid, bg.Pid} {
		if alive(p) {
			t.Errorf("process %d outlived the agent", p)
		}
	}
}

func TestConcurrentCalls(t *testing.T) {
	ta := startAgent(t, agent.Config{})
	ctx := ctxT(t)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			_, out, _ := ta.exec(t, agentproto.ExecRequest{Shell: fmt.Sprintf("echo %d", i)})
			if out != fmt.Sprintf("%d\n", i) {
				t.Errorf("exec %d: %q", i, out)
			}
			p := filepath.Join(ta.workdir, fmt.Sprintf("f%d", i))
			if _, err := ta.c.WriteFile(ctx, p, randReader(uint64(i), 1<<20), agentproto.WriteOptions{}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}

func BenchmarkExecTrue(b *testing.B) {
	ta := startAgent(b, agent.Config{})
	ctx := context.Background()
	req := agentproto.ExecRequest{Argv: []string{"true"}}
	b.ResetTimer()
	for b.Loop() {
		exit, err := ta.c.Exec(ctx, req, nil, nil, nil)
		if err != nil || exit.ExitCode != 0 {
			b.Fatal(exit, err)
		}
	}
}

func BenchmarkPing(b *testing.B) {
	ta := startAgent(b, agent.Config{})
	ctx := context.Background()
	for b.Loop() {
		if err := ta.c.Ping(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// zeroReader yields n zero bytes without touching memory.
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

const benchFileSize = 100 << 20

func BenchmarkWriteFile(b *testing.B) {
	ta := startAgent(b, agent.Config{})
	ctx := context.Background()
	p := filepath.Join(b.TempDir(), "f")
	b.SetBytes(benchFileSize)
	for b.Loop() {
		if _, err := ta.c.WriteFile(ctx, p, &zeroReader{benchFileSize}, agentproto.WriteOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadFile(b *testing.B) {
	ta := startAgent(b, agent.Config{})
	ctx := context.Background()
	p := filepath.Join(b.TempDir(), "f")
	if _, err := ta.c.WriteFile(ctx, p, &zeroReader{benchFileSize}, agentproto.WriteOptions{}); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(benchFileSize)
	for b.Loop() {
		_, r, err := ta.c.OpenFile(ctx, p)
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, r)
		r.Close()
		if err != nil || n != benchFileSize {
			b.Fatal(n, err)
		}
	}
}

// cgroup2Dir makes a cgroup for the test in the host's cgroup2 hierarchy
// and returns it open, as a runtime delegates one to the agent.
func cgroup2Dir(t *testing.T) *os.File {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a cgroup")
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	mount := ""
	for _, l := range strings.Split(string(mi), "\n") {
		pre, post, ok := strings.Cut(l, " - ")
		if pf := strings.Fields(pre); ok && strings.HasPrefix(post, "cgroup2 ") && len(pf) >= 5 {
			mount = pf[4]
		}
	}
	if mount == "" {
		t.Skip("no cgroup2 hierarchy on this host")
	}
	dir := filepath.Join(mount, fmt.Sprintf("evalbox-agent-test-%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "-")))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.Close()
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if e.IsDir() {
				t.Errorf("cgroup %s left below the agent's", e.Name())
				_ = syscall.Rmdir(filepath.Join(dir, e.Name()))
			}
		}
		if err := syscall.Rmdir(dir); err != nil {
			t.Errorf("remove test cgroup: %v", err)
		}
	})
	return f
}

// With a delegated cgroup, a timeout kills daemons of another user that
// left the session and cleared their environment (the marker scan cannot
// read a process of another user: it misses them), and the per-process
// cgroups are removed once empty.
func TestExecTimeoutKillsOtherUsersDaemons(t *testing.T) {
	ta := startAgent(t, agent.Config{Cgroup: cgroup2Dir(t)})
	// A directory nobody can write to (t.TempDir's parent is 0700).
	dir, err := os.MkdirTemp("", "evalbox-agent-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	pidFile := filepath.Join(dir, "daemon.pid")
	script := fmt.Sprintf(`(setsid sh -c 'echo $$ > %s; exec env -i sleep 1000' &); sleep 1000`, pidFile)
	exit, _, _ := ta.exec(t, agentproto.ExecRequest{Shell: script, User: "65534", Cwd: "/", TimeoutMs: 500})
	if exit.Status != agentproto.StatusTimedOut {
		t.Fatalf("exit %+v", exit)
	}
	pid := readPid(t, pidFile)
	waitGone(t, pid)
	// A command that ends on its own keeps its daemon; its cgroup stays
	// until the daemon is gone, then the next process sweeps it.
	exit, _, _ = ta.exec(t, agentproto.ExecRequest{Shell: fmt.Sprintf(`(setsid sh -c 'echo $$ > %s; exec sleep 0.3' > /dev/null 2>&1 &)`, pidFile), User: "65534", Cwd: "/"})
	if exit.Status != agentproto.StatusExited {
		t.Fatalf("exit %+v", exit)
	}
	time.Sleep(time.Second)
	ta.exec(t, agentproto.ExecRequest{Shell: "true"})
}

// threadsAlive reports whether any thread of pid still runs (a process
// whose main thread exited shows as a zombie while others run).
func threadsAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n > 1 || !strings.Contains(string(b), "State:\tZ")
		}
	}
	return false
}

// A daemon whose main thread exits while another thread runs looks like a
// zombie in /proc/<pid>/stat: the tree kill (without a cgroup) must still
// see it and kill it.
func TestExecTimeoutKillsZombieLeaderDaemon(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3")
	}
	ta := startAgent(t, agent.Config{})
	pidFile := filepath.Join(t.TempDir(), "daemon.pid")
	prog := fmt.Sprintf(`import os, threading, time, ctypes
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open(%q, "w").write(str(os.getpid()))
        threading.Thread(target=lambda: time.sleep(1000)).start()
        ctypes.CDLL(None).syscall(60, 0)  # exit: this thread only
    os._exit(0)
time.sleep(1000)
`, pidFile)
	// The timeout must come after the daemon exists: a loaded host can
	// take longer than it to start Python, so a run in which the daemon
	// never wrote its pid is run again with twice the timeout.
	for timeout := int64(800); ; timeout *= 2 {
		exit, _, _ := ta.exec(t, agentproto.ExecRequest{Argv: []string{"python3", "-c", prog}, TimeoutMs: timeout})
		if exit.Status != agentproto.StatusTimedOut {
			t.Fatalf("exit %+v", exit)
		}
		if _, err := os.Stat(pidFile); err == nil || timeout >= 12_800 {
			break
		}
		t.Logf("the daemon did not start within a %d ms timeout: again", timeout)
	}
	pid := readPid(t, pidFile)
	for deadline := time.Now().Add(5 * time.Second); threadsAlive(pid); {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("daemon %d (main thread exited) survived the timeout", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// readPid reads the pid a test's daemon wrote to path.
func readPid(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}
