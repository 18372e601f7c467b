package evalreport

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// sample is a run of 3 tasks: t/0 all pass, t/1 mixed (with an injected
// <script> in a failure's detail), t/2 never passes.
func sample() (*client.EvalRun, []client.EvalResult) {
	created := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	finished := created.Add(42 * time.Second)
	run := &client.EvalRun{
		ID: "ev_test", TeamID: "team-1", State: client.EvalStateSucceeded, CreatedAt: created, FinishedAt: &finished,
		K: []int{1, 2}, Timeout: 3, Template: "python", Runtime: "namespaces", Concurrency: 4, Seed: 7, Tasks: 3, Samples: 12,
		Done: 12, Counts: map[string]int{"passed": 6, "failed": 4, "timed_out": 1, "infra_error": 1},
		Summary: &client.EvalSummary{PassAtK: map[string]float64{"pass@1": 0.5, "pass@2": 0.6667}, Counts: map[string]int{"passed": 6, "failed": 4, "timed_out": 1, "infra_error": 1},
			TemplateDigest: "sha256:abc123", Runtime: "namespaces", RuntimeVersion: "runsc release-20260101", DurationMs: 42000, TrialsPerSecond: 0.3,
			Retries: 2, Tariff: "standard", Cost: "0.0421", BilledSeconds: 120, Phases: map[string]client.PhaseStats{"run": {P50Ms: 20, P99Ms: 40.5, MeanMs: 22}, "create": {P50Ms: 5, P99Ms: 9, MeanMs: 6}}},
	}
	res := func(task string, id int, status, detail string, ms int64) client.EvalResult {
		return client.EvalResult{TaskID: task, CompletionID: id, Status: status, Detail: detail, DurationMs: ms, Passed: status == "passed"}
	}
	rs := []client.EvalResult{
		res("t/0", 0, "passed", "", 120), res("t/0", 1, "passed", "", 130), res("t/0", 2, "passed", "", 180), res("t/0", 3, "passed", "", 95),
		res("t/1", 4, "passed", "", 210), res("t/1", 5, "failed", "AssertionError", 220),
		res("t/1", 6, "failed", `NameError: name '<script>alert(1)</script>' is not defined`, 230), res("t/1", 7, "passed", "", 240),
		res("t/2", 8, "failed", "AssertionError", 150), res("t/2", 9, "timed_out", "", 3010),
		res("t/2", 10, "failed", "exit code 1", 100), res("t/2", 11, "infra_error", "sandbox died", 12),
	}
	return run, rs
}

func statsOf(rs []client.EvalResult) *Stats {
	var s Stats
	for _, r := range rs {
		s.Add(r)
	}
	return &s
}

func TestStats(t *testing.T) {
	_, rs := sample()
	s := statsOf(rs)
	if s.Len() != 12 || fmt.Sprint(s.Counts()) != "map[failed:4 infra_error:1 passed:6 timed_out:1]" || s.SamplesPerTask() != 4 {
		t.Errorf("len %d counts %v per task %d", s.Len(), s.Counts(), s.SamplesPerTask())
	}
	var got []string
	for _, ts := range s.WorstTasks(0) {
		got = append(got, fmt.Sprintf("%s %d/%d %.3f", ts.TaskID, ts.Passed, ts.Scored(), ts.PassRate()))
	}
	if want := "[t/2 0/3 0.000 t/1 2/4 0.500 t/0 4/4 1.000]"; fmt.Sprint(got) != want {
		t.Errorf("worst tasks %v, want %s", got, want)
	}
	if w := s.WorstTasks(1); len(w) != 1 || w[0].TaskID != "t/2" {
		t.Errorf("WorstTasks(1) = %+v", w)
	}
	if tasks := s.Tasks(); tasks[0].TaskID != "t/0" || tasks[2].InfraErrors != 1 || tasks[2].TimedOut != 1 || tasks[2].Failed != 2 {
		t.Errorf("tasks %+v", tasks)
	}
	got = nil
	for _, k := range s.Kinds() {
		got = append(got, fmt.Sprintf("%s×%d", k.Kind, k.Count))
	}
	if want := "[AssertionError×2 NameError×1 exit code 1×1 timed out×1 infra_error×1]"; fmt.Sprint(got) != want {
		t.Errorf("kinds %v, want %s", got, want)
	}
	// timed out and infra_error are listed even when absent.
	var s2 Stats
	s2.Add(client.EvalResult{TaskID: "a", Status: "passed"})
	if ks := s2.Kinds(); len(ks) != 2 || ks[0] != (Kind{Kind: KindTimedOut}) || ks[1] != (Kind{Kind: KindInfraError}) {
		t.Errorf("kinds of an all-pass run: %+v", ks)
	}
	s2.Add(client.EvalResult{TaskID: "b", Status: "passed"})
	s2.Add(client.EvalResult{TaskID: "b", Status: "passed"})
	if s2.SamplesPerTask() != 0 {
		t.Error("SamplesPerTask of uneven tasks is not 0")
	}
}

