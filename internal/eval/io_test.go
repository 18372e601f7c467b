package eval

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestEqualJSON(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{`5`, `5`, true},
		{`5`, `5.0`, true},
		{`5`, `6`, false},
		{`123456789012345678901234567890`, `123456789012345678901234567890`, true},
		{`123456789012345678901234567890`, `123456789012345678901234567891`, false},
		{`0.1`, `0.30000000000000004`, false},
		{`0.3`, `0.30000000000000004`, true},
		{`1e-12`, `0`, true},
		{`1e300`, `1.0000000001e300`, true},
		{`1e300`, `1.01e300`, false},
		{`true`, `1`, false},
		{`null`, `null`, true},
		{`null`, `0`, false},
		{`"a"`, `"a"`, true},
		{`"a"`, `"b"`, false},
		{`[1, [2, "x"]]`, `[1,[2,"x"]]`, true},
		{`[1, 2]`, `[1, 2, 3]`, false},
		{`{"a": 1, "b": [true]}`, `{"b":[true],"a":1}`, true},
		{`{"a": 1}`, `{"a": 1, "b": 2}`, false},
		{`{"a": 1}`, `[1]`, false},
	} {
		got, err := EqualJSON(json.RawMessage(tc.a), json.RawMessage(tc.b))
		if err != nil || got != tc.want {
			t.Errorf("EqualJSON(%s, %s) = %v, %v; want %v", tc.a, tc.b, got, err, tc.want)
		}
	}
	if _, err := EqualJSON(json.RawMessage(`1 2`), json.RawMessage(`1`)); err == nil {
		t.Error("two values: no error")
	}
}

func TestReadProblemsModes(t *testing.T) {
	ps, err := ReadProblems(strings.NewReader(`{"task_id":"a","prompt":"","entry_point":"f","io":[{"input":[1,"x"],"output":null}]}`))
	if err != nil || len(ps.ByID["a"].IO) != 1 || string(ps.ByID["a"].IO[0].Output) != "null" || string(ps.ByID["a"].IO[0].Input[1]) != `"x"` {
		t.Fatalf("io problem: %+v, %v", ps, err)
	}
	ps, err = ReadProblems(strings.NewReader(`{"task_id":"b","prompt":"","tests":[{"input":"1 2\n","output":"3\n"}],"checker":{"type":"float","abs_tol":0.5},"language":"c++"}` + "\n" +
		`{"task_id":"c","prompt":"","test":"assert f(1) == 2\n"}`))
	if err != nil || len(ps.ByID["b"].Tests) != 1 || ps.ByID["b"].Checker.AbsTol != 0.5 || ps.ByID["b"].Language != "c++" || ps.ByID["c"].EntryPoint != "" {
		t.Fatalf("stdin and MBPP-style problems: %+v, %v", ps, err)
	}
	// MultiPL-E's Python tests call check themselves: no entry_point needed.
	if _, err := ReadProblems(strings.NewReader(`{"task_id":"d","prompt":"","test":"def check(candidate):\n    assert candidate() == 1\n\ndef test_check():\n    check(f)\n\ntest_check()\n"}`)); err != nil {
		t.Errorf("a test that calls its check: %v", err)
	}
	if prog := Program(ps.ByID["c"], Sample{TaskID: "c", Solution: new("def f(x): return 2*x\n")}, 7); strings.Contains(prog, "check(") || !strings.Contains(prog, "assert f(1) == 2\n") {
		t.Errorf("an assert problem without entry_point runs its asserts as they are, got:\n%s", prog)
	}
	for _, tc := range []struct{ in, want string }{
		{`{"task_id":"a","entry_point":"f","test":"x","io":[{"input":[],"output":1}]}`, "not several"},
		{`{"task_id":"a","test":"x","tests":[{"input":"","output":"1"}]}`, "not several"},
		{`{"task_id":"a","io":[{"input":[],"output":1}]}`, "io (I/O mode) needs entry_point"},
		{`{"task_id":"a","tests":[]}`, "tests must have 1 to 10000"},
		{`{"task_id":"a","test":"x","checker":{"type":"exact"}}`, "checker is only for tests"},
		{`{"task_id":"a","tests":[{"input":"","output":""}],"checker":{"type":"fuzzy"}}`, `checker "fuzzy"`},
		{`{"task_id":"a","tests":[{"input":"","output":""}],"checker":{"type":"program"}}`, "needs source"},
		{`{"task_id":"a","tests":[{"input":"","output":""}],"checker":{"type":"exact","source":"x"}}`, "only for type"},
		{`{"task_id":"a","tests":[{"input":"","output":""}],"checker":{"type":"program","source":"x","language":"cobol"}}`, `unknown language "cobol"`},
		{`{"task_id":"a","tests":[{"input":"","output":""}],"language":"cobol"}`, `unknown language "cobol"`},
		{`{"task_id":"a","prompt":"def f(): pass","test":"def check(candidate):\n    assert candidate() == 1\n"}`, "never calls it"},
		{`{"task_id":"a","entry_point":"f"}`, "give test"},
		{`{"task_id":"a","entry_point":"f","io":[]}`, "1 to 10000 cases"},
		{`{"task_id":"a","entry_point":"f","io":[{"output":1}]}`, "io[0]: input must be an array"},
		{`{"task_id":"a","entry_point":"f","io":[{"input":[1]}]}`, "io[0]: no output"},
		{`{"task_id":"a","entry_point":"f","io":[{"input":1,"output":1}]}`, "cannot unmarshal"},
	} {
		if _, err := ReadProblems(strings.NewReader(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.in, err, tc.want)
		}
	}
}

