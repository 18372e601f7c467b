package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// twiceTests are the stdin/stdout tests of "print 2n": the expected
// outputs carry a marker that a sample searching its sandbox for them
// would find if they were there.
func twiceTests() []client.EvalTest {
	var ts []client.EvalTest
	for _, n := range []int{1, 21, -7, 1000000007} {
		ts = append(ts, client.EvalTest{Input: fmt.Sprintf("%d\n", n), Output: fmt.Sprintf("%d\n", 2*n)})
	}
	return ts
}

// judgeCase is one sample and the verdict it must get.
type judgeCase struct {
	name, lang, src string
	status          string
	// passed is the tests it must pass (-1: do not check).
	passed int
	// detail, if set, is in the result's detail.
	detail string
}

// runJudged runs cases as one eval run of problem p on runtime rt and
// checks each verdict; it returns the results.
func runJudged(t *testing.T, c *client.Client, rt string, p client.EvalProblem, cases []judgeCase, tweak func(*client.CreateEvalRequest)) []client.EvalResult {
	t.Helper()
	req := client.CreateEvalRequest{Problems: []client.EvalProblem{p}, Runtime: rt, Timeout: 5, MemoryMB: 128, OutputLimitBytes: 64 << 10, K: []int{1}}
	for _, jc := range cases {
		src := jc.src
		req.Samples = append(req.Samples, client.EvalSample{TaskID: p.TaskID, Solution: &src, Language: jc.lang})
	}
	if tweak != nil {
		tweak(&req)
	}
	run, err := c.CreateEval(ctxT(t, time.Minute), req)
	if err != nil {
		t.Fatal(err)
	}
	run = waitEval(t, c, run.ID, 10*time.Minute)
	if run.State != client.EvalStateSucceeded {
		t.Fatalf("run %+v", run)
	}
	rs := evalResults(t, c, run.ID)
	if len(rs) != len(cases) {
		t.Fatalf("%d results for %d samples", len(rs), len(cases))
	}
	for i, jc := range cases {
		r := rs[i]
		ok := r.Status == jc.status && r.Passed == (jc.status == client.TestPassed) && strings.Contains(r.Detail, jc.detail)
		if jc.passed >= 0 && r.TestsPassed != jc.passed {
			ok = false
		}
		if p.Tests != nil && r.Status != client.CompileError && r.Status != client.TestInfraError && (r.TestsTotal != len(p.Tests) || len(r.Tests) != len(p.Tests)) {
			ok = false
		}
		if !ok {
			t.Errorf("%s/%s (%s): status %s, detail %q, tests %d/%d %+v, compile %+v; want %s, %d passed, detail with %q",
				rt, jc.name, jc.lang, r.Status, r.Detail, r.TestsPassed, r.TestsTotal, r.Tests, r.Compile, jc.status, jc.passed, jc.detail)
		}
	}
	assertNoSandboxes(t, c)
	return rs
}

