package evalrun

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/pkg/client"
)

// newEventService is a Service on real SQLite without sandboxes, with a
// run of n samples in the store that the test drives itself: it records
// verdicts and publishes them as a worker does, through the returned
// liveRun, registered as running.
func newEventService(t *testing.T, n int) (s *Service, team string, run client.EvalRun, live *liveRun) {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	tm, err := st.CreateTeam(ctx, client.Team{Name: "a", Limits: client.Limits{MaxSandboxes: 2, MaxConcurrentExec: 2}})
	if err != nil {
		t.Fatal(err)
	}
	s = New(st, nil, nil, nil, Leases{}, nil)
	t.Cleanup(s.Close)
	s.progressEvery = 5 * time.Millisecond
	run, err = st.InsertEval(ctx, store.EvalRow{Input: []byte("{}"), Run: client.EvalRun{TeamID: tm.ID, State: client.EvalStateRunning,
		K: []int{1}, Timeout: 3, Template: "python", Concurrency: 1, Tasks: 1, Samples: n}})
	if err != nil {
		t.Fatal(err)
	}
	live = newLiveRun(func() {})
	s.mu.Lock()
	s.running[run.ID] = live
	s.mu.Unlock()
	return s, tm.ID, run, live
}

// endRun ends a test-driven run as the service does: state first, then the
// followers' channels.
func endRun(t *testing.T, s *Service, team, id, state string, live *liveRun) {
	t.Helper()
	if err := s.st.FinishEval(context.Background(), team, id, state, "", &client.EvalSummary{Counts: map[string]int{}}); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	delete(s.running, id)
	s.mu.Unlock()
	live.stop()
}

// followed is what one follower saw.
type followed struct {
	events []client.EvalEvent
	err    error
}

// types spells the events' types: R run, r result, p progress, e end, x
// error.
func (f *followed) types() string {
	letter := map[string]string{client.EvalEventRun: "R", client.EvalEventResult: "r", client.EvalEventProgress: "p",
		client.EvalEventEnd: "e", client.EvalEventError: "x"}
	s := ""
	for _, e := range f.events {
		s += letter[e.Type]
	}
	return s
}

// TestFollowSnapshotRace: followers that join at random moments while
// verdicts are being recorded each see every sample exactly once, as part
// of the snapshot's counts or as a result event, then progress and the end.
func TestFollowSnapshotRace(t *testing.T) {
	const n, followers = 400, 24
	s, team, run, live := newEventService(t, n)
	ctx := t.Context()

	var (
		wg        sync.WaitGroup
		published atomic.Int64
	)
	got := make([]followed, followers)
	for i := range followers {
		wg.Go(func() {
			// Join after a random number of recorded verdicts.
			for k := rand.Int64N(n); published.Load() < k; {
				time.Sleep(100 * time.Microsecond)
			}
			got[i].err = s.Follow(ctx, team, run.ID, true, func(ev client.EvalEvent) error {
				got[i].events = append(got[i].events, ev)
				return nil
			})
		})
	}
	statuses := []string{"passed", "failed", "timed_out"}
	for i := range n {
		r := client.EvalResult{TaskID: "t", CompletionID: i, Status: statuses[i%3]}
		if _, err := s.st.PutEvalTrial(ctx, team, run.ID, "", r, store.TrialEnv{}); err != nil {
			t.Fatal(err)
		}
		live.publish(r)
		published.Add(1)
		if i%50 == 0 {
			time.Sleep(10 * time.Millisecond) // let progress events flow
		}
	}
	time.Sleep(50 * time.Millisecond)
	endRun(t, s, team, run.ID, client.EvalStateSucceeded, live)
	wg.Wait()

	mid := 0
	for i, f := range got {
		if len(f.events) > 0 && f.events[0].Run.Done > 0 && f.events[0].Run.Done < n {
			mid++
		}
		if f.err != nil {
			t.Errorf("follower %d: %v", i, f.err)
			continue
		}
		ev := f.events
		if len(ev) < 2 || ev[0].Type != client.EvalEventRun || ev[len(ev)-1].Type != client.EvalEventEnd {
			t.Errorf("follower %d: events %s", i, f.types())
			continue
		}
		snap, end := ev[0].Run, ev[len(ev)-1].Run
		seen := map[int]bool{}
		for _, e := range ev[1 : len(ev)-1] {
			switch e.Type {
			case client.EvalEventResult:
				if seen[e.Result.CompletionID] {
					t.Errorf("follower %d: result %d twice", i, e.Result.CompletionID)
				}
				seen[e.Result.CompletionID] = true
			case client.EvalEventProgress:
				if e.Run.Done != snap.Done+len(seen) {
					t.Errorf("follower %d: progress done %d, want %d+%d", i, e.Run.Done, snap.Done, len(seen))
				}
			default:
				t.Errorf("follower %d: unexpected %s event", i, e.Type)
			}
		}
		if snap.Done+len(seen) != n || end.Done != n || end.State != client.EvalStateSucceeded || end.Summary == nil {
			t.Errorf("follower %d: snapshot %d + %d results, end %s %d/%d", i, snap.Done, len(seen), end.State, end.Done, n)
		}
	}
	if mid == 0 {
		t.Error("no follower joined while verdicts were being recorded: the test tested nothing")
	}
}

