// Package judge judges one sample that is a whole program, in any language
// of internal/lang, in one fresh sandbox: the program is written to /box,
// compiled once if its language compiles (a phase of its own, with its own
// time and memory limits, whose failure is compile_error), then run on
// each stdin/stdout test with the test's time, memory and output limits.
// Each test's output is compared with the expected one outside the
// sandbox, by an internal/eval checker or by a checker program that runs
// in a sandbox of its own: the expected outputs and the checker never
// enter the sample's sandbox. Without tests (MultiPL-E's assert programs)
// the program runs once and passes when it exits 0.
//
// The program runs as an unprivileged user (65534) in /box, which only
// root may write after the compile: a run cannot change the program that
// later tests run. Infra failures (a create that fails, a sandbox that
// dies, an agent lost) retry the whole sample on a fresh sandbox, as
// internal/trial does; a sandbox stopped by the program's own memory is
// the test's memory_limit, and the tests after it run in a fresh sandbox.
package judge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"strings"
	"syscall"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/eval"
	"github.com/evalbox/evalbox/internal/lang"
	"github.com/evalbox/evalbox/internal/trial"
	"github.com/evalbox/evalbox/pkg/client"
)

// Sandboxes is what a Judge needs of the sandbox service.
type Sandboxes interface {
	Create(ctx context.Context, teamID string, req client.CreateSandboxRequest) (client.Sandbox, error)
	WriteFile(ctx context.Context, teamID, id, path, mode string, r io.Reader) (client.FileInfo, error)
	Exec(ctx context.Context, teamID, id string, req client.ExecRequest, stdout, stderr io.Writer) (client.ExecResult, error)
	Delete(ctx context.Context, teamID, id string) error
}

// Defaults and bounds of Limits.
const (
	DefaultTimeout         = 3.0
	DefaultMemoryMB        = 512
	DefaultOutputBytes     = 16 << 20
	DefaultCompileTimeout  = 30.0
	DefaultCompileMemoryMB = 1024
	MaxMemoryMB            = 16 << 10
	MaxOutputBytes         = 256 << 20
	MaxCompileTimeout      = 600.0
	// CompileOutputBytes is what is kept of the compiler's output.
	CompileOutputBytes = 8 << 10
	// sandboxSlackMB is the sandbox's memory above its largest limit:
	// the agent, the page cache of the toolchain, tmpfs files.
	sandboxSlackMB = 256
	// checkerTimeout and checkerMemoryMB bound a checker program's run.
	checkerTimeout  = 10.0
	checkerMemoryMB = 1024
	// stderrTail is what a test's verdict reads of its stderr.
	stderrTail = 4 << 10
	// maxReplaced bounds the sandboxes a sample's memory may take down
	// in one attempt: the tests after are not run.
	maxReplaced = 3
)

// Dir is where the program (and the checker, in its own sandbox) is
// written, compiled and run.
const Dir = "/box"

// User runs the compiler, the program and the checker.
const User = "65534"

// Limits bound a sample's phases. Zero values are the defaults.
type Limits struct {
	// Timeout (seconds) and MemoryMB bound each test's run.
	Timeout  float64 `json:"timeout,omitempty"`
	MemoryMB int     `json:"memory_mb,omitempty"`
	// OutputBytes bounds each of a test's streams: past it the program
	// is killed (output_limit).
	OutputBytes int64 `json:"output_bytes,omitempty"`
	// CompileTimeout (seconds) and CompileMemoryMB bound the compile.
	CompileTimeout  float64 `json:"compile_timeout,omitempty"`
	CompileMemoryMB int     `json:"compile_memory_mb,omitempty"`
	// CompileFlags replace the language's default flags (nil: its own).
	CompileFlags []string `json:"compile_flags,omitempty"`
}

// WithDefaults returns l with its zero fields set to the defaults.
func (l Limits) WithDefaults() Limits {
	if l.Timeout == 0 {
		l.Timeout = DefaultTimeout
	}
	if l.MemoryMB == 0 {
		l.MemoryMB = DefaultMemoryMB
	}
	if l.OutputBytes == 0 {
		l.OutputBytes = DefaultOutputBytes
	}
	if l.CompileTimeout == 0 {
		l.CompileTimeout = DefaultCompileTimeout
	}
	if l.CompileMemoryMB == 0 {
		l.CompileMemoryMB = DefaultCompileMemoryMB
	}
	return l
}

