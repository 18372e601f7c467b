package evalreport

import (
	"cmp"
	_ "embed"
	"fmt"
	"html/template"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

//go:embed report.html.tmpl
var pageSource string

var pageTemplate = template.Must(template.New("report").Parse(pageSource))

// Chart geometry, in SVG user units.
const (
	chartWidth   = 760
	chartHeight  = 180
	chartLeft    = 44 // room for the y axis labels
	chartBottom  = 22 // room for the x axis labels
	histogramMax = 30 // bins
)

// WriteHTML writes the report of run, whose result lines s holds, as one
// self-contained HTML page: pass@k, counts by status, failures by kind, a
// histogram of the trials' durations, per-task pass rates and the run's
// settings and environment. The same run and results give the same bytes.
func WriteHTML(w io.Writer, run *client.EvalRun, s *Stats) error {
	if err := pageTemplate.Execute(w, newPage(run, s)); err != nil {
		return fmt.Errorf("evalreport: %w", err)
	}
	return nil
}

type kv struct{ Key, Value string }

type countRow struct {
	Status string
	Count  int
	Share  string
}

type taskRow struct {
	TaskStat
	Rate  string
	BarW  string // width of the pass-rate bar, 0–100
	Class string
}

// rect is one SVG bar; Class colours it, Title is its tooltip.
type rect struct {
	X, Y, W, H string
	Class      string
	Title      string
}

// label is one SVG text.
type label struct {
	X, Y   string
	Anchor string
	Text   string
}

// chart is an SVG bar chart: bars, axis labels and grid lines.
type chart struct {
	W, H   int
	Bars   []rect
	Labels []label
	Grid   []rect // horizontal lines, as 1-unit-high rects
}

type page struct {
	Run      *client.EvalRun
	Title    string
	Subtitle string
	PassAtK  []kv
	Meta     []kv
	Counts   []countRow
	Total    int
	Status   chart // one stacked bar of the counts
	Kinds    []Kind
	Latency  chart
	Tasks    []taskRow
	TaskBars chart
}

func newPage(run *client.EvalRun, s *Stats) page {
	p := page{Run: run, Title: "eval run " + run.ID, Total: s.Len()}
	p.Subtitle = fmt.Sprintf("%s · %d tasks · %d samples · %d results", run.State, run.Tasks, run.Samples, s.Len())
	if sum := run.Summary; sum != nil {
		names := slices.SortedFunc(maps.Keys(sum.PassAtK), func(a, b string) int { return cmp.Compare(kOf(a), kOf(b)) })
		for _, name := range names {
			p.PassAtK = append(p.PassAtK, kv{name, strconv.FormatFloat(sum.PassAtK[name], 'f', 4, 64)})
		}
	}
	p.Meta = meta(run)
	counts := s.Counts()
	for _, st := range Statuses {
		p.Counts = append(p.Counts, countRow{Status: st, Count: counts[st], Share: percent(counts[st], s.Len())})
	}
	p.Status = statusBar(p.Counts, s.Len())
	p.Kinds = s.Kinds()
	p.Latency = latencyChart(s.Histogram(histogramMax))
	worst := s.WorstTasks(0)
	for _, t := range worst {
		p.Tasks = append(p.Tasks, taskRow{TaskStat: t, Rate: strconv.FormatFloat(t.PassRate(), 'f', 3, 64),
			BarW: num(100 * t.PassRate()), Class: rateClass(t)})
	}
	p.TaskBars = taskChart(worst)
	return p
}

// kOf is k of "pass@k" (0 when it is not a number).
func kOf(name string) int {
	k, _ := strconv.Atoi(strings.TrimPrefix(name, "pass@"))
	return k
}

func meta(run *client.EvalRun) []kv {
	m := []kv{
		{"state", run.State},
		{"created", timeText(run.CreatedAt)},
	}
	if run.FinishedAt != nil {
		m = append(m, kv{"finished", timeText(*run.FinishedAt)})
	}
	if run.Error != "" {
		m = append(m, kv{"error", run.Error})
	}
	ks := make([]string, len(run.K))
	for i, k := range run.K {
		ks[i] = strconv.Itoa(k)
	}
	m = append(m,
		kv{"tasks / samples", fmt.Sprintf("%d / %d", run.Tasks, run.Samples)},
		kv{"k", strings.Join(ks, ", ")},
		kv{"timeout", strconv.FormatFloat(run.Timeout, 'f', -1, 64) + " s per trial"},
		kv{"concurrency", strconv.Itoa(run.Concurrency)},
		kv{"seed", strconv.FormatInt(run.Seed, 10)},
		kv{"mode", runMode(run)},
		kv{"template", run.Template},
	)
	runtime := run.Runtime
	if sum := run.Summary; sum != nil {
		m = append(m, kv{"template digest", orDash(sum.TemplateDigest)})
		runtime = cmp.Or(sum.Runtime, runtime)
		m = append(m, kv{"runtime", orDash(runtime)}, kv{"runtime version", orDash(sum.RuntimeVersion)},
			kv{"duration", (time.Duration(sum.DurationMs) * time.Millisecond).String()},
			kv{"throughput", strconv.FormatFloat(sum.TrialsPerSecond, 'f', 1, 64) + " trials/s"},
			kv{"infra retries", strconv.Itoa(sum.Retries)})
		if sum.Cost != "" {
			m = append(m, kv{"tariff", orDash(sum.Tariff)},
				kv{"cost", sum.Cost + " (" + strconv.FormatFloat(sum.BilledSeconds, 'f', 0, 64) + " sandbox-seconds billed)"})
		}
		for _, name := range slices.Sorted(maps.Keys(sum.Phases)) {
			ph := sum.Phases[name]
			m = append(m, kv{"phase " + name, fmt.Sprintf("p50 %.1f ms, p99 %.1f ms, mean %.1f ms", ph.P50Ms, ph.P99Ms, ph.MeanMs)})
		}
	} else {
		m = append(m, kv{"runtime", cmp.Or(runtime, "server default")})
	}
	return m
}

// runMode says how the run's trials were run.
func runMode(run *client.EvalRun) string {
	switch run.Mode {
	case "", client.EvalModeTrial:
		return "trial: one fresh sandbox per sample"
	case client.EvalModeBatch:
		return fmt.Sprintf("batch: one fresh sandbox per slice of %d samples", run.Slice)
	}
	return run.Mode
}

func timeText(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05 UTC")
}

func orDash(s string) string { return cmp.Or(s, "-") }

func percent(n, total int) string {
	if total == 0 {
		return "0.0%"
	}
	return strconv.FormatFloat(100*float64(n)/float64(total), 'f', 1, 64) + "%"
}

// num formats an SVG coordinate.
func num(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) }

