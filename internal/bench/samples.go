package bench

import (
	"fmt"
	"strings"

	"github.com/evalbox/evalbox/internal/eval"
)

// variant is one kind of generated sample: a completion derived from a
// task's canonical solution, and the verdict it is built to get.
type variant struct {
	name   string
	expect eval.Status
	make   func(p eval.Problem) string
}

// variants are the kinds of the generated ("1000") sample set, in the order
// they cycle through the tasks. The hang sleeps (rather than spins) so that
// it costs the timeout's wall time but no CPU, the same in every way.
var (
	variants = []variant{
		{"canonical", eval.Passed, func(p eval.Problem) string { return p.CanonicalSolution }},
		{"canonical+print", eval.Passed, func(p eval.Problem) string {
			return p.CanonicalSolution + "\n\nprint(" + `"evalbox bench: module-level output " * 20` + ")\n"
		}},
		{"return None", eval.Failed, func(eval.Problem) string { return "    return None\n" }},
		{"wrong result", eval.Failed, wrongResult},
		{"exception", eval.Failed, func(eval.Problem) string {
			return "    raise RuntimeError(\"evalbox bench: deliberate failure\")\n"
		}},
		{"syntax error", eval.Failed, func(eval.Problem) string { return "    return (\n" }},
	}
	hang = variant{"hang", eval.TimedOut, func(eval.Problem) string {
		return "    import time\n    time.sleep(3600)\n"
	}}
)

// hangEvery places a hang at every hangEvery-th sample of the generated
// set (4 in 1,000).
const hangEvery = 250

// wrongResult is the canonical solution with the entry point wrapped so
// that it returns a nearby wrong value: a negated bool, a number plus one,
// a string with an extra character, a list or tuple with an extra None,
// None for anything else.
func wrongResult(p eval.Problem) string {
	f := p.EntryPoint
	return p.CanonicalSolution + fmt.Sprintf(`

_evalbox_bench_%[1]s = %[1]s


def %[1]s(*args, **kwargs):
    r = _evalbox_bench_%[1]s(*args, **kwargs)
    if isinstance(r, bool):
        return not r
    if isinstance(r, (int, float)):
        return r + 1
    if isinstance(r, str):
        return r + "x"
    if isinstance(r, list):
        return r + [None]
    if isinstance(r, tuple):
        return r + (None,)
    return None
`, f)
}

// benchSample is a sample with the kind it was generated as ("file" for
// samples read from a file, "canonical" for the canonical set).
type benchSample struct {
	eval.Sample
	kind   string
	expect eval.Status // "" when unknown
}

// canonicalSet is one sample per task: its canonical solution.
func canonicalSet(ps eval.Problems) []benchSample {
	out := make([]benchSample, 0, len(ps.Order))
	for _, id := range ps.Order {
		c := ps.ByID[id].CanonicalSolution
		out = append(out, benchSample{Sample: eval.Sample{TaskID: id, Completion: &c}, kind: "canonical", expect: eval.Passed})
	}
	return out
}

// mixedSet is the generated sample set of n samples: sample i is for task
// i mod T (T tasks, file order) and of variant (i div T) mod 6, so every
// task gets each variant once per 6·T samples (for HumanEval's 164 tasks
// and n = 1,000: six of each, and the first 16 tasks a seventh, canonical,
// sample), except that every 250th sample is a hang (a timeout).
func mixedSet(ps eval.Problems, n int) []benchSample {
	t := len(ps.Order)
	out := make([]benchSample, 0, n)
	for i := range n {
		v := variants[(i/t)%len(variants)]
		if (i+1)%hangEvery == 0 {
			v = hang
		}
		p := ps.ByID[ps.Order[i%t]]
		c := v.make(p)
		out = append(out, benchSample{Sample: eval.Sample{TaskID: p.TaskID, Completion: &c}, kind: v.name, expect: v.expect})
	}
	return out
}

// designedMix describes a sample set: how many samples of each kind, and
// the verdict each kind is built to get.
func designedMix(ss []benchSample) string {
	counts := map[string]int{}
	expect := map[string]eval.Status{}
	var order []string
	for _, s := range ss {
		if counts[s.kind] == 0 {
			order = append(order, s.kind)
		}
		counts[s.kind]++
		expect[s.kind] = s.expect
	}
	parts := make([]string, 0, len(order))
	for _, k := range order {
		e := string(expect[k])
		if e == "" {
			e = "?"
		}
		parts = append(parts, fmt.Sprintf("%s %d (→ %s)", k, counts[k], e))
	}
	return strings.Join(parts, ", ")
}
