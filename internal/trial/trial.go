// Package trial runs one script in a fresh sandbox: create, write the
// script, run it with a timeout, delete (also when a step fails). Infra
// failures — a create that fails, a sandbox that dies, an agent that stops
// answering — are retried on a fresh sandbox with backoff, a bounded number
// of times; the script's own failures (non-zero exit, timeout) are results,
// never retried. A sandbox that stops while the script runs, in every
// attempt, when a control script runs to its end in a fresh sandbox of the
// same kind, is the script's doing: a result (killed), not an infra
// failure. It is the unit of work of POST /v1/execute and eval runs.
package trial

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/outbuf"
	"github.com/evalbox/evalbox/pkg/client"
)

// Sandboxes is what a Runner needs of the sandbox service.
type Sandboxes interface {
	Create(ctx context.Context, teamID string, req client.CreateSandboxRequest) (client.Sandbox, error)
	WriteFile(ctx context.Context, teamID, id, path, mode string, r io.Reader) (client.FileInfo, error)
	OpenFile(ctx context.Context, teamID, id, path string) (client.FileInfo, io.ReadCloser, error)
	Exec(ctx context.Context, teamID, id string, req client.ExecRequest, stdout, stderr io.Writer) (client.ExecResult, error)
	Delete(ctx context.Context, teamID, id string) error
}

// Spec is one trial: a script written to Path and run with Argv.
type Spec struct {
	Template string
	Runtime  string
	// Script is the file's content; Path where it is written.
	Script string
	Path   string
	Argv   []string
	// User runs Argv as this user (name or uid); "" is the template's.
	User string
	// Cwd is the run's working directory ("" = the template's).
	Cwd string
	// Files are written before the script (path → content; a relative
	// path is under Cwd), and Stdin, if set, is the run's standard input.
	Files map[string][]byte
	Stdin *string
	// Fetch lists files read back after the run (or a failed Prepare)
	// into Outcome.Files (a relative path is under Cwd): those that exist
	// and are regular files of at most MaxFetchBytes.
	Fetch []string
	// FetchBudget, if set, is reserved from for each fetched file's size
	// before it is read (a file it cannot hold is left out, and
	// Outcome.FetchSkipped names it); the caller gives it back. Nil: no
	// limit but MaxFetchTotalBytes.
	FetchBudget outbuf.Source
	// MemoryMB is the sandbox's memory limit (0 = the template's).
	MemoryMB int
	// Timeout of the run in seconds.
	Timeout        float64
	MaxOutputBytes int64
	// Metadata labels the sandbox (e.g. the eval run it belongs to).
	Metadata map[string]string
	// Output, if set, is called before each attempt's run for the writers
	// that get its stdout and stderr (writers of the callers' choosing:
	// buffers counted against a budget, or only what a verdict reads);
	// the Outcome's Result then has no output. Nil: the output is
	// buffered into the Result (bounded by MaxOutputBytes alone).
	Output func() (stdout, stderr io.Writer)
	// Env is set for Prepare and Argv (over the template's).
	Env map[string]string
	// Prepare, if set, runs after the script is written and before Argv,
	// in the same sandbox, with Cwd, User and Env and no stdin: a
	// compile. Argv runs only when it exits 0; otherwise its result is
	// the trial's (Outcome.PrepareFailed). PrepareTimeout bounds it in
	// seconds (0: Timeout). PrepareOutput is to it what Output is to Argv
	// (nil: its output is buffered into Outcome.Prepare, bounded by
	// MaxOutputBytes); it may be Output itself, which is called again
	// before Argv runs.
	Prepare        []string
	PrepareTimeout float64
	PrepareOutput  func() (stdout, stderr io.Writer)
}

// prepareTimeout is the seconds Prepare may take.
func (s Spec) prepareTimeout() float64 {
	if s.Prepare == nil {
		return 0
	}
	if s.PrepareTimeout > 0 {
		return s.PrepareTimeout
	}
	return s.Timeout
}

