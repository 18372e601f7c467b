package bench

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// growth is the server's RSS or fd count, at warm-up and at the end.
type growth struct {
	Warm  float64 `json:"warm"`
	End   float64 `json:"end"`
	Delta float64 `json:"growth"`
	Bound float64 `json:"bound"`
}

type soakReport struct {
	Date         string    `json:"date"`
	Host         string    `json:"host"`
	Cores        int       `json:"cores"`
	N            int       `json:"n"`
	CheckEvery   int       `json:"check_every"`
	Concurrency  int       `json:"concurrency"`
	Runtimes     []soakRow `json:"runtimes"`
	Checks       int       `json:"checks"`
	CheckP50Ms   float64   `json:"check_p50_ms"`
	WallS        float64   `json:"wall_s"`
	GrowthFrom   int       `json:"growth_from_cycle"`
	RSSMiB       growth    `json:"server_rss_mib"`
	FDs          growth    `json:"server_fds"`
	Baseline     string    `json:"baseline"`
	Leaks        []string  `json:"leaks"`
	ServerErrors []string  `json:"server_log_errors"`
	// ChainRewrites counts the checks that found the evalbox chains'
	// rules rewritten by another process (see check).
	ChainRewrites int    `json:"chain_rewrites"`
	Error         string `json:"error,omitempty"`
}

// soakRow is one runtime's line of the report.
type soakRow struct {
	Runtime    string                `json:"runtime"`
	Cycles     int                   `json:"cycles"`
	Networks   map[string]int        `json:"networks"`
	CyclesPerS float64               `json:"cycles_per_s"`
	Phases     map[string]phaseStats `json:"phases"`
	// Leaks counts the leaks found by the id of one of its sandboxes.
	Leaks int `json:"leaks"`
	// CreateRetries lists the creates answered 503 unavailable and tried
	// again (the start failed; the checks then found whatever it left).
	CreateRetries []string `json:"create_retries"`
}

type phaseStats struct {
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
}

// fill completes the report from the runtimes' stats and the samples.
func (k *soaker) fill(rep *soakReport, samples []serverSample, checks sample, start time.Time) {
	rep.WallS = time.Since(start).Seconds()
	rep.ChainRewrites = k.rewrites
	rep.CheckP50Ms = float64(checks.pct(50)) / float64(time.Millisecond)
	rep.Runtimes = rep.Runtimes[:0]
	for _, rt := range k.o.runtimes {
		st := k.stats[rt]
		r := soakRow{Runtime: rt, Cycles: st.cycles, Networks: st.networks, Phases: map[string]phaseStats{}, Leaks: st.leaks,
			CreateRetries: append([]string{}, st.retries...)}
		if st.busy > 0 {
			r.CyclesPerS = float64(st.cycles) / st.busy.Seconds()
		}
		for _, ph := range soakPhases {
			s := st.phases[ph]
			r.Phases[ph] = phaseStats{P50Ms: float64(s.pct(50)) / float64(time.Millisecond), P99Ms: float64(s.pct(99)) / float64(time.Millisecond)}
		}
		rep.Runtimes = append(rep.Runtimes, r)
	}
	rep.RSSMiB, rep.FDs, rep.GrowthFrom = growthOf(samples, k.o.warmup)
	rep.RSSMiB.Bound, rep.FDs.Bound = k.o.rssSlackMB, float64(k.o.fdSlack)
}

// growthOf compares the server's RSS and fds over the first window of the
// samples taken after warmup cycles per runtime with the last window (a
// window is a fifth of them), each by its minimum: a Go process's RSS
// swings with its garbage collector, its floor does not. A run shorter than
// its warm-up is measured from its first sample (from is then 0).
func growthOf(samples []serverSample, warmup int) (rss, fds growth, from int) {
	var after []serverSample
	for _, sm := range samples {
		if sm.cycles > warmup {
			after = append(after, sm)
		}
	}
	from = warmup
	if len(after) == 0 {
		after, from = samples, 0
	}
	if len(after) == 0 {
		return rss, fds, from
	}
	w := max(1, len(after)/5)
	minOf := func(ss []serverSample, f func(serverSample) float64) float64 {
		m := f(ss[0])
		for _, s := range ss[1:] {
			m = min(m, f(s))
		}
		return m
	}
	rssOf := func(s serverSample) float64 { return s.rss }
	fdsOf := func(s serverSample) float64 { return s.fds }
	rss.Warm, rss.End = minOf(after[:w], rssOf), minOf(after[len(after)-w:], rssOf)
	fds.Warm, fds.End = minOf(after[:w], fdsOf), minOf(after[len(after)-w:], fdsOf)
	rss.Delta, fds.Delta = rss.End-rss.Warm, fds.End-fds.Warm
	return rss, fds, from
}

