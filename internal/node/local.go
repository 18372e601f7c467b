package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"time"

	"github.com/evalbox/evalbox/internal/agentproto"
	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/pkg/client"
)

// Local is the node's nodeapi.Node: the contract served in process, which
// the embedded server's control plane uses. Nothing is serialised: the
// contract's request and result types convert to the agent protocol's
// (same fields), streams are the caller's own readers and writers, and a
// call costs a lookup of the sandbox by id on top of the agent call.
type Local struct{ n *Node }

var _ nodeapi.Node = (*Local)(nil)

// NewLocal returns n's contract.
func NewLocal(n *Node) *Local { return &Local{n: n} }

// sandbox returns the live sandbox id, which must not be paused.
func (l *Local) sandbox(id string) (*Sandbox, error) {
	sb, err := l.n.liveSandbox(id)
	if err != nil {
		return nil, err
	}
	if sb.paused.Load() {
		return nil, errPaused(id)
	}
	return sb, nil
}

// callErr maps an agent call's error to the contract's: an agent's refusal
// to *nodeapi.AgentError, a lost session to *nodeapi.StoppedError. Context
// and transport errors pass as they are.
func callErr(sb *Sandbox, err error) error {
	if err == nil {
		return nil
	}
	if ae := (*agentproto.Error)(nil); errors.As(err, &ae) {
		return &nodeapi.AgentError{Code: ae.Code, Message: ae.Message}
	}
	if errors.Is(err, agentproto.ErrSessionClosed) {
		return &nodeapi.StoppedError{ID: sb.ID, OOMKills: sb.OOMKills()}
	}
	if errors.Is(err, agentproto.ErrSuspended) {
		if sb.paused.Load() {
			return errPaused(sb.ID)
		}
		return &apierr.Error{Code: client.CodeConflict, Message: fmt.Sprintf("the call was cut off by a snapshot or pause of sandbox %s: try it again", sb.ID)}
	}
	return err
}

func exitInfo(x agentproto.ExitInfo, oomKills int64) nodeapi.ExitInfo {
	return nodeapi.ExitInfo{Status: x.Status, ExitCode: x.ExitCode, Signal: x.Signal, DurationMs: x.DurationMs,
		StdoutTruncated: x.StdoutTruncated, StderrTruncated: x.StderrTruncated, Error: x.Error, OOMKills: oomKills,
		OutputLimitExceeded: x.OutputLimitExceeded, MemoryLimitExceeded: x.MemoryLimitExceeded, PeakMemoryBytes: x.PeakMemoryBytes}
}

func procInfo(p agentproto.ProcInfo) nodeapi.ProcInfo {
	out := nodeapi.ProcInfo{ID: p.ID, Pid: p.Pid, Argv: p.Argv, Tag: p.Tag, StartedAt: p.StartedAt, Running: p.Running}
	if p.Exit != nil {
		x := exitInfo(*p.Exit, 0)
		out.Exit = &x
	}
	return out
}

// Runtimes lists the node's runtimes.
func (l *Local) Runtimes(context.Context) ([]string, error) { return l.n.Runtimes(), nil }

// Capacity reports the node's host capacity.
func (l *Local) Capacity(context.Context) (nodeapi.CapacityStatus, error) {
	st := l.n.capacity.Status()
	return nodeapi.CapacityStatus{
		Budget:          nodeapi.Resources(st.Budget),
		Reserved:        nodeapi.Resources(st.Reserved),
		MemoryAvailable: st.MemoryAvailable, MemoryReserve: st.MemoryReserve,
		Sandboxes: st.Sandboxes, Waiting: st.Waiting,
	}, nil
}

// TemplatesPresent returns the digests whose template the node's registry
// holds.
func (l *Local) TemplatesPresent(_ context.Context, digests []string) ([]string, error) {
	present := []string{}
	for _, d := range digests {
		if _, err := l.n.cfg.Templates.ByDigest(d); err == nil {
			present = append(present, d)
		}
	}
	return present, nil
}

// SetPool sets a warm pool, once its runtime and template are known here.
func (l *Local) SetPool(_ context.Context, p nodeapi.PoolSpec) error {
	if _, ok := l.n.runtimes[p.Spec.Runtime]; !ok {
		return fmt.Errorf("node: pool %s: %w: %q", p.TemplateName, ErrUnknownRuntime, p.Spec.Runtime)
	}
	if _, err := l.n.cfg.Templates.ByDigest(p.Spec.Template); err != nil {
		return &nodeapi.TemplateMissingError{Digest: p.Spec.Template}
	}
	l.n.setPool(p.Spec, p.TemplateName, p.Target)
	return nil
}

