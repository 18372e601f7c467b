package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/runtime"
)

const gib = 1 << 30

// fakeProc writes the procfs files Capacity reads into a temp dir.
type fakeProc struct {
	t   testing.TB
	dir string
}

func newFakeProc(t testing.TB, pidMax, threadsMax, memTotal, memAvailable int64) *fakeProc {
	t.Helper()
	p := &fakeProc{t: t, dir: t.TempDir()}
	if err := os.MkdirAll(filepath.Join(p.dir, "sys/kernel"), 0o755); err != nil {
		t.Fatal(err)
	}
	p.write("sys/kernel/pid_max", fmt.Sprintf("%d\n", pidMax))
	p.write("sys/kernel/threads-max", fmt.Sprintf("%d\n", threadsMax))
	p.setMem(memTotal, memAvailable)
	return p
}

func (p *fakeProc) write(name, content string) {
	p.t.Helper()
	if err := os.WriteFile(filepath.Join(p.dir, name), []byte(content), 0o644); err != nil {
		p.t.Fatal(err)
	}
}

func (p *fakeProc) setMem(total, avail int64) {
	p.write("meminfo", fmt.Sprintf("MemTotal:       %d kB\nMemFree:        1000 kB\nMemAvailable:   %d kB\nBuffers:        0 kB\n", total>>10, avail>>10))
}

