package eval

// APPS and TACO (input_output), and CodeContests records.

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// appsInOut is APPS's input_output.
type appsInOut struct {
	Inputs  []json.RawMessage `json:"inputs"`
	Outputs []json.RawMessage `json:"outputs"`
	FnName  *string           `json:"fn_name"`
}

// appsProblem: stdin problems become stdin/stdout tests; call-based ones
// (fn_name) I/O cases on a wrapper in the prompt that calls fn_name, or
// the method of class Solution when the program has one, as APPS does.
func (s FormatSpec) appsProblem(f fields, rec record) (Problem, error) {
	id, err := f.taskID(rec, "problem_id", "task_id")
	if err != nil {
		return Problem{}, err
	}
	p := Problem{TaskID: id}
	raw, err := f.nested("input_output")
	if err != nil {
		return p, err
	}
	if raw == nil {
		return p, errors.New("input_output: no tests")
	}
	var tio appsInOut
	if err := json.Unmarshal(raw, &tio); err != nil {
		return p, fmt.Errorf("input_output: want {inputs, outputs, fn_name}: %w", err)
	}
	switch {
	case len(tio.Inputs) == 0:
		return p, errors.New("input_output: no inputs")
	case len(tio.Inputs) != len(tio.Outputs):
		return p, fmt.Errorf("input_output: %d inputs but %d outputs", len(tio.Inputs), len(tio.Outputs))
	}
	if tio.FnName == nil || *tio.FnName == "" {
		for i := range tio.Inputs {
			in, err := appsText(tio.Inputs[i])
			if err != nil {
				return p, fmt.Errorf("input_output: inputs[%d]: %w", i, err)
			}
			out, err := appsText(tio.Outputs[i])
			if err != nil {
				return p, fmt.Errorf("input_output: outputs[%d]: %w", i, err)
			}
			p.Tests = append(p.Tests, Test{Input: in, Output: out})
		}
		p.Checker = s.Checker
		return p, nil
	}
	p.Language = pythonLang
	p.EntryPoint = entryWrapper
	p.Prompt = appsPrelude + wrapperPy(*tio.FnName, true)
	for i := range tio.Inputs {
		args := []json.RawMessage{}
		if kind(tio.Inputs[i]) != "an array" || json.Unmarshal(tio.Inputs[i], &args) != nil {
			return p, fmt.Errorf("input_output: inputs[%d]: want the list of %s's arguments, got %s", i, *tio.FnName, kind(tio.Inputs[i]))
		}
		p.IO = append(p.IO, IOCase{Input: args, Output: unwrapOne(tio.Outputs[i])})
	}
	return p, nil
}

// appsText is a stdin input or expected output: a string, or lines in a
// list (joined with "\n", as APPS joins them).
func appsText(v json.RawMessage) (string, error) {
	if s, ok := jsonString(v); ok {
		return s, nil
	}
	var ss []string
	if err := json.Unmarshal(v, &ss); err != nil {
		return "", fmt.Errorf("want a string or a list of strings, got %s", kindDeep(v))
	}
	return strings.Join(ss, "\n"), nil
}

// unwrapOne is a call-based expected output: APPS wraps the return value
// in a one-element list (and accepts either the list or its element).
func unwrapOne(v json.RawMessage) json.RawMessage {
	var elems []json.RawMessage
	if json.Unmarshal(v, &elems) == nil && len(elems) == 1 {
		return elems[0]
	}
	return v
}

// pythonLang is internal/lang's name of Python.
const pythonLang = "python"

// pyIdent is a Python identifier (ASCII).
var pyIdent = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// entryWrapper is the function I/O mode calls in call-based problems.
const entryWrapper = "_evalbox_entry"

// wrapperPy defines entryWrapper: it calls name, the method of an instance
// of the program's class Solution if it defines one (made once, as APPS
// and LiveCodeBench make it), else the module-level function. With
// intKeys, a first argument that is a dict gets int keys where they all
// read as ints (JSON has string keys only; APPS converts them back).
func wrapperPy(name string, intKeys bool) string {
	var b strings.Builder
	b.WriteString("\n\ndef " + entryWrapper + "(*args):\n")
	b.WriteString("    # evalbox: the function the I/O cases call.\n")
	b.WriteString("    g = globals()\n")
	b.WriteString("    name = " + pyString(name) + "\n")
	b.WriteString("    if isinstance(g.get(\"Solution\"), type):\n" +
		"        if \"_evalbox_solution\" not in g:\n" +
		"            g[\"_evalbox_solution\"] = g[\"Solution\"]()\n" +
		"        fn = getattr(g[\"_evalbox_solution\"], name)\n" +
		"    elif name in g:\n" +
		"        fn = g[name]\n" +
		"    else:\n" +
		"        raise NameError(\"name %r is not defined\" % name)\n")
	if intKeys {
		b.WriteString("    if args and isinstance(args[0], dict):\n" +
			"        try:\n" +
			"            args = ({int(k): v for k, v in args[0].items()},) + args[1:]\n" +
			"        except (TypeError, ValueError):\n" +
			"            pass\n")
	}
	b.WriteString("    return fn(*args)\n\n\n")
	return b.String()
}

