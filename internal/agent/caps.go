package agent

import (
	"fmt"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// AgentOnlyCaps are capabilities a runtime may grant the agent for itself
// that no process it starts may hold.
//
// CAP_SYS_RESOURCE: gVisor counts RLIMIT_NPROC per user, threads included,
// and exempts only tasks holding CAP_SYS_RESOURCE (or CAP_SYS_ADMIN). The
// agent runs as root, so a fork bomb run as root would take the whole
// budget, and the agent's Go runtime, unable to create a thread it needs,
// would die (fatal error: newosproc) and take the sandbox with it. Held by
// the agent only, it keeps the agent above the limit its commands meet.
var AgentOnlyCaps = []uintptr{unix.CAP_SYS_RESOURCE}

// SealCapabilities takes AgentOnlyCaps out of the bounding set of every
// thread of the agent, and out of the ambient set: the agent keeps them
// (effective, permitted), and a process it starts cannot gain them, not
// even as root (at exec, root's permitted set is the bounding set). Threads
// made later inherit their creator's bounding set, so it covers those too.
// A capability the agent was not given is left alone; dropping one it was
// given needs CAP_SETPCAP.
func SealCapabilities() error {
	for _, c := range AgentOnlyCaps {
		in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, c, 0, 0, 0)
		if err != nil {
			return fmt.Errorf("agent: read bounding capability %d: %w", c, err)
		}
		if in == 0 {
			continue
		}
		// Not unix.Prctl: the bounding set is per thread, and every thread
		// of the agent may fork a command.
		if _, _, errno := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, c, 0); errno != 0 {
			return fmt.Errorf("agent: drop capability %d from the bounding set: %w", c, errno)
		}
		if _, _, errno := syscall.AllThreadsSyscall6(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_LOWER, c, 0, 0, 0); errno != 0 && errno != unix.EINVAL {
			return fmt.Errorf("agent: lower ambient capability %d: %w", c, errno)
		}
	}
	return nil
}

// KeepSpareThreads makes n threads now and leaves them idle, for a runtime
// whose sandbox has one pids limit for the agent and its commands (the
// namespaces runtime's cgroup): a command that takes every pid left would
// otherwise leave the agent's Go runtime unable to make a thread it needs
// (fatal error: newosproc), which kills the agent and loses the sandbox.
// The Go runtime never ends an idle thread, so these serve its later needs
// (one per goroutine blocked in a syscall) instead of new ones.
func KeepSpareThreads(n int) {
	if n <= 0 {
		return
	}
	var started, release sync.WaitGroup
	release.Add(1)
	for range n {
		started.Add(1)
		go func() {
			// Locked, every goroutine holds a thread of its own until all
			// of them run; unlocked before it returns, its thread stays.
			runtime.LockOSThread()
			started.Done()
			release.Wait()
			runtime.UnlockOSThread()
		}()
	}
	started.Wait()
	release.Done()
}
