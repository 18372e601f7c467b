package evalrun

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strconv"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/eval"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/internal/trial"
	"github.com/evalbox/evalbox/pkg/client"
)

// Batch mode limits. A slice's exec may take slice × (timeout +
// sampleSlack) + sliceSlack seconds, at most MaxSliceSeconds; its sandbox
// lives a minute longer.
const (
	DefaultSlice    = 100
	MaxSlice        = 1000
	MaxSliceSeconds = 3600.0
	sampleSlack     = 1.0
	sliceSlack      = 30.0
	// batchAttempts bounds how often a slice's unfinished samples run as a
	// batch; after that each runs alone, in trial mode.
	batchAttempts = 2
	// batchOutput caps the harness's output (the exec's max_output_bytes).
	batchOutput = 128 << 20
)

// sampleUID is sampleUser as the harness takes it.
const sampleUID = 65534

// sliceSeconds is the time a slice of n samples may take.
func sliceSeconds(n int, timeout float64) float64 {
	return float64(n)*(timeout+sampleSlack) + sliceSlack
}

// validateMode checks a request's mode and slice, with its timeout and
// samples already checked, and fills in their defaults.
func validateMode(req *client.CreateEvalRequest) error {
	switch req.Mode {
	case "", client.EvalModeTrial:
		req.Mode = client.EvalModeTrial
		if req.Slice != 0 {
			return badRequest("slice is only for mode %q (mode is %q)", client.EvalModeBatch, client.EvalModeTrial)
		}
	case client.EvalModeBatch:
		if req.Slice == 0 {
			req.Slice = DefaultSlice
		}
		if req.Slice < 1 || req.Slice > MaxSlice {
			return badRequest("slice must be in [1, %d] (0: %d), got %d", MaxSlice, DefaultSlice, req.Slice)
		}
		n := min(req.Slice, len(req.Samples))
		if sec := sliceSeconds(n, req.Timeout); sec > MaxSliceSeconds {
			return badRequest("a batch slice may take at most %g s, but a slice of %d samples × (timeout %g s + %g s) + %g s is %g s: lower slice or timeout",
				MaxSliceSeconds, n, req.Timeout, sampleSlack, sliceSlack, sec)
		}
	default:
		return badRequest("mode must be %q or %q, got %q", client.EvalModeTrial, client.EvalModeBatch, req.Mode)
	}
	return nil
}

// checkProblem checks that a problem has exactly one of test and io, and
// well-formed io cases.
func checkProblem(i int, p client.EvalProblem) error {
	if err := evalProblem(p).CheckMode(); err != nil {
		return badRequest("problems[%d] (%s): %v", i, p.TaskID, err)
	}
	return nil
}

// evalProblem is a wire problem as internal/eval takes it.
func evalProblem(p client.EvalProblem) eval.Problem {
	ep := eval.Problem{TaskID: p.TaskID, Prompt: p.Prompt, EntryPoint: p.EntryPoint, Test: p.Test, Language: p.Language}
	if p.Tests != nil {
		ep.Tests = make([]eval.Test, len(p.Tests))
		for i, t := range p.Tests {
			ep.Tests[i] = eval.Test(t)
		}
	}
	if c := p.Checker; c != nil {
		ep.Checker = &eval.Checker{Kind: c.Type, AbsTol: c.AbsTol, RelTol: c.RelTol, Language: c.Language, Source: c.Source}
	}
	if p.IO != nil {
		ep.IO = make([]eval.IOCase, len(p.IO))
		for i, c := range p.IO {
			ep.IO[i] = eval.IOCase(c)
		}
	}
	return ep
}

// work is what a run's workers share: its samples and problems, and its
// live state, which gets every recorded verdict and retry.
type work struct {
	run      client.EvalRun
	samples  []client.EvalSample
	problems map[string]eval.Problem
	live     *liveRun
	opts     options
}

// program returns sample i's problem and trial program, which ends by
// exiting with passCode (see eval.Program).
func (w *work) program(i, passCode int) (eval.Problem, string) {
	smp := w.samples[i]
	p := w.problems[smp.TaskID]
	return p, eval.Program(p, eval.Sample{TaskID: smp.TaskID, Completion: smp.Completion, Solution: smp.Solution}, passCode)
}