// appsPrelude is what APPS (and TACO) put before a call-based program:
// these imports, numpy only where it is installed.
const appsPrelude = `import sys
import time
import itertools
from itertools import accumulate, product, permutations, combinations
import collections
from collections import Counter, OrderedDict, deque, defaultdict, ChainMap
from functools import lru_cache
import math
from math import sqrt, sin, cos, tan, ceil, fabs, floor, gcd, exp, log, log2
import fractions
from typing import List, Tuple
try:
    import numpy as np
except ImportError:
    pass
import random
import heapq
from heapq import *
`

// lcbPrelude is what LiveCodeBench puts before a functional program:
// star imports of these modules (in this order: later ones win), the
// modules themselves, and a deep recursion limit.
var lcbPrelude = func() string {
	var b strings.Builder
	mods := []string{"string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random",
		"statistics", "itertools", "functools", "operator", "io", "sys", "json"}
	for _, m := range append(slices.Clone(mods), "builtins", "typing") {
		b.WriteString("from " + m + " import *\n")
	}
	for _, m := range mods {
		b.WriteString("import " + m + "\n")
	}
	b.WriteString("sys.setrecursionlimit(50000)\n")
	return b.String()
}()

// ccTests is one of CodeContests's test sets: {input: [...], output:
// [...]} as HF gives it, or a list of {input, output}.
func ccTests(f fields, k string) ([]Test, error) {
	if !f.has(k) {
		return nil, nil
	}
	var cols struct {
		Input  []string `json:"input"`
		Output []string `json:"output"`
	}
	if kind(f[k]) == "an array" {
		var ts []Test
		if err := json.Unmarshal(f[k], &ts); err != nil {
			return nil, fmt.Errorf("%s: want {input: [...], output: [...]} or a list of {input, output}: %w", k, err)
		}
		return ts, nil
	}
	if err := json.Unmarshal(f[k], &cols); err != nil {
		return nil, fmt.Errorf("%s: want {input: [...], output: [...]}: %w", k, err)
	}
	if len(cols.Input) != len(cols.Output) {
		return nil, fmt.Errorf("%s: %d inputs but %d outputs", k, len(cols.Input), len(cols.Output))
	}
	ts := make([]Test, len(cols.Input))
	for i := range cols.Input {
		ts[i] = Test{Input: cols.Input[i], Output: cols.Output[i]}
	}
	return ts, nil
}

// codeContestsChecker is CodeContests's own comparison as near as a
// Checker comes: tokens, numbers within 1e-5 absolute (its tester reads
// every number as a double); it also ignores the case of words, which this
// does not (the case_insensitive option does, without the tolerance).
var codeContestsChecker = Checker{Kind: CheckFloat, AbsTol: 1e-5, RelTol: -1}

// codeContestsProblem: stdin/stdout tests from the chosen sets (public,
// private, generated), identical ones once.
func (s FormatSpec) codeContestsProblem(f fields, rec record) (Problem, error) {
	id, err := f.taskID(rec, "name")
	if err != nil {
		return Problem{}, err
	}
	p := Problem{TaskID: id}
	for _, k := range []string{"input_file", "output_file"} {
		if v, err := f.str(k); err != nil {
			return p, err
		} else if strings.TrimSpace(v) != "" {
			return p, fmt.Errorf("%s: the program reads or writes the file %q; evalbox judges stdin and stdout only", k, v)
		}
	}
	seen := map[Test]bool{}
	for _, set := range s.sets() {
		ts, err := ccTests(f, set+"_tests")
		if err != nil {
			return p, err
		}
		for _, t := range ts {
			if !seen[t] {
				seen[t] = true
				p.Tests = append(p.Tests, t)
			}
		}
	}
	if len(p.Tests) == 0 {
		return p, fmt.Errorf("no tests in %s", strings.Join(setFields(s, "_tests"), ", "))
	}
	c := codeContestsChecker
	if s.Checker != nil {
		c = *s.Checker
	}
	p.Checker = &c
	return p, nil
}