func TestFailureKind(t *testing.T) {
	for _, tc := range []struct{ status, detail, want string }{
		{"passed", "", ""},
		{"failed", "AssertionError", "AssertionError"},
		{"failed", "NameError: name 'x' is not defined", "NameError"},
		{"failed", "json.decoder.JSONDecodeError: Expecting value", "json.decoder.JSONDecodeError"},
		{"failed", "exit code 3", "exit code 3"},
		{"failed", "killed by signal 9", "killed by signal 9"},
		{"failed", "", "failed"},
		{"failed", "weird: not an exception", "weird: not an exception"},
		{"failed", strings.Repeat("é", 40), strings.Repeat("é", 30) + "…"},
		{"timed_out", "", "timed out"},
		{"infra_error", "agent lost", "infra_error"},
		{"wrong_answer", "test 2 of 5: wrong answer: token 1 differs", "wrong_answer"},
		{"compile_error", "compile error: main.cpp:1: error", "compile_error"},
		{"memory_limit", "test 1 of 1: memory limit", "memory_limit"},
	} {
		if got := FailureKind(client.EvalResult{Status: tc.status, Detail: tc.detail}); got != tc.want {
			t.Errorf("FailureKind(%s, %q) = %q, want %q", tc.status, tc.detail, got, tc.want)
		}
	}
}

func TestHistogram(t *testing.T) {
	_, rs := sample()
	h := statsOf(rs).Histogram(30)
	// 3010 ms at most, 30 bins: 200 ms wide (100 would need 31).
	if h.BinMs != 200 || len(h.Bins) != 16 || h.Max != 7 {
		t.Fatalf("bin %d, %d bins, max %d", h.BinMs, len(h.Bins), h.Max)
	}
	total := 0
	for _, b := range h.Bins {
		total += b.Total
	}
	if total != 12 || h.Bins[0].Counts != [4]int{4, 2, 0, 1} || h.Bins[15].Counts != [4]int{0, 0, 1, 0} {
		t.Errorf("bins %+v", h.Bins)
	}
	for _, tc := range []struct{ top, bins, want int64 }{{0, 1, 1}, {9, 10, 1}, {10, 10, 2}, {49, 10, 5}, {99, 10, 10}, {100, 10, 20}, {123456, 20, 10000}} {
		if got := niceWidth(tc.top, tc.bins); got != tc.want {
			t.Errorf("niceWidth(%d, %d) = %d, want %d", tc.top, tc.bins, got, tc.want)
		}
	}
	var empty Stats
	if h := empty.Histogram(10); len(h.Bins) != 0 {
		t.Errorf("empty histogram %+v", h)
	}
}

