package store

import (
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

func TestEvalTimes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx := t.Context()
		a, b := mustTeam(t, s, "a"), mustTeam(t, s, "b")
		run, err := s.InsertEval(ctx, EvalRow{Input: []byte(`{}`), Run: client.EvalRun{TeamID: a.ID, State: client.EvalStateRunning, K: []int{1}}})
		if err != nil {
			t.Fatal(err)
		}
		us := time.Microsecond
		want := TrialTimes{Create: 1500 * us, Write: 300 * us, Run: 40 * time.Millisecond, Delete: 2 * time.Millisecond, Trial: 45 * time.Millisecond, Attempts: 2}
		for i, tt := range []TrialTimes{want, {}} { // the second: times not recorded
			r := client.EvalResult{TaskID: "t/0", CompletionID: i, Status: "passed"}
			if _, err := s.PutEvalTrial(ctx, a.ID, run.ID, "", r, TrialEnv{SandboxID: "sb", Times: tt}); err != nil {
				t.Fatal(err)
			}
		}
		var got []TrialTimes
		collect := func(tt TrialTimes) error { got = append(got, tt); return nil }
		if err := s.EvalTimes(ctx, a.ID, run.ID, collect); err != nil || len(got) != 1 || got[0] != want {
			t.Fatalf("EvalTimes = %+v, %v; want only %+v", got, err, want)
		}
		got = nil
		if err := s.EvalTimes(ctx, b.ID, run.ID, collect); err != nil || len(got) != 0 {
			t.Fatalf("another team's EvalTimes = %+v, %v", got, err)
		}
	})
}
