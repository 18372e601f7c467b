package namespaces

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"time"

	"github.com/evalbox/evalbox/internal/netrules"
	"github.com/evalbox/evalbox/internal/runtime"
	"github.com/evalbox/evalbox/internal/runtime/cgroups"
	"github.com/evalbox/evalbox/internal/runtime/network"
	"golang.org/x/sys/unix"
)

// Sandbox is a running namespaces sandbox. Besides runtime.Sandbox it
// exposes Done and Err, to notice the agent's death without reading Conn.
type Sandbox struct {
	rt    *Runtime
	id    string
	pid   int
	cmd   *exec.Cmd
	cg    *cgroups.Cgroup
	conn  *conn
	lease *network.Lease
	ids   idBlock // the host ids its user namespace maps
	// idsReleased is set once ids went back (under destroyMu).
	idsReleased bool
	// upper is a descriptor of the upper directory of its overlay, its
	// copy-on-write layer (-1 once closed, under destroyMu): ExportUpper
	// reads it.
	upper int

	done    chan struct{} // closed once the sandbox's init (the agent) is reaped
	exitErr error         // how it exited; written before done is closed
	logDone chan struct{} // closed once agent.log is written and closed

	destroyMu sync.Mutex
	destroyed bool
}

var _ runtime.Sandbox = (*Sandbox)(nil)

// wait reaps the sandbox's init process. When it exits the kernel kills
// every other process of its PID namespace.
func (s *Sandbox) wait() {
	s.exitErr = s.cmd.Wait()
	close(s.done)
}

// ID returns the sandbox id.
func (s *Sandbox) ID() string { return s.id }

// Pid returns the host pid of the sandbox's first process (the agent).
func (s *Sandbox) Pid() int { return s.pid }

// Conn returns the byte stream to the agent: writes go to its stdin, reads
// come from its stdout. Reads return io.EOF once the agent has exited.
func (s *Sandbox) Conn() io.ReadWriteCloser { return s.conn }

// Done is closed when the sandbox's agent has exited (and with it every
// process of the sandbox), whether by Destroy or on its own.
func (s *Sandbox) Done() <-chan struct{} { return s.done }

// Err reports how the agent exited (an *exec.ExitError, or nil for exit
// status 0). It is only meaningful after Done is closed.
func (s *Sandbox) Err() error {
	select {
	case <-s.done:
		return s.exitErr
	default:
		return nil
	}
}

// Destroy kills every process of the sandbox, waits for them to be gone,
// and removes its cgroup and network link. Its mounts lived in its own
// mount namespace and are gone with its processes. Spec.StateDir is left
// for the caller. Destroy is idempotent and safe for concurrent use; after
// a failure (e.g. ctx expired) it can be called again.
func (s *Sandbox) Destroy(ctx context.Context) error {
	s.destroyMu.Lock()
	defer s.destroyMu.Unlock()
	if s.destroyed {
		return nil
	}
	// Kill uses the pidfd, so it cannot hit a recycled pid; it fails
	// harmlessly once the process has been reaped.
	_ = s.cmd.Process.Kill()
	select {
	case <-s.done:
	case <-ctx.Done():
		return fmt.Errorf("namespaces: destroy %s: %w", s.id, ctx.Err())
	}
	select {
	case <-s.logDone:
	case <-ctx.Done():
		return fmt.Errorf("namespaces: destroy %s: %w", s.id, ctx.Err())
	}
	// The PID namespace is empty now; the cgroup kill is a safety net.
	if err := s.cg.KillAll(ctx); err != nil {
		return fmt.Errorf("namespaces: destroy %s: %w", s.id, err)
	}
	// No process holds the sandbox's ids any more.
	if !s.idsReleased {
		s.rt.ids.release(s.ids)
		s.idsReleased = true
	}
	if s.lease != nil {
		s.rt.net.Detach(s.lease)
		s.lease = nil
	}
	if err := s.cg.Remove(ctx); err != nil {
		return fmt.Errorf("namespaces: destroy %s: %w", s.id, err)
	}
	s.conn.Close()
	s.closeUpperLocked()
	s.destroyed = true
	s.rt.mu.Lock()
	if s.rt.live[s.id] == s {
		delete(s.rt.live, s.id)
	}
	s.rt.mu.Unlock()
	return nil
}

func (s *Sandbox) closeUpper() {
	s.destroyMu.Lock()
	defer s.destroyMu.Unlock()
	s.closeUpperLocked()
}

func (s *Sandbox) closeUpperLocked() {
	if s.upper >= 0 {
		unix.Close(s.upper)
		s.upper = -1
	}
}

