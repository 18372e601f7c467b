package eval

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// The problem-set formats ReadProblemsFormat reads (docs/formats.md: their
// fields, how each maps onto a check mode, what is not supported).
const (
	// FormatAuto detects the format from the first record's fields
	// (DetectFormat).
	FormatAuto = "auto"
	// FormatHumanEval is evalbox's own schema, HumanEval's (Problem).
	FormatHumanEval = "humaneval"
	// FormatMBPP: google-research's MBPP (full and sanitized) and the
	// original-format MBPP+ of evalplus (its test field).
	FormatMBPP = "mbpp"
	// FormatEvalPlus: evalplus's own HumanEvalPlus.jsonl and
	// MbppPlus.jsonl (base_input, plus_input, no expected outputs).
	FormatEvalPlus = "evalplus"
	// FormatAPPS: APPS, TACO and any set with APPS's input_output field.
	FormatAPPS = "apps"
	// FormatCodeContests: deepmind's CodeContests.
	FormatCodeContests = "codecontests"
	// FormatLiveCodeBench: LiveCodeBench's code_generation(_lite).
	FormatLiveCodeBench = "livecodebench"
	// FormatMultiPLE: nuprl's MultiPL-E.
	FormatMultiPLE = "multipl-e"
)

// Formats lists the formats ReadProblemsFormat reads (FormatAuto aside).
var Formats = []string{FormatHumanEval, FormatMBPP, FormatEvalPlus, FormatAPPS, FormatCodeContests, FormatLiveCodeBench, FormatMultiPLE}

// formatSets are the test sets a format's option words choose among.
var formatSets = map[string][]string{
	FormatMBPP:          {"test", "challenge"},
	FormatEvalPlus:      {"base", "plus"},
	FormatCodeContests:  {"public", "private", "generated"},
	FormatLiveCodeBench: {"public", "private"},
}

// defaultSets are the sets read when the spec names none.
var defaultSets = map[string][]string{
	FormatMBPP:          {"test"},
	FormatEvalPlus:      {"base", "plus"},
	FormatCodeContests:  {"public", "private", "generated"},
	FormatLiveCodeBench: {"public", "private"},
}

// stdinFormats are the formats with stdin/stdout problems, whose checker
// an option word may choose.
var stdinFormats = []string{FormatAPPS, FormatCodeContests, FormatLiveCodeBench}

// FormatSpec is a format and its options, written "name" or
// "name:word,word" (e.g. "codecontests:public,private,exact").
type FormatSpec struct {
	Name string
	// Sets are the test sets read (nil: the format's default): mbpp's
	// test (test_list) and challenge (challenge_test_list); evalplus's
	// base and plus inputs; codecontests's public, private and generated
	// tests; livecodebench's public and private tests.
	Sets []string
	// Checker replaces the format's checker of stdin/stdout tests (apps,
	// codecontests, livecodebench): a word of CheckKinds.
	Checker *Checker
}

// ParseFormat reads a format spec ("" is FormatAuto).
func ParseFormat(s string) (FormatSpec, error) {
	name, opts, hasOpts := strings.Cut(strings.TrimSpace(s), ":")
	name = strings.ToLower(strings.TrimSpace(name))
	switch name {
	case "", FormatAuto:
		if hasOpts {
			return FormatSpec{}, fmt.Errorf("format %q: options need a format name (one of %s)", s, strings.Join(Formats, ", "))
		}
		return FormatSpec{Name: FormatAuto}, nil
	case "multiple", "multipl_e", "multiple-e":
		name = FormatMultiPLE
	case "taco":
		name = FormatAPPS
	}
	if !slices.Contains(Formats, name) {
		return FormatSpec{}, fmt.Errorf("unknown format %q (known: %s, %s)", name, FormatAuto, strings.Join(Formats, ", "))
	}
	spec := FormatSpec{Name: name}
	if !hasOpts {
		return spec, nil
	}
	for _, w := range strings.Split(opts, ",") {
		w = strings.ToLower(strings.TrimSpace(w))
		switch {
		case slices.Contains(formatSets[name], w):
			if !slices.Contains(spec.Sets, w) {
				spec.Sets = append(spec.Sets, w)
			}
		case slices.Contains(stdinFormats, name) && slices.Contains(CheckKinds, w):
			if spec.Checker != nil {
				return FormatSpec{}, fmt.Errorf("format %q: two checkers", s)
			}
			spec.Checker = &Checker{Kind: w}
		default:
			return FormatSpec{}, fmt.Errorf("format %q: unknown option %q (%s takes %s)", s, w, name, formatOptions(name))
		}
	}
	return spec, nil
}

// formatOptions describes the option words of a format, for an error.
func formatOptions(name string) string {
	var words []string
	words = append(words, formatSets[name]...)
	if slices.Contains(stdinFormats, name) {
		words = append(words, CheckKinds...)
	}
	if len(words) == 0 {
		return "no options"
	}
	return strings.Join(words, ", ")
}