// trialOne judges sample i in its own fresh sandbox (trial mode) and
// records the verdict. It returns the attempts after the first (retries).
func (s *Service) trialOne(ctx context.Context, w *work, i int) (retries int, err error) {
	if l, whole := w.wholeProgram(i); whole {
		return s.judgeOne(ctx, w, i, l)
	}
	run := w.run
	code := eval.NewPassCode()
	p, prog := w.program(i, code)
	// Only what the verdict reads is kept, as in a batch: the head of
	// stdout (I/O mode) and the tail of stderr (the traceback), leased
	// from the output budget before the trial starts.
	stdoutCap := 0
	if p.IO != nil {
		stdoutCap = eval.HarnessStdoutCap
	}
	lease, err := s.output.Lease(ctx, trialOutputMemory(stdoutCap))
	if err != nil {
		return 0, err
	}
	defer lease.Close()
	var stdout *head
	var stderr *tail
	out, err := s.trials.Run(ctx, run.TeamID, trial.Spec{
		Template: w.pythonTemplate(), Runtime: run.Runtime, Timeout: run.Timeout,
		Script: prog, Path: programPath, Argv: []string{"python3", programPath},
		User: sampleUser, Metadata: map[string]string{runMeta: run.ID, "eval_sample": strconv.Itoa(i)},
		Output: func() (io.Writer, io.Writer) {
			stdout, stderr = &head{n: stdoutCap}, &tail{keep: trialStderrTail}
			return stdout, stderr
		},
	})
	if err != nil {
		return 0, err
	}
	r := out.Result
	run1 := eval.Run{Status: r.Status, ExitCode: r.ExitCode, Signal: r.Signal, PassCode: code, Error: r.Error}
	if stdout != nil {
		run1.Stdout, run1.Stderr = string(stdout.buf), string(stderr.bytes())
	}
	v := p.Judge(run1)
	res := eval.NewResult(p.TaskID, i, v, r.DurationMs)
	env := store.TrialEnv{SandboxID: out.Sandbox.ID, TemplateDigest: out.Sandbox.TemplateDigest,
		Runtime: out.Sandbox.Runtime, RuntimeVersion: out.Sandbox.RuntimeVersion, Times: trialTimes(out)}
	wr := wire(res)
	if ok, err := s.record(ctx, w, wr, env); err != nil {
		return 0, fmt.Errorf("record trial %d: %w", i, err)
	} else if ok {
		w.live.publish(wr)
	}
	return out.Attempts - 1, nil
}

// judgeBatch runs the samples todo (in the run's seeded order) in slices,
// each slice in one fresh sandbox through the batch harness, up to the
// run's concurrency slices at a time. Slices are cut no larger than needed
// to give every worker one.
func (s *Service) judgeBatch(ctx context.Context, w *work, todo []int) (ran, retries int, err error) {
	if len(todo) == 0 {
		return 0, 0, nil
	}
	workers := max(1, w.run.Concurrency)
	slices := cut(todo, w.run.Slice, workers)
	return fanOut(ctx, workers, slices, func(ctx context.Context, ids []int) (int, int, error) {
		n, r, err := s.runSlice(ctx, w, ids)
		w.live.addRetries(r)
		return n, r, err
	})
}

// cut aims to give each worker slicesPerWorker slices, so that slices of
// uneven cost (slow or timed-out samples) even out across the workers
// instead of one worker finishing last, but cuts no slice below minSlice
// samples (unless the run's slice is smaller).
const (
	slicesPerWorker = 4
	minSlice        = 10
)

// cut cuts todo, in order, into slices of at most size samples: smaller
// when that gives every worker slicesPerWorker slices, never below
// minSlice for that.
func cut(todo []int, size, workers int) [][]int {
	parts := max(1, workers) * slicesPerWorker
	size = max(1, min(size, max(minSlice, (len(todo)+parts-1)/parts)))
	var out [][]int
	for len(todo) > 0 {
		n := min(size, len(todo))
		out = append(out, todo[:n:n])
		todo = todo[n:]
	}
	return out
}

