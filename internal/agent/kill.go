package agent

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
	"time"
)

// markerEnv is the environment variable that marks every process the agent
// starts (and, by inheritance, all their descendants) with the id of the
// process they belong to. It finds daemons that left the process group
// and were reparented away.
const markerEnv = "EVALBOX_PROC"

// killTreeBudget bounds how long killTree keeps scanning for survivors.
const killTreeBudget = 3 * time.Second

// killTree kills the process tree of root: its process group, every
// descendant of a member, and every process whose environment carries
// marker (markerEnv=id followed by NUL), including double-forked daemons.
// Members are stopped (SIGSTOP) before they are killed so that none can
// fork a new one between the scan and the kill; scans repeat until none is
// left alive (zombies do not count) or the budget is spent.
func killTree(root int, marker []byte) {
	syscall.Kill(-root, syscall.SIGKILL)
	deadline := time.Now().Add(killTreeBudget)
	stopped := make(map[int]bool)
	delay := 500 * time.Microsecond
	var sc procScanner
	for {
		members := sc.scan(root, marker)
		if len(members) == 0 {
			return
		}
		fresh := false
		for _, pid := range members {
			if !stopped[pid] {
				stopped[pid] = true
				fresh = true
				syscall.Kill(pid, syscall.SIGSTOP)
			}
		}
		if fresh && time.Now().Before(deadline) {
			// A member may have forked between the scan and its stop:
			// scan again before killing.
			continue
		}
		for _, pid := range members {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(delay)
		delay = min(2*delay, 20*time.Millisecond)
	}
}

// procScanner reads /proc, reusing its buffers between scans.
type procScanner struct {
	buf      []byte
	parentOf map[int]int
	member   map[int]bool
}

// scan returns the live (non-zombie) processes that belong to the tree of
// root: members of its process group, holders of marker, and their
// descendants. The agent itself and PID 1 are never members.
func (sc *procScanner) scan(root int, marker []byte) []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	if sc.parentOf == nil {
		sc.parentOf = make(map[int]int)
		sc.member = make(map[int]bool)
		sc.buf = make([]byte, 4096)
	}
	clear(sc.parentOf)
	clear(sc.member)
	self := os.Getpid()
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil || pid == self || pid == 1 {
			continue
		}
		ppid, pgid, live := sc.stat(pid)
		if !live || ppid == 2 { // gone, zombie, or a kernel thread
			continue
		}
		sc.parentOf[pid] = ppid
		if pgid == root || pid == root || sc.hasMarker(pid, marker) {
			sc.member[pid] = true
		}
	}
	// Add descendants of members until nothing changes.
	for changed := true; changed; {
		changed = false
		for pid, ppid := range sc.parentOf {
			if !sc.member[pid] && sc.member[ppid] {
				sc.member[pid] = true
				changed = true
			}
		}
	}
	members := make([]int, 0, len(sc.member))
	for pid := range sc.member {
		members = append(members, pid)
	}
	return members
}

// stat reads the parent and process group of pid from /proc/pid/stat;
// live is false if the process is gone or a zombie. A process whose main
// thread exited while other threads run shows as a zombie too: it is live
// while it has more than that one thread (num_threads, field 20).
func (sc *procScanner) stat(pid int) (ppid, pgid int, live bool) {
	b := sc.read("/proc/"+strconv.Itoa(pid)+"/stat", false)
	// pid (comm) state ppid pgrp ...; comm may hold spaces and parens.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	fields := bytes.Fields(b[i+1:])
	if len(fields) < 3 {
		return 0, 0, false
	}
	if s := fields[0]; len(s) == 1 && (s[0] == 'Z' || s[0] == 'X' || s[0] == 'x') {
		if len(fields) < 18 {
			return 0, 0, false
		}
		if n, err := strconv.Atoi(string(fields[17])); err != nil || n <= 1 {
			return 0, 0, false
		}
	}
	ppid, err1 := strconv.Atoi(string(fields[1]))
	pgid, err2 := strconv.Atoi(string(fields[2]))
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return ppid, pgid, true
}

// hasMarker reports whether the environment of pid holds marker as a
// whole entry.
func (sc *procScanner) hasMarker(pid int, marker []byte) bool {
	dir := "/proc/" + strconv.Itoa(pid)
	env := sc.read(dir+"/environ", true)
	if len(env) == 0 {
		// A process whose main thread exited: its environment is read
		// through a thread that still runs.
		if tids, err := os.ReadDir(dir + "/task"); err == nil {
			for _, tid := range tids {
				if env = sc.read(dir+"/task/"+tid.Name()+"/environ", true); len(env) > 0 {
					break
				}
			}
		}
	}
	for {
		i := bytes.Index(env, marker)
		if i < 0 {
			return false
		}
		// At the start, or right after the NUL ending another entry (the
		// marker itself ends with NUL, so a cut is always at a boundary).
		if i == 0 || env[i-1] == 0 {
			return true
		}
		env = env[i+len(marker):]
	}
}

// read reads a /proc file into the scanner's buffer (whole, if all is
// set; else its first 4 KiB, enough for stat). It returns nil on error.
func (sc *procScanner) read(name string, all bool) []byte {
	fd, err := syscall.Open(name, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	defer syscall.Close(fd)
	n := 0
	for {
		if n == len(sc.buf) {
			if !all {
				break
			}
			sc.buf = append(sc.buf, make([]byte, len(sc.buf))...)
		}
		m, err := syscall.Read(fd, sc.buf[n:])
		if err == syscall.EINTR {
			continue
		}
		if err != nil || m <= 0 {
			break
		}
		n += m
	}
	return sc.buf[:n]
}