// Validate reports a limit out of its bounds.
func (l Limits) Validate() error {
	switch {
	case l.Timeout < 0 || l.Timeout > 600 || math.IsNaN(l.Timeout):
		return fmt.Errorf("timeout must be in [0, 600] seconds, got %g", l.Timeout)
	case l.MemoryMB < 0 || l.MemoryMB > MaxMemoryMB:
		return fmt.Errorf("memory_mb must be in [0, %d], got %d", MaxMemoryMB, l.MemoryMB)
	case l.OutputBytes < 0 || l.OutputBytes > MaxOutputBytes:
		return fmt.Errorf("output_limit_bytes must be in [0, %d], got %d", MaxOutputBytes, l.OutputBytes)
	case l.CompileTimeout < 0 || l.CompileTimeout > MaxCompileTimeout || math.IsNaN(l.CompileTimeout):
		return fmt.Errorf("compile_timeout must be in [0, %g] seconds, got %g", MaxCompileTimeout, l.CompileTimeout)
	case l.CompileMemoryMB < 0 || l.CompileMemoryMB > MaxMemoryMB:
		return fmt.Errorf("compile_memory_mb must be in [0, %d], got %d", MaxMemoryMB, l.CompileMemoryMB)
	}
	if l.CompileFlags != nil {
		if err := lang.CheckFlags(l.CompileFlags); err != nil {
			return fmt.Errorf("compile_flags: %w", err)
		}
	}
	return nil
}

// Spec is one sample to judge.
type Spec struct {
	// Template is the sample's template ("": its language's).
	Template string
	Runtime  string
	Lang     lang.Language
	Source   string
	// Tests are the stdin/stdout cases; nil: the program runs once, on no
	// input, and passes when it exits 0.
	Tests []eval.Test
	// Checker compares a test's output with the expected one (the zero
	// value: tokens).
	Checker eval.Checker
	Limits  Limits
	// StopOnFirstFailure leaves the tests after the first failure not_run.
	StopOnFirstFailure bool
	// Metadata labels the sandboxes.
	Metadata map[string]string
}

// Outcome is a sample's verdict and how it was reached.
type Outcome struct {
	// Status is passed, compile_error, the first failing test's status,
	// (without tests) failed, timed_out, memory_limit or output_limit, or
	// infra_error.
	Status string
	Detail string
	// Compile is set for a compiled language that got to its compile.
	Compile *client.EvalCompile
	// Tests are the tests' verdicts, in order (nil without tests).
	Tests       []client.EvalTestResult
	TestsPassed int
	// RunMs sums the program's runs (every test's, or its one run).
	RunMs int64
	// Sandbox is the (last) sandbox the program ran in.
	Sandbox client.Sandbox
	// Attempts counts the tries (infra failures retry the sample).
	Attempts int
	// Phases are the last attempt's: Create (every sandbox of it), Write
	// (the source and the compile), Run (the tests, checking included)
	// and Delete.
	Phases   trial.Phases
	Duration time.Duration
}

// Judge judges samples.
type Judge struct {
	sb  Sandboxes
	log *slog.Logger
	// Attempts bounds the tries of a sample (infra failures only).
	Attempts int
	// Backoff is the pause before the second try; it doubles after.
	Backoff time.Duration
	// CreateWait is how long a create queues at the team's sandbox limit.
	CreateWait time.Duration
}

// New returns a Judge with 3 attempts, 100 ms first backoff and creates
// that queue up to 10 minutes at the team's limit.
func New(sb Sandboxes, log *slog.Logger) *Judge {
	if log == nil {
		log = slog.Default()
	}
	return &Judge{sb: sb, log: log, Attempts: 3, Backoff: 100 * time.Millisecond, CreateWait: 10 * time.Minute}
}

// errChecker marks a checker program that failed (not a verdict on the
// sample, and not worth a retry: the checker is the problem's).
var errChecker = errors.New("checker failed")