// TestJudgeStdin: stdin/stdout problems in Python on both runtimes: every
// test verdict (passed, wrong_answer, runtime_error with the exception,
// time_limit, memory_limit, output_limit), tokens checking (CRLF and
// trailing spaces pass), partial counts, stop_on_first_failure, and a
// sample that looks for the expected outputs in its sandbox.
func TestJudgeStdin(t *testing.T) {
	t.Parallel()
	p := client.EvalProblem{TaskID: "twice", Tests: twiceTests()}
	p.Tests = append(p.Tests, client.EvalTest{Input: "4\n", Output: "8 evalbox-expected-marker\n"})
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			c, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 4, MaxConcurrentExec: 4})
			marker := `
n = int(input())
print(2 * n, "evalbox-expected-marker" if n == 4 else "")
`
			rs := runJudged(t, c, rt, p, []judgeCase{
				{"right", "", marker, client.TestPassed, 5, ""},
				{"crlf and spaces", "python", "import sys\nn = int(input())\nsys.stdout.write('  %d  \\r\\n\\r\\n' % (2 * n) + ('evalbox-expected-marker\\r\\n' if n == 4 else ''))\n", client.TestPassed, 5, ""},
				{"wrong on some", "", "n = int(input())\nprint(2 * n if n > 0 else n)\n", client.TestWrongAnswer, 3, "test 3 of 5: wrong answer: token 1 differs: expected \"-14\", got \"-7\""},
				{"exception", "", "n = int(input())\nraise ValueError('no %d' % n)\n", client.TestRuntimeError, 0, "exit code 1: ValueError: no 1"},
				{"loop", "", "while True:\n    pass\n", client.TestTimeLimit, 0, "time limit of 5 s"},
				{"memory", "", "a = []\nwhile True:\n    a.append(b'x' * (1 << 20))\n", client.TestMemoryLimit, 0, "memory limit of 128 MiB"},
				{"flood", "", "while True:\n    print('x' * 100)\n", client.TestOutputLimit, 0, "more than 65536 bytes"},
				{"signal", "", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", client.TestRuntimeError, 0, "killed by signal 11"},
			}, func(r *client.CreateEvalRequest) { r.Timeout = 5 })
			r := rs[3]
			if len(r.Tests) != 5 || r.Tests[0].Status != client.TestRuntimeError || r.Tests[0].ExitCode != 1 || r.Compile != nil || r.Language != "" {
				t.Errorf("exception: %+v", r)
			}
			if m := rs[5].Tests[0]; m.PeakMemoryBytes < 128<<20 {
				t.Errorf("memory hog's peak %d, want past 128 MiB", m.PeakMemoryBytes)
			}
			if m := rs[0].Tests[0]; m.PeakMemoryBytes <= 0 || m.PeakMemoryBytes > 100<<20 || m.DurationMs <= 0 {
				t.Errorf("right: test 1 %+v", m)
			}

			// stop_on_first_failure: the tests after the first failure
			// are not run. (A longer time limit: the search below reads
			// the sandbox's files.)
			rs = runJudged(t, c, rt, p, []judgeCase{
				{"wrong first", "", "print(0)\n", client.TestWrongAnswer, 0, "test 1 of 5"},
				{"right", "", marker, client.TestPassed, 5, ""},
				// The expected outputs never enter the sandbox: a search of
				// every readable file for the marker finds nothing.
				{"search", "", `
import os
n = int(input())
found = ""
marker = b"evalbox-expected-" + b"marker"
for root, dirs, files in os.walk("/") if n == 4 else ():
    if root.startswith(("/proc", "/sys", "/dev", "/usr", "/lib", "/bin", "/sbin")):
        dirs[:] = []
        continue
    for f in files:
        try:
            with open(os.path.join(root, f), "rb") as fh:
                if marker in fh.read(1 << 20):
                    found = os.path.join(root, f)
        except OSError:
            pass
print(2 * n, found)
`, client.TestWrongAnswer, 4, "test 5 of 5: wrong answer"},
			}, func(r *client.CreateEvalRequest) { r.StopOnFirstFailure, r.Timeout = true, 20 })
			if ts := rs[0].Tests; len(ts) != 5 || ts[0].Status != client.TestWrongAnswer || ts[1].Status != client.TestNotRun || ts[4].Status != client.TestNotRun {
				t.Errorf("stop_on_first_failure: %+v", ts)
			}
		})
	}
}

