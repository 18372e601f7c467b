package eval

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// jsonl writes records as JSON Lines.
func jsonl(t *testing.T, records ...any) string {
	t.Helper()
	var b strings.Builder
	for _, r := range records {
		line, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	return b.String()
}

// jsonText is v as JSON text (for fields that hold JSON in a string).
func jsonText(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func readFormat(t *testing.T, in, format string) (Problems, string) {
	t.Helper()
	ps, used, err := ReadProblemsFormat(strings.NewReader(in), format)
	if err != nil {
		t.Fatalf("ReadProblemsFormat(%s): %v", format, err)
	}
	return ps, used
}

func wantFormatError(t *testing.T, in, format, want string) {
	t.Helper()
	_, _, err := ReadProblemsFormat(strings.NewReader(in), format)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("ReadProblemsFormat(%s) = %v, want an error with %q\ninput: %s", format, err, want, in)
	}
}

// judgeSample runs sample s of problem p with host python3 and judges it
// as the server would (assert or I/O mode).
func judgeSample(t *testing.T, p Problem, s Sample) Verdict {
	t.Helper()
	return p.Judge(runProgram(t, Program(p, s, testPassCode), 10*time.Second))
}

func completion(task, code string) Sample { return Sample{TaskID: task, Completion: &code} }
func solution(task, code string) Sample   { return Sample{TaskID: task, Solution: &code} }

func TestParseFormat(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want FormatSpec
	}{
		{"", FormatSpec{Name: FormatAuto}},
		{"auto", FormatSpec{Name: FormatAuto}},
		{"MBPP", FormatSpec{Name: FormatMBPP}},
		{"taco", FormatSpec{Name: FormatAPPS}},
		{"multiple", FormatSpec{Name: FormatMultiPLE}},
		{"codecontests:public,private,public", FormatSpec{Name: FormatCodeContests, Sets: []string{"public", "private"}}},
		{"codecontests: generated , case_insensitive", FormatSpec{Name: FormatCodeContests, Sets: []string{"generated"}, Checker: &Checker{Kind: CheckCaseInsensitive}}},
		{"apps:exact", FormatSpec{Name: FormatAPPS, Checker: &Checker{Kind: CheckExact}}},
		{"evalplus:base", FormatSpec{Name: FormatEvalPlus, Sets: []string{"base"}}},
		{"mbpp:test,challenge", FormatSpec{Name: FormatMBPP, Sets: []string{"test", "challenge"}}},
	} {
		got, err := ParseFormat(tc.in)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseFormat(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"csv", `unknown format "csv"`},
		{"auto:public", "options need a format name"},
		{"humaneval:public", `unknown option "public" (humaneval takes no options)`},
		{"mbpp:exact", `unknown option "exact" (mbpp takes test, challenge)`},
		{"apps:float,exact", "two checkers"},
		{"livecodebench:generated", "takes public, private, tokens, exact, float, case_insensitive"},
	} {
		if _, err := ParseFormat(tc.in); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseFormat(%q) = %v, want %q", tc.in, err, tc.want)
		}
	}
}

func TestDetectFormat(t *testing.T) {
	for _, tc := range []struct {
		keys []string
		want string
	}{
		{[]string{"task_id", "prompt", "entry_point", "canonical_solution", "test"}, FormatHumanEval},
		{[]string{"task_id", "prompt", "tests", "language"}, FormatHumanEval},
		{[]string{"task_id", "text", "code", "test_list", "test_setup_code", "challenge_test_list"}, FormatMBPP},
		{[]string{"task_id", "prompt", "code", "source_file", "test_imports", "test_list", "test"}, FormatMBPP},
		{[]string{"task_id", "prompt", "entry_point", "canonical_solution", "base_input", "plus_input", "atol", "test"}, FormatEvalPlus},
		{[]string{"problem_id", "question", "solutions", "input_output", "difficulty", "url", "starter_code"}, FormatAPPS},
		{[]string{"question", "solutions", "starter_code", "input_output", "difficulty", "raw_tags", "name", "source"}, FormatAPPS},
		{[]string{"name", "description", "public_tests", "private_tests", "generated_tests", "source"}, FormatCodeContests},
		{[]string{"question_title", "question_id", "public_test_cases", "private_test_cases", "metadata"}, FormatLiveCodeBench},
		{[]string{"name", "language", "prompt", "doctests", "original", "prompt_terminology", "tests", "stop_tokens"}, FormatMultiPLE},
		{[]string{"name", "language", "prompt", "tests"}, FormatMultiPLE},
		{[]string{"question", "answer"}, ""},
	} {
		if got := DetectFormat(tc.keys); got != tc.want {
			t.Errorf("DetectFormat(%v) = %q, want %q", tc.keys, got, tc.want)
		}
	}
}