func newTestCapacity(t testing.TB, p *fakeProc, cfg CapacityConfig) *Capacity {
	t.Helper()
	cfg.ProcDir = p.dir
	c, err := NewCapacity(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCapacityBudgetFromProc(t *testing.T) {
	for _, tc := range []struct {
		name                         string
		pidMax, threadsMax, memTotal int64
		cfg                          CapacityConfig
		wantPids, wantMem            int64
	}{
		// This machine: pid_max 32768, 24 GiB.
		{"defaults, small pid_max", 32768, 192730, 24 * gib, CapacityConfig{}, 32768 - 4096, (24*gib - 24*gib/10) * 2},
		{"systemd pid_max: reserve 1/8", 4194304, 4194304, 24 * gib, CapacityConfig{}, 4194304 - 4194304/8, (24*gib - 24*gib/10) * 2},
		{"threads-max below pid_max", 4194304, 100000, 16 * gib, CapacityConfig{}, 100000 - 12500, (16*gib - 2*gib) * 2},
		{"small host: 2 GiB memory reserve", 32768, 32768, 8 * gib, CapacityConfig{}, 28672, (8*gib - 2*gib) * 2},
		{"reserves and overcommit set", 32768, 32768, 24 * gib, CapacityConfig{ReservePids: 10000, ReserveMemoryMB: 4096, MemoryOvercommit: 1.5}, 22768, (20 * gib) * 3 / 2},
		{"total pids set", 32768, 32768, 24 * gib, CapacityConfig{HostPids: 16996, ReservePids: 1}, 16996, (24*gib - 24*gib/10) * 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newTestCapacity(t, newFakeProc(t, tc.pidMax, tc.threadsMax, tc.memTotal, tc.memTotal), tc.cfg)
			b := c.Budget()
			// MemTotal goes through kB.
			if b.Pids != tc.wantPids || b.MemoryBytes>>20 != tc.wantMem>>20 {
				t.Fatalf("budget %d pids, %d MiB; want %d pids, %d MiB", b.Pids, b.MemoryBytes>>20, tc.wantPids, tc.wantMem>>20)
			}
			if h := c.Host(); h.PidMax != tc.pidMax || h.ThreadsMax != tc.threadsMax || h.MemTotal != tc.memTotal {
				t.Fatalf("host %+v", h)
			}
		})
	}
	t.Run("pid_max at most the reserve", func(t *testing.T) {
		_, err := NewCapacity(CapacityConfig{ProcDir: newFakeProc(t, 4096, 100000, 8*gib, 8*gib).dir})
		if err == nil || !strings.Contains(err.Error(), "raise kernel.pid_max") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("overcommit below 1", func(t *testing.T) {
		if _, err := NewCapacity(CapacityConfig{ProcDir: newFakeProc(t, 32768, 32768, 8*gib, 8*gib).dir, MemoryOvercommit: 0.5}); err == nil {
			t.Fatal("overcommit 0.5 accepted")
		}
	})
	t.Run("broken proc", func(t *testing.T) {
		p := newFakeProc(t, 32768, 32768, 8*gib, 8*gib)
		p.write("sys/kernel/pid_max", "many\n")
		if _, err := NewCapacity(CapacityConfig{ProcDir: p.dir}); err == nil {
			t.Fatal("unparsable pid_max accepted")
		}
	})
	t.Run("the real host", func(t *testing.T) {
		c, err := NewCapacity(CapacityConfig{})
		if err != nil {
			t.Fatal(err)
		}
		if b := c.Budget(); b.Pids <= 0 || b.MemoryBytes <= 0 {
			t.Fatalf("budget %+v", b)
		}
		if s := c.Status(); s.MemoryAvailable <= 0 {
			t.Fatalf("MemAvailable from /proc/meminfo: %+v", s)
		}
	})
}

// ns is the host cost of a namespaces sandbox with pids and mib.
func ns(pids, mib int64) runtime.Resources {
	return runtime.Resources{Pids: pids, MemoryBytes: mib << 20}
}

func TestCapacityStrict(t *testing.T) {
	// 33 sandboxes of 512 pids, and 256 more.
	c := newTestCapacity(t, newFakeProc(t, 32768, 32768, 24*gib, 24*gib), CapacityConfig{HostPids: 33*512 + 256})
	if got := c.Fits(ns(512, 512)); got != 33 {
		t.Fatalf("Fits = %d, want 33", got)
	}
	ctx := t.Context()
	var releases []func()
	for i := range 33 {
		rel, err := c.Reserve(ctx, ns(512, 512), 0)
		if err != nil {
			t.Fatalf("reservation %d: %v", i+1, err)
		}
		releases = append(releases, rel)
	}
	_, err := c.Reserve(ctx, ns(512, 512), 0)
	var cerr *CapacityError
	if !errors.As(err, &cerr) || !errors.Is(err, ErrInsufficientCapacity) || cerr.Resource != "pids" {
		t.Fatalf("34th: %v", err)
	}
	want := "not enough host pids: the sandbox needs 512, and 16896 of the node's 17152 are reserved by its sandboxes (256 free)"
	if err.Error() != want {
		t.Fatalf("message %q\nwant     %q", err, want)
	}
	// What still fits is admitted.
	small, err := c.Reserve(ctx, ns(256, 64), 0)
	if err != nil {
		t.Fatalf("256 pids into 256 free: %v", err)
	}
	s := c.Status()
	if s.Reserved.Pids != s.Budget.Pids || s.Free().Pids != 0 || s.Sandboxes != 34 {
		t.Fatalf("status %+v", s)
	}
	small()
	small() // idempotent
	releases[0]()
	if s := c.Status(); s.Reserved.Pids != 32*512 || s.Sandboxes != 32 {
		t.Fatalf("after releases: %+v", s)
	}
	if _, err := c.Reserve(ctx, ns(512, 512), 0); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	// Bigger than the whole budget: at once, whatever the wait.
	start := time.Now()
	_, err = c.Reserve(ctx, ns(20000, 64), time.Minute)
	if !errors.As(err, &cerr) || !cerr.Never || time.Since(start) > time.Second {
		t.Fatalf("a request above the budget: %v after %s", err, time.Since(start))
	}
}

func TestCapacityMemoryBudget(t *testing.T) {
	// (10 GiB − 2 GiB) × 2 = 16 GiB of limits.
	c := newTestCapacity(t, newFakeProc(t, 4194304, 4194304, 10*gib, 10*gib), CapacityConfig{})
	ctx := t.Context()
	for i := range 16 {
		if _, err := c.Reserve(ctx, ns(100, 1024), 0); err != nil {
			t.Fatalf("GiB %d: %v", i+1, err)
		}
	}
	_, err := c.Reserve(ctx, ns(100, 1024), 0)
	var cerr *CapacityError
	if !errors.As(err, &cerr) || cerr.Resource != "memory" || !strings.Contains(err.Error(), "16384 of the node's 16384 MiB are reserved") {
		t.Fatalf("past the memory budget: %v", err)
	}
}

func TestCapacityFIFOWait(t *testing.T) {
	c := newTestCapacity(t, newFakeProc(t, 32768, 32768, 24*gib, 24*gib), CapacityConfig{HostPids: 1000})
	ctx := t.Context()
	holdA, err := c.Reserve(ctx, ns(400, 64), 0)
	if err != nil {
		t.Fatal(err)
	}
	holdB, err := c.Reserve(ctx, ns(500, 64), 0)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		name string
		rel  func()
		err  error
	}
	results := make(chan result, 4)
	reserve := func(name string, need runtime.Resources, wait time.Duration) {
		rel, err := c.Reserve(ctx, need, wait)
		results <- result{name, rel, err}
	}
	none := func(when string) {
		t.Helper()
		select {
		case r := <-results:
			t.Fatalf("%s: %s returned (%v)", when, r.name, r.err)
		case <-time.After(300 * time.Millisecond):
		}
	}
	go reserve("big", ns(600, 64), 10*time.Second)
	waitFor(t, func() bool { return c.Status().Waiting == 1 })
	go reserve("small", ns(500, 64), 10*time.Second)
	waitFor(t, func() bool { return c.Status().Waiting == 2 })
	// Neither Reserve without a wait nor TryReserve overtakes them.
	var cerr *CapacityError
	if _, err := c.Reserve(ctx, ns(50, 64), 0); !errors.As(err, &cerr) || cerr.Ahead != 2 || !strings.Contains(err.Error(), "2 earlier requests queue") {
		t.Fatalf("no-wait request behind waiters: %v", err)
	}
	if _, err := c.TryReserve(ns(50, 64)); err == nil {
		t.Fatal("TryReserve overtook the waiters")
	}
	none("before any release")
	// 500 free: small would fit, but big is ahead of it.
	holdA()
	none("with 500 free")
	holdB()
	big := <-results
	if big.name != "big" || big.err != nil {
		t.Fatalf("first grant: %s (%v)", big.name, big.err)
	}
	none("with 400 free") // small needs 500
	big.rel()
	small := <-results
	if small.name != "small" || small.err != nil {
		t.Fatalf("second grant: %s (%v)", small.name, small.err)
	}
	if s := c.Status(); s.Reserved.Pids != 500 || s.Waiting != 0 {
		t.Fatalf("status %+v", s)
	}

	// A wait that runs out says so, and leaves nothing reserved or queued.
	start := time.Now()
	_, err = c.Reserve(ctx, ns(600, 64), 300*time.Millisecond)
	if !errors.As(err, &cerr) || cerr.Waited < 300*time.Millisecond || time.Since(start) > 2*time.Second || !strings.Contains(err.Error(), "waited") {
		t.Fatalf("timed-out wait: %v after %s", err, time.Since(start))
	}
	// A cancelled wait returns the context's error.
	cctx, cancel := context.WithCancel(ctx)
	go func() { time.Sleep(100 * time.Millisecond); cancel() }()
	if _, err := c.Reserve(cctx, ns(600, 64), -1); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v", err)
	}
	if s := c.Status(); s.Reserved.Pids != 500 || s.Waiting != 0 || s.Sandboxes != 1 {
		t.Fatalf("after failed waits: %+v", s)
	}
	// A waiter that gives up hands the head on: the one behind it gets
	// what frees up.
	// (The head waits long enough for the one behind to queue behind it
	// on a loaded host; the two answers may come in either order.)
	go reserve("blocked-head", ns(1000, 64), 2*time.Second)
	waitFor(t, func() bool { return c.Status().Waiting == 1 })
	go reserve("behind", ns(300, 64), 10*time.Second)
	waitFor(t, func() bool { return c.Status().Waiting == 2 })
	none("behind a head that still waits") // 500 free, but FIFO
	got := map[string]result{}
	for range 2 {
		r := <-results
		got[r.name] = r
	}
	if r := got["blocked-head"]; r.err == nil {
		t.Fatalf("blocked-head: %v, want its wait run out", r.err)
	}
	r, ok := got["behind"]
	if !ok || r.err != nil {
		t.Fatalf("behind: %v, want granted once the head gave up", r.err)
	}
	small.rel()
	r.rel()
	if s := c.Status(); s.Reserved.Pids != 0 || s.Reserved.MemoryBytes != 0 || s.Sandboxes != 0 {
		t.Fatalf("all released: %+v", s)
	}
}

func TestCapacityMemAvailable(t *testing.T) {
	p := newFakeProc(t, 32768, 32768, 24*gib, 24*gib)
	c := newTestCapacity(t, p, CapacityConfig{ReserveMemoryMB: 2048})
	ctx := t.Context()
	// The host is short: 1 GiB available, below the 2 GiB reserve.
	p.setMem(24*gib, 1*gib)
	time.Sleep(memAvailableTTL)
	_, err := c.Reserve(ctx, ns(100, 64), 0)
	var cerr *CapacityError
	if !errors.As(err, &cerr) || cerr.Resource != "available memory" ||
		!strings.Contains(err.Error(), "1024 MiB available, below its reserve of 2048 MiB") {
		t.Fatalf("short host: %v", err)
	}
	if _, err := c.TryReserve(ns(100, 64)); err == nil {
		t.Fatal("TryReserve on a short host")
	}
	// A waiter gets in once memory is back, without any release.
	done := make(chan error, 1)
	go func() {
		rel, err := c.Reserve(ctx, ns(100, 64), 10*time.Second)
		if err == nil {
			rel()
		}
		done <- err
	}()
	waitFor(t, func() bool { return c.Status().Waiting == 1 })
	p.setMem(24*gib, 10*gib)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter not admitted after MemAvailable rose")
	}
}

