package node

import (
	"bufio"
	"bytes"
	"container/list"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/internal/runtime"
)

// Capacity is the host's admission of sandboxes: every sandbox the node
// starts (user, warm-pool and build sandboxes; a template's ready_cmd runs
// in one of them) reserves what its host cgroups can take (its driver's
// runtime.Runtime.HostCost) before it starts, and gives it back once it is
// destroyed.
//
// Pids are reserved strictly: the pids limits of all sandboxes together
// never pass the budget, so fork bombs in every sandbox at once leave the
// host its reserve, and every admitted sandbox can start. Memory limits are
// ceilings that idle sandboxes use a fraction of, so the memory budget is
// overcommitted (MemoryOvercommit); on top of it no sandbox starts while
// the host's MemAvailable is below its reserve, so a host under real
// pressure stops taking more.
//
// A reservation that does not fit waits in one FIFO queue (oldest first;
// a large request at the head is not overtaken, so it cannot starve) up to
// its deadline, then fails with a *CapacityError. TryReserve never queues
// and never overtakes a waiter: warm-pool refills use it, so creates go
// first. Capacity is safe for concurrent use, and O(1) per reservation
// except a read of /proc/meminfo at most every memAvailableTTL.
type Capacity struct {
	budget     runtime.Resources
	memReserve int64 // bytes; also the MemAvailable floor
	host       HostInfo
	avail      memGauge

	mu       sync.Mutex
	reserved runtime.Resources
	holders  int
	waiters  list.List     // of *capWaiter, oldest first
	changed  chan struct{} // closed (and replaced) when capacity is given back
}

// CapacityConfig configures a Capacity. Zero values are derived from the
// host, as documented per field.
type CapacityConfig struct {
	// HostPids is the most pids the node's sandboxes may reserve together
	// (0: min(kernel.pid_max, kernel.threads-max) − ReservePids).
	HostPids int64
	// ReservePids is what is kept for the host when HostPids is 0
	// (0: max(4096, 1/8 of min(kernel.pid_max, kernel.threads-max))).
	ReservePids int64
	// ReserveMemoryMB is the host memory kept out of the budget, and the
	// MemAvailable below which no sandbox starts (0: max(2 GiB, 10 % of
	// MemTotal)).
	ReserveMemoryMB int64
	// MemoryOvercommit multiplies MemTotal − ReserveMemoryMB into the
	// memory budget (0: DefaultMemoryOvercommit; at least 1 otherwise).
	MemoryOvercommit float64
	// ProcDir is the host's procfs (""= /proc); tests use fake files.
	ProcDir string
}

// DefaultMemoryOvercommit is the default of CapacityConfig.MemoryOvercommit:
// the memory limits of running sandboxes may add up to twice the memory
// the host gives them.
const DefaultMemoryOvercommit = 2

// DefaultReservePids is the pids kept for a host whose kernel allows
// hostPids tasks (min of pid_max and threads-max): max(4096, 1/8 of it).
func DefaultReservePids(hostPids int64) int64 { return max(4096, hostPids/8) }

// memAvailableTTL is how long a MemAvailable reading is reused.
const memAvailableTTL = 100 * time.Millisecond

// waitPoll is how often waiters look at MemAvailable again (capacity given
// back wakes them at once).
const waitPoll = 200 * time.Millisecond

// HostInfo is what the budget is derived from, read from procfs once.
type HostInfo struct {
	PidMax     int64 // kernel.pid_max
	ThreadsMax int64 // kernel.threads-max
	MemTotal   int64 // bytes
}

// ErrInsufficientCapacity is wrapped by every *CapacityError.
var ErrInsufficientCapacity = nodeapi.ErrInsufficientCapacity

// CapacityError says which host resource a sandbox did not fit in; it is
// the contract's type, so that it crosses the node boundary as it is.
type CapacityError = nodeapi.CapacityError