// serverLogErrors returns the server log's error lines (at most 20).
func serverLogErrors(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	out := []string{}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "level=ERROR") && len(out) < 20 {
			out = append(out, l)
		}
	}
	return out
}

func printSoak(w io.Writer, rep soakReport) {
	fmt.Fprintf(w, "evalbox bench soak — %s, %d cores, %s, n=%d per runtime, check every %d cycle(s), concurrency %d, %.0f s\n\n",
		rep.Host, rep.Cores, rep.Date, rep.N, rep.CheckEvery, rep.Concurrency, rep.WallS)
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprint(tw, "| runtime\t| cycles\t| none / outbound\t| cycles/s\t|")
	for _, ph := range soakPhases {
		fmt.Fprintf(tw, " %s p50 / p99 ms\t|", ph)
	}
	fmt.Fprintln(tw, " leaks by id\t|")
	fmt.Fprint(tw, "|---\t|---\t|---\t|---\t|")
	for range soakPhases {
		fmt.Fprint(tw, "---\t|")
	}
	fmt.Fprintln(tw, "---\t|")
	for _, r := range rep.Runtimes {
		fmt.Fprintf(tw, "| %s\t| %d\t| %d / %d\t| %.1f\t|", r.Runtime, r.Cycles, r.Networks[client.NetworkNone], r.Networks[client.NetworkOutbound], r.CyclesPerS)
		for _, ph := range soakPhases {
			fmt.Fprintf(tw, " %.1f / %.1f\t|", r.Phases[ph].P50Ms, r.Phases[ph].P99Ms)
		}
		fmt.Fprintf(tw, " %d\t|\n", r.Leaks)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\n| server (from cycle %d per runtime to the end) | after warm-up | end | growth | bound |\n|---|---|---|---|---|\n", rep.GrowthFrom)
	fmt.Fprintf(w, "| RSS, MiB (min of window) | %.1f | %.1f | %+.1f | %.0f |\n", rep.RSSMiB.Warm, rep.RSSMiB.End, rep.RSSMiB.Delta, rep.RSSMiB.Bound)
	fmt.Fprintf(w, "| open fds (min of window) | %.0f | %.0f | %+.0f | %.0f |\n", rep.FDs.Warm, rep.FDs.End, rep.FDs.Delta, rep.FDs.Bound)
	fmt.Fprintf(w, "\n%d host checks (p50 %.1f ms). Baseline: %s.\n", rep.Checks, rep.CheckP50Ms, rep.Baseline)
	for _, r := range rep.Runtimes {
		if len(r.CreateRetries) > 0 {
			fmt.Fprintf(w, "%s: %d create(s) answered 503 unavailable and were tried again; the first: %s\n", r.Runtime, len(r.CreateRetries), r.CreateRetries[0])
		}
	}
	if rep.ChainRewrites > 0 {
		fmt.Fprintf(w, "The evalbox chains' rules were rewritten by another process %d time(s) (not a leak of this server; the new rules became the baseline).\n", rep.ChainRewrites)
	}
	if len(rep.ServerErrors) > 0 {
		fmt.Fprintf(w, "Server log errors (%d):\n", len(rep.ServerErrors))
		for _, l := range rep.ServerErrors {
			fmt.Fprintln(w, "  "+l)
		}
	}
	if rep.Error != "" {
		fmt.Fprintln(w, "Error:", rep.Error)
	}
	if len(rep.Leaks) > 0 {
		fmt.Fprintf(w, "Leaks (%d):\n", len(rep.Leaks))
		for _, l := range rep.Leaks {
			fmt.Fprintln(w, "  "+l)
		}
	} else {
		fmt.Fprintln(w, "Leaks: none.")
	}
}