// ioProblem is f(a, b) = a + b with four cases.
var ioProblem = Problem{TaskID: "io/0", Prompt: "def f(a, b):\n", EntryPoint: "f", IO: []IOCase{
	{Input: raws(`1`, `2`), Output: json.RawMessage(`3`)},
	{Input: raws(`[1]`, `[2]`), Output: json.RawMessage(`[1, 2]`)},
	{Input: raws(`"a"`, `"b"`), Output: json.RawMessage(`"ab"`)},
	{Input: raws(`0.1`, `0.2`), Output: json.RawMessage(`0.3`)},
}}

func raws(vs ...string) []json.RawMessage {
	out := make([]json.RawMessage, len(vs))
	for i, v := range vs {
		out[i] = json.RawMessage(v)
	}
	return out
}

// runProgram runs a program with python3 in a fresh temp dir and returns
// the Run a sandbox exec would give (stdout included).
func runProgram(t *testing.T, program string, timeout time.Duration) Run {
	t.Helper()
	dir := t.TempDir()
	f := filepath.Join(dir, "program.py")
	if err := os.WriteFile(f, []byte(program), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, python(t), f)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	r := Run{Status: "exited", PassCode: testPassCode, Stdout: stdout.String(), Stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		r.Status = "timed_out"
	case errors.As(err, &ee):
		r.ExitCode = ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return r
}

// ioSamples are completions of ioProblem with their verdicts.
var ioSamples = []struct {
	name, body string
	status     Status
	detail     string
}{
	{"right", "    return a + b\n", Passed, ""},
	{"wrong", "    return a + b if a != 'a' else 'ba'\n", Failed, `case 2: expected "ab", got "ba"`},
	{"raises", "    if a == [1]:\n        raise ValueError('no lists')\n    return a + b\n", Failed, "case 1: ValueError: no lists"},
	{"tuple is a list", "    return tuple(a + b) if a == [1] else a + b\n", Passed, ""},
	{"not json", "    return {a} if a == 1 else a + b\n", Failed, "case 0: TypeError: Object of type set is not JSON serializable"},
	{"slow", "    import time\n    if a == 'a':\n        time.sleep(30)\n    return a + b\n", TimedOut, "timed out in case 2"},
	{"syntax", "    return a +\n", Failed, "SyntaxError: invalid syntax"},
	{"exits early", "    import os\n    os._exit(0)\n", Failed, "case 0: no result (the program ended early)"},
	{"prints", "    print('{\"case\": 0, \"output\": 3}')\n    return 0\n", Failed, "case 0: expected 3, got 0"},
	// Forged protocol lines straight to the driver's result descriptor,
	// then an exit before the driver writes: without the expected values
	// the forgery cannot pass.
	{"forges", "    return 0\nimport os\nfor fd in range(3, 10):\n    try:\n        os.write(fd, b'{\"case\": 0, \"output\": 0}\\n{\"case\": 1, \"output\": 0}\\n{\"case\": 2, \"output\": 0}\\n{\"case\": 3, \"output\": 0}\\n')\n    except OSError:\n        pass\nos._exit(0)\n", Failed, "case 0: expected 3, got 0"},
	{"extra lines", "    return a + b\nimport os\nos.write(3, b'{\"case\": 9, \"output\": 0}\\n')\n", Failed, "case 0: malformed result line"},
}

// TestIOModeVerdicts runs I/O mode programs with python3 and judges them
// against the expected outputs, which the programs never contain.
func TestIOModeVerdicts(t *testing.T) {
	python(t)
	for _, tc := range ioSamples {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			body := tc.body
			prog := Program(ioProblem, Sample{TaskID: "io/0", Completion: &body}, testPassCode)
			if strings.Contains(prog, `"ab"`) && !strings.Contains(tc.body, "ab") {
				t.Fatalf("the program holds an expected output:\n%s", prog)
			}
			r := runProgram(t, prog, 3*time.Second)
			v := ioProblem.Judge(r)
			if v.Status != tc.status || !strings.HasPrefix(v.Detail, tc.detail) {
				t.Errorf("verdict %+v, want %s %q\nstdout: %s\nstderr: %s", v, tc.status, tc.detail, r.Stdout, r.Stderr)
			}
			if v.Status == Failed && !strings.HasPrefix(v.Result, "failed: ") {
				t.Errorf("result %q", v.Result)
			}
		})
	}
}