// Outcome is a trial's result: the run's result with its output, the
// sandbox it ran in, how many attempts it took, the durations of the
// completed attempt's phases and of the whole trial (every attempt and
// backoff included). When every attempt hit an infra failure,
// Result.Status is "error", Result.Error says why, and Phases is zero.
type Outcome struct {
	Result   client.ExecResult
	Sandbox  client.Sandbox
	Attempts int
	Phases   Phases
	Duration time.Duration
	// Files are the fetched files (Spec.Fetch), by the path asked for.
	Files map[string][]byte
	// FetchSkipped are the files of Spec.Fetch that exist but were left
	// out: too large, or past the trial's total or its FetchBudget
	// (FetchOverBudget).
	FetchSkipped    []string
	FetchOverBudget bool
	// FetchErr, if set, is why the files could not be read back after
	// the run; the run's Result stands (the code is not run again).
	FetchErr error
	// Prepare is Spec.Prepare's result (nil without one; without its
	// output when PrepareOutput is set). PrepareFailed: it did not exit
	// 0 (or timed out, or was killed), Argv did not run, and Result is
	// Prepare's result.
	Prepare       *client.ExecResult
	PrepareFailed bool
}

// MaxFetchBytes bounds one fetched file (Spec.Fetch), MaxFetchTotalBytes
// all of a trial's: the files past it are left out.
const (
	MaxFetchBytes      = 16 << 20
	MaxFetchTotalBytes = 64 << 20
)

// Phases are the durations of one attempt's steps: the sandbox's create
// (a warm-pool claim or a cold start, queueing at the team's limit
// included), the script's write, Spec.Prepare's exec (0 without one), its
// run (the exec round trip; 0 when Prepare failed) and the sandbox's
// delete.
type Phases struct {
	Create, Write, Prepare, Run, Delete time.Duration
}

// Runner runs trials.
type Runner struct {
	sb  Sandboxes
	log *slog.Logger
	// Attempts bounds the tries of one trial (infra failures only).
	Attempts int
	// Backoff is the pause before the second try; it doubles after.
	Backoff time.Duration
	// CreateWait is how long a create queues at the team's sandbox limit.
	CreateWait time.Duration
	// Metrics, when set, counts the trials that end (not those that could
	// not run at all), as Source.
	Metrics *Metrics
	Source  string
	// now is the clock of the phases and durations (tests set it).
	now func() time.Time
}

// New returns a Runner with 3 attempts, 100 ms first backoff and creates
// that queue up to 10 minutes at the team's limit.
func New(sb Sandboxes, log *slog.Logger) *Runner {
	if log == nil {
		log = slog.Default()
	}
	return &Runner{sb: sb, log: log, Attempts: 3, Backoff: 100 * time.Millisecond, CreateWait: 10 * time.Minute}
}

// Run runs spec in fresh sandboxes of the team until one attempt completes
// or the attempts run out. It returns an error only when the trial cannot
// run at all (bad input, unknown template, ctx ended); infra failures end
// as an Outcome with status "error".
func (r *Runner) Run(ctx context.Context, teamID string, spec Spec) (Outcome, error) {
	out, err := r.run(ctx, teamID, spec)
	if err == nil {
		r.Metrics.observe(r.Source, out)
	}
	return out, err
}

