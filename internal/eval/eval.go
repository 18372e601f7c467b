// Package eval holds the pure parts of evalbox's eval harness: the
// HumanEval problem and sample formats, the program one trial runs, the
// verdict read from that run, the batch harness and its protocol, result
// lines and pass@k. It runs nothing itself; the control plane feeds it
// sandbox runs.
//
// Verdicts follow openai/human-eval (human_eval/execution.py): the trial
// program is prompt + completion + "\n" + test + "\n" + "check(entry_point)",
// and results carry human-eval's spelling ("passed", "timed out",
// "failed: <exception message>") next to evalbox's status.
//
// # Checking: assert mode and I/O mode
//
// A problem is checked by exactly one of:
//   - its test program (assert mode, HumanEval's): any check Python can
//     express, but the checks and their expected values run inside the
//     sandbox, beside the candidate, which can read or subvert them (e.g.
//     redefine the names the test uses). Exiting before the asserts does
//     not pass: the program must end with its per-trial pass code.
//   - its I/O cases (I/O mode): a driver (iodriver.py) runs the candidate,
//     calls entry_point(*input) for each case and prints the results as
//     JSON lines; JudgeIO compares them with the expected outputs outside
//     the sandbox. The expected values never enter the sandbox, so a sample
//     cannot read or alter them, and a forged result line only passes if it
//     holds the right value. It expresses only input → output checks, on
//     JSON values (see EqualJSON for equality; floats within
//     FloatTolerance).
//
// # Execution: trial mode and batch mode
//
// The control plane runs Program either in a fresh sandbox per sample
// (trial mode) or through the batch harness (harness.py, HarnessArgv),
// which runs a slice of programs in one sandbox, each as its own process
// group with its own timeout, and reports each program's exit status,
// stdout and stderr tail in a result line (HarnessLine) that becomes the
// same Run a trial's exec gives: both modes are judged by the same code
// (Problem.Judge). Batch mode isolates the samples of one slice only by
// process and user: the harness runs as root and each program as
// HarnessInput.User, and kills every process a program leaves; but a
// program can leave files in world-writable places that later programs of
// its slice read (e.g. a module shadowing one they import from their
// working directory), or that fill the sandbox's disk or memory. When the
// harness does not run as root, a program can also kill it or change what
// it shares with later programs; the control plane then retries the
// slice's unfinished programs.
package eval

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
)

// Problem is one task in HumanEval's schema.
type Problem struct {
	TaskID            string `json:"task_id"`
	Prompt            string `json:"prompt"`
	EntryPoint        string `json:"entry_point"`
	CanonicalSolution string `json:"canonical_solution"`
	Test              string `json:"test"`
	// IO holds I/O mode's cases; a problem has exactly one of a Test
	// (assert mode), IO cases and stdin/stdout Tests.
	IO []IOCase `json:"io,omitempty"`
	// Tests are stdin/stdout cases: the sample is a whole program (in
	// Language), run on each test's input; its output is compared with
	// the expected one outside the sandbox by Checker (nil: tokens).
	Tests   []Test   `json:"tests,omitempty"`
	Checker *Checker `json:"checker,omitempty"`
	// Language is the problem's language ("": the run's). In assert mode
	// a problem in another language than Python is one program (prompt,
	// completion, test) that passes when it exits 0, as MultiPL-E judges.
	Language string `json:"language,omitempty"`
}

// Test is one stdin/stdout case: the program's input and the output it
// must print.
type Test struct {
	Input  string `json:"input"`
	Output string `json:"output"`
}

// MaxTests bounds a problem's stdin/stdout tests.
const MaxTests = 10_000

// Sample is one model output for a task: either a Completion, which the
// task's prompt is prepended to, or a full Solution program.
type Sample struct {
	TaskID     string  `json:"task_id"`
	Completion *string `json:"completion,omitempty"`
	Solution   *string `json:"solution,omitempty"`
	// Language is the sample's language ("": its problem's).
	Language string `json:"language,omitempty"`
}

// Problems is a problem set: the problems by task id, and the ids in file order.
type Problems struct {
	ByID  map[string]Problem
	Order []string
}

// add adds a problem read from a file: one checked for its mode, whose
// task id is new.
func (ps *Problems) add(p Problem) error {
	if err := p.CheckMode(); err != nil {
		return fmt.Errorf("problem %q: %w", p.TaskID, err)
	}
	if _, dup := ps.ByID[p.TaskID]; dup {
		return fmt.Errorf("task_id %q appears twice", p.TaskID)
	}
	ps.ByID[p.TaskID] = p
	ps.Order = append(ps.Order, p.TaskID)
	return nil
}

// maxLine bounds one JSON line of a problem or sample file.
const maxLine = 64 << 20