func TestJudgeIOProtocol(t *testing.T) {
	cases := ioProblem.IO[:2]
	for _, tc := range []struct {
		name string
		r    Run
		want Status
		det  string
	}{
		{"ok", Run{Status: "exited", Stdout: "{\"case\":0,\"output\":3}\n{\"case\":1,\"output\":[1,2]}\n"}, Passed, ""},
		{"exit 1 after all", Run{Status: "exited", ExitCode: 1, Stdout: "{\"case\":0,\"output\":3}\n{\"case\":1,\"output\":[1,2]}\n", Stderr: "Traceback (most recent call last):\nSystemExit: 1\n"}, Failed, "SystemExit: 1"},
		{"extra", Run{Status: "exited", Stdout: "{\"case\":0,\"output\":3}\n{\"case\":1,\"output\":[1,2]}\n{\"case\":2,\"output\":1}\n"}, Failed, "more result lines than the 2 cases"},
		{"out of order", Run{Status: "exited", Stdout: "{\"case\":1,\"output\":[1,2]}\n{\"case\":0,\"output\":3}\n"}, Failed, "case 0: malformed"},
		{"both", Run{Status: "exited", Stdout: "{\"case\":0,\"output\":3,\"error\":\"x\"}\n"}, Failed, "case 0: malformed"},
		{"unknown field", Run{Status: "exited", Stdout: "{\"case\":0,\"output\":3,\"pass\":true}\n"}, Failed, "case 0: malformed"},
		{"cut line", Run{Status: "exited", Stdout: "{\"case\":0,\"output\":3}\n{\"case\":1,\"out"}, Failed, "case 1: no result"},
		{"killed", Run{Status: "killed", ExitCode: -1, Signal: 9, Stdout: "{\"case\":0,\"output\":3}\n"}, Failed, "case 1: killed by signal 9"},
		{"infra", Run{Status: "error", Error: "agent lost"}, InfraError, "agent lost"},
		{"timeout", Run{Status: "timed_out", Stdout: "{\"case\":0,\"output\":3}\n"}, TimedOut, "timed out in case 1"},
		{"mismatch before timeout", Run{Status: "timed_out", Stdout: "{\"case\":0,\"output\":4}\n"}, Failed, "case 0: expected 3, got 4"},
	} {
		v := JudgeIO(tc.r, cases)
		if v.Status != tc.want || !strings.HasPrefix(v.Detail, tc.det) {
			t.Errorf("%s: %+v, want %s %q", tc.name, v, tc.want, tc.det)
		}
	}
}