// Run judges spec in fresh sandboxes of the team until one attempt
// completes or the attempts run out. It returns an error only when the
// sample cannot be judged at all (bad input, unknown template, ctx ended);
// infra failures that persist end as status infra_error.
func (j *Judge) Run(ctx context.Context, teamID string, spec Spec) (Outcome, error) {
	spec.Limits = spec.Limits.WithDefaults()
	if spec.Template == "" {
		spec.Template = spec.Lang.Template
	}
	start := time.Now()
	backoff := j.Backoff
	var last error
	inRunEvery := true // every failed attempt failed in a run of the program
	for attempt := 1; attempt <= max(1, j.Attempts); attempt++ {
		if attempt > 1 {
			if err := trial.Pause(ctx, backoff); err != nil {
				return Outcome{}, err
			}
			backoff *= 2
		}
		a := &attempt1{j: j, teamID: teamID, spec: spec}
		out, err := a.run(ctx)
		out.Attempts = attempt
		out.Duration = time.Since(start)
		switch {
		case err == nil:
			return out, nil
		case ctx.Err() != nil:
			return Outcome{}, ctx.Err()
		case errors.Is(err, errChecker):
			out.Status, out.Detail, out.Tests, out.TestsPassed = client.TestInfraError, err.Error(), nil, 0
			return out, nil
		case !trial.Retriable(err):
			return Outcome{}, err
		}
		j.log.Warn("judge: infra failure", "team", teamID, "attempt", attempt, "err", err)
		last = err
		inRunEvery = inRunEvery && a.runFailed
	}
	n := max(1, j.Attempts)
	out := Outcome{Attempts: n, Status: client.TestInfraError, Detail: fmt.Sprintf("infrastructure failure after %d attempts: %v", n, last)}
	if inRunEvery && n > 1 {
		// Every fresh sandbox failed while the program ran. If one
		// of the same kind runs a command to its end, the sandboxes are
		// sound: the program did it (it took its sandbox down, or left
		// what kept the next run from starting), its verdict, not an infra
		// failure that pass@k would leave out.
		switch cerr := j.control(ctx, teamID, spec); {
		case cerr == nil:
			out.Status = client.TestRuntimeError
			if spec.Tests == nil {
				out.Status = string(eval.Failed)
			}
			out.Detail = fmt.Sprintf("the sandbox failed while the program ran, in each of %d fresh sandboxes (a command runs to its end in another): %v", n, last)
		case ctx.Err() != nil:
			return Outcome{}, ctx.Err()
		default:
			out.Detail += fmt.Sprintf("; a control command's sandbox failed too: %v", cerr)
		}
	}
	out.Duration = time.Since(start)
	return out, nil
}

// control runs a command to its end as the program's user in a fresh
// sandbox of spec's kind, and deletes it.
func (j *Judge) control(ctx context.Context, teamID string, spec Spec) error {
	md := maps.Clone(spec.Metadata)
	if md == nil {
		md = map[string]string{}
	}
	md["trial_control"] = "1"
	sb, err := j.sb.Create(ctx, teamID, client.CreateSandboxRequest{Template: spec.Template, Runtime: spec.Runtime, Metadata: md,
		Timeout: 120, WaitSeconds: int(j.CreateWait / time.Second)})
	if err != nil {
		return err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := j.sb.Delete(dctx, teamID, sb.ID); err != nil && !isCode(err, client.CodeNotFound) {
			j.log.Warn("judge: delete control sandbox", "sandbox", sb.ID, "err", err)
		}
	}()
	r, err := j.sb.Exec(ctx, teamID, sb.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "exit 0"}, User: User, Timeout: 30}, io.Discard, io.Discard)
	if err == nil && (r.Status != client.StatusExited || r.ExitCode != 0) {
		err = fmt.Errorf("control: %s, exit code %d: %s", r.Status, r.ExitCode, r.Error)
	}
	return err
}

// attempt1 is one attempt: its sandboxes (the sample's, made again after
// one that its program's memory stopped, and the checker's) and phases.
type attempt1 struct {
	j      *Judge
	teamID string
	spec   Spec
	// box is the sample's live sandbox ("" once it stopped); boxes are
	// every sandbox the attempt made, deleted at its end.
	box   string
	boxes []string
	// compiled says the program was compiled once (a sandbox made again
	// compiles it again).
	compiled bool
	file     string
	class    string
	checker  *checkerBox
	out      Outcome
	phases   trial.Phases
	// runFailed is set when a run of the program failed as a call (the
	// sandbox stopped, the command could not start): the program's doing
	// if fresh sandboxes keep failing so; replaced counts the sandboxes
	// its memory took down.
	runFailed bool
	replaced  int
}

