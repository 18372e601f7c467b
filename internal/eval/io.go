package eval

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/evalbox/evalbox/internal/lang"
	"math"
	"math/big"
	"strings"
	"unicode/utf8"
)

// IOCase is one I/O mode test case: the entry point's positional arguments
// and the value it must return, as JSON.
type IOCase struct {
	Input  []json.RawMessage `json:"input"`
	Output json.RawMessage   `json:"output"`
}

// MaxIOCases bounds the cases of one problem.
const MaxIOCases = 10_000

// FloatTolerance is the relative and absolute tolerance of I/O mode's
// number comparison when either number is not an integer:
// math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9).
const FloatTolerance = 1e-9

//go:embed iodriver.py
var ioDriver string

// CheckMode reports whether p is checked by exactly one of a test program
// (assert mode) and I/O cases, and whether its cases are well formed.
func (p Problem) CheckMode() error {
	modes := 0
	for _, set := range []bool{p.Test != "", p.IO != nil, p.Tests != nil} {
		if set {
			modes++
		}
	}
	switch {
	case modes > 1:
		return errors.New("give exactly one of test (assert mode), io (I/O mode) and tests (stdin/stdout), not several")
	case modes == 0:
		return errors.New("give test (assert mode), io (I/O mode) or tests (stdin/stdout)")
	case p.IO != nil && p.EntryPoint == "":
		return errors.New("io (I/O mode) needs entry_point, the function its cases call")
	case p.Test != "" && p.EntryPoint == "" && isPython(p.Language) && definesUncalledCheck(p.Test):
		// HumanEval's test defines check(candidate) and leaves the call
		// to the harness: without entry_point it would never run, and
		// every sample would pass.
		return errors.New("test defines check(candidate) but never calls it, and there is no entry_point to call it on: give entry_point")
	case p.Checker != nil && p.Tests == nil:
		return errors.New("checker is only for tests (stdin/stdout)")
	case p.Tests != nil && (len(p.Tests) == 0 || len(p.Tests) > MaxTests):
		return fmt.Errorf("tests must have 1 to %d cases, got %d", MaxTests, len(p.Tests))
	}
	if p.Language != "" {
		if _, err := lang.Resolve(p.Language); err != nil {
			return err
		}
	}
	if p.Checker != nil {
		if err := p.Checker.Validate(); err != nil {
			return err
		}
	}
	return CheckIOCases(p.IO)
}

// isPython reports whether a problem's language is Python ("" is the
// run's, Python unless it says otherwise: checked as Python here).
func isPython(name string) bool {
	if name == "" {
		return true
	}
	l, ok := lang.Lookup(name)
	return ok && l.Name == lang.Python.Name
}

// definesUncalledCheck reports whether a Python test defines check() and
// calls nothing named check (MultiPL-E's Python tests, which call it
// themselves through test_check, are fine; so are MBPP's plain asserts).
func definesUncalledCheck(test string) bool {
	defs := strings.Count(test, "def check(")
	return defs > 0 && strings.Count(test, "check(") == defs
}

// CheckIOCases checks I/O cases: at least one and at most MaxIOCases, each
// with an input array of valid JSON values and a valid JSON output (null
// is a value; a missing output is not).
func CheckIOCases(cases []IOCase) error {
	if cases == nil {
		return nil
	}
	if len(cases) == 0 || len(cases) > MaxIOCases {
		return fmt.Errorf("io must have 1 to %d cases, got %d", MaxIOCases, len(cases))
	}
	for i, c := range cases {
		if c.Input == nil {
			return fmt.Errorf("io[%d]: input must be an array of arguments ([] for none)", i)
		}
		for j, a := range c.Input {
			if !json.Valid(a) {
				return fmt.Errorf("io[%d]: input[%d] is not a JSON value", i, j)
			}
		}
		if len(bytes.TrimSpace(c.Output)) == 0 {
			return fmt.Errorf("io[%d]: no output (the expected value; null is one)", i)
		}
		if !json.Valid(c.Output) {
			return fmt.Errorf("io[%d]: output is not a JSON value", i)
		}
	}
	return nil
}

// pyString returns s as a Python string literal: a JSON string is one.
func pyString(s string) string {
	b, _ := json.Marshal(s) // a string always marshals
	return string(b)
}