// TestReadProblemsFormatContainers reads one problem set as JSON Lines
// (plain and gzip), a JSON array, a JSON object of records and a single
// pretty-printed record, and checks that errors name the record.
func TestReadProblemsFormatContainers(t *testing.T) {
	recs := []map[string]any{
		{"task_id": "a/0", "prompt": "def f(x):\n", "entry_point": "f", "test": "def check(c):\n    assert c(1) == 2\n"},
		{"task_id": "a/1", "prompt": "def g(x):\n", "entry_point": "g", "io": []any{map[string]any{"input": []any{1}, "output": 2}}},
	}
	lines := jsonl(t, recs[0], recs[1])
	want, err := ReadProblems(strings.NewReader(lines))
	if err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(lines))
	zw.Close()
	pretty, _ := json.MarshalIndent(recs, "", "  ")
	object, _ := json.MarshalIndent(map[string]any{"x": recs[0], "y": recs[1]}, "", "  ")
	for name, in := range map[string]string{
		"jsonl": "\n" + lines + "\n\n", "jsonl.gz": gz.String(), "array": "  " + string(pretty), "object": string(object),
	} {
		ps, used := readFormat(t, in, "")
		if used != FormatHumanEval || !reflect.DeepEqual(ps, want) {
			t.Errorf("%s: %s %+v, want %+v", name, used, ps, want)
		}
	}
	one, _ := json.MarshalIndent(recs[0], "", "  ")
	if ps, _ := readFormat(t, string(one), FormatHumanEval); len(ps.Order) != 1 || ps.Order[0] != "a/0" {
		t.Errorf("one pretty-printed record: %+v", ps)
	}

	bad := map[string]any{"task_id": "a/2", "prompt": "", "entry_point": "f"}
	wantFormatError(t, lines+jsonl(t, bad), "", `line 3: problem "a/2": give test`)
	arr, _ := json.Marshal([]any{recs[0], bad})
	wantFormatError(t, string(arr), "", `problems: record 1: problem "a/2": give test`)
	obj, _ := json.Marshal(map[string]any{"k": bad})
	wantFormatError(t, string(obj), "", `problems: record "k": problem "a/2": give test`)
	wantFormatError(t, lines+lines, "", `line 3: task_id "a/0" appears twice`)
	wantFormatError(t, `{"question": "?", "answer": 1}`+"\n", "", "cannot tell the format from the fields answer, question: give one of humaneval")
	wantFormatError(t, "[1, 2]", "", "record 0: a record must be a JSON object, got a number")
	wantFormatError(t, `{"name": "A", "public_tests": {"input": ["1"], "output": ["1"]}, "cf_points": NaN}`+"\n", "", "line 1: codecontests: NaN or Infinity, which are not JSON")
	wantFormatError(t, "", "", "no problems")
	wantFormatError(t, "task_id,prompt\n", "", "want JSON Lines or a JSON array or object")
	wantFormatError(t, `[{"task_id": "a"}] x`, FormatHumanEval, "")
}

func TestMBPP(t *testing.T) {
	original := map[string]any{
		"task_id": 11, "text": "Write a python function to remove first and last occurrence of a given character from the string.",
		"code":                "def remove_Occ(s, ch):\n    return s.replace(ch, '', 1)[::-1].replace(ch, '', 1)[::-1]\n",
		"test_setup_code":     "import math",
		"test_list":           []string{`assert remove_Occ("hello","l") == "heo"`, `assert remove_Occ("abcda","a") == "bcd"`},
		"challenge_test_list": []string{`assert remove_Occ("PHP","P") == "H"`},
	}
	sanitized := map[string]any{
		"source_file": "x.py", "task_id": 12, "prompt": "Write a function to double a number.", "code": "def double(x):\n    return 2 * x\n",
		"test_imports": []string{"import math"}, "test_list": []string{"assert math.isclose(double(1.5), 3.0)"},
	}
	ps, used := readFormat(t, jsonl(t, original, sanitized), "")
	if used != FormatMBPP || !slices.Equal(ps.Order, []string{"11", "12"}) {
		t.Fatalf("%s %v", used, ps.Order)
	}
	p := ps.ByID["11"]
	if want := "import math\n" + `assert remove_Occ("hello","l") == "heo"` + "\n" + `assert remove_Occ("abcda","a") == "bcd"` + "\n"; p.Test != want ||
		p.EntryPoint != "" || p.Prompt != "" || p.Language != "python" || !strings.HasPrefix(p.CanonicalSolution, "def remove_Occ") {
		t.Errorf("MBPP problem %+v", p)
	}
	if ps.ByID["12"].Test != "import math\nassert math.isclose(double(1.5), 3.0)\n" {
		t.Errorf("sanitized MBPP test %q", ps.ByID["12"].Test)
	}
	ps, _ = readFormat(t, jsonl(t, original), "mbpp:test,challenge")
	if !strings.HasSuffix(ps.ByID["11"].Test, `assert remove_Occ("PHP","P") == "H"`+"\n") {
		t.Errorf("with challenge tests: %q", ps.ByID["11"].Test)
	}
	python(t)
	for _, tc := range []struct {
		s    Sample
		want Status
	}{
		{solution("11", original["code"].(string)), Passed},
		{completion("11", original["code"].(string)), Passed},
		{solution("11", "def remove_Occ(s, ch):\n    return s.replace(ch, '', 1)\n"), Failed},
		{solution("12", sanitized["code"].(string)), Passed},
	} {
		if v := judgeSample(t, ps.ByID[tc.s.TaskID], tc.s); v.Status != tc.want {
			t.Errorf("%s %q: %+v, want %s", tc.s.TaskID, sampleCode(tc.s), v, tc.want)
		}
	}
	wantFormatError(t, jsonl(t, map[string]any{"task_id": 3, "test_list": []any{1}}), "", `line 1: mbpp "3": test_list: want a list of strings, got an array whose element 0 is a number`)
	wantFormatError(t, jsonl(t, map[string]any{"task_id": 3.5, "test_list": []string{"assert 1"}}), "", "line 1: mbpp: task_id: want a string or an integer, got a number")
	wantFormatError(t, jsonl(t, map[string]any{"task_id": 4, "test_list": []string{}}), "", `mbpp "4": no tests in test_list`)
}

