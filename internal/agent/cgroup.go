package agent

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// cgroupTree gives every process the agent starts a cgroup of its own, in
// the cgroup2 directory the runtime delegated to the agent (Config.Cgroup).
// A process is born in it (clone3 with CLONE_INTO_CGROUP) and no process
// can leave it: the sandbox has no cgroup filesystem of its own to write
// to (namespaces), or only root may write there (gVisor). A tree kill is
// then one write to cgroup.kill, which the kernel applies to every member,
// forks in flight included, whatever its user, session or environment.
type cgroupTree struct {
	dir *os.File

	mu    sync.Mutex
	stale []string // cgroups of ended processes that still had members
}

func newCgroupTree(dir *os.File) *cgroupTree { return &cgroupTree{dir: dir} }

// procCgroup is the cgroup of one process tree.
type procCgroup struct {
	t    *cgroupTree
	name string

	mu     sync.Mutex
	fd     int // its directory, O_RDONLY|O_DIRECTORY; -1 once released
	killed bool
}

// create makes the cgroup of process id. Stale cgroups that have emptied
// since are removed first.
func (t *cgroupTree) create(id string) (*procCgroup, error) {
	t.sweep()
	name := "proc-" + id
	dirfd := int(t.dir.Fd())
	if err := unix.Mkdirat(dirfd, name, 0o755); err != nil {
		return nil, fmt.Errorf("cgroup %s: %w", name, err)
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
		return nil, fmt.Errorf("cgroup %s: %w", name, err)
	}
	return &procCgroup{t: t, name: name, fd: fd}, nil
}

// sweep removes the stale cgroups that have no member left.
func (t *cgroupTree) sweep() {
	t.mu.Lock()
	defer t.mu.Unlock()
	kept := t.stale[:0]
	for _, name := range t.stale {
		if err := unix.Unlinkat(int(t.dir.Fd()), name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
			kept = append(kept, name)
		}
	}
	t.stale = kept
}

// kill kills every member of the cgroup and waits, until deadline, for
// them to be gone. It reports whether the cgroup is empty. After release
// it does nothing (the descriptor number may name another file by then).
func (g *procCgroup) kill(deadline time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.fd < 0 {
		return true
	}
	g.killed = true
	if err := g.write("cgroup.kill", "1"); err != nil {
		// No cgroup.kill (Linux < 5.14): signal the members one by one
		// until none is left; membership still holds every one of them.
		g.killMembers(deadline)
	}
	for delay := 200 * time.Microsecond; ; delay = min(2*delay, 10*time.Millisecond) {
		if !g.populated() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(delay)
	}
}

// killMembers stops and kills the members read from cgroup.procs, again
// and again until none is left or deadline.
func (g *procCgroup) killMembers(deadline time.Time) {
	for {
		pids := g.procs()
		if len(pids) == 0 || time.Now().After(deadline) {
			return
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGSTOP)
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(time.Millisecond)
	}
}

// descriptor is the cgroup's descriptor, for CLONE_INTO_CGROUP, before
// release.
func (g *procCgroup) descriptor() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.fd
}

// populated reports whether a process is in the cgroup (or below it).
func (g *procCgroup) populated() bool {
	b, err := g.read("cgroup.events")
	if err != nil {
		// Unreadable: fall back on the member list.
		return len(g.procs()) > 0
	}
	return !bytes.Contains(b, []byte("populated 0"))
}

func (g *procCgroup) procs() []int {
	b, err := g.read("cgroup.procs")
	if err != nil {
		return nil
	}
	var pids []int
	for f := range bytes.FieldsSeq(b) {
		if pid, err := strconv.Atoi(string(f)); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// release closes the cgroup and removes it, or, while members remain
// (daemons a process left when it ended on its own), keeps it for a later
// sweep.
func (g *procCgroup) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.fd < 0 {
		return
	}
	unix.Close(g.fd)
	g.fd = -1
	dirfd := int(g.t.dir.Fd())
	if err := unix.Unlinkat(dirfd, g.name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		g.t.mu.Lock()
		g.t.stale = append(g.t.stale, g.name)
		g.t.mu.Unlock()
	}
}

func (g *procCgroup) read(name string) ([]byte, error) {
	fd, err := unix.Openat(g.fd, name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	buf := make([]byte, 4096)
	var out []byte
	for {
		n, err := unix.Read(fd, buf)
		if n > 0 {
			out = append(out, buf[:n]...)
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return out, nil
		}
	}
}

func (g *procCgroup) write(name, val string) error {
	fd, err := unix.Openat(g.fd, name, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	_, err = unix.Write(fd, []byte(val))
	return err
}