// Pools reports the node's warm pools.
func (l *Local) Pools(context.Context) ([]nodeapi.PoolStatus, error) { return l.n.Pools(), nil }

// Create starts (or claims from the pool) a sandbox of req.Spec.
func (l *Local) Create(ctx context.Context, req nodeapi.CreateRequest) (nodeapi.SandboxInfo, error) {
	var sb *Sandbox
	var err error
	if req.Snapshot != "" {
		// The rules are in force before the restored processes run.
		sb, err = l.n.CreateFromSnapshot(ctx, req.Snapshot, req.Spec, req.Wait, req.Egress)
	} else {
		sb, err = l.n.Create(ctx, req.Spec, req.Wait)
	}
	if err != nil {
		return nodeapi.SandboxInfo{}, err
	}
	// A snapshot's copy has its source's environment, req.Env over it
	// (never its source's secrets: a snapshot does not keep them).
	env := sb.BaseEnv()
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, req.Env)
	sb.SetEnv(env)
	sb.SetSecrets(req.Secrets)
	if req.Egress != nil && req.Snapshot == "" {
		// Before the sandbox is handed out: nothing of the caller's has run
		// in it yet.
		if err := sb.SetEgress(ctx, req.Egress); err != nil {
			if derr := l.n.Destroy(context.WithoutCancel(ctx), sb.ID); derr != nil {
				l.n.log.Error("destroying a sandbox whose egress rules failed", "sandbox", sb.ID, "err", derr)
			}
			return nodeapi.SandboxInfo{}, err
		}
	}
	return nodeapi.SandboxInfo{ID: sb.ID, Runtime: sb.Runtime, RuntimeVersion: sb.RuntimeVersion,
		StartedAt: sb.StartedAt, FromPool: sb.FromPool, EgressApplied: req.Egress != nil}, nil
}

// Snapshot snapshots a running sandbox.
func (l *Local) Snapshot(ctx context.Context, id string) (nodeapi.SnapshotInfo, error) {
	m, err := l.n.Snapshot(ctx, id)
	if err != nil {
		return nodeapi.SnapshotInfo{}, err
	}
	return m.Info(), nil
}

// DeleteSnapshot removes a snapshot.
func (l *Local) DeleteSnapshot(_ context.Context, id string) error { return l.n.DeleteSnapshot(id) }

// Pause pauses a sandbox.
func (l *Local) Pause(ctx context.Context, id string) error { return l.n.Pause(ctx, id) }

// Resume resumes a paused sandbox.
func (l *Local) Resume(ctx context.Context, id string, wait time.Duration) error {
	return l.n.Resume(ctx, id, wait)
}

// SetEgress replaces a sandbox's egress rules.
func (l *Local) SetEgress(ctx context.Context, id string, e *nodeapi.Egress) error {
	sb, err := l.sandbox(id)
	if err != nil {
		return err
	}
	return sb.SetEgress(ctx, e)
}

// Destroy destroys a sandbox.
func (l *Local) Destroy(ctx context.Context, id string) error { return l.n.Destroy(ctx, id) }

// Wait returns when the sandbox's agent session ends.
func (l *Local) Wait(ctx context.Context, id string) (nodeapi.End, error) {
	sb, err := l.n.liveSandbox(id) // paused ones too

	if err != nil {
		return nodeapi.End{}, err
	}
	select {
	case <-ctx.Done():
		return nodeapi.End{}, ctx.Err()
	case <-sb.Done():
	}
	reason := "its agent went away (it exited, was killed or ran out of memory)"
	if sb.destroyed.Load() {
		reason = "destroyed"
	}
	return nodeapi.End{Reason: reason, OOMKills: sb.OOMKills()}, nil
}

