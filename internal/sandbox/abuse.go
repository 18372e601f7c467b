package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/limits"
	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/pkg/client"
)

// The CPU-abuse rule (docs/abuse.md): a sandbox held above a threshold of
// its CPU quota for longer than a window is stopped if it is ephemeral,
// with the end reason client.EndReasonCPUAbuse; a long-running one
// (CreateSandboxRequest.LongRunning) is throttled to half its quota
// instead, once, for the rest of its life. A warning comes at 80 % of the
// window: a WARN log line and the row's CPUAbuseWarnedAt.
//
// The measure is the node's (nodeapi.Node.Stats: the CPU time of the
// sandbox's host cgroup, where gVisor's Sentry runs too), sampled every
// Interval by this loop, which keeps each sandbox's window in memory: a
// restarted server (or a replica that adopts a sandbox) starts its windows
// afresh. Why it lives in the control plane and not in the node: the
// decision needs the row (long-running, the tariff that will set the
// thresholds) and ends the sandbox through the one end path (Service.end),
// which records the reason and frees the team's slot.

// CPUAbuseConfig configures the CPU-abuse rule.
type CPUAbuseConfig struct {
	// Threshold is the fraction of its CPU quota (0.9: 90 %) that a
	// sandbox must use, sample after sample, to count as above it.
	Threshold float64
	// Window is how long a sandbox may stay above Threshold before it is
	// stopped (or throttled). 0 turns the server's rule off (Limits may
	// still give some sandboxes one of their own).
	Window time.Duration
	// Interval is how often every running sandbox is sampled (0:
	// limits.CPUAbuseInterval, 10 s). The defaults of Threshold and Window
	// are internal/limits' too (the serve flags'). A window shorter than a
	// few intervals is measured coarsely.
	Interval time.Duration
	// Limits, when set, gives a sandbox's own threshold and window (the
	// seam for per-tariff limits: it is called with the row, which names
	// the tariff) and ok=false for the server's. A zero window exempts
	// the sandbox.
	Limits func(row client.Sandbox) (threshold float64, window time.Duration, ok bool)
}

// cpuAbuseWarnShare is the share of the window after which the warning
// comes.
const cpuAbuseWarnShare = 0.8

// limitsOf returns the threshold and window that apply to a sandbox.
func (c *CPUAbuseConfig) limitsOf(row client.Sandbox) (float64, time.Duration) {
	if c.Limits != nil {
		if th, w, ok := c.Limits(row); ok {
			return th, w
		}
	}
	return c.Threshold, c.Window
}

// startCPUAbuse starts the rule's loop when it is on.
func (s *Service) startCPUAbuse() {
	if s.cfg.CPUAbuse.Window <= 0 && s.cfg.CPUAbuse.Limits == nil {
		return
	}
	if s.cfg.CPUAbuse.Interval <= 0 {
		s.cfg.CPUAbuse.Interval = limits.CPUAbuseInterval
	}
	s.wg.Add(1)
	go s.cpuAbuseLoop()
}

// cpuAbuseLoop samples the running sandboxes every interval until the
// service closes.
func (s *Service) cpuAbuseLoop() {
	defer s.wg.Done()
	windows := map[string]*cpuWindow{}
	t := time.NewTicker(s.cfg.CPUAbuse.Interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.sampleCPU(windows)
		}
	}
}

// sampleCPU samples every running sandbox once, a few at a time, and acts
// on what its window says. windows is the loop's own.
func (s *Service) sampleCPU(windows map[string]*cpuWindow) {
	type sandbox struct {
		e   *entry
		row client.Sandbox // copied under s.mu (a pause changes e.row)
	}
	s.mu.Lock()
	live := make([]sandbox, 0, len(s.live))
	for _, e := range s.live {
		live = append(live, sandbox{e, e.row})
	}
	s.mu.Unlock()
	seen := make(map[string]bool, len(live))
	// Each sample goroutine has a window of its own; the map is only
	// touched here.
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for _, sb := range live {
		seen[sb.row.ID] = true
		w := windows[sb.row.ID]
		if w == nil {
			w = &cpuWindow{}
			if sb.row.CPUThrottledAt != nil && sb.row.LongRunning {
				// Throttled before this process (a restart, another
				// replica): for the rest of its life, the node's quota is
				// set again if it reports more.
				w.throttled = sb.row.CPU / 2
			}
			windows[sb.row.ID] = w
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			s.sampleOne(sb.e, sb.row, w)
		}()
	}
	wg.Wait()
	for id := range windows {
		if !seen[id] {
			delete(windows, id) // ended
		}
	}
}