func (a *attempt1) run(ctx context.Context) (Outcome, error) {
	defer a.cleanup(ctx)
	a.file, a.class = a.spec.Lang.SourceFile(a.spec.Source)
	ok, err := a.ensureBox(ctx)
	if err != nil || !ok {
		a.out.Phases = a.phases
		return a.out, err
	}
	t := time.Now()
	if a.spec.Tests == nil {
		err = a.runProgram(ctx)
	} else {
		err = a.runTests(ctx)
	}
	a.phases.Run = time.Since(t)
	a.out.Phases = a.phases
	return a.out, err
}

// cleanup deletes the attempt's sandboxes, also when ctx ended.
func (a *attempt1) cleanup(ctx context.Context) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	t := time.Now()
	for _, id := range append(a.boxes, a.checker.ids()...) {
		if err := a.j.sb.Delete(dctx, a.teamID, id); err != nil && !isCode(err, client.CodeNotFound) {
			a.j.log.Warn("judge: delete sandbox", "sandbox", id, "err", err)
		}
	}
	a.out.Phases.Delete = time.Since(t)
}

// sandboxMemoryMB is the sample's sandbox's memory.
func (a *attempt1) sandboxMemoryMB() int { return SandboxMemoryMB(a.spec.Lang, a.spec.Limits) }

// SandboxMemoryMB is the memory of the sandbox of a sample in l under lim
// (with its defaults): its largest limit and some slack.
func SandboxMemoryMB(l lang.Language, lim Limits) int {
	lim = lim.WithDefaults()
	m := lim.MemoryMB + l.MemoryOverheadMB
	if l.Compiled() {
		m = max(m, lim.CompileMemoryMB)
	}
	return m + sandboxSlackMB
}

// ttl is the TTL in seconds of the sample's sandbox and of the checker's:
// time for the compile, every test, the checker's compile and runs (and
// the wait for its sandbox) when there is one, and a minute, within the
// service's maximum.
func (a *attempt1) ttl() int {
	runs := float64(max(1, len(a.spec.Tests)))
	sec := a.spec.Limits.CompileTimeout + runs*(a.spec.Limits.Timeout+2) + 60
	if a.spec.Checker.Kind == eval.CheckProgram {
		sec += DefaultCompileTimeout + runs*(2*checkerTimeout+5) + a.j.CreateWait.Seconds()
	}
	ttl := int(math.Min(math.Ceil(sec), 1<<30))
	if m, ok := a.j.sb.(interface{ MaxTimeout() time.Duration }); ok {
		ttl = min(ttl, max(1, int(m.MaxTimeout()/time.Second)))
	}
	return ttl
}

// ensureBox makes the sample's sandbox if none is live: created, the
// source written, compiled. It reports false when the program did not
// compile (a.out says so).
func (a *attempt1) ensureBox(ctx context.Context) (bool, error) {
	if a.box != "" {
		return true, nil
	}
	t := time.Now()
	sb, err := a.j.sb.Create(ctx, a.teamID, client.CreateSandboxRequest{
		Template: a.spec.Template, Runtime: a.spec.Runtime, Metadata: a.spec.Metadata, MemoryMB: a.sandboxMemoryMB(),
		Timeout:     a.ttl(),
		WaitSeconds: int(a.j.CreateWait / time.Second),
	})
	if err != nil {
		return false, fmt.Errorf("create: %w", err)
	}
	a.box, a.out.Sandbox = sb.ID, sb
	a.boxes = append(a.boxes, sb.ID)
	a.phases.Create += time.Since(t)
	t = time.Now()
	defer func() { a.phases.Write += time.Since(t) }()
	if _, err := a.j.sb.WriteFile(ctx, a.teamID, a.box, Dir+"/"+a.file, "0644", strings.NewReader(a.spec.Source)); err != nil {
		return false, fmt.Errorf("write %s: %w", a.file, err)
	}
	if !a.spec.Lang.Compiled() {
		return true, nil
	}
	c, err := compile(ctx, a.j.sb, a.teamID, a.box, a.spec.Lang, a.file, a.spec.Limits)
	if err != nil {
		return false, err
	}
	if a.compiled && !c.OK {
		// It compiled in the attempt's first sandbox.
		return false, fmt.Errorf("the program compiled in one sandbox but not in the next: %s", firstLine(c.Output))
	}
	if !a.compiled {
		a.out.Compile, a.compiled = &c, true
	}
	if !c.OK {
		a.out.Status, a.out.Detail = client.CompileError, compileDetail(c.Output)
		return false, nil
	}
	return true, nil
}