// run is Run, without its metrics.
func (r *Runner) run(ctx context.Context, teamID string, spec Spec) (Outcome, error) {
	start := r.clock()
	var last error
	stopped := 0 // attempts whose sandbox stopped while the script ran
	var lastSandbox client.Sandbox
	backoff := r.Backoff
	for attempt := 1; attempt <= max(1, r.Attempts); attempt++ {
		if attempt > 1 {
			if err := Pause(ctx, backoff); err != nil {
				return Outcome{}, err
			}
			backoff *= 2
		}
		out, err := r.once(ctx, teamID, spec)
		out.Attempts = attempt
		if err == nil {
			out.Duration = r.clock().Sub(start)
			return out, nil
		}
		if ctx.Err() != nil {
			return Outcome{}, ctx.Err()
		}
		if !Retriable(err) {
			return Outcome{}, err
		}
		r.log.Warn("trial infra failure", "team", teamID, "attempt", attempt, "err", err)
		last = err
		if errors.Is(err, errStoppedRunning) {
			stopped++
			lastSandbox = out.Sandbox
		}
	}
	if stopped == r.Attempts && stopped > 1 {
		// Every fresh sandbox stopped while the script ran in it. If one
		// of the same kind runs an empty script to its end, the sandboxes
		// are sound: the script did it (e.g. it took down gVisor's
		// Sentry), its result, not an infra failure that would leave it
		// out of pass@k.
		control := spec
		control.Script, control.Output, control.Metadata = "", nil, maps.Clone(spec.Metadata)
		control.Fetch, control.FetchBudget = nil, nil
		control.Prepare, control.PrepareOutput = nil, nil
		if control.Metadata == nil {
			control.Metadata = map[string]string{}
		}
		control.Metadata["trial_control"] = "1"
		_, cerr := r.once(ctx, teamID, control)
		switch {
		case cerr == nil:
			return Outcome{Attempts: stopped, Duration: r.clock().Sub(start), Sandbox: lastSandbox, Result: client.ExecResult{
				Status: client.StatusKilled, ExitCode: -1,
				Error: fmt.Sprintf("the sandbox stopped while the script ran, in each of %d fresh sandboxes (an empty script runs to its end in another): %v", stopped, last),
			}}, nil
		case ctx.Err() != nil:
			return Outcome{}, ctx.Err()
		}
		last = fmt.Errorf("%w; a control script's sandbox failed too: %w", last, cerr)
	}
	return Outcome{Attempts: max(1, r.Attempts), Duration: r.clock().Sub(start), Result: client.ExecResult{
		Status: client.StatusError, ExitCode: -1,
		Error: fmt.Sprintf("infrastructure failure after %d attempts: %v", max(1, r.Attempts), last),
	}}, nil
}

// once runs one attempt in one fresh sandbox, deleting it afterwards, and
// times each step.
func (r *Runner) once(ctx context.Context, teamID string, spec Spec) (out Outcome, err error) {
	t := r.clock()
	sb, err := r.sb.Create(ctx, teamID, client.CreateSandboxRequest{
		Template: spec.Template, Runtime: spec.Runtime, Metadata: spec.Metadata, MemoryMB: spec.MemoryMB,
		Timeout:     r.SandboxTTL(spec.Timeout + spec.prepareTimeout()),
		WaitSeconds: int(r.CreateWait / time.Second),
	})
	if err != nil {
		return Outcome{}, fmt.Errorf("create: %w", err)
	}
	out.Sandbox = sb
	out.Phases.Create, t = r.lap(t)
	defer func() {
		// Deleting must happen even when ctx ended.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		t := r.clock()
		if err := r.sb.Delete(dctx, teamID, sb.ID); err != nil && !isCode(err, client.CodeNotFound) {
			r.log.Warn("trial: delete sandbox", "sandbox", sb.ID, "err", err)
		}
		out.Phases.Delete = r.clock().Sub(t)
	}()
	if err := WriteFiles(ctx, r.sb, teamID, sb.ID, spec.Cwd, spec.Files); err != nil {
		return out, err
	}
	if _, err := r.sb.WriteFile(ctx, teamID, sb.ID, under(spec.Cwd, spec.Path), "0644", strings.NewReader(spec.Script)); err != nil {
		return out, fmt.Errorf("write %s: %w", spec.Path, err)
	}
	out.Phases.Write, t = r.lap(t)
	if spec.Prepare != nil {
		res, err := r.exec(ctx, teamID, sb.ID, spec.PrepareOutput, client.ExecRequest{
			Argv: spec.Prepare, Timeout: spec.prepareTimeout(), MaxOutputBytes: spec.MaxOutputBytes, User: spec.User,
			Cwd: spec.Cwd, Env: spec.Env,
		})
		if err != nil {
			return out, fmt.Errorf("prepare: %w", err)
		}
		out.Phases.Prepare, t = r.lap(t)
		out.Prepare = &res
		if res.Status != client.StatusExited || res.ExitCode != 0 {
			out.PrepareFailed, out.Result = true, res
		}
	}
	if !out.PrepareFailed {
		res, err := r.exec(ctx, teamID, sb.ID, spec.Output, client.ExecRequest{
			Argv: spec.Argv, Timeout: spec.Timeout, MaxOutputBytes: spec.MaxOutputBytes, User: spec.User,
			Cwd: spec.Cwd, Stdin: spec.Stdin, Env: spec.Env,
		})
		if err != nil {
			return out, fmt.Errorf("exec: %w", err)
		}
		out.Phases.Run, _ = r.lap(t)
		out.Result = res
	}
	if len(spec.Fetch) > 0 {
		// The run (or the failed Prepare) is over and its result stands:
		// a failure to read the files back is reported with it, never
		// retried, which would run the code again.
		fetched, err := ReadFiles(ctx, r.sb, teamID, sb.ID, spec.Cwd, spec.Fetch, spec.FetchBudget)
		out.Files, out.FetchSkipped, out.FetchOverBudget = fetched.Files, fetched.Skipped, fetched.OverBudget
		if err != nil {
			r.log.Warn("trial: read back files", "sandbox", sb.ID, "err", err)
			out.FetchErr = err
		}
	}
	return out, nil
}

