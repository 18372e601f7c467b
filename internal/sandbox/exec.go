package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/internal/quota"
	"github.com/evalbox/evalbox/pkg/client"
)

// execRequest builds the node request for req in sandbox e.
func (s *Service) execRequest(ctx context.Context, e *entry, req client.ExecRequest) (nodeapi.ExecRequest, error) {
	var out nodeapi.ExecRequest
	switch {
	case req.Cmd != "" && len(req.Argv) > 0:
		return out, errorf(client.CodeBadRequest, "give cmd or argv, not both")
	case req.Cmd == "" && len(req.Argv) == 0:
		return out, errorf(client.CodeBadRequest, "cmd or argv is required")
	}
	for _, a := range req.Argv {
		if strings.ContainsRune(a, 0) {
			return out, errorf(client.CodeBadRequest, "argv has a NUL byte")
		}
	}
	if strings.ContainsRune(req.Cmd, 0) || strings.ContainsRune(req.Cwd, 0) || strings.ContainsRune(req.User, 0) {
		return out, errorf(client.CodeBadRequest, "cmd, cwd and user must not contain NUL bytes")
	}
	if req.Cwd != "" && !strings.HasPrefix(req.Cwd, "/") {
		return out, errorf(client.CodeBadRequest, "cwd must be an absolute path, got %q", req.Cwd)
	}
	if err := validateEnv(req.Env); err != nil {
		return out, err
	}
	if req.Timeout < 0 || math.IsNaN(req.Timeout) || req.Timeout > s.cfg.MaxTimeout.Seconds() {
		return out, errorf(client.CodeBadRequest, "timeout must be between 0 and %d seconds", int(s.cfg.MaxTimeout.Seconds()))
	}
	if req.MaxOutputBytes < 0 || req.MaxOutputBytes > s.cfg.MaxOutputLimit {
		return out, errorf(client.CodeBadRequest, "max_output_bytes must be between 0 and %d", s.cfg.MaxOutputLimit)
	}
	if req.MemoryLimitMB < 0 || req.MemoryLimitMB > maxMemoryLimitMB {
		return out, errorf(client.CodeBadRequest, "memory_limit_mb must be between 0 and %d", maxMemoryLimitMB)
	}
	// The sandbox's own env is the node's, under this one.
	env := req.Env
	timeout := time.Duration(req.Timeout * float64(time.Second))
	if timeout == 0 {
		exp, err := s.expiry(ctx, e)
		if err != nil {
			return out, err
		}
		timeout = time.Until(exp)
	}
	maxOut := req.MaxOutputBytes
	if maxOut == 0 {
		maxOut = s.cfg.MaxOutputBytes
	}
	return nodeapi.ExecRequest{
		Argv: req.Argv, Shell: req.Cmd, Cwd: req.Cwd, Env: env, User: req.User,
		Stdin: req.Stdin != nil, TimeoutMs: max(timeout.Milliseconds(), 1), MaxOutputBytes: maxOut, Tag: req.Tag,
		KillOnOutputLimit: req.KillOnOutputLimit, MemoryLimitBytes: int64(req.MemoryLimitMB) << 20,
	}, nil
}

// maxMemoryLimitMB bounds an exec's memory_limit_mb (1 TiB).
const maxMemoryLimitMB = 1 << 20

// execSlot admits one exec against the team's concurrent-exec limit.
func (s *Service) execSlot(ctx context.Context, teamID string) (func(), error) {
	team, err := s.Team(ctx, teamID)
	if err != nil {
		return nil, err
	}
	waitStart := time.Now()
	release, err := s.execSlots.Acquire(ctx, teamID, team.Limits.MaxConcurrentExec, max(s.cfg.ExecWait, 0))
	s.waited(queueExecSlot, waitStart)
	if errors.Is(err, quota.ErrLimit) {
		return nil, &apierr.Error{Code: client.CodeRateLimited, RetryAfter: 1, Err: err,
			Message: fmt.Sprintf("team %s is at its limit of %d concurrent execs", team.Name, team.Limits.MaxConcurrentExec)}
	}
	return release, err
}

