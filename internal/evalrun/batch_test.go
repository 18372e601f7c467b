package evalrun

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/pkg/client"
)

func TestSampleUID(t *testing.T) {
	if strconv.Itoa(sampleUID) != sampleUser {
		t.Fatalf("batch mode runs samples as %d, trial mode as %s", sampleUID, sampleUser)
	}
}

func TestCut(t *testing.T) {
	todo := make([]int, 164)
	for i := range todo {
		todo[i] = 163 - i
	}
	for _, tc := range []struct {
		size, workers int
		want          string
	}{
		{100, 8, "10×16 4×1"},
		{100, 1, "41×4"},
		{100, 2, "21×7 17×1"},
		{10, 4, "10×16 4×1"},
		{5, 1, "5×32 4×1"},
		{1, 8, "1×164"},
		{100, 1000, "10×16 4×1"},
	} {
		var got []string
		seen := 0
		for _, s := range cut(todo, tc.size, tc.workers) {
			for _, i := range s {
				if i != todo[seen] {
					t.Fatalf("%+v: order broken at %d", tc, seen)
				}
				seen++
			}
			if n := len(got); n > 0 && strings.HasPrefix(got[n-1], fmt.Sprint(len(s))+"×") {
				var k, c int
				fmt.Sscanf(got[n-1], "%d×%d", &k, &c)
				got[n-1] = fmt.Sprintf("%d×%d", k, c+1)
				continue
			}
			got = append(got, fmt.Sprintf("%d×1", len(s)))
		}
		if seen != len(todo) || strings.Join(got, " ") != tc.want {
			t.Errorf("cut(164, %d, %d) = %s (%d samples), want %s", tc.size, tc.workers, strings.Join(got, " "), seen, tc.want)
		}
	}
}

func TestValidateModes(t *testing.T) {
	one := "    return 1\n"
	base := func() client.CreateEvalRequest {
		return client.CreateEvalRequest{
			Problems: []client.EvalProblem{{TaskID: "t", Prompt: "def f():\n", EntryPoint: "f", Test: "def check(c):\n    assert c() == 1\n"}},
			Samples:  []client.EvalSample{{TaskID: "t", Completion: &one}},
		}
	}
	r := base()
	if _, err := validate(&r); err != nil || r.Mode != client.EvalModeTrial || r.Slice != 0 {
		t.Fatalf("defaults: %+v, %v", r, err)
	}
	r = base()
	r.Mode = client.EvalModeBatch
	if _, err := validate(&r); err != nil || r.Slice != DefaultSlice {
		t.Fatalf("batch defaults: %+v, %v", r, err)
	}
	// The slice's time counts the samples it can hold: 58 samples of 60 s
	// fit in 3600 s, 59 do not.
	r = base()
	r.Mode, r.Timeout = client.EvalModeBatch, 60
	for range 57 {
		r.Samples = append(r.Samples, r.Samples[0])
	}
	if _, err := validate(&r); err != nil {
		t.Fatalf("58 samples of 60 s: %v", err)
	}
	r.Samples = append(r.Samples, r.Samples[0])
	r.Slice = 0
	if _, err := validate(&r); err == nil || !strings.Contains(err.Error(), "a slice of 59 samples × (timeout 60 s + 1 s) + 30 s is 3629 s") {
		t.Fatalf("59 samples of 60 s: %v", err)
	}
	r = base()
	r.Problems[0].Test = ""
	r.Problems[0].IO = []client.EvalIOCase{{Input: nil, Output: []byte("1")}}
	if _, err := validate(&r); err == nil || !strings.Contains(err.Error(), "problems[0] (t): io[0]: input must be an array") {
		t.Fatalf("io without input: %v", err)
	}
}

// TestCreateRefused: a refused request is bad_request and leaves no run in
// the store (real SQLite).
func TestCreateRefused(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	team, err := st.CreateTeam(ctx, client.Team{Name: "a", Limits: client.Limits{MaxSandboxes: 2, MaxConcurrentExec: 2}})
	if err != nil {
		t.Fatal(err)
	}
	s := New(st, nil, nil, nil, Leases{}, nil)
	defer s.Close()
	one := "    return 1\n"
	for _, edit := range []func(*client.CreateEvalRequest){
		func(r *client.CreateEvalRequest) { r.Mode = "fast" },
		func(r *client.CreateEvalRequest) { r.Slice = 3 },
		func(r *client.CreateEvalRequest) { r.Mode, r.Slice = client.EvalModeBatch, MaxSlice+1 },
		func(r *client.CreateEvalRequest) {
			r.Problems[0].IO = []client.EvalIOCase{{Input: nil, Output: []byte("1")}}
		},
		func(r *client.CreateEvalRequest) { r.Problems[0].Test = "" },
	} {
		req := client.CreateEvalRequest{
			Problems: []client.EvalProblem{{TaskID: "t", Prompt: "def f():\n", EntryPoint: "f", Test: "def check(c):\n    assert c() == 1\n"}},
			Samples:  []client.EvalSample{{TaskID: "t", Completion: &one}},
		}
		edit(&req)
		_, err := s.Create(ctx, team.ID, req)
		var se *apierr.Error
		if !errors.As(err, &se) || se.Code != client.CodeBadRequest {
			t.Errorf("%+v: %v, want bad_request", req, err)
		}
	}
	if runs, err := st.ListEvals(ctx, team.ID); err != nil || len(runs) != 0 {
		t.Errorf("runs after refused requests: %+v, %v", runs, err)
	}
}
