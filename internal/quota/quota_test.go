package quota

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// waitFor polls cond (test-only) until it holds or 2 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// checkIdle fails unless the limiter holds nothing at all.
func checkIdle(t *testing.T, l *Limiter) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, tm := range l.teams {
		t.Errorf("team %s left with %d in use, %d waiting", id, tm.inUse, tm.waiters.Len())
	}
}

func TestAcquireRelease(t *testing.T) {
	ctx := context.Background()
	l := NewLimiter()
	r1, err := l.Acquire(ctx, "a", 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := l.Acquire(ctx, "a", 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "a", 2, 0); !errors.Is(err, ErrLimit) {
		t.Fatalf("third acquire: %v, want ErrLimit", err)
	}
	// Teams are independent.
	rb, err := l.Acquire(ctx, "b", 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if l.InUse("a") != 2 || l.InUse("b") != 1 {
		t.Fatalf("in use a=%d b=%d", l.InUse("a"), l.InUse("b"))
	}
	r1()
	r1() // idempotent
	if n := l.InUse("a"); n != 1 {
		t.Fatalf("after double release in use = %d, want 1", n)
	}
	r3, err := l.Acquire(ctx, "a", 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	r2()
	r3()
	rb()
	checkIdle(t, l)
	if l.InUse("a") != 0 || l.Waiting("a") != 0 {
		t.Fatal("idle team reports use")
	}

	if _, err := l.Acquire(ctx, "a", 0, 0); !errors.Is(err, ErrLimit) {
		t.Fatalf("limit 0: %v, want ErrLimit", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := l.Acquire(cctx, "a", 5, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled ctx: %v", err)
	}
	checkIdle(t, l)
}

func TestFIFO(t *testing.T) {
	ctx := context.Background()
	l := NewLimiter()
	hold, err := l.Acquire(ctx, "a", 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	order := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			release, err := l.Acquire(ctx, "a", 1, 5*time.Second)
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			order <- i
			release()
		})
		// Enqueue one at a time so the arrival order is known.
		waitFor(t, fmt.Sprintf("waiter %d queued", i), func() bool { return l.Waiting("a") == i+1 })
	}
	// A newcomer that does not wait does not jump the queue.
	if _, err := l.Acquire(ctx, "a", 1, 0); !errors.Is(err, ErrLimit) {
		t.Fatalf("newcomer: %v, want ErrLimit", err)
	}
	hold()
	wg.Wait()
	close(order)
	want := 0
	for got := range order {
		if got != want {
			t.Fatalf("waiter %d served in position %d", got, want)
		}
		want++
	}
	checkIdle(t, l)
}

func TestWaitDeadline(t *testing.T) {
	ctx := context.Background()
	l := NewLimiter()
	hold, err := l.Acquire(ctx, "a", 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = l.Acquire(ctx, "a", 1, 50*time.Millisecond)
	if !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), "waited 50ms") {
		t.Fatalf("err = %v, want ErrLimit after waiting 50ms", err)
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Fatalf("gave up after %v, before the deadline", d)
	}
	if n := l.Waiting("a"); n != 0 {
		t.Fatalf("timed-out waiter still queued (%d)", n)
	}

	// A slot freed before the deadline is taken.
	go func() {
		waitFor(t, "waiter queued", func() bool { return l.Waiting("a") == 1 })
		hold()
	}()
	release, err := l.Acquire(ctx, "a", 1, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	release()
	checkIdle(t, l)
}

func TestCancel(t *testing.T) {
	l := NewLimiter()
	hold, err := l.Acquire(context.Background(), "a", 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, wait := range []time.Duration{time.Minute, -1} {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := l.Acquire(ctx, "a", 1, wait)
			done <- err
		}()
		waitFor(t, "waiter queued", func() bool { return l.Waiting("a") == 1 })
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("wait %v: err = %v, want context.Canceled", wait, err)
		}
		if l.Waiting("a") != 0 || l.InUse("a") != 1 {
			t.Fatalf("after cancel: waiting %d, in use %d", l.Waiting("a"), l.InUse("a"))
		}
	}
	hold()
	checkIdle(t, l)
}

// A waiter that gives up just as a slot is handed to it passes it on.
func TestGiveUpRacingGrant(t *testing.T) {
	l := NewLimiter()
	for i := range 300 {
		hold, err := l.Acquire(context.Background(), "a", 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		got := make(chan func(), 1)
		go func() {
			r, _ := l.Acquire(ctx, "a", 1, -1)
			got <- r
		}()
		waitFor(t, "waiter queued", func() bool { return l.Waiting("a") == 1 })
		// Cancel, then at once free the slot: the slot is often handed to
		// the waiter before it wakes up to see the cancellation.
		var wg sync.WaitGroup
		if i%4 == 0 {
			wg.Go(hold)
			cancel()
		} else {
			cancel()
			hold()
		}
		if r := <-got; r != nil {
			r()
		}
		wg.Wait()
		checkIdle(t, l)
		if t.Failed() {
			t.FailNow()
		}
	}
}

func TestLimitChanges(t *testing.T) {
	ctx := context.Background()
	l := NewLimiter()
	var rs []func()
	for range 3 {
		r, err := l.Acquire(ctx, "a", 3, 0)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	// Lowered to 1: holders keep their slots, nothing new until under it.
	if _, err := l.Acquire(ctx, "a", 1, 0); !errors.Is(err, ErrLimit) {
		t.Fatalf("lowered limit: %v", err)
	}
	if n := l.InUse("a"); n != 3 {
		t.Fatalf("in use after lowering = %d, want 3", n)
	}
	rs[0]()
	rs[1]()
	if _, err := l.Acquire(ctx, "a", 1, 0); !errors.Is(err, ErrLimit) {
		t.Fatalf("1 in use, limit 1: %v", err)
	}
	// A waiter queued under limit 1 is served when the last holder leaves.
	done := make(chan func(), 1)
	go func() {
		r, err := l.Acquire(ctx, "a", 1, 5*time.Second)
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	waitFor(t, "waiter queued", func() bool { return l.Waiting("a") == 1 })
	// Raised to 3: the queued waiter is served first, then the caller.
	r, err := l.Acquire(ctx, "a", 3, 0)
	if err != nil {
		t.Fatalf("raised limit: %v", err)
	}
	w := <-done
	if l.InUse("a") != 3 || l.Waiting("a") != 0 {
		t.Fatalf("after raise: in use %d, waiting %d", l.InUse("a"), l.Waiting("a"))
	}
	rs[2]()
	r()
	w()
	checkIdle(t, l)
}

func TestHold(t *testing.T) {
	ctx := context.Background()
	l := NewLimiter()
	h1 := l.Hold("a")
	h2 := l.Hold("a")
	if _, err := l.Acquire(ctx, "a", 2, 0); !errors.Is(err, ErrLimit) {
		t.Fatalf("held slots count against the limit: %v", err)
	}
	h1()
	h1()
	r, err := l.Acquire(ctx, "a", 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	h2()
	r()
	checkIdle(t, l)
}

// Random acquires, waits, timeouts, cancellations and limit changes on a
// few teams: the limit is never exceeded and no slot or waiter leaks.
func TestStress(t *testing.T) {
	l := NewLimiter()
	const workers, rounds = 32, 40
	teams := []struct {
		id       string
		min, max int // limits used; a fixed team has min == max
	}{{"fixed", 2, 2}, {"varying", 1, 4}, {"one", 1, 1}}
	holders := make([]atomic.Int64, len(teams))
	var granted, refused atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(1500 * time.Millisecond)
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for range rounds {
				if time.Now().After(stop) {
					return
				}
				ti := rng.IntN(len(teams))
				tm := teams[ti]
				limit := tm.min + rng.IntN(tm.max-tm.min+1)
				ctx, cancel := context.WithCancel(context.Background())
				var wait time.Duration
				switch rng.IntN(4) {
				case 0: // no wait
				case 1:
					wait = time.Duration(rng.IntN(3000)) * time.Microsecond
				case 2: // until ctx, cancelled soon
					wait = -1
					time.AfterFunc(time.Duration(rng.IntN(3000))*time.Microsecond, cancel)
				case 3: // long wait, cancelled soon
					wait = time.Second
					time.AfterFunc(time.Duration(rng.IntN(3000))*time.Microsecond, cancel)
				}
				release, err := l.Acquire(ctx, tm.id, limit, wait)
				if err != nil {
					if !errors.Is(err, ErrLimit) && !errors.Is(err, context.Canceled) {
						t.Errorf("unexpected error: %v", err)
					}
					refused.Add(1)
					cancel()
					continue
				}
				granted.Add(1)
				if n := holders[ti].Add(1); n > int64(tm.max) {
					t.Errorf("team %s: %d holders, limit at most %d", tm.id, n, tm.max)
				}
				time.Sleep(time.Duration(rng.IntN(500)) * time.Microsecond)
				holders[ti].Add(-1)
				release()
				if rng.IntN(4) == 0 {
					release() // idempotent
				}
				cancel()
			}
		})
	}
	wg.Wait()
	t.Logf("granted %d, refused %d", granted.Load(), refused.Load())
	if granted.Load() == 0 || refused.Load() == 0 {
		t.Fatal("stress test did not exercise both outcomes")
	}
	checkIdle(t, l)
}