// execute is Exec, without its metrics (metrics.go); it also returns the
// sandbox's runtime ("" when it was not found).
func (s *Service) execute(ctx context.Context, teamID, id string, req client.ExecRequest, stdout, stderr io.Writer) (client.ExecResult, string, error) {
	if req.KeepStdin {
		return client.ExecResult{}, "", errorf(client.CodeBadRequest, "keep_stdin is for background processes; an exec takes its stdin whole (stdin)")
	}
	e, err := s.lookup(ctx, teamID, id)
	if err != nil {
		return client.ExecResult{}, "", err
	}
	rt := e.row.Runtime
	areq, err := s.execRequest(ctx, e, req)
	if err != nil {
		return client.ExecResult{}, rt, err
	}
	release, err := s.execSlot(ctx, teamID)
	if err != nil {
		return client.ExecResult{}, rt, err
	}
	defer release()
	var stdin io.Reader
	if req.Stdin != nil {
		stdin = strings.NewReader(*req.Stdin)
	}
	// The agent caps output, but it runs next to untrusted code: the host
	// enforces the cap again.
	out, errw := capped(stdout, areq.MaxOutputBytes), capped(stderr, areq.MaxOutputBytes)
	exit, err := s.node.Exec(ctx, e.row.ID, areq, stdin, out, errw)
	if err != nil {
		return client.ExecResult{}, rt, s.callErr(e, err)
	}
	res := execResult(exit)
	res.StdoutTruncated = res.StdoutTruncated || out.truncated
	res.StderrTruncated = res.StderrTruncated || errw.truncated
	s.explainKill(e, exit.OOMKills, &res)
	return res, rt, nil
}

// explainKill says so when the OOM killer killed the process, or one of
// its children, while it ran: oomKills is the sandbox's count when the
// call ended.
func (s *Service) explainKill(e *entry, oomKills int64, res *client.ExecResult) {
	if n := oomKills; n > e.oomSeen.Load() {
		e.oomSeen.Store(n)
		if res.Error == "" {
			res.Error = fmt.Sprintf("out-of-memory killer: a process was killed because the sandbox went past its memory limit (memory_mb=%d)", e.row.MemoryMB)
		}
	}
}

// capWriter passes on at most n bytes and notes whether more came.
type capWriter struct {
	w         io.Writer
	n         int64
	truncated bool
}

func capped(w io.Writer, n int64) *capWriter { return &capWriter{w: w, n: n} }

