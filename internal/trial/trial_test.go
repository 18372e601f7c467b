package trial

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/outbuf"
	"github.com/evalbox/evalbox/pkg/client"
)

// flaky is a sandbox service whose steps fail as scripted, recording what
// was created and deleted. The Runner's retry and cleanup rules are under
// test here; the real service is exercised by the e2e suite.
type flaky struct {
	mu               sync.Mutex
	createErrs       []error // returned by successive creates, then success
	execErrs         []error
	created, deleted []string
	wrote            string
	files            map[string]string // every write, by path
	lastExec         client.ExecRequest
	execs            []client.ExecRequest // every exec, in order
	lastCreate       client.CreateSandboxRequest
	exits            map[string]int           // exit code by argv[0] (default 0)
	pause            map[string]time.Duration // per step: create, write, exec, delete
	// clock, when set, is advanced by the pauses instead of sleeping.
	clock *fakeClock
}

func (f *flaky) sleep(step string) {
	if f.clock != nil {
		f.clock.advance(f.pause[step])
		return
	}
	time.Sleep(f.pause[step])
}

// fakeClock is a Runner's clock that only the fake's steps move.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func pop(errs *[]error) error {
	if len(*errs) == 0 {
		return nil
	}
	err := (*errs)[0]
	*errs = (*errs)[1:]
	return err
}

func (f *flaky) Create(ctx context.Context, teamID string, req client.CreateSandboxRequest) (client.Sandbox, error) {
	f.sleep("create")
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := pop(&f.createErrs); err != nil {
		return client.Sandbox{}, err
	}
	f.lastCreate = req
	id := "sb-" + string(rune('a'+len(f.created)))
	f.created = append(f.created, id)
	return client.Sandbox{ID: id}, nil
}

func (f *flaky) WriteFile(ctx context.Context, teamID, id, path, mode string, r io.Reader) (client.FileInfo, error) {
	f.sleep("write")
	b, err := io.ReadAll(r)
	f.mu.Lock()
	f.wrote = path + ":" + string(b)
	if f.files == nil {
		f.files = map[string]string{}
	}
	f.files[path] = string(b)
	f.mu.Unlock()
	return client.FileInfo{}, err
}

func (f *flaky) OpenFile(ctx context.Context, teamID, id, path string) (client.FileInfo, io.ReadCloser, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if path == "/w/dir" {
		return client.FileInfo{}, nil, &apierr.Error{Code: client.CodeBadRequest, Message: "is a directory"}
	}
	if path == "/w/broken" {
		return client.FileInfo{}, nil, &apierr.Error{Code: client.CodeSandboxNotRunning, Message: "the sandbox went away"}
	}
	b, ok := f.files[path]
	if !ok {
		return client.FileInfo{}, nil, &apierr.Error{Code: client.CodeNotFound, Message: "no file " + path}
	}
	return client.FileInfo{Type: client.FileTypeFile, Size: int64(len(b))}, io.NopCloser(strings.NewReader(b)), nil
}

func (f *flaky) Exec(ctx context.Context, teamID, id string, req client.ExecRequest, stdout, stderr io.Writer) (client.ExecResult, error) {
	f.sleep("exec")
	f.mu.Lock()
	f.lastExec = req
	f.execs = append(f.execs, req)
	err := pop(&f.execErrs)
	code := f.exits[req.Argv[0]]
	f.mu.Unlock()
	if err != nil {
		return client.ExecResult{}, err
	}
	io.WriteString(stdout, strings.Join(req.Argv, " "))
	if code != 0 {
		io.WriteString(stderr, "error: "+req.Argv[0])
	}
	return client.ExecResult{Status: client.StatusExited, ExitCode: code}, ctx.Err()
}

func (f *flaky) Delete(ctx context.Context, teamID, id string) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	f.sleep("delete")
	f.mu.Lock()
	f.deleted = append(f.deleted, id)
	f.mu.Unlock()
	return nil
}

var spec = Spec{Template: "python", Script: "print(1)", Path: "/tmp/main.py", Argv: []string{"python3", "/tmp/main.py"}, Timeout: 3}

func newRunner(f *flaky) *Runner {
	r := New(f, nil)
	r.Backoff = time.Millisecond
	return r
}