func rateClass(t TaskStat) string {
	switch {
	case t.Scored() == 0:
		return "infra_error"
	case t.Passed == t.Scored():
		return "passed"
	case t.Passed == 0:
		return "failed"
	}
	return "partial"
}

// statusBar is one horizontal bar split by status.
func statusBar(rows []countRow, total int) chart {
	c := chart{W: chartWidth, H: 28}
	if total == 0 {
		return c
	}
	x := 0.0
	for _, r := range rows {
		if r.Count == 0 {
			continue
		}
		w := float64(chartWidth) * float64(r.Count) / float64(total)
		c.Bars = append(c.Bars, rect{X: num(x), Y: "0", W: num(w), H: "28", Class: r.Status,
			Title: fmt.Sprintf("%s: %d (%s)", r.Status, r.Count, r.Share)})
		x += w
	}
	return c
}

// latencyChart draws a histogram of durations, stacked by status.
func latencyChart(h Histogram) chart {
	c := chart{W: chartWidth, H: chartHeight}
	if len(h.Bins) == 0 {
		return c
	}
	plotW := float64(chartWidth - chartLeft)
	plotH := float64(chartHeight - chartBottom - 8)
	bw := plotW / float64(len(h.Bins))
	scale := plotH / float64(h.Max)
	for i, b := range h.Bins {
		y := plotH + 8
		for si, n := range b.Counts {
			if n == 0 {
				continue
			}
			hgt := float64(n) * scale
			y -= hgt
			c.Bars = append(c.Bars, rect{X: num(chartLeft + float64(i)*bw + 0.5), Y: num(y), W: num(max(bw-1, 0.5)), H: num(hgt),
				Class: Statuses[si], Title: fmt.Sprintf("%d–%d ms: %d %s", b.FromMs, b.FromMs+h.BinMs, n, Statuses[si])})
		}
	}
	base := strconv.Itoa(chartHeight - 6)
	for _, t := range []struct {
		bin    int
		anchor string
	}{{0, "start"}, {len(h.Bins) / 2, "middle"}, {len(h.Bins), "end"}} {
		if t.bin == 0 && t.anchor != "start" {
			continue
		}
		c.Labels = append(c.Labels, label{X: num(chartLeft + float64(t.bin)*bw), Y: base, Anchor: t.anchor,
			Text: durationText(int64(t.bin) * h.BinMs)})
	}
	c.Labels = append(c.Labels,
		label{X: num(chartLeft - 6), Y: "16", Anchor: "end", Text: strconv.Itoa(h.Max)},
		label{X: num(chartLeft - 6), Y: num(plotH + 8), Anchor: "end", Text: "0"})
	c.Grid = append(c.Grid, rect{X: strconv.Itoa(chartLeft), Y: num(plotH + 8), W: num(plotW), H: "1"})
	return c
}

func durationText(ms int64) string {
	if ms >= 1000 {
		return strconv.FormatFloat(float64(ms)/1000, 'f', -1, 64) + " s"
	}
	return strconv.FormatInt(ms, 10) + " ms"
}

// taskChart draws one bar per task, its pass rate, tasks in the order given.
func taskChart(ts []TaskStat) chart {
	c := chart{W: chartWidth, H: chartHeight}
	if len(ts) == 0 {
		return c
	}
	plotW := float64(chartWidth - chartLeft)
	plotH := float64(chartHeight - chartBottom - 8)
	bw := min(plotW/float64(len(ts)), 24)
	for i, t := range ts {
		hgt := max(plotH*t.PassRate(), 1)
		c.Bars = append(c.Bars, rect{X: num(chartLeft + float64(i)*bw), Y: num(plotH + 8 - hgt), W: num(max(bw-1, 0.5)), H: num(hgt),
			Class: rateClass(t), Title: fmt.Sprintf("%s: %d/%d passed (%.3f)", t.TaskID, t.Passed, t.Scored(), t.PassRate())})
	}
	for _, g := range []struct {
		f    float64
		text string
	}{{0, "0"}, {0.5, "0.5"}, {1, "1"}} {
		y := plotH + 8 - plotH*g.f
		c.Grid = append(c.Grid, rect{X: strconv.Itoa(chartLeft), Y: num(y), W: num(plotW), H: "1"})
		c.Labels = append(c.Labels, label{X: num(chartLeft - 6), Y: num(y + 4), Anchor: "end", Text: g.text})
	}
	c.Labels = append(c.Labels, label{X: strconv.Itoa(chartLeft), Y: strconv.Itoa(chartHeight - 6), Anchor: "start",
		Text: fmt.Sprintf("%d tasks, lowest pass rate first", len(ts))})
	return c
}
