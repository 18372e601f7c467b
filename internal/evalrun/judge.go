package evalrun

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/evalbox/evalbox/internal/eval"
	"github.com/evalbox/evalbox/internal/judge"
	"github.com/evalbox/evalbox/internal/lang"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/pkg/client"
)

// options are a run's judging settings, kept in its stored input: the
// limits of whole programs (stdin/stdout tests, and programs in another
// language than Python), the run's default language, and whether its
// template was asked for (else each sample runs in its language's).
type options struct {
	Language           string       `json:"language,omitempty"`
	TemplateSet        bool         `json:"template_set,omitempty"`
	Limits             judge.Limits `json:"limits"`
	StopOnFirstFailure bool         `json:"stop_on_first_failure,omitempty"`
}

// validateJudging checks a request's languages and judging limits, with
// its problems' modes already checked, fills in the run's language and
// template, and returns the options to store.
func validateJudging(req *client.CreateEvalRequest) (options, error) {
	o := options{StopOnFirstFailure: req.StopOnFirstFailure, TemplateSet: req.Template != "", Limits: judge.Limits{
		Timeout: req.Timeout, MemoryMB: req.MemoryMB, OutputBytes: req.OutputLimitBytes,
		CompileTimeout: req.CompileTimeout, CompileMemoryMB: req.CompileMemoryMB, CompileFlags: req.CompileFlags,
	}}
	if err := o.Limits.Validate(); err != nil {
		return o, badRequest("%v", err)
	}
	runLang := lang.Python
	if req.Language != "" {
		l, err := lang.Resolve(req.Language)
		if err != nil {
			return o, badRequest("language: %v", err)
		}
		runLang, req.Language = l, l.Name
	}
	o.Language = req.Language
	if req.Template == "" {
		req.Template = runLang.Template
	}
	problems := make(map[string]client.EvalProblem, len(req.Problems))
	for i, p := range req.Problems {
		if p.Language != "" {
			l, err := lang.Resolve(p.Language)
			if err != nil {
				return o, badRequest("problems[%d] (%s): %v", i, p.TaskID, err)
			}
			req.Problems[i].Language = l.Name
		}
		problems[p.TaskID] = req.Problems[i]
	}
	compiled := map[string]bool{}
	for i, smp := range req.Samples {
		p := problems[smp.TaskID]
		if smp.Language != "" {
			l, err := lang.Resolve(smp.Language)
			if err != nil {
				return o, badRequest("samples[%d]: %v", i, err)
			}
			req.Samples[i].Language = l.Name
		}
		l := sampleLang(o, evalProblem(p), req.Samples[i])
		if l.Compiled() {
			compiled[l.Name] = true
		}
		switch {
		case p.Tests == nil && req.Samples[i].Language != "" && p.Language != "" && req.Samples[i].Language != p.Language:
			return o, badRequest("samples[%d]: language %s, but problem %s is checked by its test in %s", i, req.Samples[i].Language, p.TaskID, p.Language)
		case p.IO != nil && l.Name != lang.Python.Name:
			return o, badRequest("samples[%d]: problem %s is in I/O mode, which runs Python only (its language is %s)", i, p.TaskID, l.Name)
		case req.Mode == client.EvalModeBatch && (p.Tests != nil || l.Name != lang.Python.Name):
			return o, badRequest("samples[%d]: batch mode runs Python assert and I/O problems only; problem %s is %s", i, p.TaskID, describe(p, l))
		}
	}
	if req.CompileFlags != nil && len(compiled) > 1 {
		return o, badRequest("compile_flags replace one compiler's flags, but the run compiles %s: give them in a run of one compiled language", strings.Join(slices.Sorted(maps.Keys(compiled)), ", "))
	}
	return o, nil
}

// ServiceLimits are the sandbox service's bounds a run's judging limits
// must fit in (optional: a Sandboxes without them is not checked).
type ServiceLimits interface {
	MaxMemoryMB() int
	MaxOutputLimit() int64
}

// checkServiceLimits refuses limits whose sandboxes or execs the service
// would refuse, before the run is stored: the largest sandbox a whole
// program of req needs, and a test's output limit.
func checkServiceLimits(req client.CreateEvalRequest, o options, sl ServiceLimits) error {
	problems := make(map[string]client.EvalProblem, len(req.Problems))
	for _, p := range req.Problems {
		problems[p.TaskID] = p
	}
	lim := o.Limits.WithDefaults()
	seen := map[string]bool{}
	for _, smp := range req.Samples {
		p := evalProblem(problems[smp.TaskID])
		l := sampleLang(o, p, smp)
		if seen[l.Name] || (p.Tests == nil && l.Name == lang.Python.Name) {
			continue
		}
		seen[l.Name] = true
		if need, most := judge.SandboxMemoryMB(l, lim), sl.MaxMemoryMB(); need > most {
			return badRequest("a %s sample's sandbox needs %d MiB (memory_mb %d, compile_memory_mb %d, and room for the toolchain), past this server's %d MiB: lower them",
				l.Name, need, lim.MemoryMB, lim.CompileMemoryMB, most)
		}
	}
	if len(seen) > 0 && lim.OutputBytes > sl.MaxOutputLimit() {
		return badRequest("output_limit_bytes %d is past this server's %d", lim.OutputBytes, sl.MaxOutputLimit())
	}
	return nil
}