func TestRetriesInfraFailures(t *testing.T) {
	died := &apierr.Error{Code: client.CodeSandboxNotRunning, Message: "died"}
	f := &flaky{
		createErrs: []error{&apierr.Error{Code: client.CodeInternal, Message: "boom"}},
		execErrs:   []error{died},
	}
	out, err := newRunner(f).Run(t.Context(), "t1", spec)
	if err != nil {
		t.Fatal(err)
	}
	if out.Attempts != 3 || out.Result.Status != client.StatusExited || out.Result.Stdout != "python3 /tmp/main.py" || out.Sandbox.ID != "sb-b" {
		t.Fatalf("outcome %+v", out)
	}
	if f.wrote != "/tmp/main.py:print(1)" {
		t.Fatalf("wrote %q", f.wrote)
	}
	if strings.Join(f.created, ",") != "sb-a,sb-b" || strings.Join(f.deleted, ",") != "sb-a,sb-b" {
		t.Fatalf("created %v, deleted %v: every sandbox must be deleted", f.created, f.deleted)
	}
}

func TestGivesUpAsError(t *testing.T) {
	died := &apierr.Error{Code: client.CodeSandboxNotRunning, Message: "died"}
	f := &flaky{execErrs: []error{died, died, died}}
	out, err := newRunner(f).Run(t.Context(), "t1", spec)
	if err != nil {
		t.Fatal(err)
	}
	if out.Result.Status != client.StatusError || !strings.Contains(out.Result.Error, "after 3 attempts") || !strings.Contains(out.Result.Error, "died") {
		t.Fatalf("outcome %+v", out)
	}
	if len(f.deleted) != 3 {
		t.Fatalf("deleted %v, want the 3 sandboxes", f.deleted)
	}
}

// TestOutOfMemoryIsTheScriptsResult: a sandbox that died because the
// script went past its memory limit is the script's result (killed, with
// the reason), not an infra failure to retry.
func TestOutOfMemoryIsTheScriptsResult(t *testing.T) {
	oom := &apierr.Error{Code: client.CodeSandboxNotRunning, Message: "sandbox sb-a went past its memory limit (memory_mb=512)",
		Err: fmt.Errorf("%w: session closed", apierr.ErrOutOfMemory)}
	f := &flaky{execErrs: []error{oom}}
	out, err := newRunner(f).Run(t.Context(), "t1", spec)
	if err != nil {
		t.Fatal(err)
	}
	if out.Attempts != 1 || out.Result.Status != client.StatusKilled || !strings.HasPrefix(out.Result.Error, "out-of-memory killer: sandbox sb-a went past") {
		t.Fatalf("outcome %+v", out)
	}
	if strings.Join(f.created, ",") != "sb-a" || strings.Join(f.deleted, ",") != "sb-a" {
		t.Fatalf("created %v, deleted %v", f.created, f.deleted)
	}
}

func TestNoRetryOnBadInput(t *testing.T) {
	for _, code := range []string{client.CodeBadRequest, client.CodeNotFound, client.CodeTooManySandboxes} {
		f := &flaky{createErrs: []error{&apierr.Error{Code: code, Message: "no"}}}
		_, err := newRunner(f).Run(t.Context(), "t1", spec)
		var se *apierr.Error
		if !errors.As(err, &se) || se.Code != code || len(f.created) != 0 || len(f.createErrs) != 0 {
			t.Errorf("%s: err %v, created %v", code, err, f.created)
		}
	}
}

func TestDeletesAfterCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	f := &flaky{}
	if _, err := newRunner(f).Run(ctx, "t1", spec); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	if strings.Join(f.deleted, ",") != "sb-a" {
		t.Fatalf("deleted %v after cancel", f.deleted)
	}
}

func TestPhases(t *testing.T) {
	ms := time.Millisecond
	died := &apierr.Error{Code: client.CodeSandboxNotRunning, Message: "died"}
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	f := &flaky{execErrs: []error{died}, clock: clock, pause: map[string]time.Duration{"create": 60 * ms, "write": 10 * ms, "exec": 120 * ms, "delete": 90 * ms}}
	r := newRunner(f)
	r.now = clock.Now
	out, err := r.Run(t.Context(), "t1", spec)
	if err != nil {
		t.Fatal(err)
	}
	// Each phase is its own step's time, never another step's.
	want := Phases{Create: 60 * ms, Write: 10 * ms, Run: 120 * ms, Delete: 90 * ms}
	if out.Phases != want {
		t.Errorf("phases %+v, want %+v", out.Phases, want)
	}
	// The trial covers both attempts: the failed one and the second.
	if out.Attempts != 2 || out.Duration != 2*280*ms {
		t.Errorf("attempts %d, duration %v, want 2 and %v", out.Attempts, out.Duration, 2*280*ms)
	}
}