// sampleOne samples one sandbox and acts on its window.
func (s *Service) sampleOne(e *entry, row client.Sandbox, w *cpuWindow) {
	select {
	case <-e.ended:
		return
	default:
	}
	ctx, cancel := context.WithTimeout(e.life, s.cfg.CPUAbuse.Interval)
	defer cancel()
	st, err := s.node.Stats(ctx, row.ID)
	if err != nil {
		// A paused sandbox, one that just ended, a node that does not
		// answer: no sample, and the window goes on from the next one.
		if apierr.Code(err) != client.CodeSandboxNotRunning && !errors.Is(err, nodeapi.ErrSandboxNotFound) && ctx.Err() == nil {
			s.log.Debug("cpu abuse: no sample", "sandbox", row.ID, "err", err)
		}
		w.have = false
		return
	}
	threshold, window := s.cfg.CPUAbuse.limitsOf(row)
	if window <= 0 {
		return
	}
	act, f, above := w.observe(st, threshold, window, row.LongRunning)
	if act == cpuNone {
		return
	}
	s.cpuAct(ctx, e, row, w, act, f, above, threshold, window, st)
}

// cpuAct carries out what a sandbox's window decided.
func (s *Service) cpuAct(ctx context.Context, e *entry, row client.Sandbox, w *cpuWindow, act cpuAction, f float64, above time.Duration, threshold float64, window time.Duration, st nodeapi.SandboxStats) {
	log := s.log.With("sandbox", row.ID, "team", row.TeamID, "cpu_fraction", fmt.Sprintf("%.2f", f),
		"threshold", threshold, "above_for", above.Round(time.Second), "window", window, "long_running", row.LongRunning)
	now := time.Now().UTC()
	switch act {
	case cpuWarn:
		then := "stopped (cpu_abuse)"
		if row.LongRunning {
			then = "throttled to half its CPU"
		}
		log.Warn("cpu abuse warning: sandbox above its CPU threshold for 80% of the window; at the window's end it is " + then)
		if err := s.store.SetCPUAbuseWarned(context.WithoutCancel(ctx), row.ID, now); err != nil {
			log.Error("cpu abuse: recording the warning", "err", err)
		}
	case cpuStop:
		log.Warn("cpu abuse: sandbox stopped")
		// Not cut short by the sample's deadline.
		s.end(context.WithoutCancel(ctx), e, client.StateDeleted, client.EndReasonCPUAbuse)
	case cpuThrottle:
		cpu := row.CPU / 2
		if cpu <= 0 {
			cpu = st.CPU / 2
		}
		if cpu <= 0 {
			return // no quota to halve
		}
		first := w.throttled == 0
		if err := s.node.Throttle(ctx, row.ID, cpu); err != nil {
			log.Warn("cpu abuse: throttling the sandbox", "err", err)
			return
		}
		w.throttled = cpu
		if !first {
			log.Info("cpu abuse: throttle set again (the sandbox was resumed)", "cpu", cpu)
			return
		}
		log.Warn("cpu abuse: long-running sandbox throttled to half its CPU for the rest of its life", "cpu", cpu)
		if err := s.store.SetCPUThrottled(context.WithoutCancel(ctx), row.ID, now); err != nil {
			log.Error("cpu abuse: recording the throttle", "err", err)
		}
	}
}

// cpuAction is what a window decides after a sample.
type cpuAction int

const (
	cpuNone cpuAction = iota
	cpuWarn
	cpuStop
	cpuThrottle
)

// cpuWindow is one sandbox's window: its last sample and since when it has
// been above the threshold.
type cpuWindow struct {
	prev nodeapi.SandboxStats
	have bool // prev is a sample to measure the next one from
	// aboveSince is the start of the interval from which every sample was
	// above the threshold (zero: the last one was not).
	aboveSince time.Time
	warned     bool
	// throttled is the quota Throttle set (0: none): a throttled
	// sandbox is not judged again, but its quota is set again when the
	// node reports more (a resume restores the shape's).
	throttled float64
}

// observe takes a sample and says what to do: warn once the sandbox has
// been above threshold for 80 % of window, stop an ephemeral one (or
// throttle a long-running one) once it has been for window. It also
// returns the fraction of the quota used since the previous sample and
// how long the sandbox has been above. A sample that cannot be measured
// against the previous one (the first, or after a resume restarted the
// counter) starts the window again.
func (w *cpuWindow) observe(st nodeapi.SandboxStats, threshold float64, window time.Duration, longRunning bool) (cpuAction, float64, time.Duration) {
	prev, had := w.prev, w.have
	w.prev, w.have = st, true
	if w.throttled > 0 {
		if st.CPU > w.throttled*1.001 {
			return cpuThrottle, 0, 0
		}
		return cpuNone, 0, 0
	}
	var f float64
	ok := false
	if had {
		f, ok = st.Fraction(prev)
	}
	if !ok || f < threshold {
		w.aboveSince, w.warned = time.Time{}, false
		return cpuNone, f, 0
	}
	if w.aboveSince.IsZero() {
		w.aboveSince = prev.SampledAt // the interval just measured
	}
	above := st.SampledAt.Sub(w.aboveSince)
	switch {
	case above >= window && longRunning:
		return cpuThrottle, f, above
	case above >= window:
		return cpuStop, f, above
	case !w.warned && above >= time.Duration(cpuAbuseWarnShare*float64(window)):
		w.warned = true
		return cpuWarn, f, above
	}
	return cpuNone, f, above
}
