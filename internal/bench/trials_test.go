package bench

import (
	"bytes"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/eval"
)

// problems returns n toy tasks in HumanEval's schema: add_k(a) returns a+k.
func problems(n int) eval.Problems {
	ps := eval.Problems{ByID: map[string]eval.Problem{}}
	for k := range n {
		id := "T/" + string(rune('0'+k))
		ps.ByID[id] = eval.Problem{
			TaskID: id, EntryPoint: "f",
			Prompt:            "def f(a):\n    \"\"\"a plus " + string(rune('0'+k)) + "\"\"\"\n",
			CanonicalSolution: "    return a + " + string(rune('0'+k)) + "\n",
			Test:              "def check(candidate):\n    assert candidate(1) == 1 + " + string(rune('0'+k)) + "\n",
		}
		ps.Order = append(ps.Order, id)
	}
	return ps
}

func TestMixedSet(t *testing.T) {
	ps := problems(164)
	ss := mixedSet(ps, 1000)
	if len(ss) != 1000 {
		t.Fatalf("%d samples", len(ss))
	}
	kinds := map[string]int{}
	perTask := map[string]int{}
	for i, s := range ss {
		kinds[s.kind]++
		perTask[s.TaskID]++
		if s.TaskID != ps.Order[i%164] {
			t.Fatalf("sample %d is for %s, want %s", i, s.TaskID, ps.Order[i%164])
		}
	}
	// 6 × 164 = 984 cycle through the 6 kinds, the last 16 are canonical
	// again; 4 of the 1,000 (every 250th) hang instead.
	// (samples 249, 499, 749, 999: canonical+print, wrong result,
	// exception, canonical).
	want := map[string]int{"canonical": 164 + 16 - 1, "canonical+print": 164 - 1, "return None": 164,
		"wrong result": 164 - 1, "exception": 164 - 1, "syntax error": 164, "hang": 4}
	for k, n := range want {
		if kinds[k] != n {
			t.Errorf("%s: %d samples, want %d (all: %v)", k, kinds[k], n, kinds)
		}
	}
	for id, n := range perTask {
		if n < 6 || n > 7 {
			t.Errorf("task %s has %d samples", id, n)
		}
	}
	again := mixedSet(ps, 1000)
	for i := range ss {
		if *ss[i].Completion != *again[i].Completion {
			t.Fatalf("sample %d differs between two generations", i)
		}
	}
	if got := designedMix(ss[:7]); !strings.HasPrefix(got, "canonical 7 (→ passed)") {
		t.Errorf("designedMix = %q", got)
	}
}

// TestVariantsJudged runs every kind of generated sample through python3
// and the judge: each gets the verdict it is built for.
func TestVariantsJudged(t *testing.T) {
	python, err := exec.LookPath("/usr/bin/python3")
	if err != nil {
		t.Skip("no /usr/bin/python3")
	}
	ps := problems(1)
	p := ps.ByID["T/0"]
	l := &localRunner{python: python, dir: t.TempDir(), timeout: 500 * time.Millisecond}
	for _, v := range append(variants, hang) {
		c := v.make(p)
		code := eval.NewPassCode()
		r, err := l.run(t.Context(), eval.Program(p, eval.Sample{TaskID: p.TaskID, Completion: &c}, code))
		if err != nil {
			t.Fatal(err)
		}
		r.PassCode = code
		if got := eval.Judge(r); got.Status != v.expect {
			t.Errorf("%s: verdict %+v (stderr %q), want %s", v.name, got, r.Stderr, v.expect)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(l.dir, "*")); len(left) != 0 {
		t.Errorf("left behind %v", left)
	}
}

func TestLocalRunnerKillsGroupAtTimeout(t *testing.T) {
	python, err := exec.LookPath("/usr/bin/python3")
	if err != nil {
		t.Skip("no /usr/bin/python3")
	}
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "child.pid")
	l := &localRunner{python: python, dir: dir, timeout: 300 * time.Millisecond}
	// A child that would outlive its parent keeps the pipes open: the
	// group kill must end it too.
	prog := "import subprocess, time\np = subprocess.Popen(['sleep', '60'])\nopen(" + pyQuote(pidFile) + ", 'w').write(str(p.pid))\ntime.sleep(60)\n"
	start := time.Now()
	r, err := l.run(t.Context(), prog)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != "timed_out" || time.Since(start) > 5*time.Second {
		t.Fatalf("run %+v after %v", r, time.Since(start))
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/proc/" + strings.TrimSpace(string(b))); err == nil {
		// Reaped by init shortly after the kill; give it a moment.
		time.Sleep(200 * time.Millisecond)
		if st, err := os.ReadFile("/proc/" + strings.TrimSpace(string(b)) + "/stat"); err == nil && !bytes.Contains(st, []byte(") Z ")) {
			t.Errorf("the sample's child %s survived the timeout", b)
		}
	}
}

func pyQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `\'`) + "'" }

func TestRatiosAndVerdicts(t *testing.T) {
	set := sampleSet{name: "s", samples: []benchSample{{Sample: eval.Sample{TaskID: "a"}}, {Sample: eval.Sample{TaskID: "b"}}}}
	rows := []heRow{
		{Way: "gvisor (warm)", Runtime: "gvisor", PerS: 30, statuses: []eval.Status{eval.Passed, eval.Failed}},
		{Way: "unsandboxed", Runtime: wayUnsandboxed, PerS: 60, statuses: []eval.Status{eval.Passed, eval.TimedOut}},
		{Way: "namespaces (warm)", Runtime: "namespaces", PerS: 54, statuses: []eval.Status{eval.Passed, eval.TimedOut}},
	}
	ratios(rows)
	for i, want := range []float64{0.5, 1, 0.9} {
		if math.Abs(rows[i].Ratio-want) > 1e-9 {
			t.Errorf("%s: ratio %v, want %v", rows[i].Way, rows[i].Ratio, want)
		}
	}
	mm := compareVerdicts(set, 1, rows)
	if len(mm) != 1 || mm[0].Way != "gvisor (warm)" || mm[0].RefWay != "unsandboxed" || mm[0].CompletionID != 1 || mm[0].TaskID != "b" || mm[0].Status != "failed" {
		t.Fatalf("mismatches %+v", mm)
	}
	var out bytes.Buffer
	if err := printHumanEval(&out, heReport{Rows: rows, Mismatches: mm}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "WARNING: 1 VERDICTS DIFFER") || !strings.Contains(out.String(), "| 0.50 ") {
		t.Errorf("table:\n%s", out.String())
	}

	// Without an unsandboxed row there is no ratio.
	rows = []heRow{{Runtime: "gvisor", PerS: 3}}
	ratios(rows)
	if rows[0].Ratio != 0 {
		t.Errorf("ratio %v without a baseline", rows[0].Ratio)
	}
	if got := rotate([]way{{runtime: "a"}, {runtime: "b"}, {runtime: "c"}}, 4); got[0].runtime != "b" || got[2].runtime != "a" {
		t.Errorf("rotate: %v", got)
	}
}

func TestSamplePercentiles(t *testing.T) {
	var s sample
	for i := 100; i >= 1; i-- {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	if s.pct(50) != 50*time.Millisecond || s.pct(99) != 99*time.Millisecond {
		t.Fatalf("p50 %v p99 %v", s.pct(50), s.pct(99))
	}
}