// TestJudgeCheckers: the float and exact checkers through a run, and a
// checker program (testlib's convention) that runs in a sandbox of its
// own: a sample that looks for it, or writes where it would be, cannot
// change its verdict.
func TestJudgeCheckers(t *testing.T) {
	t.Parallel()
	c, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 4, MaxConcurrentExec: 4})
	rt := client.RuntimeNamespaces
	third := client.EvalProblem{TaskID: "third", Tests: []client.EvalTest{{Input: "1\n", Output: "0.333333333\n"}, {Input: "2\n", Output: "0.666666667\n"}},
		Checker: &client.EvalChecker{Type: client.CheckerFloat, AbsTol: 1e-6}}
	runJudged(t, c, rt, third, []judgeCase{
		{"close", "", "print(int(input()) / 3)\n", client.TestPassed, 2, ""},
		{"rounded", "", "print('%.4f' % (int(input()) / 3))\n", client.TestWrongAnswer, 0, "token 1 differs"},
	}, nil)
	exact := client.EvalProblem{TaskID: "exact", Tests: []client.EvalTest{{Input: "", Output: "a b\n"}}, Checker: &client.EvalChecker{Type: client.CheckerExact}}
	runJudged(t, c, rt, exact, []judgeCase{
		{"same", "", "print('a b')\n", client.TestPassed, 1, ""},
		{"spaces", "", "print('a  b')\n", client.TestWrongAnswer, 0, "byte 2 differs"},
	}, nil)

	// A checker that accepts any number within 1 of the answer; it marks
	// itself so that a sample can look for it.
	checker := `
import sys
# evalbox-checker-marker
inp, out, ans = (open(p).read() for p in sys.argv[1:4])
try:
    got = int(out.split()[0])
except (ValueError, IndexError):
    print("not a number: %r" % out[:20], file=sys.stderr)
    sys.exit(1)
want = int(ans.split()[0])
if abs(got - want) > 1:
    print("expected %d give or take 1, got %d" % (want, got), file=sys.stderr)
    sys.exit(1)
`
	near := client.EvalProblem{TaskID: "near", Tests: twiceTests(), Checker: &client.EvalChecker{Type: client.CheckerProgram, Source: checker}}
	runJudged(t, c, rt, near, []judgeCase{
		{"off by one", "", "print(2 * int(input()) + 1)\n", client.TestPassed, 4, ""},
		{"off by two", "", "print(2 * int(input()) + 2)\n", client.TestWrongAnswer, 0, "checker: expected 2 give or take 1, got 4"},
		// The sample looks for the checker and its files, and plants
		// files where the checker's would be: neither is in its sandbox.
		{"tamper", "", `
import os
for d in ("/box/t", "/tmp/t"):
    try:
        os.makedirs(d, exist_ok=True)
        for name in ("answer", "output", "input"):
            open(os.path.join(d, name), "w").write("0\n")
    except OSError:
        pass
found = 0
marker = b"evalbox-checker-" + b"marker"
for root, dirs, files in os.walk("/"):
    if root.startswith(("/proc", "/sys", "/dev", "/usr", "/lib", "/bin", "/sbin")):
        dirs[:] = []
        continue
    for f in files:
        try:
            if marker in open(os.path.join(root, f), "rb").read(1 << 20):
                found += 1
        except OSError:
            pass
print(found * 1000 + 12345)
`, client.TestWrongAnswer, 0, "checker: expected"},
		{"not a number", "", "print('x')\n", client.TestWrongAnswer, 0, "checker: not a number"},
	}, nil)

	// A run whose default language is not Python runs its Python
	// problems' samples in the python template all the same.
	twoLangs := client.CreateEvalRequest{Language: "bash", Runtime: rt, Problems: []client.EvalProblem{
		{TaskID: "he", Prompt: "def f():\n", EntryPoint: "f", Test: "def check(c):\n    assert c() == 1\n", Language: "python"},
		{TaskID: "echo", Tests: []client.EvalTest{{Input: "5\n", Output: "5\n"}}},
	}}
	ret1, echo := "    return 1\n", "read n; echo $n\n"
	twoLangs.Samples = []client.EvalSample{{TaskID: "he", Completion: &ret1}, {TaskID: "echo", Solution: &echo}}
	run, err := c.CreateEval(ctxT(t, time.Minute), twoLangs)
	if err != nil {
		t.Fatal(err)
	}
	if run = waitEval(t, c, run.ID, 5*time.Minute); run.State != client.EvalStateSucceeded || run.Summary == nil || run.Summary.Counts["passed"] != 2 || run.Template != "base" {
		t.Errorf("a bash run with a Python problem: %+v %+v %v", run, run.Summary, evalResults(t, c, run.ID))
	}

	// A checker program needs a second sandbox beside the sample's: a team
	// that may have only one cannot start such a run (it would wait on
	// itself).
	one, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 1, MaxConcurrentExec: 1})
	src := "print(1)\n"
	if _, err := one.CreateEval(ctxT(t, time.Minute), client.CreateEvalRequest{Problems: []client.EvalProblem{near},
		Samples: []client.EvalSample{{TaskID: near.TaskID, Solution: &src}}}); client.ErrorCode(err) != client.CodeTooManySandboxes {
		t.Errorf("a checker program on a team of 1 sandbox: %v, want %s", err, client.CodeTooManySandboxes)
	}

	// A checker that crashes is the problem's fault: infra_error, not a
	// wrong answer.
	broken := client.EvalProblem{TaskID: "broken", Tests: twiceTests()[:1], Checker: &client.EvalChecker{Type: client.CheckerProgram, Source: "raise SystemExit(3)\n"}}
	runJudged(t, c, rt, broken, []judgeCase{{"any", "", "print(2)\n", client.TestInfraError, 0, "checker failed"}}, nil)

	// A checker that an output makes fail, but that accepts the answer,
	// was failed by the output: a wrong answer, not an infra_error that
	// pass@k would leave out.
	fragile := client.EvalProblem{TaskID: "fragile", Tests: twiceTests()[:1], Checker: &client.EvalChecker{Type: client.CheckerProgram, Source: `
import sys
out, ans = open(sys.argv[2]).read(), open(sys.argv[3]).read()
if len(out) > 10:
    sys.exit(3)
sys.exit(0 if out.split() == ans.split() else 1)
`}}
	runJudged(t, c, rt, fragile, []judgeCase{
		{"right", "", "print(2 * int(input()))\n", client.TestPassed, 1, ""},
		{"breaks it", "", "print('x' * 100)\n", client.TestWrongAnswer, 0, "the checker failed on this output"},
	}, nil)
}

