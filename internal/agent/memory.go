package agent

import (
	"bytes"
	"os"
	"strconv"
	"time"

	"github.com/evalbox/evalbox/internal/agentproto"
)

// pageSize is the unit of /proc/PID/statm.
var pageSize = int64(os.Getpagesize())

// watchMemory samples the resident memory of p's tree every
// agentproto.MemoryPollInterval until exited closes, kills the tree
// (reasonMemory) the first time a sample passes limit, and returns the
// largest sample.
func (p *proc) watchMemory(limit int64, exited <-chan struct{}) int64 {
	t := time.NewTicker(agentproto.MemoryPollInterval)
	defer t.Stop()
	var peak int64
	for {
		rss := p.resident()
		peak = max(peak, rss)
		if rss > limit {
			p.killFor(reasonMemory)
			return peak
		}
		select {
		case <-exited:
			return peak
		case <-t.C:
		}
	}
}

// resident is the resident memory of p's tree: the sum over the members
// of its cgroup (the process alone without one). Pages two members share
// count twice: a tree that forks to share memory is measured high, never
// low.
func (p *proc) resident() int64 {
	pids := []int{p.pid}
	if p.cg != nil {
		if m := p.cg.procs(); len(m) > 0 {
			pids = m
		}
	}
	var sum int64
	for _, pid := range pids {
		sum += statmResident(pid)
	}
	return sum
}

// statmResident reads a process's resident set size from /proc/PID/statm
// (0 when it is gone).
func statmResident(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/statm")
	if err != nil {
		return 0
	}
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0
	}
	n, err := strconv.ParseInt(string(f[1]), 10, 64)
	if err != nil {
		return 0
	}
	return n * pageSize
}

// killFor starts killing p's tree for reason without waiting: the reason
// is p's before killFor returns (unless another came first), so that the
// run that collects p's exit reports it.
func (p *proc) killFor(reason int32) {
	p.reason.CompareAndSwap(reasonNone, reason)
	go p.kill(reason)
}