func sampleCode(s Sample) string {
	if s.Solution != nil {
		return *s.Solution
	}
	return *s.Completion
}

// mbppPlusSuite is a suite in the shape evalplus writes into MBPP+'s test
// field: numpy, an assertion with a tolerance, inputs and results.
const mbppPlusSuite = `import numpy as np
from math import inf


def is_floats(x) -> bool:
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)) and x:
        return all(isinstance(i, float) for i in x)
    if isinstance(x, np.ndarray):
        return x.dtype == np.float64 or x.dtype == np.float32
    return False


def assertion(out, exp, atol):
    exact_match = out == exp
    if atol == 0 and is_floats(exp):
        atol = 1e-6
    if not exact_match and atol != 0:
        assert np.allclose(out, exp, rtol=1e-07, atol=atol)
    else:
        assert exact_match


inputs = [[[1.0, 3.0]], [[0.1, 0.2, 0.4]], [[2.0, 2.0, 4.0]]]
results = [[0.25, 0.75], [0.14285714285714282, 0.28571428571428564, 0.5714285714285713], [0.25, 0.25, 0.5]]
for i, (inp, exp) in enumerate(zip(inputs, results)):
    assertion(normalize(*inp), exp, 0)
`

// TestMBPPPlus reads MBPP+ in MBPP's form: its test field is the suite,
// which runs with evalbox's numpy stand-in where numpy is missing.
func TestMBPPPlus(t *testing.T) {
	rec := map[string]any{"task_id": 900, "prompt": "Write a function to scale a list of numbers so that they sum to 1.",
		"code": "def normalize(xs):\n    s = sum(xs)\n    return [x / s for x in xs]\n", "source_file": "x.py",
		"test_imports": []string{}, "test_list": []string{"assert normalize([1.0, 1.0]) == [0.5, 0.5]"}, "test": mbppPlusSuite}
	ps, used := readFormat(t, jsonl(t, rec), "")
	p := ps.ByID["900"]
	if used != FormatMBPP || !strings.HasSuffix(p.Test, mbppPlusSuite) || !strings.HasPrefix(p.Test, "try:\n    import numpy") || p.Prompt != "" {
		t.Fatalf("MBPP+ problem %+v", p)
	}
	python(t)
	for _, tc := range []struct {
		code string
		want Status
	}{
		{rec["code"].(string), Passed},
		// Within the suite's 1e-6 tolerance of float results.
		{"def normalize(xs):\n    s = sum(xs)\n    return [x / s + 1e-9 for x in xs]\n", Passed},
		{"def normalize(xs):\n    return [x / len(xs) for x in xs]\n", Failed},
		{"def normalize(xs):\n    return xs[:1]\n", Failed},
	} {
		if v := judgeSample(t, p, solution("900", tc.code)); v.Status != tc.want {
			t.Errorf("%q: %+v, want %s", tc.code, v, tc.want)
		}
	}
}