// TestFollowSlowClient: a follower that stops reading never stalls the
// verdicts; it is dropped with an error event once it falls followBuffer
// results behind, while a reading follower sees them all.
func TestFollowSlowClient(t *testing.T) {
	const n = followBuffer + 100
	s, team, run, live := newEventService(t, n)
	ctx := t.Context()
	joined := make(chan struct{}, 2)
	release := make(chan struct{})
	var slow, fast followed
	var wg sync.WaitGroup
	wg.Go(func() {
		slow.err = s.Follow(ctx, team, run.ID, true, func(ev client.EvalEvent) error {
			slow.events = append(slow.events, ev)
			if ev.Type == client.EvalEventRun {
				joined <- struct{}{}
				<-release // a client that does not read
			}
			return nil
		})
	})
	wg.Go(func() {
		fast.err = s.Follow(ctx, team, run.ID, false, func(ev client.EvalEvent) error {
			fast.events = append(fast.events, ev)
			if ev.Type == client.EvalEventRun {
				joined <- struct{}{}
			}
			return nil
		})
	})
	<-joined
	<-joined
	start := time.Now()
	for i := range n {
		live.publish(client.EvalResult{TaskID: "t", CompletionID: i, Status: "passed"})
		if i%1000 == 0 {
			time.Sleep(20 * time.Millisecond) // the fast follower keeps up
		}
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("publishing took %v", el)
	}
	close(release)
	time.Sleep(50 * time.Millisecond)
	endRun(t, s, team, run.ID, client.EvalStateSucceeded, live)
	wg.Wait()

	var se *apierr.Error
	if !errors.As(slow.err, &se) || se.Code != client.CodeUnavailable {
		t.Errorf("slow follower ended with %v", slow.err)
	}
	if last := slow.events[len(slow.events)-1]; last.Type != client.EvalEventError || last.Error == nil || last.Error.Code != client.CodeUnavailable {
		t.Errorf("slow follower's last event %+v", last)
	}
	if fast.err != nil || fast.types()[0] != 'R' || fast.events[len(fast.events)-1].Type != client.EvalEventEnd {
		t.Fatalf("fast follower: %v, events %s", fast.err, fast.types())
	}
	// results=false: progress only, and the last progress counts them all.
	last := client.EvalRun{}
	for _, ev := range fast.events[1 : len(fast.events)-1] {
		if ev.Type != client.EvalEventProgress {
			t.Fatalf("fast follower (results=false) got a %s event", ev.Type)
		}
		last = *ev.Run
	}
	if last.Done != n {
		t.Errorf("fast follower's last progress: %d done, want %d", last.Done, n)
	}
}

// TestFollowEndedAndScoped: an ended run gives its snapshot and end at
// once; another team's run is not found before any event; a follower that
// leaves ends with its context's error.
func TestFollowEndedAndScoped(t *testing.T) {
	s, team, run, live := newEventService(t, 3)
	ctx := t.Context()

	var f followed
	err := s.Follow(ctx, "other-team", run.ID, true, func(ev client.EvalEvent) error { f.events = append(f.events, ev); return nil })
	var se *apierr.Error
	if !errors.As(err, &se) || se.Code != client.CodeNotFound || len(f.events) != 0 {
		t.Errorf("other team: %v, %d events", err, len(f.events))
	}

	lctx, leave := context.WithCancel(ctx)
	var left followed
	done := make(chan struct{})
	go func() {
		defer close(done)
		left.err = s.Follow(lctx, team, run.ID, true, func(ev client.EvalEvent) error { left.events = append(left.events, ev); return nil })
	}()
	time.Sleep(20 * time.Millisecond)
	leave()
	<-done
	if !errors.Is(left.err, context.Canceled) || left.types() != "R" {
		t.Errorf("leaving follower: %v, events %s", left.err, left.types())
	}
	live.mu.Lock()
	if n := len(live.subs); n != 0 {
		t.Errorf("%d followers still subscribed after leaving", n)
	}
	live.mu.Unlock()

	endRun(t, s, team, run.ID, client.EvalStateCancelled, live)
	f = followed{}
	f.err = s.Follow(ctx, team, run.ID, true, func(ev client.EvalEvent) error { f.events = append(f.events, ev); return nil })
	if f.err != nil || f.types() != "Re" || f.events[1].Run.State != client.EvalStateCancelled {
		t.Errorf("ended run: %v, events %s", f.err, f.types())
	}
}

