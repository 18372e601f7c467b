package evalrun

import (
	"context"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// TestLeaseLostStopsTheRun: a replica whose run another replica took over
// stops its trials at its next renewal and writes no verdict after it;
// the run stays running, leased to the other, and shutting down does not
// release the other's lease.
func TestLeaseLostStopsTheRun(t *testing.T) {
	s, st, _, team := newLeasedHostService(t, Leases{Owner: "a", TTL: 600 * time.Millisecond})
	ctx := context.Background()
	req := batchRequest()
	req.Mode, req.Concurrency = client.EvalModeTrial, 2
	body := "    import time\n    time.sleep(0.1)\n    return 1\n"
	for range 200 {
		req.Samples = append(req.Samples, client.EvalSample{TaskID: "t", Completion: &body})
	}
	run, err := s.Create(ctx, team, req)
	if err != nil {
		t.Fatal(err)
	}
	done := func() int {
		c, err := st.EvalCounts(ctx, team, run.ID)
		if err != nil {
			t.Fatal(err)
		}
		return c["passed"] + c["failed"]
	}
	for done() < 2 {
		time.Sleep(10 * time.Millisecond)
	}
	// Replica b takes the run over: a's lease looks expired to it (unless
	// a renewed it in between: then again).
	for took := false; !took; {
		if _, err := st.RenewEval(ctx, run.ID, "a", time.Now().Add(-time.Second)); err != nil {
			t.Fatal(err)
		}
		if took, err = st.ClaimEval(ctx, run.ID, "b", time.Now(), time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		s.mu.Lock()
		_, running := s.running[run.ID]
		s.mu.Unlock()
		if !running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("replica a still runs the run it lost")
		}
		time.Sleep(10 * time.Millisecond)
	}
	n := done()
	time.Sleep(500 * time.Millisecond)
	if m := done(); m != n || n >= len(req.Samples) {
		t.Fatalf("verdicts after the lease was lost: %d, then %d (of %d)", n, m, len(req.Samples))
	}
	s.Close()
	if owner, _, err := st.EvalLease(ctx, run.ID); err != nil || owner != "b" {
		t.Fatalf("lease after a's shutdown: %q, %v; want b's", owner, err)
	}
	if r, err := st.GetEval(ctx, team, run.ID); err != nil || r.State != client.EvalStateRunning {
		t.Fatalf("run after a lost it: %+v, %v", r, err)
	}
}

// TestTakeOverDeletesTheOldLeasesSandboxes: a replica that takes a run
// over deletes the run's sandboxes left running under the previous lease
// (a replica that died leaves them on a fleet's nodes, holding the team's
// slots), before it judges their samples again; the run completes.
func TestTakeOverDeletesTheOldLeasesSandboxes(t *testing.T) {
	a, st, h, team := newLeasedHostService(t, Leases{Owner: "a", TTL: 600 * time.Millisecond})
	ctx := context.Background()
	req := batchRequest()
	req.Mode, req.Concurrency = client.EvalModeTrial, 2
	body := "    return 1\n"
	for range 6 {
		req.Samples = append(req.Samples, client.EvalSample{TaskID: "t", Completion: &body})
	}
	run, err := a.Create(ctx, team, req)
	if err != nil {
		t.Fatal(err)
	}
	a.Close() // drops its lease
	// What a replica that died mid-trial leaves: its trial's sandbox.
	left, err := h.Create(ctx, team, client.CreateSandboxRequest{Metadata: map[string]string{runMeta: run.ID, "eval_sample": "0"}})
	if err != nil {
		t.Fatal(err)
	}
	other, err := h.Create(ctx, team, client.CreateSandboxRequest{Metadata: map[string]string{runMeta: "another-run"}})
	if err != nil {
		t.Fatal(err)
	}
	b := New(st, h, nil, nil, Leases{Owner: "b", TTL: 600 * time.Millisecond}, nil)
	b.trials.Backoff = time.Millisecond
	b.hostHarness = true
	t.Cleanup(b.Close)
	if err := b.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	got, rs := waitRun(t, b, team, run.ID)
	if got.State != client.EvalStateSucceeded || len(rs) != 6 {
		t.Fatalf("run taken over: %+v, %d results", got, len(rs))
	}
	if _, err := h.dir(left.ID); err == nil {
		t.Errorf("the old lease's sandbox %s is still there", left.ID)
	}
	if _, err := h.dir(other.ID); err != nil {
		t.Errorf("another run's sandbox was deleted: %v", err)
	}
	if err := h.Delete(ctx, team, other.ID); err != nil {
		t.Fatal(err)
	}
}