// TestStoppedWhileRunningIsTheScripts: when the sandbox stops while the
// script runs, in every one of the fresh sandboxes it is tried in, and an
// empty script runs to its end in another, the script did it: the result
// is the script's (killed, saying so), not an infra error that pass@k
// would leave out. A sandbox that stops once, or before the script ran,
// or a control that stops too, is an infra failure, as before.
func TestStoppedWhileRunningIsTheScripts(t *testing.T) {
	stopped := func() error {
		return &apierr.Error{Code: client.CodeSandboxNotRunning, Message: "sandbox sb-a stopped while the call ran",
			Err: fmt.Errorf("%w: session closed", apierr.ErrStoppedDuringCall)}
	}
	f := &flaky{execErrs: []error{stopped(), stopped(), stopped()}}
	out, err := newRunner(f).Run(t.Context(), "t1", spec)
	if err != nil {
		t.Fatal(err)
	}
	// Three attempts and the control, an empty script, which ran.
	if out.Result.Status != client.StatusKilled || out.Attempts != 3 || !strings.Contains(out.Result.Error, "in each of 3 fresh sandboxes") ||
		out.Sandbox.ID != "sb-c" || len(f.deleted) != 4 || f.wrote != "/tmp/main.py:" {
		t.Fatalf("outcome %+v, deleted %v, wrote %q", out, f.deleted, f.wrote)
	}

	// When the control's sandbox stops too, the sandboxes are at fault:
	// an infra error.
	f = &flaky{execErrs: []error{stopped(), stopped(), stopped(), stopped()}}
	out, err = newRunner(f).Run(t.Context(), "t1", spec)
	if err != nil {
		t.Fatal(err)
	}
	if out.Result.Status != client.StatusError || !strings.Contains(out.Result.Error, "control script") || len(f.deleted) != 4 {
		t.Fatalf("outcome %+v, deleted %v, want an infra error", out, f.deleted)
	}

	// Two stops and a sandbox found stopped before the script ran: not
	// every attempt ran the script to a stop, so it is an infra error.
	f = &flaky{execErrs: []error{stopped(), &apierr.Error{Code: client.CodeSandboxNotRunning, Message: "died"}, stopped()}}
	out, err = newRunner(f).Run(t.Context(), "t1", spec)
	if err != nil {
		t.Fatal(err)
	}
	if out.Result.Status != client.StatusError {
		t.Fatalf("outcome %+v, want an infra error", out)
	}

	// With one attempt, one stop says nothing about the script.
	f = &flaky{execErrs: []error{stopped()}}
	r := newRunner(f)
	r.Attempts = 1
	if out, err = r.Run(t.Context(), "t1", spec); err != nil || out.Result.Status != client.StatusError {
		t.Fatalf("outcome %+v, %v, want an infra error", out, err)
	}
}

// maxed is a sandbox service that says its longest TTL.
type maxed struct {
	*flaky
	max time.Duration
}

func (m maxed) MaxTimeout() time.Duration { return m.max }

// TestSandboxTTL: a trial's sandbox outlives its run by a minute, within
// the service's maximum TTL when the service says it.
func TestSandboxTTL(t *testing.T) {
	if got := newRunner(&flaky{}).SandboxTTL(2.5); got != 63 {
		t.Errorf("ttl %d, want 63", got)
	}
	if got := New(maxed{&flaky{}, 30 * time.Second}, nil).SandboxTTL(2.5); got != 30 {
		t.Errorf("ttl %d, want the maximum 30", got)
	}
}