// TestFollowRealRun: trial- and batch-mode runs on host sandboxes,
// followed from their start: every verdict comes once, in the snapshot or
// as a result event, and the end has the summary; a cancelled run's
// follower gets an end in state cancelled.
func TestFollowRealRun(t *testing.T) {
	s, _, _, team := newHostService(t)
	s.progressEvery = 50 * time.Millisecond
	ctx := t.Context()
	req := batchRequest("    return 1\n", "    return 2\n", "    import time; time.sleep(0.3)\n    return 1\n", "    return 1\n")
	req.Mode, req.Concurrency = "", 2
	run, err := s.Create(ctx, team, req)
	if err != nil {
		t.Fatal(err)
	}
	var f followed
	f.err = s.Follow(ctx, team, run.ID, true, func(ev client.EvalEvent) error { f.events = append(f.events, ev); return nil })
	if f.err != nil {
		t.Fatal(f.err)
	}
	snap, end := f.events[0].Run, f.events[len(f.events)-1].Run
	results := 0
	for _, ev := range f.events {
		if ev.Type == client.EvalEventResult {
			results++
		}
	}
	if snap.Done+results != 4 || end.State != client.EvalStateSucceeded || end.Summary == nil || end.Summary.PassAtK["pass@1"] != 0.75 {
		t.Errorf("events %s: snapshot %d + %d results, end %+v", f.types(), snap.Done, results, end)
	}

	// Batch mode: the harness's verdicts stream as they are recorded.
	req = batchRequest("    return 1\n", "    import time; time.sleep(0.2)\n    return 2\n", "    return 1\n")
	run, err = s.Create(ctx, team, req)
	if err != nil {
		t.Fatal(err)
	}
	f = followed{}
	f.err = s.Follow(ctx, team, run.ID, true, func(ev client.EvalEvent) error { f.events = append(f.events, ev); return nil })
	results = 0
	for _, ev := range f.events {
		if ev.Type == client.EvalEventResult {
			results++
		}
	}
	if end := f.events[len(f.events)-1].Run; f.err != nil || f.events[0].Run.Done+results != 3 || end.State != client.EvalStateSucceeded || end.Counts["passed"] != 2 {
		t.Errorf("batch run: %v, events %s, end %+v", f.err, f.types(), end)
	}

	// Cancel while followed.
	var slow []string
	for range 6 {
		slow = append(slow, "    import time; time.sleep(5)\n    return 1\n")
	}
	req = batchRequest(slow...)
	req.Mode, req.Concurrency = "", 2
	run, err = s.Create(ctx, team, req)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		if _, err := s.Cancel(context.Background(), team, run.ID); err != nil {
			t.Error(err)
		}
	}()
	f = followed{}
	f.err = s.Follow(ctx, team, run.ID, true, func(ev client.EvalEvent) error { f.events = append(f.events, ev); return nil })
	if f.err != nil || f.events[len(f.events)-1].Type != client.EvalEventEnd || f.events[len(f.events)-1].Run.State != client.EvalStateCancelled {
		t.Errorf("cancelled run: %v, events %s %s", f.err, f.types(), fmt.Sprint(f.events[len(f.events)-1].Run))
	}
}

// TestFollowDrain: at Drain (the server's shutdown begins) a follower of a
// running run gets an error event saying so and its stream ends at once;
// the run itself is not ended.
func TestFollowDrain(t *testing.T) {
	s, team, run, live := newEventService(t, 3)
	joined := make(chan struct{})
	var f followed
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.err = s.Follow(t.Context(), team, run.ID, true, func(ev client.EvalEvent) error {
			f.events = append(f.events, ev)
			if ev.Type == client.EvalEventRun {
				close(joined)
			}
			return nil
		})
	}()
	<-joined
	live.publish(client.EvalResult{TaskID: "t", CompletionID: 0, Status: "passed"})
	time.Sleep(20 * time.Millisecond)
	s.Drain()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Follow still running after Drain")
	}
	var se *apierr.Error
	if !errors.As(f.err, &se) || se.Code != client.CodeUnavailable || !strings.HasSuffix(f.types(), "x") {
		t.Fatalf("events %s, err %v", f.types(), f.err)
	}
	if got, err := s.st.GetEval(context.Background(), team, run.ID); err != nil || got.State != client.EvalStateRunning {
		t.Fatalf("run after Drain: %+v, %v", got, err)
	}
	endRun(t, s, team, run.ID, client.EvalStateSucceeded, live)
}
