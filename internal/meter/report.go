package meter

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/evalbox/evalbox/internal/limits"
	"github.com/evalbox/evalbox/internal/store"
)

// Rules are how seconds are counted and billed.
type Rules struct {
	// Granularity is the unit a sandbox's running (or paused) time in a
	// report is rounded up to (default 1 s).
	Granularity time.Duration
	// Minimum is what a sandbox's running time is billed at least, counted
	// in the report whose window holds its start (default 60 s; negative:
	// none).
	Minimum time.Duration
}

// DefaultTariff is the tariff that prices sandboxes created without one
// (a built-in, seeded by the store's migration).
const DefaultTariff = "standard"

// Defaults of Rules.
const (
	DefaultGranularity = limits.BillingGranularity
	DefaultMinimum     = limits.BillingMinimum
)

// WithDefaults is r with its zero fields at their defaults.
func (r Rules) WithDefaults() Rules {
	if r.Granularity <= 0 {
		r.Granularity = DefaultGranularity
	}
	if r.Minimum == 0 {
		r.Minimum = DefaultMinimum
	}
	return r
}

// GroupBy values of a report.
const (
	BySandbox  = "sandbox"
	ByTemplate = "template"
	ByTariff   = "tariff"
	ByDay      = "day"
	ByEvalRun  = "eval_run"
)

// ValidGroupBy reports whether g is a grouping of Report.
func ValidGroupBy(g string) bool {
	return slices.Contains([]string{BySandbox, ByTemplate, ByTariff, ByDay, ByEvalRun}, g)
}

// Line is a report's total for one group (or for all).
type Line struct {
	Key       string
	Sandboxes int
	// Running and Paused are the metered time in the window; Billed is the
	// running time billed (rounded up per sandbox, the minimum applied),
	// BilledPaused the paused time billed (rounded up, no minimum).
	Running, Paused, Billed, BilledPaused time.Duration
	// VCPUSeconds, GiBSeconds: billed running time times the shape.
	VCPUSeconds, GiBSeconds float64
	// Cost in nano-units.
	Cost int64
}

// Report sums segments over [from, to), grouped by groupBy. Each segment
// is cut to the window (and, by day, at UTC midnights); a sandbox's time
// in a group is rounded up to the granularity; the minimum is added to the
// group of a sandbox's first stretch when its start is in the window.
func Report(segs []store.UsageSegment, from, to time.Time, groupBy string, rules Rules) ([]Line, Line) {
	rules = rules.WithDefaults()
	type acc struct {
		seg             store.UsageSegment // the shape and prices (a sandbox's are the same in every segment)
		running, paused time.Duration
		first           bool
	}
	// By group, then sandbox.
	groups := map[string]map[string]*acc{}
	add := func(key string, u store.UsageSegment, d time.Duration, first bool) {
		g := groups[key]
		if g == nil {
			g = map[string]*acc{}
			groups[key] = g
		}
		a := g[u.SandboxID]
		if a == nil {
			a = &acc{seg: u}
			g[u.SandboxID] = a
		}
		if u.Paused {
			a.paused += d
		} else {
			a.running += d
		}
		a.first = a.first || first
	}
	for _, u := range segs {
		start, end := later(u.StartedAt, from), earlier(u.End(), to)
		first := u.Seq == 0 && !u.StartedAt.Before(from) && u.StartedAt.Before(to)
		if end.Before(start) {
			if !first {
				continue
			}
			end = start
		}
		if groupBy != ByDay {
			add(keyOf(u, groupBy), u, end.Sub(start), first)
			continue
		}
		// Cut at UTC midnights (Truncate counts from the zero time, a UTC
		// midnight).
		day := start.UTC().Truncate(24 * time.Hour)
		for {
			next := day.Add(24 * time.Hour)
			add(day.Format(time.DateOnly), u, max(earlier(end, next).Sub(later(start, day)), 0), first)
			first = false
			if !end.After(next) {
				break
			}
			day = next
		}
	}
	var lines []Line
	var total Line
	seen := map[string]bool{}
	for key, g := range groups {
		l := Line{Key: key}
		for id, a := range g {
			billed := roundUp(a.running, rules.Granularity)
			if a.first && rules.Minimum > 0 {
				billed = max(billed, rules.Minimum)
			}
			bp := roundUp(a.paused, rules.Granularity)
			l.Sandboxes++
			l.Running += a.running
			l.Paused += a.paused
			l.Billed += billed
			l.BilledPaused += bp
			l.VCPUSeconds += billed.Seconds() * a.seg.CPU
			l.GiBSeconds += billed.Seconds() * float64(a.seg.MemoryMB) / 1024
			l.Cost += cost(a.seg, billed, bp)
			if !seen[id] {
				seen[id] = true
				total.Sandboxes++
			}
		}
		total.Running += l.Running
		total.Paused += l.Paused
		total.Billed += l.Billed
		total.BilledPaused += l.BilledPaused
		total.VCPUSeconds += l.VCPUSeconds
		total.GiBSeconds += l.GiBSeconds
		total.Cost += l.Cost
		lines = append(lines, l)
	}
	slices.SortFunc(lines, func(a, b Line) int { return cmp.Compare(a.Key, b.Key) })
	return lines, total
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func keyOf(u store.UsageSegment, groupBy string) string {
	switch groupBy {
	case ByTemplate:
		return u.Template
	case ByTariff:
		return u.Tariff
	case ByEvalRun:
		return u.EvalRun
	}
	return u.SandboxID
}

func roundUp(d, unit time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return (d + unit - 1) / unit * unit
}

// cost prices billed running time (vCPU, memory and disk) and billed
// paused time (disk only) at a segment's prices, in nano-units: per
// microsecond, in integers, so that only the final division rounds.
func cost(u store.UsageSegment, running, paused time.Duration) int64 {
	us := running.Microseconds()
	cpuMilli := int64(math.Round(u.CPU * 1000))
	c := mulDiv(us, cpuMilli*u.PriceVCPUSecond, 1000*1_000_000) +
		mulDiv(us, int64(u.MemoryMB)*u.PriceGiBSecond, 1024*1_000_000) +
		mulDiv(us+paused.Microseconds(), int64(u.DiskMB)*u.PriceDiskGiBSecond, 1024*1_000_000)
	return c
}

// mulDiv is a*b/d without overflowing in the product (a, b ≥ 0), and
// never above an eighth of int64's range (so that sums of a few stay in
// it).
func mulDiv(a, b, d int64) int64 {
	const ceiling = math.MaxInt64 / 8
	if a <= 0 || b <= 0 {
		return 0
	}
	if a <= math.MaxInt64/b {
		return a * b / d
	}
	return int64(min(float64(a)/float64(d)*float64(b), ceiling))
}

// Describe is a one-line summary of l, for logs and the CLI.
func Describe(l Line) string {
	return fmt.Sprintf("%d sandboxes, %s billed, cost %s", l.Sandboxes, l.Billed, FormatMoney(l.Cost))
}