func (s FormatSpec) sets() []string {
	if s.Sets != nil {
		return s.Sets
	}
	return defaultSets[s.Name]
}

func (s FormatSpec) wants(set string) bool { return slices.Contains(s.sets(), set) }

// DetectFormat names the format of a record with these JSON keys, or ""
// when it cannot tell. The first rule that matches decides:
//   - input_output: apps (APPS, TACO);
//   - public_tests, private_tests or generated_tests: codecontests;
//   - public_test_cases or private_test_cases: livecodebench;
//   - stop_tokens, or name, prompt, tests and language without task_id:
//     multipl-e;
//   - base_input or plus_input: evalplus;
//   - test_list: mbpp;
//   - task_id: humaneval (evalbox's schema).
func DetectFormat(keys []string) string {
	has := func(names ...string) bool {
		for _, n := range names {
			if slices.Contains(keys, n) {
				return true
			}
		}
		return false
	}
	all := func(names ...string) bool {
		for _, n := range names {
			if !slices.Contains(keys, n) {
				return false
			}
		}
		return true
	}
	switch {
	case has("input_output"):
		return FormatAPPS
	case has("public_tests", "private_tests", "generated_tests"):
		return FormatCodeContests
	case has("public_test_cases", "private_test_cases"):
		return FormatLiveCodeBench
	case has("stop_tokens"), all("name", "prompt", "tests", "language") && !has("task_id"):
		return FormatMultiPLE
	case has("base_input", "plus_input"):
		return FormatEvalPlus
	case has("test_list"):
		return FormatMBPP
	case has("task_id"):
		return FormatHumanEval
	}
	return ""
}

// ReadProblemsFormat reads a problem set of format (a FormatSpec; ""
// or FormatAuto: detected from the first record's fields) from r and
// returns it with the format it read. r holds JSON Lines (one record a
// line) or one JSON document: an array of records, or an object whose
// values are records (its keys are the records' ids where they have
// none); either may be gzip compressed. Errors name the record (its line,
// its index in an array, its key in an object) and the field.
func ReadProblemsFormat(r io.Reader, format string) (Problems, string, error) {
	spec, err := ParseFormat(format)
	if err != nil {
		return Problems{}, "", err
	}
	ps := Problems{ByID: map[string]Problem{}}
	var conv func(fields, record) (Problem, error)
	err = eachRecord(r, func(rec record) error {
		f, nonFinite, err := rec.fields()
		if err != nil {
			return err
		}
		if conv == nil {
			if spec.Name == FormatAuto {
				keys := make([]string, 0, len(f))
				for k := range f {
					keys = append(keys, k)
				}
				if spec.Name = DetectFormat(keys); spec.Name == "" {
					slices.Sort(keys)
					return fmt.Errorf("cannot tell the format from the fields %s: give one of %s", strings.Join(keys, ", "), strings.Join(Formats, ", "))
				}
			}
			conv = spec.converter()
		}
		if nonFinite && spec.Name != FormatEvalPlus {
			return fmt.Errorf("%s: NaN or Infinity, which are not JSON (only evalplus's inputs may hold them)", spec.Name)
		}
		p, err := conv(f, rec)
		if err != nil {
			if p.TaskID != "" {
				return fmt.Errorf("%s %q: %w", spec.Name, p.TaskID, err)
			}
			return fmt.Errorf("%s: %w", spec.Name, err)
		}
		return ps.add(p)
	})
	if err != nil {
		return Problems{}, spec.Name, fmt.Errorf("problems: %w", err)
	}
	if len(ps.Order) == 0 {
		return Problems{}, spec.Name, errors.New("problems: no problems")
	}
	return ps, spec.Name, nil
}

// ReadProblemsFormatFile is ReadProblemsFormat on a file (.jsonl, .json,
// either gzip compressed).
func ReadProblemsFormatFile(path, format string) (Problems, string, error) {
	f, err := os.Open(path)
	if err != nil {
		return Problems{}, "", err
	}
	defer f.Close()
	ps, used, err := ReadProblemsFormat(f, format)
	if err != nil {
		return Problems{}, used, fmt.Errorf("%s: %w", path, err)
	}
	return ps, used, nil
}

// converter is the record → Problem function of the spec's format.
func (s FormatSpec) converter() func(fields, record) (Problem, error) {
	switch s.Name {
	case FormatMBPP:
		return s.mbppProblem
	case FormatEvalPlus:
		return s.evalPlusProblem
	case FormatAPPS:
		return s.appsProblem
	case FormatCodeContests:
		return s.codeContestsProblem
	case FormatLiveCodeBench:
		return s.liveCodeBenchProblem
	case FormatMultiPLE:
		return multiPLEProblem
	}
	return humanEvalProblem
}