// TestEvalPlus reads evalplus's own form: inputs without outputs, which
// the canonical solution gives in the sandbox.
func TestEvalPlus(t *testing.T) {
	// NaN and Infinity are Python's json, not JSON.
	line := `{"task_id": "Mbpp/901", "prompt": "\"\"\"\nWrite a function to find the largest of a list.\nassert biggest([1, 3]) == 3\n\"\"\"\n", ` +
		`"entry_point": "biggest", "canonical_solution": "\ndef biggest(xs):\n    return max(xs)\n", ` +
		`"base_input": [[[1, 3]], [[2.5, -1]]], "plus_input": [[[-Infinity, 7]], [[0, 0, 0]]], "atol": 0, "contract": ""}` + "\n"
	floats := map[string]any{"task_id": "HumanEval/902", "prompt": "def mean(xs):\n", "entry_point": "mean",
		"canonical_solution": "    return sum(xs) / len(xs)\n", "base_input": []any{[]any{[]any{1, 2}}}, "plus_input": []any{[]any{[]any{0.1, 0.2, 0.3}}},
		"atol": 1e-4, "test": "def check(candidate):\n    assert candidate([1, 2]) == 1.5\n"}
	ps, used := readFormat(t, line+jsonl(t, floats), "")
	if used != FormatEvalPlus || !slices.Equal(ps.Order, []string{"Mbpp/901", "HumanEval/902"}) {
		t.Fatalf("%s %v", used, ps.Order)
	}
	p := ps.ByID["Mbpp/901"]
	if p.EntryPoint != "" || !strings.HasPrefix(p.Prompt, `"""`) || !strings.Contains(p.Test, `[[[1,3]],[[2.5,-1]],[[-Infinity,7]],[[0,0,0]]]`) {
		t.Errorf("evalplus problem %+v", p)
	}
	base, _ := readFormat(t, line, "evalplus:base")
	if strings.Contains(base.ByID["Mbpp/901"].Test, "Infinity") {
		t.Errorf("evalplus:base reads the plus inputs:\n%s", base.ByID["Mbpp/901"].Test)
	}
	python(t)
	for _, tc := range []struct {
		s    Sample
		want Status
		in   string
	}{
		{solution("Mbpp/901", "def biggest(xs):\n    return sorted(xs)[-1]\n"), Passed, ""},
		{completion("Mbpp/901", "def biggest(xs):\n    return sorted(xs)[-1]\n"), Passed, ""},
		// Passes the base inputs, not the plus ones.
		{solution("Mbpp/901", "def biggest(xs):\n    return max(xs) if xs[0] != 0 else 1\n"), Failed, "input 3"},
		{solution("Mbpp/901", "def biggest(xs):\n    return max(xs) if min(xs) > -1e308 else 0\n"), Failed, "input 2"},
		{completion("HumanEval/902", "    return sum(xs) / len(xs) + 1e-5\n"), Passed, ""},
		{completion("HumanEval/902", "    return sum(xs) / len(xs) + 1e-3\n"), Failed, "input 0"},
		{completion("HumanEval/902", "    return int(sum(xs) / len(xs))\n"), Failed, "input 0"},
	} {
		v := judgeSample(t, ps.ByID[tc.s.TaskID], tc.s)
		if v.Status != tc.want || !strings.Contains(v.Detail, tc.in) {
			t.Errorf("%s %q: %+v, want %s (%s)", tc.s.TaskID, sampleCode(tc.s), v, tc.want, tc.in)
		}
	}
	if v := judgeSample(t, base.ByID["Mbpp/901"], solution("Mbpp/901", "def biggest(xs):\n    return max(xs) if xs[0] != 0 else 1\n")); v.Status != Passed {
		t.Errorf("base inputs only: %+v", v)
	}
	wantFormatError(t, jsonl(t, map[string]any{"task_id": "X/1", "entry_point": "f(", "canonical_solution": "x", "base_input": []any{}}), FormatEvalPlus, `entry_point "f(": want a Python identifier`)
	wantFormatError(t, jsonl(t, map[string]any{"task_id": "X/1", "entry_point": "f", "canonical_solution": "x", "base_input": []any{1}}), FormatEvalPlus, "base_input[0]: want a list of arguments, got a number")
	wantFormatError(t, jsonl(t, map[string]any{"task_id": "X/1", "entry_point": "f", "base_input": []any{}}), FormatEvalPlus, "no canonical_solution")
}

func TestAPPS(t *testing.T) {
	stdin := map[string]any{"problem_id": 4000, "question": "Print the sum of the numbers.", "starter_code": "",
		"input_output": jsonText(t, map[string]any{"inputs": []any{"1 2\n", []string{"3", "4"}}, "outputs": []any{"3\n", []string{"7"}}})}
	function := map[string]any{"problem_id": 4001, "question": "Count the ones.", "starter_code": "def count_ones(xs):\n\t",
		"input_output": jsonText(t, map[string]any{"fn_name": "count_ones", "inputs": []any{[]any{[]any{1, 0, 1}}, []any{[]any{}}}, "outputs": []any{[]any{2}, []any{0}}})}
	leetcode := map[string]any{"problem_id": 4002, "question": "Pair sums.", "starter_code": "class Solution:\n    def pairSums(self, xs: List[int]) -> List[int]:\n        ",
		"input_output": jsonText(t, map[string]any{"fn_name": "pairSums", "inputs": []any{[]any{[]any{1, 2, 3, 4}}}, "outputs": []any{[]any{[]any{3, 7}}}})}
	dictKeys := map[string]any{"problem_id": 4003, "question": "Largest key.",
		"input_output": jsonText(t, map[string]any{"fn_name": "largest_key", "inputs": []any{[]any{map[string]any{"2": "a", "10": "b"}}}, "outputs": []any{[]any{10}}})}
	ps, used := readFormat(t, jsonl(t, stdin, function, leetcode, dictKeys), "")
	if used != FormatAPPS || !slices.Equal(ps.Order, []string{"4000", "4001", "4002", "4003"}) {
		t.Fatalf("%s %v", used, ps.Order)
	}
	if p := ps.ByID["4000"]; !reflect.DeepEqual(p.Tests, []Test{{"1 2\n", "3\n"}, {"3\n4", "7"}}) || p.Checker != nil || p.Language != "" || p.IO != nil {
		t.Errorf("stdin problem %+v", p)
	}
	p := ps.ByID["4001"]
	if p.EntryPoint != entryWrapper || p.Language != "python" || len(p.IO) != 2 || string(p.IO[0].Output) != "2" || string(p.IO[0].Input[0]) != "[1,0,1]" {
		t.Errorf("call-based problem %+v", p)
	}
	python(t)
	for _, tc := range []struct {
		s      Sample
		want   Status
		detail string
	}{
		{completion("4001", "def count_ones(xs):\n    return xs.count(1)\n"), Passed, ""},
		{completion("4001", "def count_ones(xs):\n    return [xs.count(1)]\n"), Failed, "case 0: expected 2, got [2]"},
		{completion("4001", "def count_one(xs):\n    return 0\n"), Failed, "NameError: name 'count_ones' is not defined"},
		// The solution replaces the prompt, and with it the wrapper.
		{solution("4001", "def count_ones(xs):\n    return xs.count(1)\n"), Failed, "_evalbox_entry"},
		// List comes from APPS's imports; a tuple is a list.
		{completion("4002", "class Solution:\n    def pairSums(self, xs: List[int]) -> List[int]:\n        return tuple(xs[i] + xs[i + 1] for i in range(0, len(xs), 2))\n"), Passed, ""},
		{completion("4002", "class Solution:\n    def pairSums(self, xs):\n        return []\n"), Failed, "case 0: expected [3,7], got []"},
		{completion("4003", "def largest_key(d):\n    return max(d)\n"), Passed, ""},
	} {
		v := judgeSample(t, ps.ByID[tc.s.TaskID], tc.s)
		if v.Status != tc.want || !strings.Contains(v.Detail, tc.detail) {
			t.Errorf("%s %q: %+v, want %s (%s)", tc.s.TaskID, sampleCode(tc.s), v, tc.want, tc.detail)
		}
	}

	// TACO: no id (the record's index), input_output as an object too.
	taco := map[string]any{"question": "Echo.", "name": "Echo", "source": "codechef",
		"input_output": map[string]any{"inputs": []string{"x\n"}, "outputs": []string{"x\n"}}}
	ps, _ = readFormat(t, jsonl(t, taco, taco), "taco:exact")
	if !slices.Equal(ps.Order, []string{"0", "1"}) || ps.ByID["1"].Checker.Kind != CheckExact {
		t.Errorf("TACO: %+v", ps)
	}
	for _, tc := range []struct {
		rec  map[string]any
		want string
	}{
		{map[string]any{"problem_id": 1, "input_output": ""}, `line 1: apps "1": input_output: no tests`},
		{map[string]any{"problem_id": 1, "input_output": "{"}, "input_output: the string is not JSON text"},
		{map[string]any{"problem_id": 1, "input_output": `{"inputs": ["1"], "outputs": []}`}, "input_output: 1 inputs but 0 outputs"},
		{map[string]any{"problem_id": 1, "input_output": `{"inputs": [1], "outputs": ["1"]}`}, "input_output: inputs[0]: want a string or a list of strings, got a number"},
		{map[string]any{"problem_id": 1, "input_output": `{"fn_name": "f", "inputs": ["1"], "outputs": [1]}`}, "inputs[0]: want the list of f's arguments, got a string"},
	} {
		wantFormatError(t, jsonl(t, tc.rec), FormatAPPS, tc.want)
	}
}

