package evalrun

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/eval"
)

// TestScanCacheOneScanner: of slices that start at once on one template,
// one scans and the others get its scan; when the scanner gives up, one of
// the waiting slices scans; another key has a scan of its own.
func TestScanCacheOneScanner(t *testing.T) {
	var c scanCache
	ctx := context.Background()
	key := scanKey{team: "t1", digest: "sha256:a", runtime: "gvisor"}
	want := &eval.HarnessScan{Dirs: []string{"/tmp"}}

	first, done, err := c.get(ctx, key, time.Minute)
	if err != nil || first != nil || done == nil {
		t.Fatalf("first get: %v %v %v", first, done != nil, err)
	}
	var scanners atomic.Int32
	var wg sync.WaitGroup
	got := make([]*eval.HarnessScan, 8)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				s, d, err := c.get(ctx, key, time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				if d == nil {
					got[i] = s
					return
				}
				// A waiter that became the scanner after the first gave up.
				if scanners.Add(1) > 1 {
					t.Error("two scanners at once")
				}
				time.Sleep(10 * time.Millisecond)
				scanners.Add(-1)
				d(want)
			}
		}()
	}
	time.Sleep(20 * time.Millisecond)
	done(nil)  // the first scanner's slice failed before its scan
	done(want) // ignored: only the first call counts
	wg.Wait()
	for i, s := range got {
		if s != want {
			t.Errorf("slice %d got %v", i, s)
		}
	}
	if s, d, _ := c.get(ctx, key, time.Minute); s != want || d != nil {
		t.Errorf("after the scan: %v, scanner %v", s, d != nil)
	}
	if s, d, _ := c.get(ctx, scanKey{team: "t1", digest: "sha256:a", runtime: "namespaces"}, time.Minute); s != nil || d == nil {
		t.Errorf("another runtime: %v, scanner %v", s, d != nil)
	}

	// Another team's slices scan for themselves.
	if s, d, _ := c.get(ctx, scanKey{team: "t2", digest: "sha256:a", runtime: "gvisor"}, time.Minute); s != nil || d == nil {
		t.Errorf("another team: %v, scanner %v", s, d != nil)
	}

	// A waiter whose context ends stops waiting; one that waited its
	// bound scans for itself, and its scan is not the key's.
	slow := scanKey{team: "t1", digest: "sha256:c", runtime: "gvisor"}
	if _, d, _ := c.get(ctx, slow, time.Minute); d == nil {
		t.Fatal("no scanner for a new key")
	}
	s, d, err := c.get(ctx, slow, 10*time.Millisecond)
	if err != nil || s != nil || d == nil {
		t.Fatalf("after the bound: %v %v %v", s, d != nil, err)
	}
	d(&eval.HarnessScan{})
	cctx0, cancel0 := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel0()
	if _, _, err := c.get(cctx0, slow, time.Minute); err == nil {
		t.Error("the bounded waiter's scan became the key's")
	}

	// A waiter whose context ends stops waiting.
	other := scanKey{digest: "sha256:b", runtime: "gvisor"}
	if _, d, _ := c.get(ctx, other, time.Minute); d == nil {
		t.Fatal("no scanner for a new key")
	}
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, _, err := c.get(cctx, other, time.Minute); err == nil {
		t.Error("a waiter outlived its context")
	}
}
