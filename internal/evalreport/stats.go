// Package evalreport summarises an eval run's result lines (per-task pass
// rates, failures by kind, durations) and renders a run as one
// self-contained HTML page: inline CSS, SVG and script, no external
// asset. Result details come from untrusted model code; the page is built
// with html/template, which escapes them.
package evalreport

import (
	"cmp"
	"maps"
	"slices"
	"strings"

	"github.com/evalbox/evalbox/pkg/client"
)

// Result statuses, in the order reports show them.
var Statuses = []string{"passed", "failed", "timed_out", "infra_error"}

// Group is the status of Statuses a result's status is shown under: a
// whole program's time_limit is timed_out, its other verdicts
// (compile_error, wrong_answer, runtime_error, memory_limit, output_limit)
// failed; the failure kinds keep them apart.
func Group(status string) string {
	switch status {
	case "passed", "failed", "timed_out", "infra_error":
		return status
	case client.TestTimeLimit:
		return "timed_out"
	}
	return "failed"
}

// Kinds of non-passing results that are not exceptions.
const (
	KindTimedOut   = "timed out"
	KindInfraError = "infra_error"
)

// Stats accumulates an eval run's result lines. The zero value is ready to
// use; Add the lines in the order the API sends them (the samples' order).
type Stats struct {
	n      int
	counts map[string]int
	tasks  map[string]*TaskStat
	order  []string
	kinds  map[string]*Kind
	points []point
}

// point is one result's duration and status (an index of Statuses, -1 for
// another status).
type point struct {
	ms     int64
	status int
}

// TaskStat is one task's results.
type TaskStat struct {
	TaskID      string
	N           int // results
	Passed      int
	Failed      int
	TimedOut    int
	InfraErrors int
}

// Scored is the number of results that count for pass rates (all but infra
// errors).
func (t TaskStat) Scored() int { return t.N - t.InfraErrors }

// PassRate is Passed/Scored, 0 when nothing was scored.
func (t TaskStat) PassRate() float64 {
	if t.Scored() == 0 {
		return 0
	}
	return float64(t.Passed) / float64(t.Scored())
}

// Kind is a group of non-passing results: an exception name
// ("AssertionError"), "timed out", "infra_error", or the detail itself when
// it names no exception ("exit code 1").
type Kind struct {
	Kind  string
	Count int
	// Example is the first result's detail, when it says more than Kind.
	Example string
}

// Add counts one result line.
func (s *Stats) Add(r client.EvalResult) {
	if s.counts == nil {
		s.counts = map[string]int{}
		s.tasks = map[string]*TaskStat{}
		s.kinds = map[string]*Kind{}
	}
	s.n++
	group := Group(r.Status)
	s.counts[group]++
	s.points = append(s.points, point{ms: max(r.DurationMs, 0), status: slices.Index(Statuses, group)})
	t := s.tasks[r.TaskID]
	if t == nil {
		t = &TaskStat{TaskID: r.TaskID}
		s.tasks[r.TaskID] = t
		s.order = append(s.order, r.TaskID)
	}
	t.N++
	switch group {
	case "passed":
		t.Passed++
	case "failed":
		t.Failed++
	case "timed_out":
		t.TimedOut++
	case "infra_error":
		t.InfraErrors++
	}
	k := FailureKind(r)
	if k == "" {
		return
	}
	g := s.kinds[k]
	if g == nil {
		g = &Kind{Kind: k}
		if d := strings.TrimSpace(r.Detail); d != k {
			g.Example = d
		}
		s.kinds[k] = g
	}
	g.Count++
}

// Len is the number of results added.
func (s *Stats) Len() int { return s.n }

// Counts returns the number of results by status (every status of
// Statuses is present).
func (s *Stats) Counts() map[string]int {
	m := make(map[string]int, len(Statuses))
	for _, st := range Statuses {
		m[st] = 0
	}
	maps.Copy(m, s.counts)
	return m
}

// Tasks returns the per-task stats in the order the tasks first appeared.
func (s *Stats) Tasks() []TaskStat {
	ts := make([]TaskStat, len(s.order))
	for i, id := range s.order {
		ts[i] = *s.tasks[id]
	}
	return ts
}