// compile compiles file of language l in the sandbox id, in Dir, as User,
// and then makes Dir root's: the compiler may write there, the program
// may not. An error is an infra failure; a program that does not compile
// is a result.
func compile(ctx context.Context, sb Sandboxes, teamID, id string, l lang.Language, file string, lim Limits) (client.EvalCompile, error) {
	if _, err := root(ctx, sb, teamID, id, "chown "+User+" "+Dir); err != nil {
		return client.EvalCompile{}, err
	}
	// The compiler's diagnostics are on stderr (javac, tsc: stdout too).
	errb, outb := tailBuf{keep: CompileOutputBytes}, tailBuf{keep: CompileOutputBytes}
	r, err := sb.Exec(ctx, teamID, id, client.ExecRequest{
		Argv: l.CompileArgv(file, lim.CompileFlags), Cwd: Dir, User: User, Env: env(l),
		Timeout: lim.CompileTimeout, MemoryLimitMB: lim.CompileMemoryMB,
		MaxOutputBytes: 1 << 20, KillOnOutputLimit: true, Stdin: new(""),
	}, &outb, &errb)
	if err != nil && !errors.Is(err, apierr.ErrOutOfMemory) {
		return client.EvalCompile{}, fmt.Errorf("compile: %w", err)
	}
	text := string(outb.bytes())
	if e := errb.bytes(); len(e) > 0 {
		text = strings.TrimSpace(text + "\n" + string(e))
	}
	if len(text) > CompileOutputBytes {
		text = text[len(text)-CompileOutputBytes:]
	}
	c := client.EvalCompile{DurationMs: r.DurationMs, Output: text}
	switch {
	case err != nil:
		c.Output += fmt.Sprintf("\n[evalbox] the compiler took the sandbox past its memory: %v", err)
	case r.Status == client.StatusError:
		return client.EvalCompile{}, fmt.Errorf("compile: %s", r.Error)
	case r.MemoryLimitExceeded:
		c.Output += fmt.Sprintf("\n[evalbox] the compiler passed the compile memory limit of %d MiB", lim.CompileMemoryMB)
	case r.OutputLimitExceeded:
		c.Output += "\n[evalbox] the compiler printed more than 1 MiB"
	case r.Status == client.StatusTimedOut:
		c.Output += fmt.Sprintf("\n[evalbox] the compile ran past its timeout of %g s", lim.CompileTimeout)
	case r.Status == client.StatusExited && r.ExitCode == 0:
		c.OK = true
	}
	if c.OK {
		if _, err := root(ctx, sb, teamID, id, "chown -R 0:0 "+Dir+" && chmod -R go-w "+Dir); err != nil {
			return client.EvalCompile{}, err
		}
	}
	c.Output = strings.TrimSpace(c.Output)
	return c, nil
}

// root runs a shell command as root in the sandbox id; a failure of it is
// an infra failure.
func root(ctx context.Context, sb Sandboxes, teamID, id, cmd string) (client.ExecResult, error) {
	var stderr bytes.Buffer
	r, err := sb.Exec(ctx, teamID, id, client.ExecRequest{Argv: []string{"/bin/sh", "-c", cmd}, User: "root", Timeout: 30, MaxOutputBytes: 4096}, io.Discard, &stderr)
	if err != nil {
		return r, fmt.Errorf("%s: %w", cmd, err)
	}
	if r.Status != client.StatusExited || r.ExitCode != 0 {
		return r, fmt.Errorf("%s: %s, exit code %d: %s", cmd, r.Status, r.ExitCode, strings.TrimSpace(stderr.String()))
	}
	return r, nil
}

// env is a language's environment, with HOME in /tmp (the program's user
// has no home).
func env(l lang.Language) map[string]string {
	m := map[string]string{"HOME": "/tmp"}
	for k, v := range l.Env {
		m[k] = v
	}
	return m
}