func render(t *testing.T, run *client.EvalRun, rs []client.EvalResult) string {
	t.Helper()
	var b bytes.Buffer
	if err := WriteHTML(&b, run, statsOf(rs)); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestWriteHTML checks the page's structure: well-formed, self-contained,
// the sections and numbers present, untrusted details escaped, and the
// same input giving the same bytes.
func TestWriteHTML(t *testing.T) {
	run, rs := sample()
	page := render(t, run, rs)

	if again := render(t, run, rs); again != page {
		t.Error("two renderings of the same run differ")
	}
	// Escaped: the detail's <script> never reaches the page as a tag.
	if strings.Count(page, "<script") != 1 || strings.Contains(page, "<script>alert") || !strings.Contains(page, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Errorf("the detail's <script> is not escaped")
	}
	// Self-contained: no external reference of any kind.
	for _, re := range []string{`(?i)\b(src|href)\s*=`, `(?i)url\(`, `(?i)@import`, `(?i)https?://`} {
		if m := regexp.MustCompile(re).FindString(page); m != "" {
			t.Errorf("page refers outside itself: %q", m)
		}
	}
	// Well-formed enough for an XML parser once the doctype and the (static)
	// script are gone: every element closes, so the SVGs render.
	markup := strings.Replace(page, "<!DOCTYPE html>", "", 1)
	if i, j := strings.Index(markup, "<script>"), strings.Index(markup, "</script>"); i >= 0 && j > i {
		markup = markup[:i] + markup[j+len("</script>"):]
	}
	dec := xml.NewDecoder(strings.NewReader(markup))
	dec.Strict, dec.AutoClose, dec.Entity = true, nil, xml.HTMLEntity
	elems := map[string]int{}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("page is not well-formed: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			elems[se.Name.Local]++
		}
	}
	// status bar, latency histogram, task chart; a bar per status (4),
	// per histogram segment and per task.
	if elems["svg"] != 3 || elems["section"] != 6 || elems["rect"] < 4+3 {
		t.Errorf("elements %v", elems)
	}
	for _, want := range []string{
		"<title>eval run ev_test</title>",
		"pass@1<b>0.5000</b>", "pass@2<b>0.6667</b>",
		`<td><span class="sw passed"></span>passed</td><td class="n">6</td><td class="n">50.0%</td>`,
		`<td><span class="sw infra_error"></span>infra_error</td><td class="n">1</td>`,
		`<tr><td>AssertionError</td><td class="n">2</td><td class="detail"></td></tr>`,
		`<tr><td>infra_error</td><td class="n">1</td><td class="detail">sandbox died</td></tr>`,
		"<td>t/2</td><td class=\"n\">4</td><td class=\"n\">0</td>",
		"<title>t/1: 2/4 passed (0.500)</title>",
		"<title>3000–3200 ms: 1 timed_out</title>",
		"<td>template digest</td><td>sha256:abc123</td>",
		"<td>runtime version</td><td>runsc release-20260101</td>",
		"<td>timeout</td><td>3 s per trial</td>", "<td>concurrency</td><td>4</td>",
		"<td>mode</td><td>trial: one fresh sandbox per sample</td>", "<td>infra retries</td><td>2</td>",
		"<td>phase run</td><td>p50 20.0 ms, p99 40.5 ms, mean 22.0 ms</td>",
		"<td>tariff</td><td>standard</td>", "<td>cost</td><td>0.0421 (120 sandbox-seconds billed)</td>",
		`style="width: 50.0%"`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	// Worst task first in the table.
	if i, j := strings.Index(page, "<td>t/2</td>"), strings.Index(page, "<td>t/0</td>"); i < 0 || j < i {
		t.Errorf("task table not worst first (%d, %d)", i, j)
	}

	// A run without a summary (cancelled) still renders what finished.
	run.State, run.Summary = client.EvalStateCancelled, nil
	page = render(t, run, rs[:3])
	if !strings.Contains(page, "No pass@k: the run has no summary (cancelled)") || !strings.Contains(page, "<td>runtime</td><td>namespaces</td>") {
		t.Errorf("cancelled run page:\n%s", page)
	}
	// And an empty one.
	page = render(t, run, nil)
	if !strings.Contains(page, "No finished trials.") {
		t.Error("empty run page lacks 'No finished trials.'")
	}
}

// TestWholeProgramStatuses: a whole program's verdicts count under the
// report's status groups and keep their own failure kinds.
func TestWholeProgramStatuses(t *testing.T) {
	var s Stats
	for _, st := range []string{"passed", "wrong_answer", "time_limit", "compile_error", "memory_limit", "runtime_error", "output_limit"} {
		s.Add(client.EvalResult{TaskID: "a", Status: st, Detail: "test 1 of 2: " + st})
	}
	if c := s.Counts(); c["passed"] != 1 || c["failed"] != 5 || c["timed_out"] != 1 || len(c) != 4 {
		t.Errorf("counts %v", c)
	}
	if ts := s.Tasks(); len(ts) != 1 || ts[0].Failed != 5 || ts[0].TimedOut != 1 || ts[0].Passed != 1 {
		t.Errorf("tasks %+v", ts)
	}
	kinds := map[string]int{}
	for _, k := range s.Kinds() {
		kinds[k.Kind] = k.Count
	}
	for _, k := range []string{"wrong_answer", "time_limit", "compile_error", "memory_limit", "runtime_error", "output_limit"} {
		if kinds[k] != 1 {
			t.Errorf("kind %s: %d (%v)", k, kinds[k], kinds)
		}
	}
}