// NewCapacity reads the host's limits from procfs and returns the node's
// capacity.
func NewCapacity(cfg CapacityConfig) (*Capacity, error) {
	if cfg.ProcDir == "" {
		cfg.ProcDir = "/proc"
	}
	host, err := readHostInfo(cfg.ProcDir)
	if err != nil {
		return nil, fmt.Errorf("node: host capacity: %w", err)
	}
	if cfg.HostPids < 0 || cfg.ReservePids < 0 || cfg.ReserveMemoryMB < 0 {
		return nil, errors.New("node: host capacity: pids and memory reserves must not be negative")
	}
	switch {
	case cfg.MemoryOvercommit == 0:
		cfg.MemoryOvercommit = DefaultMemoryOvercommit
	case cfg.MemoryOvercommit < 1:
		return nil, fmt.Errorf("node: host capacity: memory overcommit %g is below 1", cfg.MemoryOvercommit)
	}
	hostPids := min(host.PidMax, host.ThreadsMax)
	pids := cfg.HostPids
	if pids == 0 {
		reserve := cfg.ReservePids
		if reserve == 0 {
			reserve = DefaultReservePids(hostPids)
		}
		pids = hostPids - reserve
		if pids <= 0 {
			return nil, fmt.Errorf("node: host capacity: kernel.pid_max/threads-max is %d, no more than the host's reserve of %d pids: raise kernel.pid_max, or set the budget with --host-pids", hostPids, reserve)
		}
	}
	memReserve := cfg.ReserveMemoryMB << 20
	if memReserve == 0 {
		memReserve = max(2<<30, host.MemTotal/10)
	}
	if memReserve >= host.MemTotal {
		return nil, fmt.Errorf("node: host capacity: the memory reserve (%d MiB) is not below MemTotal (%d MiB)", memReserve>>20, host.MemTotal>>20)
	}
	c := &Capacity{
		budget:     runtime.Resources{Pids: pids, MemoryBytes: int64(float64(host.MemTotal-memReserve) * cfg.MemoryOvercommit)},
		memReserve: memReserve,
		host:       host,
		avail:      memGauge{path: filepath.Join(cfg.ProcDir, "meminfo"), ttl: memAvailableTTL, now: time.Now},
		changed:    make(chan struct{}),
	}
	return c, nil
}

// Host returns what the budget was derived from.
func (c *Capacity) Host() HostInfo { return c.host }

// Budget returns the pids and memory the node's sandboxes may reserve.
func (c *Capacity) Budget() runtime.Resources { return c.budget }

// Fits returns how many sandboxes of cost fit in the empty budget.
func (c *Capacity) Fits(cost runtime.Resources) int64 {
	n := int64(-1)
	if cost.Pids > 0 {
		n = c.budget.Pids / cost.Pids
	}
	if cost.MemoryBytes > 0 {
		if m := c.budget.MemoryBytes / cost.MemoryBytes; n < 0 || m < n {
			n = m
		}
	}
	return n
}

// CapacityStatus is the node's capacity now: the view it reports.
type CapacityStatus struct {
	Budget, Reserved runtime.Resources
	// MemoryAvailable is the host's MemAvailable (bytes; -1: unknown), and
	// MemoryReserve the floor below which no sandbox starts.
	MemoryAvailable, MemoryReserve int64
	// Sandboxes is how many reservations are held; Waiting how many
	// requests queue for one.
	Sandboxes, Waiting int
}

// Free is what is left of the budget.
func (s CapacityStatus) Free() runtime.Resources {
	return runtime.Resources{Pids: max(0, s.Budget.Pids-s.Reserved.Pids), MemoryBytes: max(0, s.Budget.MemoryBytes-s.Reserved.MemoryBytes)}
}

