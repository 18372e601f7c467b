package eval

// HumanEval, MBPP (and MBPP+) and evalplus records.

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

func humanEvalProblem(f fields, rec record) (Problem, error) {
	var p Problem
	if err := json.Unmarshal(rec.raw, &p); err != nil {
		return Problem{}, err
	}
	if p.TaskID == "" {
		return Problem{}, errors.New("problem without task_id")
	}
	return p, nil
}

// mbppProblem: MBPP's asserts in assert mode without entry_point (they
// run as they are), after test_setup_code and test_imports; MBPP+'s test
// (the whole evalplus suite) when the record has one.
func (s FormatSpec) mbppProblem(f fields, rec record) (Problem, error) {
	id, err := f.id("task_id")
	if err != nil {
		return Problem{}, err
	}
	if id == "" {
		return Problem{}, errors.New("no task_id")
	}
	p := Problem{TaskID: id, Language: pythonLang}
	if p.CanonicalSolution, err = f.str("code"); err != nil {
		return p, err
	}
	suite, err := f.str("test")
	if err != nil {
		return p, err
	}
	if strings.TrimSpace(suite) != "" {
		// MBPP+ in MBPP's form: evalplus's suite, which checks with numpy.
		p.Test = numpyFallback + suite
		return p, nil
	}
	var parts []string
	if setup, err := f.str("test_setup_code"); err != nil {
		return p, err
	} else if strings.TrimSpace(setup) != "" {
		parts = append(parts, setup)
	}
	imports, err := f.strs("test_imports")
	if err != nil {
		return p, err
	}
	parts = append(parts, imports...)
	n := 0
	for _, set := range [][2]string{{"test", "test_list"}, {"challenge", "challenge_test_list"}} {
		if !s.wants(set[0]) {
			continue
		}
		tests, err := f.strs(set[1])
		if err != nil {
			return p, err
		}
		parts = append(parts, tests...)
		n += len(tests)
	}
	if n == 0 {
		return p, fmt.Errorf("no tests in %s", strings.Join(mbppSetFields(s), " or "))
	}
	p.Test = strings.Join(parts, "\n") + "\n"
	return p, nil
}

func mbppSetFields(s FormatSpec) []string {
	var out []string
	for _, set := range s.sets() {
		out = append(out, map[string]string{"test": "test_list", "challenge": "challenge_test_list"}[set])
	}
	return out
}

// numpyFallback makes `import numpy` work where numpy is not installed
// (the python template) with what evalplus's assertion uses of it:
// allclose and the ndarray type.
const numpyFallback = `try:
    import numpy as _evalbox_numpy
except ImportError:
    import sys as _evalbox_sys, types as _evalbox_types
    _evalbox_numpy = _evalbox_types.ModuleType("numpy")
    _evalbox_numpy.__doc__ = "evalbox's stand-in for numpy: allclose and ndarray only"
    class _evalbox_ndarray:
        pass
    _evalbox_numpy.ndarray = _evalbox_ndarray
    _evalbox_numpy.float64 = _evalbox_numpy.float32 = float
` + allclosePy + `    _evalbox_numpy.allclose = _evalbox_allclose
    _evalbox_sys.modules["numpy"] = _evalbox_numpy
`

// allclosePy is numpy.allclose on numbers and (nested) sequences of them,
// a scalar or a one-element sequence broadcast: every pair within
// atol + rtol*|b|; infinities equal only to themselves, NaN to nothing.
// Indented to sit in a block.
const allclosePy = `    def _evalbox_allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
        import math
        def seq(x):
            return isinstance(x, (list, tuple))
        def close(a, b):
            if seq(a) or seq(b):
                a = list(a) if seq(a) else [a]
                b = list(b) if seq(b) else [b]
                if len(a) != len(b):
                    if len(a) == 1:
                        a = a * len(b)
                    elif len(b) == 1:
                        b = b * len(a)
                    else:
                        raise ValueError("shapes differ: %d and %d" % (len(a), len(b)))
                return all(close(x, y) for x, y in zip(a, b))
            a, b = float(a), float(b)
            if math.isnan(a) or math.isnan(b):
                return equal_nan and math.isnan(a) and math.isnan(b)
            if math.isinf(a) or math.isinf(b):
                return a == b
            return abs(a - b) <= atol + rtol * abs(b)
        return close(a, b)
`

