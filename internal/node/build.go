package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/evalbox/evalbox/internal/agentproto"
	"github.com/evalbox/evalbox/internal/runtime"
	"github.com/evalbox/evalbox/internal/template"
)

// BuildConfig is the shape of build sandboxes, the throwaway sandboxes in
// which template build steps run.
type BuildConfig struct {
	// Runtime must be one whose sandboxes can export their copy-on-write
	// layer (runtime.UpperExporter): "gvisor".
	Runtime  string
	CPU      float64
	MemoryMB int
	// DiskMB bounds what one step may write (held in memory by gVisor).
	DiskMB int
	Pids   int
}

func (c *BuildConfig) setDefaults() {
	if c.Runtime == "" {
		c.Runtime = "gvisor"
	}
	if c.CPU == 0 {
		c.CPU = 2
	}
	if c.MemoryMB == 0 {
		c.MemoryMB = 2048
	}
	if c.DiskMB == 0 {
		c.DiskMB = 4096
	}
	if c.Pids == 0 {
		c.Pids = 4096
	}
}

// buildOutputCap bounds what one build command may print (each stream).
const buildOutputCap = 256 << 20

// stderrTailBytes is how much of a failed step's stderr its error shows.
const stderrTailBytes = 2 << 10

// RunBuildStep implements template.Runner: it starts a build sandbox whose
// root is s.RootFS (never written), runs s.Shell in it, streams its output
// to s.Output and, when the command succeeded and s.UpperTar is set, writes
// what it changed in the root filesystem there. The sandbox is destroyed
// before it returns.
func (n *Node) RunBuildStep(ctx context.Context, s template.RunStep) (res template.RunResult, err error) {
	rt, ok := n.runtimes[n.cfg.Build.Runtime]
	if !ok {
		return res, fmt.Errorf("node: template builds need the %s runtime, which this server does not run", n.cfg.Build.Runtime)
	}
	b := n.cfg.Build
	cost, err := hostCost(rt, Shape{CPU: b.CPU, MemoryMB: b.MemoryMB, DiskMB: b.DiskMB, Pids: b.Pids, Network: s.Network})
	if err != nil {
		return res, err
	}
	// A build step queues for host capacity as long as its build may run
	// (ctx carries the build timeout), before it joins n.wg: Close ends
	// the wait.
	release, err := n.reserve(ctx, cost, 0)
	var cerr *CapacityError
	if errors.As(err, &cerr) && !cerr.Never {
		n.log.Info("build step waits for host capacity", "sandbox", s.ID, "err", err)
		if s.Output != nil {
			fmt.Fprintf(s.Output, "waiting for host capacity: %v\n", err)
		}
		release, err = n.reserve(ctx, cost, -1)
	}
	if err != nil {
		return res, fmt.Errorf("node: build sandbox: %w", err)
	}
	n.mu.Lock()
	if n.isClosed() {
		n.mu.Unlock()
		release()
		return res, ErrClosed
	}
	n.wg.Add(1)
	n.mu.Unlock()
	sb, err := n.startBuildSandbox(ctx, rt, s, release)
	n.wg.Done()
	if err != nil {
		return res, err
	}
	defer n.destroy(context.WithoutCancel(ctx), sb)

	out := s.Output
	if out == nil {
		out = io.Discard
	}
	tail := &tailWriter{max: stderrTailBytes}
	info, err := sb.Agent.Exec(ctx, agentproto.ExecRequest{Shell: s.Shell, User: s.User, MaxOutputBytes: buildOutputCap},
		nil, out, io.MultiWriter(out, tail))
	if err != nil {
		return res, fmt.Errorf("node: build step: %w", err)
	}
	res = template.RunResult{Status: info.Status, ExitCode: info.ExitCode, StderrTail: string(tail.bytes())}
	if info.Status == agentproto.StatusError {
		// The command could not start (unknown user, no /bin/sh): the
		// agent says why in ExitInfo.Error.
		res.StderrTail = info.Error
	}
	if info.Status != agentproto.StatusExited || info.ExitCode != 0 || s.UpperTar == "" {
		return res, nil
	}
	ex, ok := sb.runtime().(runtime.UpperExporter)
	if !ok {
		return res, fmt.Errorf("node: the %s runtime cannot export a sandbox's changes", rt.Name())
	}
	if err := ex.ExportUpper(ctx, s.UpperTar); err != nil {
		return res, fmt.Errorf("node: %w", err)
	}
	return res, nil
}