// TestNodeLostIsInfra: a sandbox lost with its node is an infra failure,
// retried on a fresh sandbox; three node losses are an infra error, never
// the script's result (the stopped-during-call rule does not apply), and no
// control script runs.
func TestNodeLostIsInfra(t *testing.T) {
	lost := func() error {
		return &apierr.Error{Code: client.CodeSandboxNotRunning, Message: "sandbox sb-a was lost with its node",
			Err: fmt.Errorf("%w: node n1 lost (its lease expired)", apierr.ErrNodeLost)}
	}
	f := &flaky{execErrs: []error{lost()}}
	out, err := newRunner(f).Run(t.Context(), "t1", spec)
	if err != nil {
		t.Fatal(err)
	}
	if out.Attempts != 2 || out.Result.Status != client.StatusExited || out.Sandbox.ID != "sb-b" {
		t.Fatalf("outcome %+v, want the second sandbox's result", out)
	}

	f = &flaky{execErrs: []error{lost(), lost(), lost(), lost()}}
	out, err = newRunner(f).Run(t.Context(), "t1", spec)
	if err != nil {
		t.Fatal(err)
	}
	if out.Result.Status != client.StatusError || !strings.Contains(out.Result.Error, "lost") || len(f.created) != 3 {
		t.Fatalf("outcome %+v, created %v: want an infra error after 3 sandboxes, no control", out, f.created)
	}
}

// TestFilesStdinFetch: the spec's files go in before the run (relative
// ones under Cwd), the run gets Cwd and Stdin, and the files asked for come
// back; a missing one or a directory is left out.
func TestFilesStdinFetch(t *testing.T) {
	f := &flaky{}
	r := New(f, nil)
	in := "input"
	out, err := r.Run(context.Background(), "team", Spec{Template: "python", Path: "code.py", Script: "print(1)", Argv: []string{"python3", "code.py"},
		Cwd: "/w", Stdin: &in, Files: map[string][]byte{"data/in.txt": []byte("x"), "/abs.txt": []byte("y")},
		Fetch: []string{"data/in.txt", "/abs.txt", "missing", "dir"}})
	if err != nil {
		t.Fatal(err)
	}
	if f.files["/w/code.py"] != "print(1)" || f.files["/w/data/in.txt"] != "x" || f.files["/abs.txt"] != "y" {
		t.Errorf("written %v", f.files)
	}
	if f.lastExec.Cwd != "/w" || f.lastExec.Stdin == nil || *f.lastExec.Stdin != "input" {
		t.Errorf("exec %+v", f.lastExec)
	}
	if len(out.Files) != 2 || string(out.Files["data/in.txt"]) != "x" || string(out.Files["/abs.txt"]) != "y" {
		t.Errorf("fetched %q", out.Files)
	}
}

// TestFetchBounds: a fetched file past MaxFetchBytes, or past
// MaxFetchTotalBytes in all, is left out; a name asked for twice is read
// once.
func TestFetchBounds(t *testing.T) {
	f := &flaky{files: map[string]string{}}
	big := strings.Repeat("x", 15<<20)
	names := []string{"/a", "/b", "/c", "/d", "/e", "/a"}
	for _, n := range names[:5] {
		f.files[n] = big
	}
	f.files["/huge"] = strings.Repeat("y", MaxFetchBytes+1)
	got, err := ReadFiles(context.Background(), f, "team", "sb", "", append(names, "/huge"), nil)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, b := range got.Files {
		total += len(b)
	}
	if len(got.Files) != 4 || total > MaxFetchTotalBytes || got.Files["/huge"] != nil || got.Files["/e"] != nil {
		t.Errorf("fetched %d files, %d bytes", len(got.Files), total)
	}
	if !slices.Equal(got.Skipped, []string{"/e", "/huge"}) {
		t.Errorf("skipped %q, want /e and /huge", got.Skipped)
	}

	// A budget holds what it can: the files that fit are read and stay
	// reserved, the next is skipped.
	budget := outbuf.NewBudget(32 << 20)
	got, err = ReadFiles(context.Background(), f, "team", "sb", "", names, budget)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Files) != 2 || budget.Used() != int64(len(big))*2 || !slices.Equal(got.Skipped, []string{"/c", "/d", "/e"}) {
		t.Errorf("with a 32 MiB budget: fetched %d, budget used %d, skipped %q", len(got.Files), budget.Used(), got.Skipped)
	}
}

// TestFetchErrorAfterTheRun: a file that cannot be read back after the
// run does not make the trial an infra failure that runs the code again:
// the result stands, with the error beside it.
func TestFetchErrorAfterTheRun(t *testing.T) {
	f := &flaky{files: map[string]string{"/w/out.txt": "done"}}
	r := New(f, nil)
	out, err := r.Run(context.Background(), "team", Spec{Template: "python", Script: "print(1)", Path: "code.py", Argv: []string{"python3", "code.py"},
		Cwd: "/w", Fetch: []string{"out.txt", "broken"}})
	if err != nil {
		t.Fatal(err)
	}
	if out.Attempts != 1 || len(f.created) != 1 {
		t.Errorf("%d attempts, %d sandboxes: the code ran again for its files", out.Attempts, len(f.created))
	}
	if out.FetchErr == nil || !strings.Contains(out.FetchErr.Error(), "broken") {
		t.Errorf("FetchErr %v", out.FetchErr)
	}
	if out.Result.Status != client.StatusExited || string(out.Files["out.txt"]) != "done" {
		t.Errorf("result %+v, files %q", out.Result, out.Files)
	}
}

