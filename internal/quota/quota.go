// Package quota implements admission control: per-team counted slots with
// a FIFO wait queue, used for a team's active sandboxes (a slot is held for
// a sandbox's life) and for its concurrent execs.
package quota

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// ErrLimit: the team is at its limit and the caller did not wait, or did
// not get a slot before its wait ran out. The API maps it to 429
// (too_many_sandboxes or rate_limited).
var ErrLimit = errors.New("limit reached")

// Limiter counts slots per team. The zero value is not usable; call NewLimiter.
// It is safe for concurrent use.
type Limiter struct {
	mu    sync.Mutex
	teams map[string]*team // only teams with holders or waiters
}

type team struct {
	inUse int
	// limit is the one passed by the latest Acquire: limits change at
	// runtime and the newest is the one in force.
	limit   int
	waiters list.List // of *waiter, oldest first
}

type waiter struct {
	ready   chan struct{} // closed once granted
	granted bool          // guarded by Limiter.mu
	elem    *list.Element
}

// NewLimiter returns an empty Limiter.
func NewLimiter() *Limiter {
	return &Limiter{teams: make(map[string]*team)}
}

// Acquire takes one of the team's limit slots and returns the function
// that gives it back; calling that more than once is harmless.
//
// If no slot is free: with wait == 0 it fails at once with ErrLimit; with
// wait > 0 it queues behind earlier waiters (FIFO) until a slot is handed
// to it, the wait runs out (ErrLimit) or ctx ends (ctx.Err()); wait < 0
// waits until a slot frees or ctx ends.
//
// limit is the team's current limit, passed on every call: raising it
// serves queued waiters at once; lowering it takes no slot back from
// holders but grants nothing more until they are under the new limit.
// A limit <= 0 admits nobody.
func (l *Limiter) Acquire(ctx context.Context, teamID string, limit int, wait time.Duration) (release func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l.mu.Lock()
	t := l.teams[teamID]
	if t == nil {
		t = &team{}
		l.teams[teamID] = t
	}
	t.limit = limit
	l.grantLocked(t) // the limit may have been raised
	if t.inUse < limit && t.waiters.Len() == 0 {
		t.inUse++
		l.mu.Unlock()
		return l.releaser(teamID, t), nil
	}
	if wait == 0 {
		inUse := t.inUse
		l.dropIfIdleLocked(teamID, t)
		l.mu.Unlock()
		return nil, fmt.Errorf("%w: %d of %d in use", ErrLimit, inUse, limit)
	}
	w := &waiter{ready: make(chan struct{})}
	w.elem = t.waiters.PushBack(w)
	l.mu.Unlock()

	var timeout <-chan time.Time
	if wait > 0 {
		timer := time.NewTimer(wait)
		defer timer.Stop()
		timeout = timer.C
	}
	select {
	case <-w.ready:
		return l.releaser(teamID, t), nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-timeout:
		err = fmt.Errorf("%w: waited %s for a free slot (limit %d)", ErrLimit, wait, limit)
	}
	l.mu.Lock()
	if w.granted {
		// A slot was handed over as we gave up: pass it on.
		l.releaseLocked(teamID, t)
	} else {
		t.waiters.Remove(w.elem)
		l.dropIfIdleLocked(teamID, t)
	}
	l.mu.Unlock()
	return nil, err
}

// Hold takes a slot whatever the limit and returns the function that gives
// it back. It is for accounting slots that are already in use, such as the
// sandboxes found running when the server restarts.
func (l *Limiter) Hold(teamID string) (release func()) {
	l.mu.Lock()
	t := l.teams[teamID]
	if t == nil {
		t = &team{}
		l.teams[teamID] = t
	}
	t.inUse++
	l.mu.Unlock()
	return l.releaser(teamID, t)
}

// InUse returns how many of the team's slots are held.
func (l *Limiter) InUse(teamID string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t := l.teams[teamID]; t != nil {
		return t.inUse
	}
	return 0
}

// Waiting returns how many Acquire calls are queued for the team.
func (l *Limiter) Waiting(teamID string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t := l.teams[teamID]; t != nil {
		return t.waiters.Len()
	}
	return 0
}

// releaser returns an idempotent release of one of t's slots. t stays in
// l.teams while the slot is held, so the pointer stays the team's.
func (l *Limiter) releaser(teamID string, t *team) func() {
	var done atomic.Bool
	return func() {
		if done.Swap(true) {
			return
		}
		l.mu.Lock()
		l.releaseLocked(teamID, t)
		l.mu.Unlock()
	}
}

func (l *Limiter) releaseLocked(teamID string, t *team) {
	t.inUse--
	l.grantLocked(t)
	l.dropIfIdleLocked(teamID, t)
}

// grantLocked hands free slots to waiters, oldest first.
func (l *Limiter) grantLocked(t *team) {
	for t.inUse < t.limit && t.waiters.Len() > 0 {
		w := t.waiters.Remove(t.waiters.Front()).(*waiter)
		w.granted = true
		t.inUse++
		close(w.ready)
	}
}

// dropIfIdleLocked forgets a team with no holders and no waiters, so the
// map only grows with active teams.
func (l *Limiter) dropIfIdleLocked(teamID string, t *team) {
	if t.inUse == 0 && t.waiters.Len() == 0 {
		delete(l.teams, teamID)
	}
}
