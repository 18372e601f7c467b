package evalrun

import (
	"context"
	"sync"
	"time"

	"github.com/evalbox/evalbox/internal/eval"
)

// scanKey names a sandbox filesystem as a team's batch slices see it (per
// team: a team may change its own slice sandboxes while one is scanned,
// which must not change what other teams' harnesses restore).
type scanKey struct{ team, digest, runtime string }

// scanWait bounds how long a slice waits for another's scan before it
// scans for itself (and keeps its scan to itself).
const scanWait = 20 * time.Second

// scanCache holds, per team, template digest and runtime, what the batch
// harness found a sample may write to in such a sandbox (it restores those
// places after every sample). Each is scanned once, by one slice, before any
// sample ran in its sandbox: the slices that start meanwhile wait for that
// scan instead of walking the same tree at once (for up to wait), and when
// the scanning slice ends without one, one of them scans.
type scanCache struct {
	mu sync.Mutex
	m  map[scanKey]*scanEntry
}

type scanEntry struct {
	ready chan struct{} // closed once scan is set, or its scanner gave up
	scan  *eval.HarnessScan
}

// get returns key's scan, waiting up to wait while another slice makes
// it. When there is none, the caller scans: get returns a nil scan and
// done, which the caller must call with its scan, or with nil when it has
// none (only the first call counts; after a wait that timed out, done
// keeps the scan to the caller).
func (c *scanCache) get(ctx context.Context, key scanKey, wait time.Duration) (scan *eval.HarnessScan, done func(*eval.HarnessScan), err error) {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		c.mu.Lock()
		if c.m == nil {
			c.m = map[scanKey]*scanEntry{}
		}
		e := c.m[key]
		if e == nil {
			e = &scanEntry{ready: make(chan struct{})}
			c.m[key] = e
			c.mu.Unlock()
			var once sync.Once
			return nil, func(s *eval.HarnessScan) {
				once.Do(func() {
					c.mu.Lock()
					if s == nil {
						delete(c.m, key)
					} else {
						e.scan = s
					}
					c.mu.Unlock()
					close(e.ready)
				})
			}, nil
		}
		c.mu.Unlock()
		select {
		case <-e.ready:
			if e.scan != nil {
				return e.scan, nil, nil
			}
			// Its scanner gave up: try to be the next.
		case <-timer.C:
			return nil, func(*eval.HarnessScan) {}, nil
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}