// lines calls fn for every non-blank line of r, which may be gzip
// compressed (detected by its magic bytes), with its 1-based line number.
// Blank lines are skipped, as human-eval's stream_jsonl does.
func lines(r io.Reader, fn func(n int, line []byte) error) error {
	br := bufio.NewReader(r)
	if magic, err := br.Peek(2); err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("gzip: %w", err)
		}
		defer zr.Close()
		br = bufio.NewReader(zr)
	}
	sc := bufio.NewScanner(br)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	n := 0
	for sc.Scan() {
		n++
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		if err := fn(n, line); err != nil {
			return fmt.Errorf("line %d: %w", n, err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("line %d: %w", n+1, err)
	}
	return nil
}

// ReadProblems reads a problem set in JSON Lines (.jsonl, or gzip
// compressed .jsonl.gz) from r.
func ReadProblems(r io.Reader) (Problems, error) {
	ps := Problems{ByID: map[string]Problem{}}
	err := lines(r, func(_ int, line []byte) error {
		var p Problem
		if err := json.Unmarshal(line, &p); err != nil {
			return err
		}
		if p.TaskID == "" {
			return errors.New("problem without task_id")
		}
		return ps.add(p)
	})
	if err != nil {
		return Problems{}, fmt.Errorf("problems: %w", err)
	}
	if len(ps.Order) == 0 {
		return Problems{}, errors.New("problems: no problems")
	}
	return ps, nil
}

// ReadSamples reads samples in JSON Lines (.jsonl or .jsonl.gz) from r.
// A sample's completion id is its index in the returned slice (its 0-based
// line index among the non-blank lines).
func ReadSamples(r io.Reader) ([]Sample, error) {
	var ss []Sample
	err := lines(r, func(_ int, line []byte) error {
		var s Sample
		if err := json.Unmarshal(line, &s); err != nil {
			return err
		}
		switch {
		case s.TaskID == "":
			return errors.New("sample without task_id")
		case s.Completion == nil && s.Solution == nil:
			return fmt.Errorf("sample for %q has neither completion nor solution", s.TaskID)
		case s.Completion != nil && s.Solution != nil:
			return fmt.Errorf("sample for %q has both completion and solution", s.TaskID)
		}
		ss = append(ss, s)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("samples: %w", err)
	}
	if len(ss) == 0 {
		return nil, errors.New("samples: no samples")
	}
	return ss, nil
}

// ReadProblemsFile reads a problem set from a .jsonl or .jsonl.gz file.
func ReadProblemsFile(path string) (Problems, error) {
	f, err := os.Open(path)
	if err != nil {
		return Problems{}, err
	}
	defer f.Close()
	ps, err := ReadProblems(f)
	if err != nil {
		return Problems{}, fmt.Errorf("%s: %w", path, err)
	}
	return ps, nil
}

// ReadSamplesFile reads samples from a .jsonl or .jsonl.gz file.
func ReadSamplesFile(path string) ([]Sample, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ss, err := ReadSamples(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ss, nil
}

// CheckSamples reports the first sample whose task is not in ps.
func CheckSamples(ps Problems, ss []Sample) error {
	for i, s := range ss {
		if _, ok := ps.ByID[s.TaskID]; !ok {
			return fmt.Errorf("sample %d: task_id %q is not in the problems", i, s.TaskID)
		}
	}
	return nil
}

// Program returns the Python program a trial runs. In assert mode it is
// built as human-eval's execution.py builds it: prompt + completion, the
// test, then check(entry_point); then it exits with passCode, which proves
// that the checks ran to their end: a sample that exits early (sys.exit(0),
// os._exit(0), exit()) before or inside check does not pass, as in
// human-eval, where the SystemExit is a failure. In I/O mode it is the I/O
// driver, which runs prompt + completion, calls entry_point on each case's
// input and exits with passCode after the last case. A sample with a
// solution replaces prompt + completion. Use a fresh NewPassCode per trial
// and judge the run with the same code in Run.PassCode.
func Program(p Problem, s Sample, passCode int) string {
	var b strings.Builder
	body := p.Prompt
	if s.Solution != nil {
		body = *s.Solution
	} else if s.Completion != nil {
		body += *s.Completion
	}
	if p.IO != nil {
		return ioProgram(p, body, passCode)
	}
	b.Grow(len(body) + len(p.Test) + len(p.EntryPoint) + 80)
	b.WriteString(body)
	b.WriteByte('\n')
	b.WriteString(p.Test)
	if p.EntryPoint != "" {
		b.WriteString("\ncheck(")
		b.WriteString(p.EntryPoint)
		b.WriteString(")")
	}
	b.WriteString("\n")
	b.WriteString(exitWith(passCode))
	return b.String()
}

// exitWith is the program's last statement: it exits with code after
// flushing output, whatever the sample rebound at module level.
func exitWith(code int) string {
	return "import sys as _evalbox_sys\n_evalbox_sys.exit(" + strconv.Itoa(code) + ")\n"
}

// Pass codes are in [minPassCode, maxPassCode]: never 0, 1 or 2 (a normal
// exit, an uncaught exception, a usage error), below the shell's 126 and
// 128+N.
const (
	minPassCode = 3
	maxPassCode = 125
)

// NewPassCode returns a random exit code for one trial's program: a
// sample cannot learn it from other trials, so it cannot fake the end of
// the checks by exiting with a fixed code.
func NewPassCode() int {
	return minPassCode + rand.IntN(maxPassCode-minPassCode+1)
}