// Exec runs a foreground process.
func (l *Local) Exec(ctx context.Context, id string, req nodeapi.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (nodeapi.ExitInfo, error) {
	sb, err := l.sandbox(id)
	if err != nil {
		return nodeapi.ExitInfo{}, err
	}
	req.Env = sb.ExecEnv(req.Env)
	x, err := sb.Agent.Exec(ctx, agentproto.ExecRequest(req), stdin, stdout, stderr)
	if err != nil {
		return nodeapi.ExitInfo{}, callErr(sb, err)
	}
	return exitInfo(x, sb.OOMKills()), nil
}

// ConnectPort connects to a port on the sandbox's loopback through its
// agent.
func (l *Local) ConnectPort(ctx context.Context, id string, port int) (nodeapi.PortConn, error) {
	sb, err := l.sandbox(id)
	if err != nil {
		return nil, err
	}
	c, err := sb.Agent.Connect(ctx, port)
	if err != nil {
		return nil, callErr(sb, err)
	}
	return &localPortConn{c: c, sb: sb}, nil
}

// WatchDir watches a directory of the sandbox through its agent.
func (l *Local) WatchDir(ctx context.Context, id, path string, recursive bool) (nodeapi.DirWatch, error) {
	sb, err := l.sandbox(id)
	if err != nil {
		return nil, err
	}
	w, err := sb.Agent.Watch(ctx, path, recursive)
	if err != nil {
		return nil, callErr(sb, err)
	}
	return &localWatch{w: w, sb: sb}, nil
}

// localWatch maps the agent watch's errors to the contract's.
type localWatch struct {
	w  *agentproto.Watcher
	sb *Sandbox
}

func (w *localWatch) Next() (nodeapi.WatchEvent, error) {
	ev, err := w.w.Next()
	if err != nil && err != io.EOF {
		err = callErr(w.sb, err)
	}
	return nodeapi.WatchEvent(ev), err
}

func (w *localWatch) Close() error { return w.w.Close() }

// localPortConn maps the agent connection's errors to the contract's.
type localPortConn struct {
	c  *agentproto.Conn
	sb *Sandbox
}

func (p *localPortConn) Read(b []byte) (int, error) {
	n, err := p.c.Read(b)
	if err != nil && err != io.EOF {
		err = callErr(p.sb, err)
	}
	return n, err
}

func (p *localPortConn) Write(b []byte) (int, error) {
	n, err := p.c.Write(b)
	return n, callErr(p.sb, err)
}

func (p *localPortConn) CloseWrite() error { return callErr(p.sb, p.c.CloseWrite()) }
func (p *localPortConn) Close() error      { return p.c.Close() }

// StartProcess starts a background process.
func (l *Local) StartProcess(ctx context.Context, id string, req nodeapi.ExecRequest) (nodeapi.ProcInfo, error) {
	sb, err := l.sandbox(id)
	if err != nil {
		return nodeapi.ProcInfo{}, err
	}
	req.Env = sb.ExecEnv(req.Env)
	p, err := sb.Agent.Start(ctx, agentproto.ExecRequest(req))
	if err != nil {
		return nodeapi.ProcInfo{}, callErr(sb, err)
	}
	return procInfo(p), nil
}

// ListProcesses lists a sandbox's processes.
func (l *Local) ListProcesses(ctx context.Context, id string) ([]nodeapi.ProcInfo, error) {
	sb, err := l.sandbox(id)
	if err != nil {
		return nil, err
	}
	ps, err := sb.Agent.List(ctx)
	if err != nil {
		return nil, callErr(sb, err)
	}
	out := make([]nodeapi.ProcInfo, len(ps))
	for i, p := range ps {
		out[i] = procInfo(p)
	}
	return out, nil
}

// AttachProcess follows a background process's output.
func (l *Local) AttachProcess(ctx context.Context, id, procID string, stdout, stderr io.Writer) (nodeapi.ExitInfo, error) {
	sb, err := l.sandbox(id)
	if err != nil {
		return nodeapi.ExitInfo{}, err
	}
	x, err := sb.Agent.Attach(ctx, procID, stdout, stderr)
	if err != nil {
		return nodeapi.ExitInfo{}, callErr(sb, err)
	}
	return exitInfo(x, sb.OOMKills()), nil
}

// WaitProcess waits for a background process to end.
func (l *Local) WaitProcess(ctx context.Context, id, procID string) (nodeapi.ExitInfo, error) {
	sb, err := l.sandbox(id)
	if err != nil {
		return nodeapi.ExitInfo{}, err
	}
	x, err := sb.Agent.Wait(ctx, procID)
	if err != nil {
		return nodeapi.ExitInfo{}, callErr(sb, err)
	}
	return exitInfo(x, sb.OOMKills()), nil
}

// SignalProcess signals a background process's group.
func (l *Local) SignalProcess(ctx context.Context, id, procID string, sig int) error {
	sb, err := l.sandbox(id)
	if err != nil {
		return err
	}
	return callErr(sb, sb.Agent.Signal(ctx, procID, sig))
}

// WriteStdin writes to a background process's stdin.
func (l *Local) WriteStdin(ctx context.Context, id, procID string, data []byte, closeAfter bool) error {
	if len(data) > nodeapi.MaxStdinBytes {
		return fmt.Errorf("node: stdin of %d bytes: at most %d a call", len(data), nodeapi.MaxStdinBytes)
	}
	sb, err := l.sandbox(id)
	if err != nil {
		return err
	}
	return callErr(sb, sb.Agent.WriteStdin(ctx, procID, data, closeAfter))
}

// WriteFile streams r into a file of the sandbox.
func (l *Local) WriteFile(ctx context.Context, id, path string, r io.Reader, opts nodeapi.WriteOptions) (nodeapi.FileInfo, error) {
	sb, err := l.sandbox(id)
	if err != nil {
		return nodeapi.FileInfo{}, err
	}
	fi, err := sb.Agent.WriteFile(ctx, path, r, agentproto.WriteOptions(opts))
	if err != nil {
		return nodeapi.FileInfo{}, callErr(sb, err)
	}
	return nodeapi.FileInfo(fi), nil
}

// OpenFile opens a file of the sandbox for reading.
func (l *Local) OpenFile(ctx context.Context, id, path string) (nodeapi.FileInfo, io.ReadCloser, error) {
	sb, err := l.sandbox(id)
	if err != nil {
		return nodeapi.FileInfo{}, nil, err
	}
	fi, rc, err := sb.Agent.OpenFile(ctx, path)
	if err != nil {
		return nodeapi.FileInfo{}, nil, callErr(sb, err)
	}
	return nodeapi.FileInfo(fi), &fileReader{sb: sb, rc: rc}, nil
}

// fileReader maps the errors of a download midway to the contract's.
type fileReader struct {
	sb *Sandbox
	rc io.ReadCloser
}

func (f *fileReader) Read(p []byte) (int, error) {
	n, err := f.rc.Read(p)
	if err != nil && err != io.EOF {
		err = callErr(f.sb, err)
	}
	return n, err
}

func (f *fileReader) Close() error { return f.rc.Close() }

// Stat describes a path of the sandbox.
func (l *Local) Stat(ctx context.Context, id, path string) (nodeapi.FileInfo, error) {
	sb, err := l.sandbox(id)
	if err != nil {
		return nodeapi.FileInfo{}, err
	}
	fi, err := sb.Agent.Stat(ctx, path)
	if err != nil {
		return nodeapi.FileInfo{}, callErr(sb, err)
	}
	return nodeapi.FileInfo(fi), nil
}

// ListDir lists a directory of the sandbox.
func (l *Local) ListDir(ctx context.Context, id, path string) ([]nodeapi.FileInfo, error) {
	sb, err := l.sandbox(id)
	if err != nil {
		return nil, err
	}
	fs, err := sb.Agent.ListDir(ctx, path)
	if err != nil {
		return nil, callErr(sb, err)
	}
	out := make([]nodeapi.FileInfo, len(fs))
	for i, f := range fs {
		out[i] = nodeapi.FileInfo(f)
	}
	return out, nil
}

// Mkdir creates a directory in the sandbox.
func (l *Local) Mkdir(ctx context.Context, id, path string, opts nodeapi.MkdirOptions) (nodeapi.FileInfo, error) {
	sb, err := l.sandbox(id)
	if err != nil {
		return nodeapi.FileInfo{}, err
	}
	fi, err := sb.Agent.Mkdir(ctx, path, opts.Mode, opts.Parents, opts.User)
	if err != nil {
		return nodeapi.FileInfo{}, callErr(sb, err)
	}
	return nodeapi.FileInfo(fi), nil
}

// Remove removes a path in the sandbox.
// Rename moves a file of the sandbox.
func (l *Local) Rename(ctx context.Context, id, path, target string) (nodeapi.FileInfo, error) {
	sb, err := l.sandbox(id)
	if err != nil {
		return nodeapi.FileInfo{}, err
	}
	fi, err := sb.Agent.Rename(ctx, path, target)
	if err != nil {
		return nodeapi.FileInfo{}, callErr(sb, err)
	}
	return nodeapi.FileInfo(fi), nil
}

func (l *Local) Remove(ctx context.Context, id, path string, recursive bool) error {
	sb, err := l.sandbox(id)
	if err != nil {
		return err
	}
	return callErr(sb, sb.Agent.Remove(ctx, path, recursive))
}