func TestCodeContests(t *testing.T) {
	rec := map[string]any{"name": "1000_A. Sum", "description": "Print a+b.", "source": 2, "difficulty": 7,
		"public_tests":    map[string]any{"input": []string{"1 2\n"}, "output": []string{"3\n"}},
		"private_tests":   map[string]any{"input": []string{"5 5\n", "1 2\n"}, "output": []string{"10\n", "3\n"}},
		"generated_tests": map[string]any{"input": []string{"0 0\n"}, "output": []string{"0\n"}},
		"input_file":      "", "output_file": "", "time_limit": map[string]any{"seconds": 2}, "memory_limit_bytes": 256 << 20}
	ps, used := readFormat(t, jsonl(t, rec), "")
	p := ps.ByID["1000_A. Sum"]
	if used != FormatCodeContests || !reflect.DeepEqual(p.Tests, []Test{{"1 2\n", "3\n"}, {"5 5\n", "10\n"}, {"0 0\n", "0\n"}}) ||
		*p.Checker != codeContestsChecker || p.Language != "" {
		t.Errorf("%s %+v", used, p)
	}
	if c := codeContestsChecker; c.Compare("0.5000001\nYES\n", "0.5 YES") != "" || c.Compare("3", "4") == "" || c.Compare("YES", "yes") == "" {
		t.Errorf("CodeContests checker: %q %q", c.Compare("0.5000001\nYES\n", "0.5 YES"), c.Compare("3", "4"))
	}
	ps, _ = readFormat(t, jsonl(t, rec), "codecontests:private,case_insensitive")
	if p := ps.ByID["1000_A. Sum"]; !reflect.DeepEqual(p.Tests, []Test{{"5 5\n", "10\n"}, {"1 2\n", "3\n"}}) || p.Checker.Kind != CheckCaseInsensitive {
		t.Errorf("private only: %+v", p)
	}
	listForm := map[string]any{"name": "B", "public_tests": []any{map[string]any{"input": "1\n", "output": "1\n"}}}
	if ps, _ := readFormat(t, jsonl(t, listForm), FormatCodeContests); len(ps.ByID["B"].Tests) != 1 {
		t.Errorf("tests as a list: %+v", ps)
	}
	wantFormatError(t, jsonl(t, map[string]any{"name": "C", "public_tests": map[string]any{"input": []string{}, "output": []string{}}}), "",
		`codecontests "C": no tests in public_tests, private_tests, generated_tests`)
	wantFormatError(t, jsonl(t, map[string]any{"name": "C", "public_tests": map[string]any{"input": []string{"1"}, "output": []string{}}}), "",
		"public_tests: 1 inputs but 0 outputs")
	wantFormatError(t, jsonl(t, map[string]any{"name": "C", "input_file": "input.txt", "public_tests": map[string]any{"input": []string{"1"}, "output": []string{"1"}}}), "",
		`input_file: the program reads or writes the file "input.txt"`)
}