// compiled is a trial of a compiled program: Prepare compiles, Argv runs.
var compiled = Spec{Template: "polyglot", Script: "int main(){}", Path: "main.cpp", Cwd: "/w",
	Prepare: []string{"g++", "-o", "main", "main.cpp"}, PrepareTimeout: 30, Argv: []string{"./main"}, Timeout: 2,
	Env: map[string]string{"K": "v"}}

// TestPrepare: Prepare runs in the same sandbox before Argv, with Cwd and
// Env but no stdin and its own timeout; its output is its own (buffered
// into Outcome.Prepare, or through PrepareOutput, which may be Output
// itself: it is called again before the run); the sandbox lives for both.
func TestPrepare(t *testing.T) {
	f := &flaky{}
	in := "input"
	sp := compiled
	sp.Stdin = &in
	out, err := newRunner(f).Run(t.Context(), "t1", sp)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.execs) != 2 || len(f.created) != 1 {
		t.Fatalf("execs %+v in %v, want the compile then the run in one sandbox", f.execs, f.created)
	}
	c, r := f.execs[0], f.execs[1]
	if strings.Join(c.Argv, " ") != "g++ -o main main.cpp" || c.Timeout != 30 || c.Stdin != nil || c.Cwd != "/w" || c.Env["K"] != "v" {
		t.Errorf("compile %+v", c)
	}
	if strings.Join(r.Argv, " ") != "./main" || r.Timeout != 2 || r.Stdin == nil || r.Cwd != "/w" || r.Env["K"] != "v" {
		t.Errorf("run %+v", r)
	}
	if out.PrepareFailed || out.Prepare == nil || out.Prepare.Stdout != "g++ -o main main.cpp" || out.Result.Stdout != "./main" {
		t.Errorf("outcome %+v, prepare %+v", out, out.Prepare)
	}
	if f.lastCreate.Timeout != 30+2+60 {
		t.Errorf("sandbox TTL %d, want the compile's and the run's timeouts and a minute", f.lastCreate.Timeout)
	}

	// One pair of writers for both: reset before each command.
	var calls int
	var buf strings.Builder
	sp.Output = func() (io.Writer, io.Writer) { calls++; buf.Reset(); return &buf, io.Discard }
	sp.PrepareOutput = sp.Output
	f = &flaky{}
	if out, err = newRunner(f).Run(t.Context(), "t1", sp); err != nil {
		t.Fatal(err)
	}
	if calls != 2 || buf.String() != "./main" || out.Prepare.Stdout != "" {
		t.Errorf("%d calls, output %q, prepare %+v", calls, buf.String(), out.Prepare)
	}
}

// TestPrepareFails: a compile that exits non-zero is the trial's result,
// not retried, and the program never runs; a compile whose sandbox dies is
// an infra failure, retried in a fresh sandbox with both steps.
func TestPrepareFails(t *testing.T) {
	f := &flaky{exits: map[string]int{"g++": 1}}
	out, err := newRunner(f).Run(t.Context(), "t1", compiled)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.execs) != 1 || out.Attempts != 1 || !out.PrepareFailed || out.Result.ExitCode != 1 || out.Result.Stderr != "error: g++" ||
		out.Prepare == nil || out.Phases.Run != 0 || len(f.deleted) != 1 {
		t.Fatalf("outcome %+v, execs %+v, deleted %v", out, f.execs, f.deleted)
	}

	died := &apierr.Error{Code: client.CodeSandboxNotRunning, Message: "died"}
	f = &flaky{execErrs: []error{died}}
	if out, err = newRunner(f).Run(t.Context(), "t1", compiled); err != nil {
		t.Fatal(err)
	}
	if out.Attempts != 2 || len(f.execs) != 3 || out.PrepareFailed || out.Result.Stdout != "./main" || len(f.deleted) != 2 {
		t.Fatalf("outcome %+v, execs %+v", out, f.execs)
	}
}