func TestMemGaugeCaches(t *testing.T) {
	p := newFakeProc(t, 32768, 32768, 24*gib, 5*gib)
	now := time.Unix(1000, 0)
	g := memGauge{path: filepath.Join(p.dir, "meminfo"), ttl: memAvailableTTL, now: func() time.Time { return now }}
	if v, err := g.get(); err != nil || v != 5*gib {
		t.Fatalf("get = %d, %v", v, err)
	}
	p.setMem(24*gib, 7*gib)
	now = now.Add(memAvailableTTL / 2)
	if v, _ := g.get(); v != 5*gib {
		t.Fatalf("within the TTL: %d, want the cached value", v)
	}
	now = now.Add(memAvailableTTL)
	if v, _ := g.get(); v != 7*gib {
		t.Fatalf("after the TTL: %d, want a fresh reading", v)
	}
	p.write("meminfo", "MemTotal: 1 kB\n")
	now = now.Add(memAvailableTTL)
	if _, err := g.get(); err == nil {
		t.Fatal("meminfo without MemAvailable read fine")
	}
}

// TestCapacityConcurrent checks, under the race detector, that the sum of
// reservations never passes the budget however requests interleave, and
// that everything comes back.
func TestCapacityConcurrent(t *testing.T) {
	c := newTestCapacity(t, newFakeProc(t, 32768, 32768, 24*gib, 24*gib), CapacityConfig{HostPids: 5000})
	var held atomic.Int64
	var wg sync.WaitGroup
	var granted atomic.Int64
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			need := ns(int64(100+i*13%700), 64)
			for range 20 {
				var rel func()
				var err error
				if i%4 == 0 {
					rel, err = c.TryReserve(need)
				} else {
					rel, err = c.Reserve(t.Context(), need, time.Duration(i%3)*50*time.Millisecond)
				}
				if err != nil {
					if !errors.Is(err, ErrInsufficientCapacity) {
						t.Error(err)
					}
					continue
				}
				granted.Add(1)
				if h := held.Add(need.Pids); h > 5000 {
					t.Errorf("%d pids held, budget 5000", h)
				}
				time.Sleep(time.Millisecond)
				held.Add(-need.Pids)
				rel()
			}
		}()
	}
	wg.Wait()
	if s := c.Status(); s.Reserved != (runtime.Resources{}) || s.Sandboxes != 0 || s.Waiting != 0 || granted.Load() == 0 {
		t.Fatalf("after all: %+v (granted %d)", s, granted.Load())
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// BenchmarkCapacityReserve is the admission on a cold create's path: a
// reservation and its release, MemAvailable read from the real
// /proc/meminfo at most every memAvailableTTL.
func BenchmarkCapacityReserve(b *testing.B) {
	c, err := NewCapacity(CapacityConfig{HostPids: 1 << 30})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	need := ns(1024, 512)
	for b.Loop() {
		rel, err := c.Reserve(ctx, need, 0)
		if err != nil {
			b.Fatal(err)
		}
		rel()
	}
}

// BenchmarkMemAvailableRead is one uncached read of /proc/meminfo.
func BenchmarkMemAvailableRead(b *testing.B) {
	for b.Loop() {
		if _, err := readMemInfo("/proc/meminfo", "MemAvailable"); err != nil {
			b.Fatal(err)
		}
	}
}