// ioProgram is I/O mode's trial program: the driver, then a call that runs
// the candidate (prompt + completion, or the solution) and its entry point
// on every case's input. The expected outputs are not in it.
func ioProgram(p Problem, body string, passCode int) string {
	inputs := make([]json.RawMessage, len(p.IO))
	for i, c := range p.IO {
		in, _ := json.Marshal(c.Input) // valid JSON values, checked at the edge
		inputs[i] = in
	}
	args, _ := json.Marshal(inputs)
	var b strings.Builder
	b.Grow(len(ioDriver) + 2*len(body) + 2*len(args) + 64)
	b.WriteString(ioDriver)
	b.WriteString("_evalbox_io(")
	b.WriteString(pyString(body))
	b.WriteString(", ")
	b.WriteString(pyString(p.EntryPoint))
	b.WriteString(", ")
	b.WriteString(pyString(string(args)))
	b.WriteString(")\n")
	b.WriteString(exitWith(passCode))
	return b.String()
}

// ioLine is one line the driver prints.
type ioLine struct {
	Case   *int            `json:"case"`
	Output json.RawMessage `json:"output"`
	Error  *string         `json:"error"`
}

// JudgeIO judges an I/O mode run against the expected outputs: the first
// case whose result is missing, an exception or unequal to its output
// decides (failed, or timed_out when the run timed out in it); a run
// passes only when every case matched and it exited 0. The result lines
// come from inside the sandbox and are read as untrusted: anything but one
// line per case, in order, fails the sample.
func JudgeIO(r Run, cases []IOCase) Verdict {
	if r.Status == "error" {
		return Judge(r)
	}
	fail := func(format string, args ...any) Verdict {
		d := fmt.Sprintf(format, args...)
		return Verdict{Status: Failed, Detail: d, Result: "failed: " + d}
	}
	rest := r.Stdout
	for i, c := range cases {
		line, more, ok := strings.Cut(rest, "\n")
		if !ok {
			// No whole line for this case: the run ended (or was cut) in it.
			switch {
			case r.Status == "timed_out":
				return Verdict{Status: TimedOut, Detail: fmt.Sprintf("timed out in case %d", i), Result: "timed out"}
			case r.Status == "exited" && (r.ExitCode == 0 || r.ExitCode == r.PassCode):
				return fail("case %d: no result (the program ended early)", i)
			}
			v := Judge(r)
			if i > 0 && v.Status == Failed {
				v.Detail = fmt.Sprintf("case %d: %s", i, v.Detail)
			}
			return v
		}
		rest = more
		var l ioLine
		dec := json.NewDecoder(strings.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil || l.Case == nil || *l.Case != i || (l.Error == nil) == (l.Output == nil) {
			return fail("case %d: malformed result line %s", i, quote(line))
		}
		if l.Error != nil {
			return fail("case %d: %s", i, clip(*l.Error, 200))
		}
		eq, err := EqualJSON(c.Output, l.Output)
		if err != nil {
			return fail("case %d: malformed result line %s", i, quote(line))
		}
		if !eq {
			return fail("case %d: expected %s, got %s", i, clip(string(c.Output), 100), clip(string(l.Output), 100))
		}
	}
	if rest != "" {
		return fail("more result lines than the %d cases", len(cases))
	}
	if r.Status == "exited" && r.ExitCode == r.PassCode {
		return Verdict{Status: Passed, Result: "passed"}
	}
	return Judge(r)
}

// EqualJSON reports whether two JSON texts hold equal values: integers
// exactly, other numbers within FloatTolerance (relative and absolute),
// strings, booleans and null by value, arrays element-wise and objects by
// key. A boolean never equals a number.
func EqualJSON(a, b json.RawMessage) (bool, error) {
	va, err := decodeJSON(a)
	if err != nil {
		return false, err
	}
	vb, err := decodeJSON(b)
	if err != nil {
		return false, err
	}
	return equal(va, vb), nil
}

func decodeJSON(b json.RawMessage) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, errors.New("more than one JSON value")
	}
	return v, nil
}

func equal(a, b any) bool {
	switch a := a.(type) {
	case json.Number:
		b, ok := b.(json.Number)
		return ok && equalNumbers(a, b)
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !equal(a[i], b[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, va := range a {
			vb, ok := b[k]
			if !ok || !equal(va, vb) {
				return false
			}
		}
		return true
	default: // string, bool, nil
		return a == b
	}
}

func equalNumbers(a, b json.Number) bool {
	ia, aInt := new(big.Int).SetString(string(a), 10)
	ib, bInt := new(big.Int).SetString(string(b), 10)
	if aInt && bInt {
		return ia.Cmp(ib) == 0
	}
	fa, errA := a.Float64()
	fb, errB := b.Float64()
	if errA != nil || errB != nil {
		return a == b // out of float64's range: only the same text is equal
	}
	d := math.Abs(fa - fb)
	return d <= max(FloatTolerance*max(math.Abs(fa), math.Abs(fb)), FloatTolerance)
}

// clip shortens s to about n bytes for a detail line.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func quote(s string) string {
	return fmt.Sprintf("%q", clip(s, 100))
}
