package evalrun

import (
	"context"
	"sync"

	"github.com/evalbox/evalbox/internal/eval"
)

// scanKey names a sandbox filesystem as a batch slice sees it.
type scanKey struct{ digest, runtime string }

// scanCache holds, per template digest and runtime, what the batch harness
// found a sample may write to in such a sandbox (it restores those places
// after every sample). Each is scanned once, by one slice, before any
// sample ran in its sandbox: the slices that start meanwhile wait for that
// scan instead of walking the same tree at once, and when the scanning
// slice ends without one, one of them scans.
type scanCache struct {
	mu sync.Mutex
	m  map[scanKey]*scanEntry
}

type scanEntry struct {
	ready chan struct{} // closed once scan is set, or its scanner gave up
	scan  *eval.HarnessScan
}

// get returns key's scan, waiting while another slice makes it. When there
// is none, the caller is the key's scanner: get returns a nil scan and
// done, which the caller must call with its scan, or with nil when it has
// none (only the first call counts).
func (c *scanCache) get(ctx context.Context, key scanKey) (scan *eval.HarnessScan, done func(*eval.HarnessScan), err error) {
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
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}