// ExportUpper implements runtime.UpperExporter: what the sandbox changed
// in its root filesystem, read through the descriptor of its layer with
// the sandbox frozen (its cgroup's freezer), so that the archive is of one
// moment. At most the size of its disk of file content is written (a
// sparse file can seem larger: runtime.ErrUpperTooLarge). A Destroy meanwhile
// waits for it.
func (s *Sandbox) ExportUpper(ctx context.Context, p string) (err error) {
	s.destroyMu.Lock()
	defer s.destroyMu.Unlock()
	if s.destroyed || s.upper < 0 {
		return fmt.Errorf("namespaces: export %s: the sandbox is gone", s.id)
	}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(s.upper, &sfs); err != nil {
		return fmt.Errorf("namespaces: export %s: %w", s.id, err)
	}
	limit := int64(sfs.Blocks) * sfs.Bsize
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("namespaces: export %s: %w", s.id, err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("namespaces: export %s: %w", s.id, cerr)
		}
		if err != nil {
			_ = os.Remove(p)
		}
	}()
	if err := s.cg.Freeze(ctx); err != nil {
		return fmt.Errorf("namespaces: export %s: %w", s.id, err)
	}
	defer func() {
		if terr := s.cg.Thaw(); err == nil && terr != nil {
			err = fmt.Errorf("namespaces: export %s: %w", s.id, terr)
		}
	}()
	w := bufio.NewWriterSize(f, 1<<20)
	if err := exportUpper(ctx, s.upper, s.ids.hostID, limit, w); err != nil {
		return fmt.Errorf("namespaces: export %s: %w", s.id, err)
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("namespaces: export %s: %w", s.id, err)
	}
	return nil
}

var _ runtime.UpperExporter = (*Sandbox)(nil)

// OOMKills implements runtime.Sandbox.
func (s *Sandbox) OOMKills() (int64, error) { return s.cg.OOMKills() }

// CPUUsage implements runtime.CPUController.
func (s *Sandbox) CPUUsage() (time.Duration, error) { return s.cg.CPUUsage() }

// CPULimit implements runtime.CPUController.
func (s *Sandbox) CPULimit() (float64, error) { return s.cg.CPULimit() }

// SetCPULimit implements runtime.CPUController.
func (s *Sandbox) SetCPULimit(cpu float64) error { return s.cg.SetCPULimit(cpu) }

// Usage reports the memory charged to the sandbox's cgroup and the summed
// resident set size of its processes (shared pages counted once per
// process).
func (s *Sandbox) Usage(ctx context.Context) (runtime.Usage, error) {
	mem, err := s.cg.MemoryUsage()
	if err != nil {
		return runtime.Usage{}, fmt.Errorf("namespaces: usage %s: %w", s.id, err)
	}
	pids, err := s.cg.Procs()
	if err != nil {
		return runtime.Usage{}, fmt.Errorf("namespaces: usage %s: %w", s.id, err)
	}
	var rss int64
	page := int64(os.Getpagesize())
	buf := make([]byte, 0, 128)
	for _, pid := range pids {
		if err := ctx.Err(); err != nil {
			return runtime.Usage{}, err
		}
		buf = strconv.AppendInt(append(buf[:0], "/proc/"...), int64(pid), 10)
		b, err := os.ReadFile(string(append(buf, "/statm"...)))
		if err != nil {
			continue // exited meanwhile
		}
		// statm: size resident shared text lib data dt (pages)
		f := bytes.Fields(b)
		if len(f) < 2 {
			continue
		}
		n, err := strconv.ParseInt(string(f[1]), 10, 64)
		if err == nil {
			rss += n * page
		}
	}
	return runtime.Usage{MemoryBytes: mem, RSSBytes: rss}, nil
}

// conn is the agent's stdin (w) and stdout (r) as one stream.
type conn struct {
	r, w *os.File
	once sync.Once
	err  error
}

func (c *conn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *conn) Write(p []byte) (int, error) { return c.w.Write(p) }

// Close closes both directions; pending Reads and Writes return.
func (c *conn) Close() error {
	c.once.Do(func() { c.err = errors.Join(c.r.Close(), c.w.Close()) })
	return c.err
}

// SetEgress limits an outbound sandbox's egress (runtime.EgressFilter).
func (s *Sandbox) SetEgress(ctx context.Context, r *netrules.Rules) error {
	s.destroyMu.Lock()
	defer s.destroyMu.Unlock()
	if s.destroyed || s.lease == nil {
		return fmt.Errorf("namespaces: sandbox %s has no network (or was destroyed)", s.id)
	}
	return s.rt.net.SetEgress(ctx, s.lease, r)
}
