package evalrun

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/pkg/client"
)

// Event stream pacing and bounds.
const (
	// progressEvery is how often a follower gets a progress event at most
	// (only when the counts changed).
	progressEvery = time.Second
	// followBuffer is how many verdicts a follower may fall behind before
	// it is dropped: trials never wait for a follower.
	followBuffer = 4096
)

// errTooSlow ends a follower that fell followBuffer verdicts behind.
var errTooSlow = &apierr.Error{Code: client.CodeUnavailable,
	Message: fmt.Sprintf("client too slow: the event stream fell %d results behind; read the results and follow again", followBuffer)}

// errDraining ends the event streams of a server that is shutting down.
var errDraining = &apierr.Error{Code: client.CodeUnavailable,
	Message: "the server is shutting down: the run goes on when it starts again; follow it again then"}

// liveRun is a run this process is running: how to stop it, its retries
// so far, and the followers its verdicts fan out to.
type liveRun struct {
	cancel  context.CancelFunc
	retries atomic.Int64
	done    chan struct{} // closed once the run's worker ended
	// leaseLost is set when the run stopped because this replica no
	// longer holds its lease.
	leaseLost atomic.Bool

	mu   sync.Mutex
	subs map[*follower]struct{} // nil once the run stopped
}

// follower receives a live run's verdicts until its channel closes: at the
// run's stop, or when it fell behind (dropped set first).
type follower struct {
	ch      chan client.EvalResult
	dropped bool // written under liveRun.mu before ch is closed
}

func newLiveRun(cancel context.CancelFunc) *liveRun {
	return &liveRun{cancel: cancel, subs: map[*follower]struct{}{}, done: make(chan struct{})}
}

// subscribe adds a follower; after stop, its channel is closed at once.
func (l *liveRun) subscribe() *follower {
	f := &follower{ch: make(chan client.EvalResult, followBuffer)}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.subs == nil {
		close(f.ch)
		return f
	}
	l.subs[f] = struct{}{}
	return f
}

// unsubscribe removes a follower that stops reading.
func (l *liveRun) unsubscribe(f *follower) {
	l.mu.Lock()
	delete(l.subs, f)
	l.mu.Unlock()
}

// publish hands a recorded verdict to every follower without waiting: a
// follower whose buffer is full is dropped.
func (l *liveRun) publish(r client.EvalResult) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for f := range l.subs {
		select {
		case f.ch <- r:
		default:
			f.dropped = true
			close(f.ch)
			delete(l.subs, f)
		}
	}
}

// addRetries counts retries as they happen.
func (l *liveRun) addRetries(n int) {
	if l != nil && n != 0 {
		l.retries.Add(int64(n))
	}
}

// stop closes every follower's channel, after the run's last verdict.
func (l *liveRun) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for f := range l.subs {
		close(f.ch)
	}
	l.subs = nil
}

// Follow calls fn with a team's run's events (see client.EvalEvent): a
// "run" snapshot with the counts, a "result" for every verdict recorded
// after the snapshot (none when results is false), "progress" at most
// every progressEvery when the counts changed, and an "end" with the ended
// run. It returns nil after the end event; ctx's error when the caller
// leaves; nil without an end event when the run stops without ending (the
// service closes); and, after an "error" event, the error that ended the
// stream (a follower too slow to keep up). Another team's run is not
// found, before fn is called.
func (s *Service) Follow(ctx context.Context, teamID, id string, results bool, fn func(client.EvalEvent) error) error {
	if _, err := s.getRun(ctx, teamID, id); err != nil {
		return err
	}
	// Subscribe before the snapshot: a verdict recorded before the
	// subscription is in the snapshot; one recorded after it reaches the
	// follower, and is skipped when the snapshot had it too.
	s.mu.Lock()
	live := s.running[id]
	s.mu.Unlock()
	var f *follower
	if live != nil {
		f = live.subscribe()
		defer live.unsubscribe(f)
	}
	run, err := s.getRun(ctx, teamID, id)
	if err != nil {
		return err
	}
	seen := make([]bool, run.Samples)
	run.Counts, run.Done = map[string]int{}, 0
	err = s.st.EvalTrials(ctx, teamID, id, func(r client.EvalResult) error {
		if r.CompletionID >= 0 && r.CompletionID < len(seen) && !seen[r.CompletionID] {
			seen[r.CompletionID] = true
			run.Counts[r.Status]++
			run.Done++
		}
		return nil
	})
	if err != nil {
		return err
	}
	if live != nil && run.State == client.EvalStateRunning {
		run.Retries = int(live.retries.Load())
	}
	snap := run
	snap.Counts = maps.Clone(run.Counts)
	if err := fn(client.EvalEvent{Type: client.EvalEventRun, Run: &snap}); err != nil {
		return err
	}
	if f == nil {
		return s.followEnd(ctx, teamID, id, fn)
	}
	tick := time.NewTicker(s.progressEvery)
	defer tick.Stop()
	shown := run.Done
	shownRetries := run.Retries
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.draining:
			_ = fn(client.EvalEvent{Type: client.EvalEventError, Error: &client.ErrorDetail{Code: errDraining.Code, Message: errDraining.Message}})
			return errDraining
		case r, ok := <-f.ch:
			if !ok {
				if f.dropped {
					_ = fn(client.EvalEvent{Type: client.EvalEventError, Error: &client.ErrorDetail{Code: errTooSlow.Code, Message: errTooSlow.Message}})
					return errTooSlow
				}
				return s.followEnd(ctx, teamID, id, fn)
			}
			if r.CompletionID < 0 || r.CompletionID >= len(seen) || seen[r.CompletionID] {
				continue
			}
			seen[r.CompletionID] = true
			run.Counts[r.Status]++
			run.Done++
			if results {
				if err := fn(client.EvalEvent{Type: client.EvalEventResult, Result: &r}); err != nil {
					return err
				}
			}
		case <-tick.C:
			retries := int(live.retries.Load())
			if run.Done == shown && retries == shownRetries {
				continue
			}
			shown, shownRetries = run.Done, retries
			p := run
			p.Counts, p.Retries = maps.Clone(run.Counts), retries
			if err := fn(client.EvalEvent{Type: client.EvalEventProgress, Run: &p}); err != nil {
				return err
			}
		}
	}
}

// followEnd sends the end event of a run that stopped in this process or
// was not running in it; a run still running in the store (the service is
// closing; the next start resumes it) gets none.
func (s *Service) followEnd(ctx context.Context, teamID, id string, fn func(client.EvalEvent) error) error {
	run, err := s.Get(ctx, teamID, id)
	if err != nil {
		return err
	}
	if run.State == client.EvalStateRunning {
		return nil
	}
	return fn(client.EvalEvent{Type: client.EvalEventEnd, Run: &run})
}
