// Package outbuf bounds the memory that command output buffered for JSON
// answers may pin: a server-wide Budget of bytes, and Buffers that reserve
// from it chunk by chunk as output arrives. Streamed answers (NDJSON) need
// none of this: they are bounded by flow control.
package outbuf

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
)

// ErrExhausted is returned when output cannot be held because the budget is
// spent.
var ErrExhausted = errors.New("outbuf: output memory budget exhausted")

// Source is what a Buffer reserves from: a Budget, or a Lease taken from
// one ahead of time.
type Source interface {
	TryReserve(n int64) bool
	Release(n int64)
}

// Budget counts the bytes reserved by every Buffer of a server. The zero
// value is not usable; a nil *Budget is unlimited.
type Budget struct {
	mu    sync.Mutex
	total int64
	used  int64
	freed chan struct{} // closed (and replaced) when bytes are released
}

// NewBudget returns a budget of total bytes.
func NewBudget(total int64) *Budget {
	return &Budget{total: total, freed: make(chan struct{})}
}

// Total is the size of the budget.
func (b *Budget) Total() int64 {
	if b == nil {
		return 0
	}
	return b.total
}

// Used is the number of bytes reserved now.
func (b *Budget) Used() int64 {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// TryReserve reserves n bytes if they are free and reports whether it did.
func (b *Budget) TryReserve(n int64) bool {
	if b == nil {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.total {
		return false
	}
	b.used += n
	return true
}

// Release gives back n reserved bytes.
func (b *Budget) Release(n int64) {
	if b == nil || n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	if b.used < 0 {
		panic("outbuf: released more than was reserved")
	}
	close(b.freed)
	b.freed = make(chan struct{})
}

// Lease reserves n bytes (at most the whole budget), waiting until they are
// free or ctx ends. It is for background work that can wait (eval runs),
// never for a request that already holds budget: a caller must take its
// whole lease at once, before anything else, so that waiting ones hold
// nothing and cannot deadlock those that hold.
func (b *Budget) Lease(ctx context.Context, n int64) (*Lease, error) {
	if b == nil {
		return &Lease{size: n}, nil
	}
	n = min(n, b.total)
	for {
		b.mu.Lock()
		if b.used+n <= b.total {
			b.used += n
			b.mu.Unlock()
			return &Lease{b: b, size: n}, nil
		}
		freed := b.freed
		b.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-freed:
		}
	}
}

// Lease is a part of a budget reserved ahead of time: Buffers reserve from
// it without ever waiting or failing until it is spent. Close gives it back
// to the budget; a Lease is used by one goroutine at a time.
type Lease struct {
	b          *Budget
	size, used int64
}

// TryReserve implements Source.
func (l *Lease) TryReserve(n int64) bool {
	if l.used+n > l.size {
		return false
	}
	l.used += n
	return true
}

// Release implements Source.
func (l *Lease) Release(n int64) { l.used -= n }

// Close gives the whole lease back to its budget.
func (l *Lease) Close() {
	if l.b != nil {
		l.b.Release(l.size)
		l.b = nil
	}
}

// Tally is a Source that reserves from another and counts what it holds,
// so that memory many holders took for one request (its Buffers, the files
// it read) is given back at once by ReleaseAll. It is safe for concurrent
// use: a command's stdout and stderr are written from two goroutines.
type Tally struct {
	src  Source
	held atomic.Int64
}

// NewTally returns a Tally over src (nil: unlimited).
func NewTally(src Source) *Tally { return &Tally{src: src} }

// TryReserve implements Source.
func (t *Tally) TryReserve(n int64) bool {
	if t.src != nil && !t.src.TryReserve(n) {
		return false
	}
	t.held.Add(n)
	return true
}

// Release implements Source.
func (t *Tally) Release(n int64) {
	t.held.Add(-n)
	if t.src != nil {
		t.src.Release(n)
	}
}

// Held is the number of bytes reserved through t now.
func (t *Tally) Held() int64 { return t.held.Load() }

// ReleaseAll gives back everything reserved through t. Call it after every
// Buffer over t is released, never before: a Buffer released later would
// give back its memory twice.
func (t *Tally) ReleaseAll() { t.Release(t.held.Load()) }