// langPrograms are, per language, "print 2n" and the ways a program
// fails: each must get its verdict in every language, and C++ and Python
// the same ones (a judge's verdicts do not depend on the language).
var langPrograms = map[string]map[string]string{
	"python": {
		"hello": "n = int(input())\nprint(2 * n)\n", "compile": "",
		"runtime": "raise RuntimeError('boom')\n", "loop": "while True:\n    pass\n",
		"memory": "a = []\nwhile True:\n    a.append(b'x' * (1 << 20))\n", "flood": "while True:\n    print('x' * 100)\n",
	},
	"c": {
		"hello":   "#include <stdio.h>\nint main(void) { long long n; if (scanf(\"%lld\", &n) != 1) return 1; printf(\"%lld\\n\", 2 * n); return 0; }\n",
		"compile": "int main(void) { return undefined_name; }\n",
		"runtime": "#include <stdlib.h>\nint main(void) { abort(); }\n",
		"loop":    "int main(void) { volatile unsigned long x = 0; for (;;) x++; }\n",
		"memory":  "#include <stdlib.h>\n#include <string.h>\nint main(void) { for (;;) { char *p = malloc(1 << 20); memset(p, 1, 1 << 20); } }\n",
		"flood":   "#include <stdio.h>\nint main(void) { for (;;) puts(\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"); }\n",
	},
	"cpp": {
		"hello":   "#include <iostream>\nint main() { long long n; std::cin >> n; std::cout << 2 * n << '\\n'; }\n",
		"compile": "#include <vector>\nint main() { std::vector<int> v = 1; }\n",
		"runtime": "#include <stdexcept>\nint main() { throw std::runtime_error(\"boom\"); }\n",
		"loop":    "int main() { volatile unsigned long x = 0; for (;;) x = x + 1; }\n",
		"memory":  "#include <vector>\nint main() { std::vector<std::vector<char>> v; for (;;) v.emplace_back(1 << 20, 'x'); }\n",
		"flood":   "#include <cstdio>\nint main() { for (;;) std::puts(\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"); }\n",
	},
	"java": {
		// The public class is not Main: the file is named after it.
		"hello":   "import java.util.*;\npublic class Solution {\n  public static void main(String[] a) { Scanner s = new Scanner(System.in); long n = s.nextLong(); System.out.println(2 * n); }\n}\n",
		"compile": "public class Main { public static void main(String[] a) { int x = \"s\"; } }\n",
		"runtime": "public class Main { public static void main(String[] a) { throw new IllegalStateException(\"boom\"); } }\n",
		"loop":    "public class Main { public static void main(String[] a) { long x = 0; while (true) { x++; } } }\n",
		"memory":  "import java.util.*;\npublic class Main { public static void main(String[] a) { List<byte[]> l = new ArrayList<>(); while (true) { byte[] b = new byte[1 << 20]; Arrays.fill(b, (byte) 1); l.add(b); } } }\n",
		"flood":   "public class Main { public static void main(String[] a) { while (true) System.out.println(\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"); } }\n",
	},
	"nodejs": {
		"hello":   "const n = BigInt(require('fs').readFileSync(0, 'utf8').trim());\nconsole.log((2n * n).toString());\n",
		"compile": "",
		"runtime": "throw new Error('boom');\n",
		"loop":    "for (;;) {}\n",
		"memory":  "const a = [];\nfor (;;) a.push(Buffer.alloc(1 << 20, 1));\n",
		"flood":   "const s = 'x'.repeat(100) + '\\n';\nfor (;;) require('fs').writeSync(1, s);\n",
	},
	"typescript": {
		"hello":   "import * as fs from 'fs';\nconst n: number = parseInt(fs.readFileSync(0, 'utf8'), 10);\nconsole.log(2 * n);\n",
		"compile": "const n: number = 'not a number';\nconsole.log(n);\n",
		"runtime": "throw new Error('boom');\n",
		"loop":    "for (;;) {}\n",
		"memory":  "const a: Buffer[] = [];\nfor (;;) a.push(Buffer.alloc(1 << 20, 1));\n",
		"flood":   "import * as fs from 'fs';\nconst s: string = 'x'.repeat(100) + '\\n';\nfor (;;) fs.writeSync(1, s);\n",
	},
	"go": {
		"hello":   "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tvar n int64\n\tfmt.Scan(&n)\n\tfmt.Println(2 * n)\n}\n",
		"compile": "package main\n\nfunc main() {\n\tvar x int = \"s\"\n}\n",
		"runtime": "package main\n\nfunc main() {\n\tpanic(\"boom\")\n}\n",
		"loop":    "package main\n\nfunc main() {\n\tx := 0\n\tfor {\n\t\tx++\n\t}\n}\n",
		"memory":  "package main\n\nfunc main() {\n\tvar a [][]byte\n\tfor {\n\t\tb := make([]byte, 1<<20)\n\t\tfor i := range b {\n\t\t\tb[i] = 1\n\t\t}\n\t\ta = append(a, b)\n\t}\n}\n",
		"flood":   "package main\n\nimport \"os\"\n\nfunc main() {\n\tb := []byte(\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\\n\")\n\tfor {\n\t\tos.Stdout.Write(b)\n\t}\n}\n",
	},
	"rust": {
		"hello":   "use std::io::Read;\nfn main() { let mut s = String::new(); std::io::stdin().read_to_string(&mut s).unwrap(); let n: i64 = s.trim().parse().unwrap(); println!(\"{}\", 2 * n); }\n",
		"compile": "fn main() { let x: i32 = \"s\"; }\n",
		"runtime": "fn main() { panic!(\"boom\"); }\n",
		"loop":    "fn main() { let mut x: u64 = 1; loop { x = x.wrapping_add(1); if x == 0 { println!(); } } }\n",
		"memory":  "fn main() { let mut v: Vec<Vec<u8>> = Vec::new(); loop { v.push(vec![1u8; 1 << 20]); } }\n",
		"flood":   "fn main() { loop { println!(\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"); } }\n",
	},
	"bash": {
		"hello": "read n\necho $((2 * n))\n", "compile": "",
		"runtime": "echo boom >&2\nexit 3\n", "loop": "while :; do :; done\n",
		"memory": "printf -v s '%01048576d' 0\nwhile :; do s+=$s; done\n", "flood": "yes\n",
	},
}