// pythonTemplate is the template of the run's Python trial programs: the
// run's when it was asked for, else Python's (the run's own default may
// be another language's).
func (w *work) pythonTemplate() string {
	if w.opts.TemplateSet {
		return w.run.Template
	}
	return lang.Python.Template
}

// sandboxesPerTrial is how many sandboxes one trial of problems holds at
// once: 2 when a problem has a checker program (the sample's and the
// checker's), else 1.
func sandboxesPerTrial(problems []client.EvalProblem) int {
	for _, p := range problems {
		if p.Checker != nil && p.Checker.Type == client.CheckerProgram {
			return 2
		}
	}
	return 1
}

// describe names a problem's mode and language for an error.
func describe(p client.EvalProblem, l lang.Language) string {
	if p.Tests != nil {
		return "stdin/stdout in " + l.Name
	}
	return "assert mode in " + l.Name
}

// sampleLang is the language a sample runs in: its own, else its
// problem's, else the run's, else Python.
func sampleLang(o options, p eval.Problem, smp client.EvalSample) lang.Language {
	for _, name := range []string{smp.Language, p.Language, o.Language} {
		if name != "" {
			if l, ok := lang.Lookup(name); ok {
				return l
			}
		}
	}
	return lang.Python
}

// wholeProgram reports whether sample i is judged as a whole program by
// internal/judge (stdin/stdout tests, or assert mode in another language
// than Python) rather than by the Python trial program, and its language.
func (w *work) wholeProgram(i int) (lang.Language, bool) {
	smp := w.samples[i]
	p := w.problems[smp.TaskID]
	l := sampleLang(w.opts, p, smp)
	return l, p.Tests != nil || l.Name != lang.Python.Name
}

// judgeOne judges sample i as a whole program in its own fresh sandbox and
// records the verdict. It returns the attempts after the first (retries).
func (s *Service) judgeOne(ctx context.Context, w *work, i int, l lang.Language) (retries int, err error) {
	run := w.run
	smp := w.samples[i]
	p := w.problems[smp.TaskID]
	source := p.Prompt
	if smp.Solution != nil {
		source = *smp.Solution
	} else if smp.Completion != nil {
		source += *smp.Completion
	}
	if p.Tests == nil {
		// MultiPL-E: the prompt and completion, then the tests, one
		// program that passes when it exits 0.
		source += "\n" + p.Test + "\n"
	}
	lim := w.opts.Limits.WithDefaults()
	stdout := int64(0)
	if p.Tests != nil {
		stdout = lim.OutputBytes
	}
	// What a test's output costs: the head buffer (up to twice it while
	// it grows) and its copy for the checker.
	lease, err := s.output.Lease(ctx, 3*stdout+trialOutputMemory(0))
	if err != nil {
		return 0, err
	}
	defer lease.Close()
	spec := judge.Spec{Runtime: run.Runtime, Lang: l, Source: source, Tests: p.Tests, Limits: lim,
		StopOnFirstFailure: w.opts.StopOnFirstFailure,
		Metadata:           map[string]string{runMeta: run.ID, "eval_sample": strconv.Itoa(i)}}
	if w.opts.TemplateSet {
		spec.Template = run.Template
	}
	if p.Checker != nil {
		spec.Checker = *p.Checker
	}
	out, err := s.judges.Run(ctx, run.TeamID, spec)
	if err != nil {
		return 0, err
	}
	res := client.EvalResult{TaskID: p.TaskID, CompletionID: i, Status: out.Status, Detail: out.Detail,
		DurationMs: out.RunMs, Passed: out.Status == client.TestPassed, Compile: out.Compile,
		Tests: out.Tests, TestsPassed: out.TestsPassed, TestsTotal: len(p.Tests)}
	if l.Name != lang.Python.Name {
		res.Language = l.Name
	}
	switch out.Status {
	case client.TestPassed:
		res.Result = "passed"
	case string(eval.TimedOut):
		res.Result = "timed out"
	case client.TestInfraError:
	default:
		res.Result = "failed: " + strings.TrimSpace(out.Detail)
	}
	env := store.TrialEnv{SandboxID: out.Sandbox.ID, TemplateDigest: out.Sandbox.TemplateDigest,
		Runtime: out.Sandbox.Runtime, RuntimeVersion: out.Sandbox.RuntimeVersion, Times: store.TrialTimes{
			Create: out.Phases.Create, Write: out.Phases.Write, Run: out.Phases.Run, Delete: out.Phases.Delete,
			Trial: out.Duration, Attempts: out.Attempts}}
	if ok, err := s.record(ctx, w, res, env); err != nil {
		return 0, fmt.Errorf("record trial %d: %w", i, err)
	} else if ok {
		w.live.publish(res)
	}
	return out.Attempts - 1, nil
}