// exec runs the program once in the sample's sandbox with stdin, keeping
// stdout up to the output limit and stderr's tail. A sandbox its program
// took past its memory comes back as a killed result with oom set, and
// the sandbox is forgotten (the next run makes another).
func (a *attempt1) exec(ctx context.Context, stdin string) (r client.ExecResult, stdout []byte, stderr string, oom bool, err error) {
	// Only a test's output is read (a program without tests: none).
	var out headBuf
	if a.spec.Tests != nil {
		out.max = a.spec.Limits.OutputBytes
	}
	var errb tailBuf
	errb.keep = stderrTail
	lim := a.spec.Limits
	r, err = a.j.sb.Exec(ctx, a.teamID, a.box, client.ExecRequest{
		Argv: runArgv(a.spec.Lang.RunArgvLimited(a.file, a.class, lim.MemoryMB)), Cwd: Dir, User: User, Env: env(a.spec.Lang),
		Stdin: &stdin, Timeout: lim.Timeout, MemoryLimitMB: lim.MemoryMB + a.spec.Lang.MemoryOverheadMB,
		MaxOutputBytes: lim.OutputBytes, KillOnOutputLimit: true,
	}, &out, &errb)
	a.out.RunMs += r.DurationMs
	if errors.Is(err, apierr.ErrOutOfMemory) {
		a.box = ""
		return client.ExecResult{Status: client.StatusKilled, ExitCode: -1, Signal: int(syscall.SIGKILL)}, nil, string(errb.bytes()), true, nil
	}
	if err != nil {
		a.runFailed = true
		return r, nil, "", false, fmt.Errorf("exec: %w", err)
	}
	if r.Status == client.StatusError {
		a.runFailed = true
		return r, nil, "", false, fmt.Errorf("exec: %s", r.Error)
	}
	return r, out.buf, string(errb.bytes()), false, nil
}

// runArgv is argv run by a shell that first kills every process of the
// program's user left by an earlier run (kill(-1) as that user spares
// only itself): no daemon of one test outlives it into the next, beyond
// every limit. exec keeps the program's exit status and signal.
func runArgv(argv []string) []string {
	return append([]string{"/bin/sh", "-c", `kill -9 -1 2>/dev/null; exec "$@"`, "judge"}, argv...)
}

// limitVerdict is the verdict of a run that passed a limit or did not
// exit 0: "" for a clean exit.
func (a *attempt1) limitVerdict(r client.ExecResult, stderr string, oom bool) (status, detail string) {
	lim := a.spec.Limits
	failed := r.Status != client.StatusExited || r.ExitCode != 0
	marker := a.spec.Lang.OOMMarker
	switch {
	case oom || r.MemoryLimitExceeded || r.Status == client.StatusKilled && strings.Contains(r.Error, "out-of-memory"):
		return client.TestMemoryLimit, fmt.Sprintf("passed the memory limit of %d MiB", lim.MemoryMB)
	case failed && marker != "" && strings.Contains(stderr, marker):
		return client.TestMemoryLimit, fmt.Sprintf("passed the memory limit of %d MiB (%s)", lim.MemoryMB, marker)
	case r.OutputLimitExceeded:
		return client.TestOutputLimit, fmt.Sprintf("printed more than %d bytes on one stream", lim.OutputBytes)
	case r.Status == client.StatusTimedOut:
		return client.TestTimeLimit, fmt.Sprintf("ran past the time limit of %g s", lim.Timeout)
	case r.Status == client.StatusKilled || r.Signal != 0:
		return client.TestRuntimeError, withStderr(fmt.Sprintf("killed by signal %d", r.Signal), stderr)
	case r.ExitCode != 0:
		return client.TestRuntimeError, withStderr(fmt.Sprintf("exit code %d", r.ExitCode), stderr)
	}
	return "", ""
}

// runProgram runs a program without tests once: it passes when it exits 0.
func (a *attempt1) runProgram(ctx context.Context) error {
	r, _, stderr, oom, err := a.exec(ctx, "")
	if err != nil {
		return err
	}
	status, detail := a.limitVerdict(r, stderr, oom)
	switch status {
	case "":
		a.out.Status = client.TestPassed
	case client.TestTimeLimit:
		a.out.Status, a.out.Detail = string(eval.TimedOut), detail
	case client.TestRuntimeError:
		a.out.Status, a.out.Detail = string(eval.Failed), detail
	default:
		a.out.Status, a.out.Detail = status, detail
	}
	return nil
}

