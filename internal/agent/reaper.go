package agent

import (
	"errors"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// waitResult is how a child ended, as reported by wait4.
type waitResult struct {
	status syscall.WaitStatus
	err    error // set if the status could not be collected
}

// reaper collects the exit statuses of the agent's children. There is one
// per process: wait4 is process-wide.
//
// When the agent is PID 1 or a child subreaper, orphans are reparented to
// it, so it reaps every child (wait4(-1)) and hands the statuses of the
// ones it started to their waiters. Otherwise it must not steal the
// statuses of children it did not start (a test binary runs os/exec
// commands too), so it only waits for its own pids.
type reaper struct {
	reapAll bool
	sig     chan os.Signal

	mu      sync.Mutex // held across start+track and across each reap pass
	waiters map[int]chan waitResult
}

var (
	theReaper     *reaper
	theReaperOnce sync.Once
)

// getReaper returns the process's reaper, starting it on first use.
func getReaper() *reaper {
	theReaperOnce.Do(func() {
		r := &reaper{
			reapAll: os.Getpid() == 1 || isSubreaper(),
			sig:     make(chan os.Signal, 1),
			waiters: make(map[int]chan waitResult),
		}
		signal.Notify(r.sig, syscall.SIGCHLD)
		go r.loop()
		theReaper = r
	})
	return theReaper
}

// isSubreaper reports whether the process is a child subreaper
// (PR_SET_CHILD_SUBREAPER).
func isSubreaper() bool {
	var v int32
	if err := unix.Prctl(unix.PR_GET_CHILD_SUBREAPER, uintptr(unsafe.Pointer(&v)), 0, 0, 0); err != nil {
		return false
	}
	return v != 0
}

// start runs fork (which returns the new pid) and registers the pid before
// any reap pass can see it exit.
func (r *reaper) start(fork func() (int, error)) (int, <-chan waitResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := fork()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan waitResult, 1)
	r.waiters[pid] = ch
	return pid, ch, nil
}

func (r *reaper) loop() {
	for range r.sig {
		r.reap()
	}
}

// reap collects every child that has exited.
func (r *reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ws syscall.WaitStatus
	if r.reapAll {
		for {
			pid, err := wait4(-1, &ws)
			if err != nil || pid <= 0 {
				return
			}
			if ch, ok := r.waiters[pid]; ok {
				delete(r.waiters, pid)
				ch <- waitResult{status: ws}
			}
		}
	}
	for pid, ch := range r.waiters {
		wpid, err := wait4(pid, &ws)
		switch {
		case err != nil:
			// ECHILD: someone else collected it; its status is lost.
			delete(r.waiters, pid)
			ch <- waitResult{err: err}
		case wpid == pid:
			delete(r.waiters, pid)
			ch <- waitResult{status: ws}
		}
	}
}

// wait4 is a non-blocking wait4 that retries on EINTR.
func wait4(pid int, ws *syscall.WaitStatus) (int, error) {
	for {
		wpid, err := syscall.Wait4(pid, ws, syscall.WNOHANG, nil)
		if !errors.Is(err, syscall.EINTR) {
			return wpid, err
		}
	}
}