// evalPlusProblem: evalplus judges a sample on every input against the
// canonical solution's output on it; its file holds the inputs and the
// solution, not the outputs. The test program runs the canonical solution
// in a namespace of its own, in the sandbox, and compares as evalplus
// does.
func (s FormatSpec) evalPlusProblem(f fields, rec record) (Problem, error) {
	id, err := f.id("task_id")
	if err != nil {
		return Problem{}, err
	}
	if id == "" {
		return Problem{}, errors.New("no task_id")
	}
	p := Problem{TaskID: id, Language: pythonLang}
	if p.Prompt, err = f.str("prompt"); err != nil {
		return p, err
	}
	entry, err := f.str("entry_point")
	if err != nil {
		return p, err
	}
	if !pyIdent.MatchString(entry) {
		return p, fmt.Errorf("entry_point %q: want a Python identifier", entry)
	}
	if p.CanonicalSolution, err = f.str("canonical_solution"); err != nil {
		return p, err
	}
	if strings.TrimSpace(p.CanonicalSolution) == "" {
		return p, errors.New("no canonical_solution (evalplus's expected outputs are its outputs)")
	}
	atol := 0.0
	if f.has("atol") {
		if err := json.Unmarshal(f["atol"], &atol); err != nil {
			return p, fmt.Errorf("atol: want a number, got %s", kind(f["atol"]))
		}
	}
	var inputs []json.RawMessage
	for _, set := range []string{"base", "plus"} {
		if !s.wants(set) {
			continue
		}
		k := set + "_input"
		if !f.has(k) {
			continue
		}
		var in []json.RawMessage
		if err := json.Unmarshal(f[k], &in); err != nil {
			return p, fmt.Errorf("%s: want a list of argument lists, got %s", k, kind(f[k]))
		}
		for i, args := range in {
			if kind(args) != "an array" {
				return p, fmt.Errorf("%s[%d]: want a list of arguments, got %s", k, i, kind(args))
			}
		}
		inputs = append(inputs, in...)
	}
	if len(inputs) == 0 {
		return p, fmt.Errorf("no inputs in %s", strings.Join(setFields(s, "_input"), " or "))
	}
	text, _ := json.Marshal(inputs) // raw values, valid JSON
	var b strings.Builder
	b.WriteString("def _evalbox_is_floats(x):\n" +
		"    if isinstance(x, float):\n        return True\n" +
		"    if isinstance(x, (list, tuple)) and x:\n        return all(isinstance(i, float) for i in x)\n" +
		"    return False\n\n")
	b.WriteString(strings.TrimPrefix(strings.ReplaceAll(allclosePy, "\n    ", "\n"), "    "))
	b.WriteString(`
def _evalbox_plus_match(out, exp, atol):
    if out == exp:
        return True
    if atol == 0 and _evalbox_is_floats(exp):
        atol = 1e-6
    if atol == 0 or type(out) != type(exp):
        return False
    if isinstance(exp, (list, tuple)) and len(out) != len(exp):
        return False
    try:
        return _evalbox_allclose(out, exp, rtol=1e-07, atol=atol)
    except (TypeError, ValueError):
        return False


def _evalbox_plus_check(candidate, reference_source, entry_point, inputs, atol):
    import copy, json, reprlib
    scope = {"__name__": "__reference__"}
    exec(compile(reference_source, "<reference>", "exec"), scope)
    reference = scope[entry_point]
    for i, args in enumerate(json.loads(inputs)):
        expected = reference(*copy.deepcopy(args))
        got = candidate(*copy.deepcopy(args))
        assert _evalbox_plus_match(got, expected, atol), "input %d: expected %s, got %s" % (i, reprlib.repr(expected), reprlib.repr(got))


`)
	fmt.Fprintf(&b, "_evalbox_plus_check(%s, %s, %s, %s, %s)\n", entry, pyString(p.Prompt+p.CanonicalSolution),
		pyString(entry), pyString(string(restoreNonFinite(text))), strconv.FormatFloat(atol, 'g', -1, 64))
	p.Test = b.String()
	return p, nil
}

func setFields(s FormatSpec, suffix string) []string {
	var out []string
	for _, set := range s.sets() {
		out = append(out, set+suffix)
	}
	return out
}