// runTests runs every test (up to the first failure with
// StopOnFirstFailure) and sets the sample's verdict.
func (a *attempt1) runTests(ctx context.Context) error {
	tests := a.spec.Tests
	a.out.Tests = make([]client.EvalTestResult, len(tests))
	first := -1
	for i, tc := range tests {
		if first >= 0 && a.spec.StopOnFirstFailure {
			a.out.Tests[i] = client.EvalTestResult{Status: client.TestNotRun}
			continue
		}
		if a.box == "" && a.replaced >= maxReplaced {
			// Its memory took down sandbox after sandbox: the rest are
			// not worth one each.
			a.out.Tests[i] = client.EvalTestResult{Status: client.TestNotRun, Detail: fmt.Sprintf("not run: the program's memory took down %d sandboxes", a.replaced)}
			continue
		}
		ok, err := a.ensureBox(ctx)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("the program compiled in one sandbox but not in the next")
		}
		r, stdout, stderr, oom, err := a.exec(ctx, tc.Input)
		if oom {
			a.replaced++
		}
		if err != nil {
			return err
		}
		res := client.EvalTestResult{DurationMs: r.DurationMs, ExitCode: r.ExitCode, Signal: r.Signal, PeakMemoryBytes: r.PeakMemoryBytes}
		res.Status, res.Detail = a.limitVerdict(r, stderr, oom)
		if res.Status == "" {
			if res.Status, res.Detail, err = a.check(ctx, tc, stdout); err != nil {
				return fmt.Errorf("test %d: %w", i+1, err)
			}
		}
		a.out.Tests[i] = res
		if res.Status == client.TestPassed {
			a.out.TestsPassed++
		} else if first < 0 {
			first = i
		}
	}
	if first < 0 {
		a.out.Status = client.TestPassed
		return nil
	}
	t := a.out.Tests[first]
	a.out.Status = t.Status
	a.out.Detail = fmt.Sprintf("test %d of %d: %s", first+1, len(tests), strings.ReplaceAll(t.Status, "_", " "))
	if t.Detail != "" {
		a.out.Detail += ": " + t.Detail
	}
	return nil
}

// check judges a test's output.
func (a *attempt1) check(ctx context.Context, tc eval.Test, got []byte) (status, detail string, err error) {
	if a.spec.Checker.Kind != eval.CheckProgram {
		if d := a.spec.Checker.Compare(tc.Output, string(got)); d != "" {
			return client.TestWrongAnswer, d, nil
		}
		return client.TestPassed, "", nil
	}
	if a.checker == nil {
		a.checker = &checkerBox{}
	}
	return a.checker.check(ctx, a, tc, got)
}

// withStderr adds the last line of stderr to a detail.
func withStderr(d, stderr string) string {
	if l := lastLine(stderr); l != "" {
		return d + ": " + l
	}
	return d
}

// lastLine is s's last non-blank line, at most about 200 bytes.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return clip(strings.TrimSpace(lines[len(lines)-1]), 200)
}

// firstLine is s's first non-blank line, at most about 200 bytes.
func firstLine(s string) string {
	l, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return clip(strings.TrimSpace(l), 200)
}

// compileDetail is a compile error's detail: the compiler's first line
// that names an error, else its first line.
func compileDetail(out string) string {
	for l := range strings.Lines(out) {
		if strings.Contains(strings.ToLower(l), "error") {
			return "compile error: " + clip(strings.TrimSpace(l), 200)
		}
	}
	if l := firstLine(out); l != "" {
		return "compile error: " + l
	}
	return "compile error"
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && n < len(s) && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n] + "…"
}

func isCode(err error, code string) bool {
	var se *apierr.Error
	return errors.As(err, &se) && se.Code == code
}

// headBuf keeps up to max bytes written to it.
type headBuf struct {
	buf []byte
	max int64
}

func (h *headBuf) Write(p []byte) (int, error) {
	if room := h.max - int64(len(h.buf)); room > 0 {
		h.buf = append(h.buf, p[:min(int64(len(p)), room)]...)
	}
	return len(p), nil
}

// tailBuf keeps the last keep bytes written to it.
type tailBuf struct {
	buf  []byte
	keep int
}

func (t *tailBuf) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2*t.keep {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.keep:]...)
	}
	return len(p), nil
}

func (t *tailBuf) bytes() []byte {
	if len(t.buf) > t.keep {
		return t.buf[len(t.buf)-t.keep:]
	}
	return t.buf
}