// WorstTasks returns the tasks by pass rate, lowest first (ties: more
// scored results first, then task order); n ≤ 0 returns them all.
func (s *Stats) WorstTasks(n int) []TaskStat {
	ts := s.Tasks()
	slices.SortStableFunc(ts, func(a, b TaskStat) int {
		return cmp.Or(cmp.Compare(a.PassRate(), b.PassRate()), cmp.Compare(b.Scored(), a.Scored()))
	})
	if n > 0 && len(ts) > n {
		ts = ts[:n]
	}
	return ts
}

// SamplesPerTask returns the number of results of every task when all
// tasks have the same number, else 0.
func (s *Stats) SamplesPerTask() int {
	n := 0
	for _, t := range s.tasks {
		if n != 0 && t.N != n {
			return 0
		}
		n = t.N
	}
	return n
}

// Kinds returns the failures by kind: exception kinds by count (most
// first, then by name), then "timed out" and "infra_error", which are
// always present (possibly with a count of 0).
func (s *Stats) Kinds() []Kind {
	var ks []Kind
	for _, k := range s.kinds {
		if k.Kind != KindTimedOut && k.Kind != KindInfraError {
			ks = append(ks, *k)
		}
	}
	slices.SortFunc(ks, func(a, b Kind) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), strings.Compare(a.Kind, b.Kind))
	})
	for _, name := range []string{KindTimedOut, KindInfraError} {
		k := Kind{Kind: name}
		if g := s.kinds[name]; g != nil {
			k = *g
		}
		ks = append(ks, k)
	}
	return ks
}

// FailureKind groups a non-passing result: the exception's name for a
// failure whose detail starts with one ("NameError: name 'x' is not
// defined" → "NameError"), else the detail itself ("exit code 1"), "timed
// out" or "infra_error"; "" for a pass.
func FailureKind(r client.EvalResult) string {
	switch r.Status {
	case "passed":
		return ""
	case "timed_out":
		return KindTimedOut
	case "infra_error":
		return KindInfraError
	case "failed":
	default:
		// A whole program's verdict (compile_error, wrong_answer,
		// time_limit, …) is its kind.
		return r.Status
	}
	d := strings.TrimSpace(r.Detail)
	name, _, _ := strings.Cut(d, ":")
	switch {
	case d == "":
		return r.Status
	case isExceptionName(name):
		return name
	case len(d) > 60:
		return strings.ToValidUTF8(d[:60], "") + "…"
	}
	return d
}

// isExceptionName reports whether s looks like a Python exception name,
// possibly qualified: "ValueError", "json.decoder.JSONDecodeError".
func isExceptionName(s string) bool {
	if s == "" || len(s) > 100 {
		return false
	}
	for part := range strings.SplitSeq(s, ".") {
		if part == "" || part[0] >= '0' && part[0] <= '9' {
			return false
		}
		for _, c := range part {
			if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
				return false
			}
		}
	}
	last := s[strings.LastIndexByte(s, '.')+1:]
	return last[0] >= 'A' && last[0] <= 'Z'
}

// Histogram is the results' durations in equal bins from 0 ms.
type Histogram struct {
	BinMs int64 // width of a bin
	Bins  []Bin
	Max   int // largest bin total
}

// Bin is one histogram bar: durations in [FromMs, FromMs+BinMs), counted by
// status (indexes of Statuses).
type Bin struct {
	FromMs int64
	Counts [4]int
	Total  int
}

// Histogram bins the durations into at most maxBins bins of a round width
// (1, 2 or 5 × 10^n ms).
func (s *Stats) Histogram(maxBins int) Histogram {
	if len(s.points) == 0 || maxBins < 1 {
		return Histogram{}
	}
	top := int64(0)
	for _, p := range s.points {
		top = max(top, p.ms)
	}
	width := niceWidth(top, int64(maxBins))
	h := Histogram{BinMs: width, Bins: make([]Bin, top/width+1)}
	for i := range h.Bins {
		h.Bins[i].FromMs = int64(i) * width
	}
	for _, p := range s.points {
		b := &h.Bins[p.ms/width]
		if p.status >= 0 {
			b.Counts[p.status]++
		}
		b.Total++
		h.Max = max(h.Max, b.Total)
	}
	return h
}

// niceWidth is the smallest of 1, 2, 5, 10, 20, 50, … that cuts [0, top]
// into at most bins bins.
func niceWidth(top, bins int64) int64 {
	for base := int64(1); ; base *= 10 {
		for _, m := range []int64{1, 2, 5} {
			if w := base * m; top/w+1 <= bins {
				return w
			}
		}
	}
}