// pickleStr is pickle.dumps(s, protocol) as CPython writes it for one str:
// protocol 2 as BINUNICODE and BINPUT; 4 and 5 in a frame, SHORT_BINUNICODE
// (or BINUNICODE, unframed, from 64 KiB) and MEMOIZE.
func pickleStr(s string, protocol int) []byte {
	var body []byte
	le32 := binary.LittleEndian.AppendUint32
	if protocol == 2 {
		body = append(le32([]byte{'X'}, uint32(len(s))), s...)
		return append(append([]byte{0x80, 2}, body...), 'q', 0, '.')
	}
	if len(s) >= 64<<10 {
		return append(append(le32([]byte{0x80, byte(protocol), 'X'}, uint32(len(s))), s...), 0x94, '.')
	}
	if len(s) < 256 {
		body = append([]byte{0x8c, byte(len(s))}, s...)
	} else {
		body = append(le32([]byte{'X'}, uint32(len(s))), s...)
	}
	body = append(body, 0x94, '.')
	out := binary.LittleEndian.AppendUint64([]byte{0x80, byte(protocol), 0x95}, uint64(len(body)))
	return append(out, body...)
}

func TestUnpickleString(t *testing.T) {
	// CPython 3.11's pickle.dumps("héllo", protocol=4) and protocol=2.
	for _, h := range []string{"8004950a000000000000008c0668c3a96c6c6f942e", "8002580600000068c3a96c6c6f71002e"} {
		b, _ := hex.DecodeString(h)
		if s, err := unpickleString(b); s != "héllo" || err != nil {
			t.Errorf("%s: %q, %v", h, s, err)
		}
	}
	for _, s := range []string{"", "[]", strings.Repeat("é", 200), strings.Repeat("x", 70_000)} {
		for _, proto := range []int{2, 4, 5} {
			if got, err := unpickleString(pickleStr(s, proto)); got != s || err != nil {
				t.Errorf("protocol %d, %d bytes: %d bytes, %v", proto, len(s), len(got), err)
			}
		}
	}
	b8 := binary.LittleEndian.AppendUint64([]byte{0x80, 4, 0x8d}, 2)
	if s, err := unpickleString(append(b8, 'h', 'i', 0x94, '.')); s != "hi" || err != nil {
		t.Errorf("BINUNICODE8: %q, %v", s, err)
	}
	ok := pickleStr("hi", 2)
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"a list", []byte{0x80, 4, 0x95, 2, 0, 0, 0, 0, 0, 0, 0, ']', '.'}, "opcode 0x5d"},
		{"a global (code)", append([]byte{0x80, 2, 'c'}, "os\nsystem\n"...), "opcode 0x63"},
		{"two strs", []byte{0x80, 4, 0x8c, 1, 'a', 0x8c, 1, 'b', '.'}, "more than one object"},
		{"protocol 1", []byte{'X', 1, 0, 0, 0, 'a', '.'}, ""},
		{"protocol 6", []byte{0x80, 6, 0x8c, 1, 'a', '.'}, "protocol 6"},
		{"PROTO twice", []byte{0x80, 4, 0x80, 4, 0x8c, 1, 'a', '.'}, "protocol 4 at byte 2"},
		{"trailing data", append(slices.Clone(ok), 'x'), "data after STOP"},
		{"no STOP", ok[:len(ok)-1], "no STOP"},
		{"truncated", ok[:len(ok)-4], "truncated"},
		{"frame past the end", []byte{0x80, 4, 0x95, 99, 0, 0, 0, 0, 0, 0, 0, 0x8c, 1, 'a', '.'}, "frame past the end"},
		{"bad UTF-8", []byte{0x80, 4, 0x8c, 1, 0xff, '.'}, "not valid UTF-8"},
		{"memo first", []byte{0x80, 4, 0x94, 0x8c, 1, 'a', '.'}, "out of place"},
		{"empty", nil, "no STOP"},
		{"STOP alone", []byte{0x80, 4, '.'}, "no str before STOP"},
	} {
		s, err := unpickleString(tc.b)
		if tc.name == "protocol 1" {
			// Without PROTO: a protocol-1 pickle of a str; taken.
			if s != "a" || err != nil {
				t.Errorf("%s: %q, %v", tc.name, s, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %q, %v; want an error with %q", tc.name, s, err, tc.want)
		}
	}
}

// lcbCompress packs LiveCodeBench's private tests as code_generation_lite
// does: base64(zlib(pickle(json))).
func lcbCompress(t *testing.T, tests any, protocol int) string {
	t.Helper()
	var z bytes.Buffer
	zw := zlib.NewWriter(&z)
	zw.Write(pickleStr(jsonText(t, tests), protocol))
	zw.Close()
	return base64.StdEncoding.EncodeToString(z.Bytes())
}

func TestLiveCodeBench(t *testing.T) {
	type lt = map[string]string
	big := strings.Repeat("9", 70_000) // an unframed pickle payload
	stdin := map[string]any{"question_title": "Double", "question_id": "abc300_a", "platform": "atcoder", "starter_code": "",
		"public_test_cases":  jsonText(t, []lt{{"input": "2\n", "output": "4\n", "testtype": "stdin"}}),
		"private_test_cases": lcbCompress(t, []lt{{"input": "5\n", "output": "10\n", "testtype": "stdin"}, {"input": big + "\n", "output": "x\n", "testtype": "stdin"}}, 4),
		"metadata":           "{}", "contest_id": "abc300", "contest_date": "2023-04-29T00:00:00", "difficulty": "easy"}
	functional := map[string]any{"question_title": "Pair sums", "question_id": "3000", "platform": "leetcode",
		"starter_code":       "class Solution:\n    def pairSums(self, nums: List[int], k: int) -> List[int]:\n        ",
		"public_test_cases":  jsonText(t, []lt{{"input": "[1, 2, 3, 4]\n2", "output": "[3, 7]", "testtype": "functional"}}),
		"private_test_cases": jsonText(t, []lt{{"input": "[5, 5]\n2\n", "output": "[10]", "testtype": "functional"}, {"input": "[]\n2", "output": "[]", "testtype": "functional"}}),
		"metadata":           jsonText(t, map[string]any{"func_name": "pairSums"}), "contest_id": "weekly-contest-1", "difficulty": "medium"}
	ps, used := readFormat(t, jsonl(t, stdin, functional), "")
	if used != FormatLiveCodeBench || !slices.Equal(ps.Order, []string{"abc300_a", "3000"}) {
		t.Fatalf("%s %v", used, ps.Order)
	}
	if p := ps.ByID["abc300_a"]; len(p.Tests) != 3 || p.Tests[1] != (Test{"5\n", "10\n"}) || p.Tests[2].Input != big+"\n" || p.Checker != nil || p.IO != nil {
		t.Errorf("stdin problem: %d tests, %+v", len(p.Tests), p.Tests[:min(2, len(p.Tests))])
	}
	p := ps.ByID["3000"]
	if p.EntryPoint != entryWrapper || len(p.IO) != 3 || string(p.IO[1].Input[0]) != "[5, 5]" || string(p.IO[1].Input[1]) != "2" || string(p.IO[2].Output) != "[]" {
		t.Errorf("functional problem %+v", p.IO)
	}
	pub, _ := readFormat(t, jsonl(t, stdin), "livecodebench:public")
	if n := len(pub.ByID["abc300_a"].Tests); n != 1 {
		t.Errorf("public only: %d tests", n)
	}
	// Protocol 5 and a plain JSON list are read too.
	stdin["private_test_cases"] = lcbCompress(t, []lt{{"input": "1\n", "output": "2\n", "testtype": "stdin"}}, 5)
	functional["private_test_cases"] = []lt{{"input": "[1]\n1", "output": "[1]", "testtype": "functional"}}
	if ps, _ := readFormat(t, jsonl(t, stdin, functional), ""); len(ps.ByID["abc300_a"].Tests) != 2 || len(ps.ByID["3000"].IO) != 2 {
		t.Errorf("protocol 5 and a list: %+v", ps)
	}

	python(t)
	for _, tc := range []struct {
		code   string
		want   Status
		detail string
	}{
		// List, and zip_longest, are LiveCodeBench's imports.
		{"class Solution:\n    def pairSums(self, nums: List[int], k: int) -> List[int]:\n        return [sum(nums[i:i + k]) for i in range(0, len(nums), k)]\n", Passed, ""},
		{"class Solution:\n    def pairSums(self, nums, k):\n        return [a + b for a, b in zip_longest(nums[::k], nums[1::k], fillvalue=0)]\n", Passed, ""},
		{"class Solution:\n    def pairSums(self, nums, k):\n        return nums[:1]\n", Failed, "case 0: expected [3, 7], got [1]"},
		{"class Solution:\n    def pairSums(self, nums, k):\n        while True:\n            pass\n", TimedOut, ""},
	} {
		v := p.Judge(runProgram(t, Program(p, completion("3000", tc.code), testPassCode), 2*time.Second))
		if v.Status != tc.want || !strings.Contains(v.Detail, tc.detail) {
			t.Errorf("%q: %+v, want %s (%s)", tc.code, v, tc.want, tc.detail)
		}
	}

	for _, tc := range []struct {
		rec  map[string]any
		want string
	}{
		{map[string]any{"question_id": "q", "public_test_cases": "[]", "private_test_cases": "bm90IHpsaWI="}, `livecodebench "q": private_test_cases: neither JSON nor base64(zlib(pickle)): zlib`},
		{map[string]any{"question_id": "q", "public_test_cases": "[]", "private_test_cases": "!!"}, "base64"},
		{map[string]any{"question_id": "q", "public_test_cases": "[]", "private_test_cases": ""}, "no tests in public_test_cases or private_test_cases"},
		{map[string]any{"question_id": "q", "public_test_cases": jsonText(t, []lt{{"input": "1", "output": "1", "testtype": "functional"}}), "metadata": "{}"},
			`test 0: testtype "functional", but the problem is stdin`},
		{map[string]any{"question_id": "q", "public_test_cases": jsonText(t, []lt{{"input": "[1,", "output": "1", "testtype": "functional"}}), "metadata": `{"func_name": "f"}`},
			"test 0: input line 1 is not a JSON value"},
	} {
		wantFormatError(t, jsonl(t, tc.rec), FormatLiveCodeBench, tc.want)
	}
	var z bytes.Buffer
	zw := zlib.NewWriter(&z)
	zw.Write([]byte{0x80, 4, ']', '.'}) // a pickled list
	zw.Close()
	wantFormatError(t, jsonl(t, map[string]any{"question_id": "q", "public_test_cases": "[]", "private_test_cases": base64.StdEncoding.EncodeToString(z.Bytes())}),
		FormatLiveCodeBench, "pickle: opcode 0x5d at byte 2: only one str is read")
}

func TestMultiPLE(t *testing.T) {
	cpp := map[string]any{"name": "HumanEval_53_add", "language": "cpp", "prompt": "#include<assert.h>\n#include<bits/stdc++.h>\nlong add(long x, long y) {\n",
		"tests": "}\nint main() {\n    auto candidate = add;\n    assert(candidate((0), (1)) == (1));\n}\n", "stop_tokens": []string{"\n}"}, "doctests": "transform", "original": "x", "prompt_terminology": "reworded"}
	java := map[string]any{"name": "HumanEval_53_add", "language": "java",
		"prompt": "import java.util.*;\nimport java.lang.reflect.*;\nimport org.javatuples.*;\nimport java.security.*;\nclass Problem {\n    public static long add(long x, long y) {\n",
		"tests":  "    }\n    public static void main(String[] args) {\n    assert(add((0l), (1l)) == (1l));\n    assert(add((5l), (7l)) == (12l));\n    }\n\n}\n", "stop_tokens": []string{"\n    }\n"}}
	javaPair := map[string]any{"name": "HumanEval_107", "language": "java", "prompt": java["prompt"].(string) + "    public static Pair<Long, Long> f(long n) {\n",
		"tests": "    }\n    public static void main(String[] args) {\n    assert(f((1l)).equals((Pair.with(1l, 0l))));\n    }\n\n}\n"}
	ts := map[string]any{"name": "HumanEval_53_add", "language": "ts", "prompt": "function add(x: number, y: number): number {\n",
		"tests": "}\n\ndeclare var require: any;\nconst assert = require('node:assert');\nfunction test() {\n  let candidate = add;\n  assert.deepEqual(candidate(0, 1),1);\n}\n\ntest();\n"}
	py := map[string]any{"name": "HumanEval_53_add", "language": "py", "prompt": "def add(x: int, y: int) -> int:\n",
		"tests": "def check(candidate):\n    assert candidate(0, 1) == 1\n    assert candidate(5, 7) == 12\n\ndef test_check():\n    check(add)\n\ntest_check()\n"}

	ps, used := readFormat(t, jsonl(t, cpp), "")
	if p := ps.ByID["HumanEval_53_add"]; used != FormatMultiPLE || p.Language != "cpp" || p.Test != cpp["tests"] || p.Prompt != cpp["prompt"] || p.EntryPoint != "" {
		t.Errorf("%s %+v", used, p)
	}
	ps, _ = readFormat(t, jsonl(t, java, javaPair), "")
	p := ps.ByID["HumanEval_53_add"]
	if want := "    }\n    public static void main(String[] args) {\n    if (!(add((0l), (1l)) == (1l))) throw new AssertionError();\n    if (!(add((5l), (7l)) == (12l))) throw new AssertionError();\n    }\n\n}\n"; p.Test != want || p.Language != "java" {
		t.Errorf("Java tests:\n%s\nwant\n%s", p.Test, want)
	}
	if strings.Contains(p.Prompt, "javatuples") || !strings.Contains(p.Prompt, "import java.lang.reflect.*;\nimport java.security.*;\n") {
		t.Errorf("a Java prompt without tuples keeps its javatuples import:\n%s", p.Prompt)
	}
	if p := ps.ByID["HumanEval_107"]; !strings.Contains(p.Prompt, "import org.javatuples.*;") || !strings.Contains(p.Test, "if (!(f((1l)).equals((Pair.with(1l, 0l))))) throw new AssertionError();") {
		t.Errorf("a Java problem with a Pair: %+v", p)
	}
	ps, _ = readFormat(t, jsonl(t, ts), "")
	if p := ps.ByID["HumanEval_53_add"]; p.Test != ts["tests"] || p.Language != "typescript" {
		t.Errorf("TypeScript tests:\n%s", p.Test)
	}
	ps, _ = readFormat(t, jsonl(t, py), "")
	p = ps.ByID["HumanEval_53_add"]
	python(t)
	if v := judgeSample(t, p, completion(p.TaskID, "    return x + y\n")); v.Status != Passed || p.Language != "python" {
		t.Errorf("py: %+v", v)
	}
	if v := judgeSample(t, p, completion(p.TaskID, "    return x * y\n")); v.Status != Failed {
		t.Errorf("py, wrong: %+v", v)
	}
	for _, tc := range []struct {
		lang, want string
	}{
		{"go_test.go", `language "go_test.go": MultiPL-E's Go tests are ` + "`go test`" + ` files`},
		{"lua", `language "lua" is not supported (supported: bash, cpp, java, javascript, js, notypes.py, py, python, rs, rust, sh, ts, typescript)`},
		{"", "no language"},
	} {
		rec := map[string]any{"name": "HumanEval_0", "language": tc.lang, "prompt": "x", "tests": "y", "stop_tokens": []string{}}
		wantFormatError(t, jsonl(t, rec), "", `line 1: multipl-e "HumanEval_0": `+tc.want)
	}
}