// TestJudgeLanguages: every language of the table on both runtimes, from
// the polyglot template: print 2n (passed), a compile error (with the
// compiler's message; compiled languages), a runtime error (an exit code
// or a signal), an infinite loop (time_limit), a memory hog
// (memory_limit) and an output flood (output_limit). C++ and Python get
// the same verdicts case by case.
func TestJudgeLanguages(t *testing.T) {
	t.Parallel()
	p := client.EvalProblem{TaskID: "twice", Tests: twiceTests()}
	want := map[string]string{"hello": client.TestPassed, "compile": client.CompileError, "runtime": client.TestRuntimeError,
		"loop": client.TestTimeLimit, "memory": client.TestMemoryLimit, "flood": client.TestOutputLimit}
	order := []string{"hello", "compile", "runtime", "loop", "memory", "flood"}
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			c, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 4, MaxConcurrentExec: 4})
			var cases []judgeCase
			for _, l := range []string{"python", "c", "cpp", "java", "nodejs", "typescript", "go", "rust", "bash"} {
				for _, k := range order {
					src := langPrograms[l][k]
					if src == "" {
						continue // not compiled
					}
					passed := 0
					if k == "hello" {
						passed = len(p.Tests)
					}
					cases = append(cases, judgeCase{name: k, lang: l, src: src, status: want[k], passed: passed})
				}
			}
			// Time limits are per test: 4 tests of a loop take 4 × 2 s, so
			// stop at the first failure.
			// A time limit of 10 s: time limits are wall-clock, and on two
			// cores beside the rest of the suite (load 30 measured) a
			// Node.js start took 5 s.
			// And compiles get 120 s: javac and tsc took 12 and 16 s there.
			rs := runJudged(t, c, rt, p, cases, func(r *client.CreateEvalRequest) {
				r.StopOnFirstFailure, r.Timeout, r.Concurrency, r.CompileTimeout = true, 10, 4, 120
			})
			verdicts := map[string]map[string]string{}
			for i, jc := range cases {
				r := rs[i]
				if verdicts[jc.lang] == nil {
					verdicts[jc.lang] = map[string]string{}
				}
				verdicts[jc.lang][jc.name] = r.Status
				compiled := jc.lang != "python" && jc.lang != "nodejs" && jc.lang != "bash"
				switch {
				case compiled && (r.Compile == nil || r.Compile.OK != (jc.name != "compile") || r.Compile.DurationMs <= 0):
					t.Errorf("%s/%s: compile %+v", jc.lang, jc.name, r.Compile)
				case compiled && jc.name == "compile" && (r.Compile.Output == "" || !strings.HasPrefix(r.Detail, "compile error")):
					t.Errorf("%s/%s: a compile error with the compiler's message, got %q (output %q)", jc.lang, jc.name, r.Detail, r.Compile.Output)
				case !compiled && r.Compile != nil:
					t.Errorf("%s/%s: compile %+v for an interpreted language", jc.lang, jc.name, r.Compile)
				case jc.lang != "python" && r.Language != jc.lang:
					t.Errorf("%s/%s: language %q", jc.lang, jc.name, r.Language)
				}
				if jc.name == "loop" && len(r.Tests) > 0 && (r.Tests[0].DurationMs < 9900 || r.Tests[0].DurationMs > 16000) {
					t.Errorf("%s/loop: ran %d ms for a limit of 10 s", jc.lang, r.Tests[0].DurationMs)
				}
			}
			for _, k := range order {
				if verdicts["cpp"][k] != verdicts["python"][k] && k != "compile" {
					t.Errorf("%s: C++ %s, Python %s", k, verdicts["cpp"][k], verdicts["python"][k])
				}
			}
		})
	}
}