// startBuildSandbox starts a build sandbox and adds it to the live set
// (Close and Sweep see it). On error nothing is left. It owns release
// (the sandbox's host capacity) from the start.
func (n *Node) startBuildSandbox(ctx context.Context, rt runtime.Runtime, s template.RunStep, release func()) (_ *Sandbox, err error) {
	n.mu.Lock()
	n.starting[s.ID] = struct{}{}
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		delete(n.starting, s.ID)
		n.mu.Unlock()
	}()
	stateDir := filepath.Join(n.cfg.StateDir, s.ID)
	if err := os.Mkdir(stateDir, 0o700); err != nil {
		release()
		return nil, fmt.Errorf("node: %w", err)
	}
	b := n.cfg.Build
	sb := &Sandbox{ID: s.ID, Runtime: rt.Name(), RuntimeVersion: rt.Version(), StartedAt: time.Now(), stateDir: stateDir,
		Shape: Shape{CPU: b.CPU, MemoryMB: b.MemoryMB, DiskMB: b.DiskMB, Pids: b.Pids, Network: s.Network}, release: release}
	defer func() {
		if err != nil {
			n.destroy(context.WithoutCancel(ctx), sb)
		}
	}()
	startCtx, cancel := context.WithTimeout(ctx, n.cfg.StartTimeout)
	defer cancel()
	// The agent runs as uid 0 (a name would need /etc/passwd, which an
	// imported image may lack); the step's user applies to its command.
	sb.rt, err = rt.Start(startCtx, runtime.Spec{
		ID: s.ID, RootFS: s.RootFS, AgentPath: n.cfg.AgentPath,
		AgentArgs: []string{"--workdir", s.Workdir, "--user", "0"},
		Env:       s.Env, StateDir: stateDir,
		CPU: b.CPU, MemoryMB: b.MemoryMB, DiskMB: b.DiskMB, Pids: b.Pids,
		Network: s.Network, Hostname: "build",
	})
	if err != nil {
		return nil, fmt.Errorf("node: start build sandbox %s: %w", s.ID, err)
	}
	if sb.Agent, err = agentproto.Dial(sb.rt.Conn()); err != nil {
		return nil, fmt.Errorf("node: agent %s: %w", s.ID, err)
	}
	if err := sb.Agent.Ping(startCtx); err != nil {
		return nil, fmt.Errorf("node: agent %s did not answer: %w", s.ID, err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.isClosed() {
		return nil, ErrClosed
	}
	n.live[s.ID] = sb
	return sb, nil
}

// tailWriter keeps the last max bytes written to it.
type tailWriter struct {
	max int
	buf []byte
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tailWriter) bytes() []byte { return t.buf }

// StartCmdTag tags the background process of a template's start_cmd.
const StartCmdTag = "start-cmd"

// readyCheck starts the template's start_cmd in a new sandbox, then runs
// its ready_cmd; a failure of either fails the start.
func readyCheck(ctx context.Context, sb *Sandbox) error {
	if start := sb.Template.Defaults.StartCmd; start != "" {
		p, err := sb.Agent.Start(ctx, agentproto.ExecRequest{Shell: start, Tag: StartCmdTag})
		if err != nil {
			return fmt.Errorf("node: start_cmd of %s: %w", sb.ID, err)
		}
		if p.Exit != nil && p.Exit.Status == agentproto.StatusError {
			return fmt.Errorf("node: the template's start_cmd could not start: %s", p.Exit.Error)
		}
	}
	cmd := sb.Template.Defaults.ReadyCmd
	if cmd == "" {
		return nil
	}
	tail := &tailWriter{max: stderrTailBytes}
	info, err := sb.Agent.Exec(ctx, agentproto.ExecRequest{Shell: cmd, MaxOutputBytes: 1 << 20}, nil, io.Discard, tail)
	if err != nil {
		return fmt.Errorf("node: ready_cmd of %s: %w", sb.ID, err)
	}
	if info.Status != agentproto.StatusExited || info.ExitCode != 0 {
		return errors.New("node: the template's ready_cmd failed (" + info.Status + fmt.Sprintf(", exit code %d", info.ExitCode) + "): " + string(tail.bytes()))
	}
	return nil
}