// exec runs req in the sandbox id, its output to output's writers (nil:
// buffered into the result). A sandbox the command took past its memory
// limit is the command's result (killed), not an error; a sandbox that
// stopped under it is errStoppedRunning.
func (r *Runner) exec(ctx context.Context, teamID, id string, output func() (io.Writer, io.Writer), req client.ExecRequest) (client.ExecResult, error) {
	var bufOut, bufErr strings.Builder
	var stdout, stderr io.Writer = &bufOut, &bufErr
	if output != nil {
		stdout, stderr = output()
	}
	res, err := r.sb.Exec(ctx, teamID, id, req, stdout, stderr)
	if errors.Is(err, apierr.ErrOutOfMemory) {
		// The script took the sandbox past its memory limit (gVisor: the
		// OOM killer stops the whole sandbox): its result, not an infra
		// failure, as when the OOM killer takes one process.
		msg := err.Error()
		if se := (*apierr.Error)(nil); errors.As(err, &se) {
			msg = se.Message
		}
		res, err = client.ExecResult{Status: client.StatusKilled, ExitCode: -1, Signal: int(syscall.SIGKILL), Error: "out-of-memory killer: " + msg}, nil
	}
	if errors.Is(err, apierr.ErrStoppedDuringCall) {
		return client.ExecResult{}, fmt.Errorf("%w: %w", errStoppedRunning, err)
	}
	if err != nil {
		return client.ExecResult{}, err
	}
	res.Stdout, res.Stderr = bufOut.String(), bufErr.String()
	return res, nil
}

// FileStore is what WriteFiles and ReadFiles need of the sandbox service.
type FileStore interface {
	WriteFile(ctx context.Context, teamID, id, path, mode string, r io.Reader) (client.FileInfo, error)
	OpenFile(ctx context.Context, teamID, id, path string) (client.FileInfo, io.ReadCloser, error)
}

// WriteFiles writes files (path → content; a relative path is under cwd)
// into the sandbox id, in the order of their paths.
func WriteFiles(ctx context.Context, fs FileStore, teamID, id, cwd string, files map[string][]byte) error {
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if _, err := fs.WriteFile(ctx, teamID, id, under(cwd, name), "0644", bytes.NewReader(files[name])); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	return nil
}

// Fetched are the files ReadFiles read, by the name asked for, and the
// names of those it left out though they exist (too large, past the total
// or the budget).
type Fetched struct {
	Files   map[string][]byte
	Skipped []string
	// OverBudget is set when a file was skipped because the budget could
	// not hold it (not for its size alone).
	OverBudget bool
}

