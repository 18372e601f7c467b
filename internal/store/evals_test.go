package store

import (
	"errors"
	"testing"

	"github.com/evalbox/evalbox/pkg/client"
)

func TestEvals(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx := t.Context()
		a, b := mustTeam(t, s, "a"), mustTeam(t, s, "b")
		run, err := s.InsertEval(ctx, EvalRow{Input: []byte(`{"problems":[]}`), Run: client.EvalRun{
			TeamID: a.ID, State: client.EvalStateRunning, K: []int{1, 10}, Timeout: 3, Template: "python", Concurrency: 4, Seed: 9, Tasks: 2, Samples: 3,
			Mode: client.EvalModeBatch, Slice: 50,
		}})
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.GetEval(ctx, a.ID, run.ID)
		if err != nil || got.ID != run.ID || len(got.K) != 2 || got.K[1] != 10 || got.Seed != 9 || got.Samples != 3 || got.State != client.EvalStateRunning || got.Summary != nil ||
			got.Mode != client.EvalModeBatch || got.Slice != 50 {
			t.Fatalf("GetEval = %+v, %v", got, err)
		}
		if _, err := s.GetEval(ctx, b.ID, run.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("another team's GetEval: %v", err)
		}
		if _, err := s.EvalInput(ctx, b.ID, run.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("another team's EvalInput: %v", err)
		}
		if in, err := s.EvalInput(ctx, a.ID, run.ID); err != nil || string(in) != `{"problems":[]}` {
			t.Fatalf("EvalInput = %q, %v", in, err)
		}
		env := TrialEnv{SandboxID: "sb-1", TemplateDigest: "sha256:x", Runtime: "gvisor", RuntimeVersion: "v1"}
		for _, r := range []client.EvalResult{
			{TaskID: "t/1", CompletionID: 2, Status: "failed", Detail: "AssertionError", Result: "failed: "},
			{TaskID: "t/0", CompletionID: 0, Status: "passed", Result: "passed", DurationMs: 5},
			{TaskID: "t/1", CompletionID: 3, Status: "wrong_answer", Language: "cpp", Compile: &client.EvalCompile{OK: true, DurationMs: 300},
				TestsPassed: 1, TestsTotal: 2, Tests: []client.EvalTestResult{{Status: "passed", DurationMs: 4, PeakMemoryBytes: 1 << 20}, {Status: "wrong_answer", Detail: "token 1 differs"}}},
		} {
			if _, err := s.PutEvalTrial(ctx, a.ID, run.ID, "", r, env); err != nil {
				t.Fatal(err)
			}
		}
		// A second verdict of a sample is not written: the first stays.
		if ok, err := s.PutEvalTrial(ctx, a.ID, run.ID, "", client.EvalResult{CompletionID: 0, Status: "failed"}, env); ok || err != nil {
			t.Fatalf("a trial recorded twice: %v, %v", ok, err)
		}
		if counts, err := s.EvalCounts(ctx, a.ID, run.ID); err != nil || counts["passed"] != 1 || counts["failed"] != 1 {
			t.Fatalf("after a second verdict: %v, %v", counts, err)
		}
		var ids []int
		if err := s.EvalTrials(ctx, a.ID, run.ID, func(r client.EvalResult) error {
			ids = append(ids, r.CompletionID)
			if r.Passed != (r.Status == "passed") {
				t.Errorf("result %+v", r)
			}
			if r.CompletionID == 3 && (r.Language != "cpp" || r.Compile == nil || r.Compile.DurationMs != 300 || r.TestsPassed != 1 || r.TestsTotal != 2 ||
				len(r.Tests) != 2 || r.Tests[0].PeakMemoryBytes != 1<<20 || r.Tests[1].Detail != "token 1 differs") {
				t.Errorf("a whole program's result came back as %+v", r)
			}
			if r.CompletionID != 3 && (r.Tests != nil || r.Compile != nil || r.Language != "") {
				t.Errorf("result %+v", r)
			}
			return nil
		}); err != nil || len(ids) != 3 || ids[0] != 0 || ids[1] != 2 || ids[2] != 3 {
			t.Fatalf("EvalTrials order %v, %v", ids, err)
		}
		if err := s.EvalTrials(ctx, b.ID, run.ID, func(client.EvalResult) error { t.Error("another team saw a trial"); return nil }); err != nil {
			t.Fatal(err)
		}
		if counts, err := s.EvalCounts(ctx, a.ID, run.ID); err != nil || counts["passed"] != 1 || counts["failed"] != 1 || counts["wrong_answer"] != 1 {
			t.Fatalf("EvalCounts = %v, %v", counts, err)
		}
		if e, err := s.EvalEnv(ctx, a.ID, run.ID); err != nil || e != env {
			t.Fatalf("EvalEnv = %+v, %v", e, err)
		}
		if l, err := s.ListEvalsByState(ctx, client.EvalStateRunning); err != nil || len(l) != 1 {
			t.Fatalf("ListEvalsByState = %v, %v", l, err)
		}
		sum := &client.EvalSummary{PassAtK: map[string]float64{"pass@1": 0.5}, Counts: map[string]int{"passed": 1}}
		if err := s.FinishEval(ctx, a.ID, run.ID, client.EvalStateSucceeded, "", sum); err != nil {
			t.Fatal(err)
		}
		if err := s.FinishEval(ctx, a.ID, run.ID, client.EvalStateCancelled, "", nil); !errors.Is(err, ErrConflict) {
			t.Fatalf("finishing an ended run: %v", err)
		}
		got, err = s.GetEval(ctx, a.ID, run.ID)
		if err != nil || got.State != client.EvalStateSucceeded || got.FinishedAt == nil || got.Summary == nil || got.Summary.PassAtK["pass@1"] != 0.5 {
			t.Fatalf("after finish %+v, %v", got, err)
		}
		if l, err := s.ListEvals(ctx, b.ID); err != nil || len(l) != 0 {
			t.Fatalf("team b lists %v, %v", l, err)
		}

		// Its input counts for its team; deleted, it counts no more.
		if n, err := s.EvalInputBytes(ctx, a.ID); err != nil || n != int64(len(`{"problems":[]}`)) {
			t.Fatalf("EvalInputBytes = %d, %v", n, err)
		}
		if n, err := s.EvalInputBytes(ctx, b.ID); err != nil || n != 0 {
			t.Fatalf("team b's EvalInputBytes = %d, %v", n, err)
		}
		if err := s.DeleteEval(ctx, b.ID, run.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("another team's DeleteEval: %v", err)
		}
		live, err := s.InsertEval(ctx, EvalRow{Input: []byte(`{}`), Run: client.EvalRun{TeamID: a.ID, State: client.EvalStateRunning, K: []int{1}}})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteEval(ctx, a.ID, live.ID); !errors.Is(err, ErrConflict) {
			t.Fatalf("DeleteEval of a running run: %v", err)
		}
		if err := s.DeleteEval(ctx, a.ID, run.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetEval(ctx, a.ID, run.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("GetEval after delete: %v", err)
		}
		if counts, err := s.EvalCounts(ctx, a.ID, run.ID); err != nil || len(counts) != 0 {
			t.Fatalf("trials after delete: %v, %v", counts, err)
		}
		if n, err := s.EvalInputBytes(ctx, a.ID); err != nil || n != 2 {
			t.Fatalf("EvalInputBytes after delete = %d, %v", n, err)
		}
	})
}

