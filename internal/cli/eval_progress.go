package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/evalbox/evalbox/pkg/client"
	"golang.org/x/sys/unix"
)

// evalLineInterval is how often a plain (non-terminal) progress line is
// printed at most when no 10 % step was crossed.
const evalLineInterval = 5 * time.Second

// terminalWidth returns the column count of w when it is a terminal.
func terminalWidth(w io.Writer) (int, bool) {
	f, ok := w.(*os.File)
	if !ok {
		return 0, false
	}
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return 0, false
	}
	return int(ws.Col), true
}

// progress prints an eval run's progress: on a terminal one line rewritten
// in place (a bar, done/total, passed, trials/s, ETA, infra errors), else a
// plain line at every 10 % step or every evalLineInterval, whichever comes
// first.
type progress struct {
	w     io.Writer
	tty   bool
	start time.Time // when progress began to be watched
	done0 int       // trials done then

	onScreen bool // tty: a progress line is shown
	lastLine time.Time
	lastStep int // plain: the last 10 % step printed
	lastDone int
}

func newProgress(w io.Writer, run *client.EvalRun, now time.Time) *progress {
	_, tty := terminalWidth(w)
	return &progress{w: w, tty: tty, start: now, done0: run.Done, lastLine: now, lastStep: tenth(run), lastDone: run.Done}
}

// tenth is the run's progress in 10 % steps (0–10).
func tenth(run *client.EvalRun) int {
	if run.Samples <= 0 {
		return 0
	}
	return run.Done * 10 / run.Samples
}

// update shows run's progress as of now.
func (p *progress) update(run *client.EvalRun, now time.Time) {
	if p.tty {
		cols, _ := terminalWidth(p.w)
		fmt.Fprintf(p.w, "\r\033[K%s", fitWidth(barLine(run, p.rate(run, now)), cols))
		p.onScreen = true
		return
	}
	step := tenth(run)
	ended := run.State != client.EvalStateRunning
	if ended && run.Done == p.lastDone && !p.lastLine.Equal(p.start) {
		return // the last line already says it
	}
	if !ended && step <= p.lastStep && now.Sub(p.lastLine) < evalLineInterval {
		return
	}
	fmt.Fprintln(p.w, plainLine(run, p.rate(run, now)))
	p.lastLine, p.lastStep, p.lastDone = now, step, run.Done
}

// end finishes the terminal line, if one is shown.
func (p *progress) end() {
	if p.onScreen {
		fmt.Fprintln(p.w)
		p.onScreen = false
	}
}

// rate is the trials per second since watching began; 0 while unknown.
func (p *progress) rate(run *client.EvalRun, now time.Time) float64 {
	el := now.Sub(p.start)
	if el < time.Second || run.Done <= p.done0 {
		return 0
	}
	return float64(run.Done-p.done0) / el.Seconds()
}

// rateETA formats the throughput and the time left ("12.3 trials/s  ETA
// 4m10s"); "" while the rate is unknown.
func rateETA(run *client.EvalRun, rate float64) string {
	if rate <= 0 {
		return ""
	}
	s := fmt.Sprintf("  %.1f trials/s", rate)
	if left := run.Samples - run.Done; left > 0 && run.State == client.EvalStateRunning {
		s += "  ETA " + (time.Duration(float64(left)/rate) * time.Second).Round(time.Second).String()
	}
	return s
}

func percentDone(run *client.EvalRun) int {
	if run.Samples <= 0 {
		return 0
	}
	return run.Done * 100 / run.Samples
}

// plainLine is "[ 42%] 1234/2920  passed 412  failed 800  timed_out 22
// infra_error 0  12.3 trials/s  ETA 2m17s".
func plainLine(run *client.EvalRun, rate float64) string {
	return fmt.Sprintf("[%3d%%] %d/%d  %s%s", percentDone(run), run.Done, run.Samples, countsLine(run.Counts), rateETA(run, rate))
}

// barLine is "[#######.............]  42%  1234/2920  passed 412  infra 0
// 12.3 trials/s  ETA 2m17s".
func barLine(run *client.EvalRun, rate float64) string {
	const width = 20
	filled := 0
	if run.Samples > 0 {
		filled = min(run.Done*width/run.Samples, width)
	}
	return fmt.Sprintf("[%s%s] %3d%%  %d/%d  passed %d  infra %d%s", strings.Repeat("#", filled), strings.Repeat(".", width-filled),
		percentDone(run), run.Done, run.Samples, run.Counts["passed"], run.Counts["infra_error"], rateETA(run, rate))
}

// fitWidth cuts s to fewer than cols runes, so that the line never wraps
// (a wrapped line cannot be rewritten with \r).
func fitWidth(s string, cols int) string {
	if cols <= 1 || utf8.RuneCountInString(s) < cols {
		return s
	}
	r := []rune(s)
	return string(r[:cols-1])
}

// countsLine is "passed N  failed N  timed_out N  infra_error N".
func countsLine(counts map[string]int) string {
	var b strings.Builder
	for i, st := range []string{"passed", "failed", "timed_out", "infra_error"} {
		if i > 0 {
			b.WriteString("  ")
		}
		fmt.Fprintf(&b, "%s %d", st, counts[st])
	}
	return b.String()
}

// follow follows a running run's event stream (progress only) until the
// run ends, showing its progress on w. It returns the last state seen;
// when ctx ends first, with ctx's error (the run goes on on the server).
func follow(ctx context.Context, c *client.Client, run *client.EvalRun, w io.Writer) (*client.EvalRun, error) {
	if run.State != client.EvalStateRunning {
		return run, nil
	}
	p := newProgress(w, run, time.Now())
	defer p.end()
	err := c.EvalProgressEvents(ctx, run.ID, func(ev client.EvalEvent) error {
		if ev.Type == client.EvalEventResult {
			return nil
		}
		run = ev.Run
		p.update(run, time.Now())
		return nil
	})
	if err != nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	return run, err
}

// printFollowHint tells how to find an interrupted command's run again.
func printFollowHint(w io.Writer, id string) {
	fmt.Fprintf(w, "the run goes on on the server: 'evalbox eval watch %s' follows it, 'evalbox eval show %s' shows it, 'evalbox eval cancel %s' stops it\n", id, id, id)
}
