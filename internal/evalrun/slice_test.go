package evalrun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/pkg/client"
)

// hostSandboxes runs "sandboxes" as host processes, each exec in its own
// pid and mount namespace with the sandbox's directory as /tmp, as root or
// as the exec's user (setpriv). It is the sandbox service's stand-in, so
// that the batch logic, the real harness and real SQLite can be tested
// without a runtime. failHarness makes the first n harness execs fail as
// a lost sandbox would.
type hostSandboxes struct {
	mu          sync.Mutex
	dirs        map[string]string
	meta        map[string]map[string]string // of the sandboxes in dirs
	seq         atomic.Int64
	created     atomic.Int64
	failHarness atomic.Int64
	failAll     atomic.Bool
	// harnessUser runs the harness unprivileged (as a template whose user
	// is not root would).
	harnessUser string
}

func (h *hostSandboxes) Team(context.Context, string) (client.Team, error) {
	return client.Team{Name: "t", Limits: client.Limits{MaxSandboxes: 4, MaxConcurrentExec: 4}}, nil
}

func (h *hostSandboxes) Create(ctx context.Context, teamID string, req client.CreateSandboxRequest) (client.Sandbox, error) {
	dir, err := os.MkdirTemp("", "evalrun-sb-")
	if err != nil {
		return client.Sandbox{}, err
	}
	if err := os.Chmod(dir, 0o1777); err != nil {
		return client.Sandbox{}, err
	}
	id := fmt.Sprintf("sb-%d", h.seq.Add(1))
	h.mu.Lock()
	h.dirs[id] = dir
	if h.meta == nil {
		h.meta = map[string]map[string]string{}
	}
	h.meta[id] = req.Metadata
	h.mu.Unlock()
	h.created.Add(1)
	return client.Sandbox{ID: id, Runtime: "host", TemplateDigest: "sha256:host"}, nil
}

func (h *hostSandboxes) dir(id string) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	d, ok := h.dirs[id]
	if !ok {
		return "", &apierr.Error{Code: client.CodeNotFound, Message: "no sandbox " + id}
	}
	return d, nil
}

func (h *hostSandboxes) WriteFile(ctx context.Context, teamID, id, path, mode string, r io.Reader) (client.FileInfo, error) {
	d, err := h.dir(id)
	if err != nil {
		return client.FileInfo{}, err
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return client.FileInfo{}, err
	}
	return client.FileInfo{}, os.WriteFile(filepath.Join(d, filepath.Base(path)), b, 0o644)
}

func (h *hostSandboxes) OpenFile(ctx context.Context, teamID, id, path string) (client.FileInfo, io.ReadCloser, error) {
	d, err := h.dir(id)
	if err != nil {
		return client.FileInfo{}, nil, err
	}
	f, err := os.Open(filepath.Join(d, filepath.Base(path)))
	if err != nil {
		return client.FileInfo{}, nil, &apierr.Error{Code: client.CodeNotFound, Message: err.Error()}
	}
	return client.FileInfo{Type: client.FileTypeFile}, f, nil
}

func (h *hostSandboxes) Exec(ctx context.Context, teamID, id string, req client.ExecRequest, stdout, stderr io.Writer) (client.ExecResult, error) {
	d, err := h.dir(id)
	if err != nil {
		return client.ExecResult{}, err
	}
	harness := len(req.Argv) > 1 && req.Argv[1] == "-I"
	if harness && h.failHarness.Add(-1) >= 0 || h.failAll.Load() {
		return client.ExecResult{}, &apierr.Error{Code: client.CodeSandboxNotRunning, Message: "sandbox " + id + " died"}
	}
	argv, user := slices.Clone(req.Argv), req.User
	if harness {
		user = h.harnessUser
	}
	// Files land in the sandbox's directory (mounted at /tmp) by name.
	for i, a := range argv {
		if strings.HasPrefix(a, "/.evalbox/") {
			argv[i] = "/tmp/" + path.Base(a)
		}
	}
	if user != "" {
		argv = append([]string{"setpriv", "--reuid", user, "--regid", user, "--clear-groups"}, argv...)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(req.Timeout*float64(time.Second)))
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", append([]string{"--pid", "--fork", "--kill-child", "--mount", "--mount-proc",
		"sh", "-c", `mount --bind "$0" /tmp && cd /tmp && "$@"; exit $?`, d}, argv...)...)
	if req.Stdin != nil {
		cmd.Stdin = strings.NewReader(*req.Stdin)
	}
	// The system python3, which every user may run (not a shim in root's
	// home).
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"}
	var errb strings.Builder
	cmd.Stdout, cmd.Stderr = stdout, io.MultiWriter(stderr, &errb)
	cmd.WaitDelay = time.Second
	err = cmd.Run()
	res := client.ExecResult{Status: client.StatusExited, Stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		res.Status, res.ExitCode = client.StatusTimedOut, -1
	case errors.As(err, &ee):
		res.ExitCode = ee.ExitCode()
	case err != nil:
		return res, err
	}
	return res, nil
}