// runSlice judges a slice's samples: as a batch in a fresh sandbox; when
// the batch ends with samples unjudged (sandbox died, agent lost, harness
// killed), the sample that was running then is judged alone in trial mode
// (it may be the cause), and the rest run again as a batch, at most
// batchAttempts times, then each alone in trial mode, whose own retries
// end in infra_error. So a hostile sample costs only itself a sandbox of
// its own, and never turns another sample's verdict into anything but the
// one it would get alone.
func (s *Service) runSlice(ctx context.Context, w *work, ids []int) (ran, retries int, err error) {
	log := s.log.With("run", w.run.ID, "team", w.run.TeamID)
	pending := ids
	for attempt := 1; len(pending) > 0; attempt++ {
		if attempt > 1 {
			retries += len(pending)
		}
		if attempt > batchAttempts {
			for _, i := range pending {
				r, err := s.trialOne(ctx, w, i)
				if err != nil {
					return ran, retries, err
				}
				ran, retries = ran+1, retries+r
			}
			return ran, retries, nil
		}
		out, err := s.sliceOnce(ctx, w, pending)
		ran += len(out.done)
		switch {
		case ctx.Err() != nil:
			return ran, retries, ctx.Err()
		case out.fatal != nil:
			return ran, retries, out.fatal
		case err != nil && !trial.Retriable(err):
			return ran, retries, err
		case err == nil:
			return ran, retries, nil
		}
		log.Warn("eval batch slice infra failure", "attempt", attempt, "samples", len(pending), "judged", len(out.done), "err", err)
		rest := pending[:0:0]
		for _, i := range pending {
			if !out.done[i] && i != out.running {
				rest = append(rest, i)
			}
		}
		if out.running >= 0 && !out.done[out.running] {
			r, err := s.trialOne(ctx, w, out.running)
			if err != nil {
				return ran, retries, err
			}
			ran, retries = ran+1, retries+r+1
		}
		pending = rest
	}
	return ran, retries, nil
}

// sliceResult is what one batch attempt judged: the samples recorded, the
// one that was running when the harness stopped (-1: none), and a failure
// to record that ends the run.
type sliceResult struct {
	done    map[int]bool
	running int
	fatal   error
}