// TestVerdictOncePerSample: two writers (a retry, or two attempts of one
// sample) racing to record the same sample's verdict: exactly one is
// recorded and the other is told so (false), on both backends. (Replicas
// racing over a run's lease: TestEvalLeaseRaces.)
func TestVerdictOncePerSample(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx := t.Context()
		a := mustTeam(t, s, "a")
		run, err := s.InsertEval(ctx, EvalRow{Input: []byte(`{}`), Run: client.EvalRun{TeamID: a.ID, State: client.EvalStateRunning, K: []int{1}}})
		if err != nil {
			t.Fatal(err)
		}
		type put struct {
			stored bool
			err    error
		}
		for sample := range 20 {
			puts := make(chan put, 2)
			for _, status := range []string{"passed", "failed"} {
				go func() {
					stored, err := s.PutEvalTrial(ctx, a.ID, run.ID, "", client.EvalResult{TaskID: "t/0", CompletionID: sample, Status: status}, TrialEnv{})
					puts <- put{stored, err}
				}()
			}
			var stored, kept int
			for range 2 {
				switch p := <-puts; {
				case p.err != nil:
					t.Fatalf("sample %d: %v", sample, p.err)
				case p.stored:
					stored++
				default:
					kept++
				}
			}
			if stored != 1 || kept != 1 {
				t.Fatalf("sample %d: %d recorded, %d told the first was kept; want 1 and 1", sample, stored, kept)
			}
		}
		counts, err := s.EvalCounts(ctx, a.ID, run.ID)
		if err != nil || counts["passed"]+counts["failed"] != 20 {
			t.Fatalf("EvalCounts = %v, %v: want 20 verdicts", counts, err)
		}
	})
}