func (c *capWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > c.n {
		c.truncated = true
		if c.n > 0 {
			if _, err := c.w.Write(p[:c.n]); err != nil {
				return 0, err
			}
			c.n = 0
		}
		return len(p), nil
	}
	c.n -= int64(len(p))
	if _, err := c.w.Write(p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// callErr maps a node call's error. A sandbox that stopped under the call
// (its agent went away), or that the node no longer runs, died: it is
// recorded as lost before the caller hears of it, and the error wraps
// apierr.ErrOutOfMemory when its memory limit is what killed it.
func (s *Service) callErr(e *entry, err error) error {
	if lost := (*nodeapi.NodeLostError)(nil); errors.As(err, &lost) {
		// The node went away with the sandbox: the infrastructure's
		// doing, never the code's (not ErrStoppedDuringCall).
		s.endWith(context.Background(), e, client.StateLost, lost.Error(), 0)
		return &apierr.Error{Code: client.CodeSandboxNotRunning, Err: fmt.Errorf("%w: %w", apierr.ErrNodeLost, err),
			Message: fmt.Sprintf("sandbox %s was lost with its node while the call ran: %v", e.row.ID, lost)}
	}
	var stopped *nodeapi.StoppedError
	if errors.As(err, &stopped) || errors.Is(err, nodeapi.ErrSandboxNotFound) {
		var oom int64
		if stopped != nil {
			oom = stopped.OOMKills
		}
		s.endLost(e, oom)
		// end has returned (endOnce is done): oomEnded is settled.
		if e.oomEnded {
			return &apierr.Error{Code: client.CodeSandboxNotRunning, Err: fmt.Errorf("%w: %w", apierr.ErrOutOfMemory, err),
				Message: fmt.Sprintf("sandbox %s went past its memory limit (memory_mb=%d) while the call ran and was stopped", e.row.ID, e.row.MemoryMB)}
		}
		if !e.died {
			// The server ended it meanwhile (a delete, its TTL, a
			// shutdown): not the doing of the code that ran in it.
			return &apierr.Error{Code: client.CodeSandboxNotRunning, Err: err,
				Message: fmt.Sprintf("sandbox %s was ended while the call ran", e.row.ID)}
		}
		return &apierr.Error{Code: client.CodeSandboxNotRunning, Err: fmt.Errorf("%w: %w", apierr.ErrStoppedDuringCall, err),
			Message: fmt.Sprintf("sandbox %s stopped while the call ran (it exited, was killed or ran out of memory)", e.row.ID)}
	}
	return nodeErr(err)
}

func execResult(x nodeapi.ExitInfo) client.ExecResult {
	return client.ExecResult{
		ExitCode: x.ExitCode, Status: x.Status, Signal: x.Signal, DurationMs: x.DurationMs,
		StdoutTruncated: x.StdoutTruncated, StderrTruncated: x.StderrTruncated, Error: x.Error,
		OutputLimitExceeded: x.OutputLimitExceeded, MemoryLimitExceeded: x.MemoryLimitExceeded, PeakMemoryBytes: x.PeakMemoryBytes,
	}
}

func process(p nodeapi.ProcInfo) client.Process {
	out := client.Process{ID: p.ID, Pid: p.Pid, Argv: p.Argv, Tag: p.Tag, StartedAt: p.StartedAt, Running: p.Running}
	if p.Exit != nil {
		r := execResult(*p.Exit)
		out.Result = &r
	}
	return out
}

// StartProcess starts a background command. Like an exec, it holds one of
// the team's concurrent-exec slots (queueing for one) until it ends, is
// killed, or its sandbox ends.
func (s *Service) StartProcess(ctx context.Context, teamID, id string, req client.ExecRequest) (client.Process, error) {
	e, err := s.lookup(ctx, teamID, id)
	if err != nil {
		return client.Process{}, err
	}
	if req.Stdin != nil {
		return client.Process{}, errorf(client.CodeBadRequest, "stdin is for execs: a background process keeps its stdin open with keep_stdin, then POST …/processes/{pid}/stdin")
	}
	areq, err := s.execRequest(ctx, e, req)
	if err != nil {
		return client.Process{}, err
	}
	areq.Stdin = req.KeepStdin
	release, err := s.execSlot(ctx, teamID)
	if err != nil {
		return client.Process{}, err
	}
	p, err := s.node.StartProcess(ctx, e.row.ID, areq)
	if err != nil {
		release()
		return client.Process{}, s.callErr(e, err)
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer release()
		// Returns when the process ends, or with an error when the
		// sandbox stops. A node that cannot be reached is asked again
		// until the sandbox ends: the process may still run.
		backoff := 100 * time.Millisecond
		for {
			// e.life ends with the sandbox, or when a fleet replica that
			// shuts down leaves it running on its node.
			_, err := s.node.WaitProcess(e.life, e.row.ID, p.ID)
			if e.life.Err() != nil {
				return
			}
			if !errors.Is(err, nodeapi.ErrNodeUnreachable) {
				return
			}
			select {
			case <-e.ended:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 10*time.Second)
		}
	}()
	return process(p), nil
}

// ListProcesses lists the sandbox's processes started through the API.
func (s *Service) ListProcesses(ctx context.Context, teamID, id string) ([]client.Process, error) {
	e, err := s.lookup(ctx, teamID, id)
	if err != nil {
		return nil, err
	}
	ps, err := s.node.ListProcesses(ctx, e.row.ID)
	if err != nil {
		return nil, s.callErr(e, err)
	}
	out := make([]client.Process, 0, len(ps))
	for _, p := range ps {
		out = append(out, process(p))
	}
	return out, nil
}

// GetProcess returns one process.
func (s *Service) GetProcess(ctx context.Context, teamID, id, pid string) (client.Process, error) {
	ps, err := s.ListProcesses(ctx, teamID, id)
	if err != nil {
		return client.Process{}, err
	}
	for _, p := range ps {
		if p.ID == pid {
			return p, nil
		}
	}
	return client.Process{}, errorf(client.CodeNotFound, "process %s not found in sandbox %s", pid, id)
}

// AttachProcess replays a process's output so far and follows it until it
// ends (or ctx ends).
func (s *Service) AttachProcess(ctx context.Context, teamID, id, pid string, stdout, stderr io.Writer) (client.ExecResult, error) {
	e, err := s.lookup(ctx, teamID, id)
	if err != nil {
		return client.ExecResult{}, err
	}
	out, errw := capped(stdout, s.cfg.MaxOutputLimit), capped(stderr, s.cfg.MaxOutputLimit)
	exit, err := s.node.AttachProcess(ctx, e.row.ID, pid, out, errw)
	if err != nil {
		return client.ExecResult{}, s.callErr(e, err)
	}
	res := execResult(exit)
	res.StdoutTruncated = res.StdoutTruncated || out.truncated
	res.StderrTruncated = res.StderrTruncated || errw.truncated
	s.explainKill(e, exit.OOMKills, &res)
	return res, nil
}

// MaxStdinBytes bounds the data of one WriteStdin.
const MaxStdinBytes = nodeapi.MaxStdinBytes

// WriteStdin writes data to the stdin of a background process started
// with keep_stdin, then closes it if closeAfter.
func (s *Service) WriteStdin(ctx context.Context, teamID, id, pid string, data []byte, closeAfter bool) error {
	if len(data) > MaxStdinBytes {
		return errorf(client.CodePayloadTooLarge, "stdin of %d bytes: at most %d a call", len(data), MaxStdinBytes)
	}
	e, err := s.lookup(ctx, teamID, id)
	if err != nil {
		return err
	}
	if err := s.node.WriteStdin(ctx, e.row.ID, pid, data, closeAfter); err != nil {
		return s.callErr(e, err)
	}
	return nil
}

// SignalProcess sends a signal to a process's group.
func (s *Service) SignalProcess(ctx context.Context, teamID, id, pid, signal string) error {
	sig, err := ParseSignal(signal)
	if err != nil {
		return err
	}
	e, err := s.lookup(ctx, teamID, id)
	if err != nil {
		return err
	}
	if err := s.node.SignalProcess(ctx, e.row.ID, pid, int(sig)); err != nil {
		return s.callErr(e, err)
	}
	return nil
}

// ParseSignal reads "SIGTERM", "TERM" or "15".
func ParseSignal(s string) (syscall.Signal, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n < 1 || n > 64 {
			return 0, errorf(client.CodeBadRequest, "signal %d out of range", n)
		}
		return syscall.Signal(n), nil
	}
	name := strings.TrimPrefix(strings.ToUpper(s), "SIG")
	if sig, ok := signals[name]; ok {
		return sig, nil
	}
	return 0, errorf(client.CodeBadRequest, "unknown signal %q", s)
}

var signals = map[string]syscall.Signal{
	"HUP": syscall.SIGHUP, "INT": syscall.SIGINT, "QUIT": syscall.SIGQUIT, "KILL": syscall.SIGKILL,
	"USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2, "TERM": syscall.SIGTERM, "STOP": syscall.SIGSTOP,
	"CONT": syscall.SIGCONT, "ALRM": syscall.SIGALRM, "PIPE": syscall.SIGPIPE,
}

// ConnectPort connects to a port on the loopback of a sandbox of the team
// (from inside it, through its node and agent): the backend of its port
// URLs. Nothing listening there is port_closed; an ended sandbox is
// sandbox_not_running; another team's is not_found.
func (s *Service) ConnectPort(ctx context.Context, teamID, id string, port int) (nodeapi.PortConn, error) {
	if port < 1 || port > 65535 {
		return nil, errorf(client.CodeBadRequest, "port %d: want 1 to 65535", port)
	}
	e, err := s.lookup(ctx, teamID, id)
	if err != nil {
		return nil, err
	}
	conn, err := s.node.ConnectPort(ctx, id, port)
	if err != nil {
		if ae := (*nodeapi.AgentError)(nil); errors.As(err, &ae) && ae.Code == nodeapi.CodeConnRefused {
			return nil, &apierr.Error{Code: client.CodePortClosed, Err: err,
				Message: fmt.Sprintf("nothing listens on port %d in sandbox %s", port, id)}
		}
		return nil, s.callErr(e, err)
	}
	return conn, nil
}