// Status reports the capacity now.
func (c *Capacity) Status() CapacityStatus {
	avail, err := c.avail.get()
	if err != nil {
		avail = -1
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return CapacityStatus{Budget: c.budget, Reserved: c.reserved, MemoryAvailable: avail, MemoryReserve: c.memReserve,
		Sandboxes: c.holders, Waiting: c.waiters.Len()}
}

// Changed returns a channel closed the next time capacity is given back.
func (c *Capacity) Changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

type capWaiter struct {
	need    runtime.Resources
	ready   chan struct{} // closed once granted
	granted bool          // guarded by Capacity.mu
	elem    *list.Element
}

// Reserve reserves need and returns the function that gives it back
// (calling it more than once is harmless). If need does not fit now: with
// wait == 0 it fails at once; with wait > 0 it queues behind earlier
// requests (FIFO) until it fits or the wait runs out; wait < 0 queues until
// ctx ends. Running out of room or time is a *CapacityError; a need larger
// than the whole budget fails at once, whatever the wait.
func (c *Capacity) Reserve(ctx context.Context, need runtime.Resources, wait time.Duration) (release func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := c.neverFits(need); err != nil {
		return nil, err
	}
	start := time.Now()
	c.mu.Lock()
	c.grantLocked() // MemAvailable may have risen since the last look
	if c.waiters.Len() == 0 {
		cerr := c.shortLocked(need)
		if cerr == nil {
			c.takeLocked(need)
			c.mu.Unlock()
			return c.releaser(need), nil
		}
		if wait == 0 {
			c.mu.Unlock()
			return nil, cerr
		}
	} else if wait == 0 {
		// Not overtaking the requests that queue ahead, this fails as
		// it would behind them.
		cerr := c.queuedError(need)
		c.mu.Unlock()
		return nil, cerr
	}
	w := &capWaiter{need: need, ready: make(chan struct{})}
	w.elem = c.waiters.PushBack(w)
	c.mu.Unlock()

	var timeout <-chan time.Time
	if wait > 0 {
		timer := time.NewTimer(wait)
		defer timer.Stop()
		timeout = timer.C
	}
	poll := time.NewTicker(waitPoll)
	defer poll.Stop()
	for err == nil {
		select {
		case <-w.ready:
			return c.releaser(need), nil
		case <-ctx.Done():
			err = ctx.Err()
		case <-timeout:
			err = errTimeout
		case <-poll.C:
			// MemAvailable may have risen.
			c.mu.Lock()
			c.grantLocked()
			c.mu.Unlock()
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if w.granted {
		if err == errTimeout {
			// Granted as the wait ran out: take it.
			return c.releaser(need), nil
		}
		// Granted as the caller went away: hand it on.
		c.giveBackLocked(need)
	} else {
		c.waiters.Remove(w.elem)
		// The head may have been the one holding the others up.
		c.grantLocked()
	}
	if err != errTimeout {
		return nil, err
	}
	var cerr *CapacityError
	switch {
	case c.waiters.Len() > 0:
		cerr = c.queuedError(need)
	default:
		if cerr = c.shortLocked(need); cerr == nil {
			// Room came as the wait ran out.
			c.takeLocked(need)
			return c.releaser(need), nil
		}
	}
	cerr.Waited = time.Since(start)
	return nil, cerr
}

var errTimeout = errors.New("wait ran out")

// TryReserve reserves need if it fits now and nobody queues; it never
// waits.
func (c *Capacity) TryReserve(need runtime.Resources) (release func(), err error) {
	if err := c.neverFits(need); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.grantLocked()
	if c.waiters.Len() > 0 {
		return nil, c.queuedError(need)
	}
	if cerr := c.shortLocked(need); cerr != nil {
		return nil, cerr
	}
	c.takeLocked(need)
	return c.releaser(need), nil
}

func (c *Capacity) neverFits(need runtime.Resources) *CapacityError {
	switch {
	case need.Pids > c.budget.Pids:
		return &CapacityError{Resource: "pids", Need: need.Pids, Budget: c.budget.Pids, Never: true}
	case need.MemoryBytes > c.budget.MemoryBytes:
		return &CapacityError{Resource: "memory", Need: need.MemoryBytes, Budget: c.budget.MemoryBytes, Never: true}
	}
	return nil
}

// queuedError is the error of a request that does not overtake the ones
// queueing: what holds up the oldest of them (grantLocked just ran, so it
// is short of something), with this request's need.
func (c *Capacity) queuedError(need runtime.Resources) *CapacityError {
	head := c.waiters.Front().Value.(*capWaiter)
	cerr := c.shortLocked(head.need)
	if cerr == nil {
		cerr = &CapacityError{Resource: "pids", Reserved: c.reserved.Pids, Budget: c.budget.Pids}
	}
	cerr.Need = need.Pids
	if cerr.Resource != "pids" {
		cerr.Need = need.MemoryBytes
	}
	cerr.Ahead = c.waiters.Len()
	return cerr
}

// shortLocked says what need does not fit in now, or nil.
func (c *Capacity) shortLocked(need runtime.Resources) *CapacityError {
	if c.reserved.Pids+need.Pids > c.budget.Pids {
		return &CapacityError{Resource: "pids", Need: need.Pids, Reserved: c.reserved.Pids, Budget: c.budget.Pids}
	}
	if c.reserved.MemoryBytes+need.MemoryBytes > c.budget.MemoryBytes {
		return &CapacityError{Resource: "memory", Need: need.MemoryBytes, Reserved: c.reserved.MemoryBytes, Budget: c.budget.MemoryBytes}
	}
	// An unreadable /proc/meminfo does not stop the host: the budgets
	// still hold.
	if avail, err := c.avail.get(); err == nil && avail < c.memReserve {
		return &CapacityError{Resource: "available memory", Need: need.MemoryBytes, Reserved: avail, Budget: c.memReserve}
	}
	return nil
}

func (c *Capacity) takeLocked(need runtime.Resources) {
	c.reserved.Pids += need.Pids
	c.reserved.MemoryBytes += need.MemoryBytes
	c.holders++
}

// grantLocked hands capacity to waiters, oldest first, while the oldest
// fits.
func (c *Capacity) grantLocked() {
	for c.waiters.Len() > 0 {
		w := c.waiters.Front().Value.(*capWaiter)
		if c.shortLocked(w.need) != nil {
			return
		}
		c.waiters.Remove(w.elem)
		c.takeLocked(w.need)
		w.granted = true
		close(w.ready)
	}
}

func (c *Capacity) releaser(need runtime.Resources) func() {
	var done atomic.Bool
	return func() {
		if done.Swap(true) {
			return
		}
		c.mu.Lock()
		c.giveBackLocked(need)
		c.mu.Unlock()
	}
}

func (c *Capacity) giveBackLocked(need runtime.Resources) {
	c.reserved.Pids -= need.Pids
	c.reserved.MemoryBytes -= need.MemoryBytes
	c.holders--
	c.grantLocked()
	close(c.changed)
	c.changed = make(chan struct{})
}

// memGauge reads MemAvailable from a meminfo file, at most once per ttl.
type memGauge struct {
	path string
	ttl  time.Duration
	now  func() time.Time

	mu  sync.Mutex
	at  time.Time
	val int64
	err error
}

func (g *memGauge) get() (int64, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	if g.at.IsZero() || now.Sub(g.at) >= g.ttl {
		g.val, g.err = readMemInfo(g.path, "MemAvailable")
		g.at = now
	}
	return g.val, g.err
}

// readHostInfo reads the host's pid and thread limits and MemTotal.
func readHostInfo(proc string) (HostInfo, error) {
	var h HostInfo
	var err error
	if h.PidMax, err = readInt(filepath.Join(proc, "sys/kernel/pid_max")); err != nil {
		return h, err
	}
	if h.ThreadsMax, err = readInt(filepath.Join(proc, "sys/kernel/threads-max")); err != nil {
		return h, err
	}
	if h.MemTotal, err = readMemInfo(filepath.Join(proc, "meminfo"), "MemTotal"); err != nil {
		return h, err
	}
	return h, nil
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s: %q is not a positive number", path, bytes.TrimSpace(b))
	}
	return n, nil
}

// readMemInfo returns field of a meminfo file ("MemAvailable:  123 kB"), in
// bytes.
func readMemInfo(path, field string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	prefix := []byte(field + ":")
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, prefix) {
			continue
		}
		v := bytes.Fields(line[len(prefix):])
		if len(v) == 0 {
			break
		}
		n, err := strconv.ParseInt(string(v[0]), 10, 64)
		if err != nil {
			break
		}
		if len(v) > 1 && string(v[1]) == "kB" {
			n <<= 10
		}
		return n, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s: no %s", path, field)
}