// sliceOnce runs samples ids as one batch in a fresh sandbox, recording
// each verdict as its line comes. It returns an error when the batch did
// not judge every sample.
func (s *Service) sliceOnce(ctx context.Context, w *work, ids []int) (sliceResult, error) {
	run := w.run
	out := sliceResult{done: make(map[int]bool, len(ids)), running: -1}
	sec := sliceSeconds(len(ids), run.Timeout)
	// The harness's lines are read as they come; what a slice holds of
	// them is bounded (eval.HarnessReaderMemory) and leased from the
	// output budget before the slice starts.
	lease, err := s.output.Lease(ctx, eval.HarnessReaderMemory)
	if err != nil {
		return out, err
	}
	defer lease.Close()
	sb, err := s.sb.Create(ctx, run.TeamID, client.CreateSandboxRequest{
		Template: w.pythonTemplate(), Runtime: run.Runtime, Timeout: s.trials.SandboxTTL(sec),
		Metadata:    map[string]string{runMeta: run.ID, "eval_mode": client.EvalModeBatch},
		WaitSeconds: int(s.trials.CreateWait / time.Second),
	})
	if err != nil {
		return out, fmt.Errorf("create: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := s.sb.Delete(dctx, run.TeamID, sb.ID); err != nil && !isNotFound(err) {
			s.log.Warn("eval batch: delete sandbox", "sandbox", sb.ID, "err", err)
		}
	}()
	in := eval.HarnessInput{Nonce: rand.Text(), Timeout: run.Timeout, Dir: path.Dir(programPath), File: path.Base(programPath), User: sampleUID,
		StderrCap: eval.HarnessStderrCap, Sandboxed: true}
	// scanned records this slice's scan of its template (nil: not the
	// scanner).
	var scanned func(*eval.HarnessScan)
	switch {
	case s.hostHarness:
		in.Sandboxed, in.Dir = false, "/tmp/.evalbox"
	case sb.TemplateDigest != "":
		scan, done, err := s.scans.get(ctx, scanKey{team: run.TeamID, digest: sb.TemplateDigest, runtime: sb.Runtime}, scanWait)
		if err != nil {
			return out, err
		}
		if scan != nil {
			in.Writable = scan
			break
		}
		in.Scan, scanned = true, done
		defer done(nil) // no scan came: another slice makes it
	default:
		in.Scan = true
	}
	want := make(map[int]bool, len(ids))
	codes := make(map[int]int, len(ids))
	for _, i := range ids {
		codes[i] = eval.NewPassCode()
		p, prog := w.program(i, codes[i])
		if p.IO != nil {
			in.StdoutCap = min(eval.HarnessStdoutCap, batchOutput/2/len(ids))
		}
		in.Programs = append(in.Programs, eval.HarnessProgram{ID: i, Source: prog})
		want[i] = true
	}
	payload, err := json.Marshal(in)
	if err != nil {
		return out, err
	}
	stdin := string(payload)
	started := false
	env := store.TrialEnv{SandboxID: sb.ID, TemplateDigest: sb.TemplateDigest, Runtime: sb.Runtime, RuntimeVersion: sb.RuntimeVersion}
	lines := &eval.HarnessReader{Nonce: in.Nonce, Line: func(l eval.HarnessLine) {
		if l.Scan != nil {
			// Only the harness's own scan, before any sample ran, is
			// what the template offers.
			if scanned != nil && !started {
				scanned(l.Scan)
			}
			return
		}
		started = true
		if !want[l.ID] || out.done[l.ID] || out.fatal != nil {
			return
		}
		if l.Start {
			out.running = l.ID
			return
		}
		out.running = -1
		p := w.problems[w.samples[l.ID].TaskID]
		r := l.Run()
		r.PassCode = codes[l.ID]
		v := p.Judge(r)
		if v.Status == eval.InfraError {
			return // the harness could not run it: it stays unjudged and is retried
		}
		res := eval.NewResult(p.TaskID, l.ID, v, l.DurationMs)
		wr := wire(res)
		ok, err := s.record(ctx, w, wr, env)
		if err != nil {
			out.fatal = fmt.Errorf("record trial %d: %w", l.ID, err)
			return
		}
		out.done[l.ID] = true
		if ok {
			w.live.publish(wr)
		}
	}}
	stderr := tail{keep: 512}
	res, err := s.sb.Exec(ctx, run.TeamID, sb.ID, client.ExecRequest{
		// As root whatever the template's user: the harness runs each
		// sample as sampleUser and undoes what it did, as root can.
		Argv: eval.HarnessArgv(), Stdin: &stdin, Timeout: sec, MaxOutputBytes: batchOutput, User: "0",
	}, lines, &stderr)
	if err != nil {
		return out, fmt.Errorf("exec: %w", err)
	}
	if len(out.done) == len(ids) {
		return out, nil
	}
	return out, fmt.Errorf("the batch harness ended (%s, exit code %d, signal %d) with %d of %d samples judged: %s%s",
		res.Status, res.ExitCode, res.Signal, len(out.done), len(ids), res.Error, bytes.TrimSpace(stderr.bytes()))
}

// trialStderrTail is how much of the end of a trial's stderr its verdict
// reads (where the traceback is).
const trialStderrTail = 64 << 10

// trialOutputMemory is what a trial holds of its output: a head of
// stdoutCap and a tail of stderr, each up to twice its size while it
// grows, and their copies for the verdict.
func trialOutputMemory(stdoutCap int) int64 {
	return int64(3*stdoutCap + 3*trialStderrTail)
}

// head keeps the first n bytes written to it.
type head struct {
	n   int
	buf []byte
}

func (h *head) Write(p []byte) (int, error) {
	if k := min(len(p), h.n-len(h.buf)); k > 0 {
		h.buf = append(h.buf, p[:k]...)
	}
	return len(p), nil
}

// tail keeps the last keep bytes written to it (the harness's stderr, for
// the log line of a failed slice; a trial's, for its verdict).
type tail struct {
	keep int
	buf  []byte
}

func (t *tail) Write(p []byte) (int, error) {
	if len(p) >= t.keep {
		t.buf = append(t.buf[:0], p[len(p)-t.keep:]...)
		return len(p), nil
	}
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2*t.keep {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.keep:]...)
	}
	return len(p), nil
}

// bytes returns the last keep bytes.
func (t *tail) bytes() []byte {
	if len(t.buf) > t.keep {
		return t.buf[len(t.buf)-t.keep:]
	}
	return t.buf
}

func isNotFound(err error) bool {
	var se *apierr.Error
	return errors.As(err, &se) && se.Code == client.CodeNotFound
}