func (h *hostSandboxes) Delete(ctx context.Context, teamID, id string) error {
	d, err := h.dir(id)
	if err != nil {
		return err
	}
	h.mu.Lock()
	delete(h.dirs, id)
	delete(h.meta, id)
	h.mu.Unlock()
	return os.RemoveAll(d)
}

func (h *hostSandboxes) DeleteByMetadata(ctx context.Context, teamID string, md map[string]string) ([]string, error) {
	h.mu.Lock()
	var ids []string
	for id, m := range h.meta {
		match := true
		for k, v := range md {
			match = match && m[k] == v
		}
		if match {
			ids = append(ids, id)
		}
	}
	h.mu.Unlock()
	for _, id := range ids {
		if err := h.Delete(ctx, teamID, id); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// newHostService is a Service on real SQLite whose sandboxes are host
// processes (skipped where pid namespaces or python3 are missing).
func newHostService(t *testing.T) (*Service, *store.Store, *hostSandboxes, string) {
	t.Helper()
	return newLeasedHostService(t, Leases{})
}

// newLeasedHostService is newHostService with these leases.
func newLeasedHostService(t *testing.T, leases Leases) (*Service, *store.Store, *hostSandboxes, string) {
	t.Helper()
	for _, c := range [][]string{{"unshare", "--pid", "--fork", "--mount", "--mount-proc", "true"}, {"python3", "-c", ""}, {"setpriv", "--reuid", "65534", "true"}} {
		if err := exec.Command(c[0], c[1:]...).Run(); err != nil {
			t.Skipf("%v: %v", c, err)
		}
	}
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	team, err := st.CreateTeam(ctx, client.Team{Name: "a", Limits: client.Limits{MaxSandboxes: 4, MaxConcurrentExec: 4}})
	if err != nil {
		t.Fatal(err)
	}
	h := &hostSandboxes{dirs: map[string]string{}}
	s := New(st, h, nil, nil, leases, nil)
	s.trials.Backoff = time.Millisecond
	s.hostHarness = true
	t.Cleanup(func() {
		s.Close()
		if len(h.dirs) != 0 {
			t.Errorf("sandboxes left: %v", h.dirs)
		}
	})
	return s, st, h, team.ID
}

func waitRun(t *testing.T, s *Service, teamID, id string) (client.EvalRun, []client.EvalResult) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		r, err := s.Get(context.Background(), teamID, id)
		if err != nil {
			t.Fatal(err)
		}
		if r.State != client.EvalStateRunning {
			var rs []client.EvalResult
			if err := s.Results(context.Background(), teamID, id, func(x client.EvalResult) error { rs = append(rs, x); return nil }); err != nil {
				t.Fatal(err)
			}
			return r, rs
		}
		if time.Now().After(deadline) {
			t.Fatalf("run still running: %+v", r)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func batchRequest(bodies ...string) client.CreateEvalRequest {
	req := client.CreateEvalRequest{
		Problems:    []client.EvalProblem{{TaskID: "t", Prompt: "def f():\n", EntryPoint: "f", Test: "def check(c):\n    assert c() == 1\n"}},
		Mode:        client.EvalModeBatch,
		Concurrency: 1,
		Timeout:     5,
	}
	for _, b := range bodies {
		req.Samples = append(req.Samples, client.EvalSample{TaskID: "t", Completion: &b})
	}
	return req
}

// TestBatchRunsAndRecords: one slice, one sandbox, every verdict recorded
// with the slice's sandbox.
func TestBatchRunsAndRecords(t *testing.T) {
	s, st, h, team := newHostService(t)
	run, err := s.Create(context.Background(), team, batchRequest("    return 1\n", "    return 2\n", "    import os\n    return 1 if os.getuid() == 65534 else os.getuid()\n"))
	if err != nil {
		t.Fatal(err)
	}
	got, rs := waitRun(t, s, team, run.ID)
	if got.State != client.EvalStateSucceeded || len(rs) != 3 || rs[0].Status != "passed" || rs[1].Status != "failed" || rs[2].Status != "passed" {
		t.Fatalf("run %+v results %+v", got, rs)
	}
	if n := h.created.Load(); n != 1 {
		t.Errorf("%d sandboxes for one slice", n)
	}
	if env, err := st.EvalEnv(context.Background(), team, run.ID); err != nil || env.SandboxID != "sb-1" || env.Runtime != "host" {
		t.Errorf("env %+v, %v", env, err)
	}
}

// TestBatchLostSandboxRetried: slices whose sandbox is lost are run again,
// then sample by sample; verdicts stay right and none is infra_error.
func TestBatchLostSandboxRetried(t *testing.T) {
	s, _, h, team := newHostService(t)
	h.failHarness.Store(batchAttempts) // every batch attempt fails
	run, err := s.Create(context.Background(), team, batchRequest("    return 1\n", "    return 2\n", "    return 1\n"))
	if err != nil {
		t.Fatal(err)
	}
	got, rs := waitRun(t, s, team, run.ID)
	if got.State != client.EvalStateSucceeded || got.Summary.Counts["passed"] != 2 || got.Summary.Counts["failed"] != 1 || got.Summary.Retries != 2*3 {
		t.Fatalf("run %+v summary %+v results %+v", got, got.Summary, rs)
	}
	// Two batch sandboxes, then one per sample.
	if n := h.created.Load(); n != batchAttempts+3 {
		t.Errorf("%d sandboxes, want %d", n, batchAttempts+3)
	}
}

// TestBatchInfraErrorNeverFailed: when every sandbox fails, the samples
// end as infra_error after the batch attempts and the trials' own retries,
// never as failed.
func TestBatchInfraErrorNeverFailed(t *testing.T) {
	s, _, h, team := newHostService(t)
	h.failAll.Store(true)
	s.trials.Attempts = 2
	run, err := s.Create(context.Background(), team, batchRequest("    return 1\n", "    return 2\n"))
	if err != nil {
		t.Fatal(err)
	}
	got, rs := waitRun(t, s, team, run.ID)
	if got.State != client.EvalStateSucceeded || got.Summary.Counts["infra_error"] != 2 || len(rs) != 2 {
		t.Fatalf("run %+v summary %+v results %+v", got, got.Summary, rs)
	}
	if n := h.created.Load(); n != batchAttempts+2*2 {
		t.Errorf("%d sandboxes, want %d", n, batchAttempts+2*2)
	}
}

// TestBatchHarnessKilled: a sample that kills its harness (possible only
// when the harness runs unprivileged, as the sample) is judged alone in
// trial mode; the samples before it keep their verdicts, the ones after it
// run in a new batch, and none is an infra error. As root the harness
// refuses such a sample (PermissionError) and the slice needs one sandbox.
func TestBatchHarnessKilled(t *testing.T) {
	kill := "    import os, signal\n    os.kill(os.getppid(), signal.SIGKILL)\n    return 1\n"
	req := batchRequest("    return 1\n", kill, "    return 2\n", "    return 1\n")
	t.Run("root harness", func(t *testing.T) {
		s, _, h, team := newHostService(t)
		run, err := s.Create(context.Background(), team, req)
		if err != nil {
			t.Fatal(err)
		}
		got, rs := waitRun(t, s, team, run.ID)
		if got.State != client.EvalStateSucceeded || len(rs) != 4 || rs[1].Status != "failed" || !strings.Contains(rs[1].Detail, "PermissionError") ||
			rs[0].Status != "passed" || rs[2].Status != "failed" || rs[3].Status != "passed" || h.created.Load() != 1 {
			t.Fatalf("run %+v results %+v, %d sandboxes", got, rs, h.created.Load())
		}
	})
	t.Run("unprivileged harness", func(t *testing.T) {
		s, _, h, team := newHostService(t)
		h.harnessUser = sampleUser
		run, err := s.Create(context.Background(), team, req)
		if err != nil {
			t.Fatal(err)
		}
		got, rs := waitRun(t, s, team, run.ID)
		// Alone, in trial mode, the sample's parent is root's (the agent in
		// a sandbox): the kill is refused, as it is in trial mode.
		if got.State != client.EvalStateSucceeded || len(rs) != 4 || rs[0].Status != "passed" || rs[1].Status != "failed" ||
			!strings.Contains(rs[1].Detail, "PermissionError") || rs[2].Status != "failed" || rs[3].Status != "passed" || got.Summary.Retries < 1 {
			t.Fatalf("run %+v summary %+v results %+v", got, got.Summary, rs)
		}
		if n := h.created.Load(); n != 3 {
			t.Errorf("%d sandboxes, want 3 (batch, the killer alone, batch)", n)
		}
	})
}