// ReadFiles reads the files names (a relative path is under cwd) from the
// sandbox id. A name that is missing or not a regular file is passed over;
// one larger than MaxFetchBytes, past MaxFetchTotalBytes in all, or whose
// size budget (nil: none) cannot reserve is skipped. What is reserved from
// budget for the files read stays reserved (the caller gives it back), also
// on an error.
func ReadFiles(ctx context.Context, fs FileStore, teamID, id, cwd string, names []string, budget outbuf.Source) (Fetched, error) {
	var out Fetched
	if len(names) == 0 {
		return out, nil
	}
	out.Files = map[string][]byte{}
	seen := map[string]bool{}
	left := int64(MaxFetchTotalBytes)
	for _, name := range names {
		if seen[name] {
			continue
		}
		seen[name] = true
		fi, rc, err := fs.OpenFile(ctx, teamID, id, under(cwd, name))
		if isCode(err, client.CodeNotFound) || isCode(err, client.CodeBadRequest) {
			continue // missing, or a directory
		}
		if err != nil {
			return out, fmt.Errorf("fetch %s: %w", name, err)
		}
		if fi.Type != client.FileTypeFile {
			rc.Close()
			continue
		}
		if fi.Size > min(int64(MaxFetchBytes), left) {
			rc.Close()
			out.Skipped = append(out.Skipped, name)
			continue
		}
		if budget != nil && !budget.TryReserve(fi.Size) {
			rc.Close()
			out.Skipped, out.OverBudget = append(out.Skipped, name), true
			continue
		}
		// At most the size reserved: a file that grew since is skipped.
		b, err := io.ReadAll(io.LimitReader(rc, fi.Size+1))
		rc.Close()
		if err != nil {
			return out, fmt.Errorf("fetch %s: %w", name, err)
		}
		if int64(len(b)) > fi.Size {
			out.Skipped = append(out.Skipped, name)
			continue
		}
		out.Files[name] = b
		left -= int64(len(b))
	}
	return out, nil
}

// under is name under dir when it is relative and dir is set.
func under(dir, name string) string {
	if dir == "" || path.IsAbs(name) {
		return name
	}
	return path.Join(dir, name)
}

// errStoppedRunning marks an attempt whose sandbox stopped while the
// script ran in it.
var errStoppedRunning = errors.New("the sandbox stopped while the script ran")

// SandboxTTL is the TTL, in seconds, of a sandbox that runs something for
// up to timeout seconds: a minute more, so that its TTL never ends it under
// the run, within the service's maximum when it tells it.
func (r *Runner) SandboxTTL(timeout float64) int {
	ttl := int(math.Ceil(timeout)) + 60
	if m, ok := r.sb.(interface{ MaxTimeout() time.Duration }); ok {
		ttl = min(ttl, max(1, int(m.MaxTimeout()/time.Second)))
	}
	return ttl
}

func (r *Runner) clock() time.Time {
	if r.now != nil {
		return r.now()
	}
	return time.Now()
}

// lap returns the time since t and now.
func (r *Runner) lap(t time.Time) (time.Duration, time.Time) {
	now := r.clock()
	return now.Sub(t), now
}

// Pause waits d, the backoff before a retry, or until ctx ends (its
// error).
func Pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Retriable reports whether err is an infra failure worth a fresh sandbox:
// not bad input, a missing template or a refused quota.
func Retriable(err error) bool {
	var se *apierr.Error
	if !errors.As(err, &se) {
		return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
	}
	switch se.Code {
	case client.CodeBadRequest, client.CodeNotFound, client.CodeForbidden, client.CodeUnauthorized,
		client.CodePayloadTooLarge, client.CodeTooManySandboxes, client.CodeConflict:
		return false
	}
	return true
}

func isCode(err error, code string) bool {
	var se *apierr.Error
	return errors.As(err, &se) && se.Code == code
}
