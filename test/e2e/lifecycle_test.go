package e2e

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

func TestActiveSandboxLimit(t *testing.T) {
	t.Parallel()
	c, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 2, MaxConcurrentExec: 4})
	ctx := ctxT(t, 3*time.Minute)
	a := mustCreate(t, c, client.CreateSandboxRequest{Runtime: client.RuntimeNamespaces})
	mustCreate(t, c, client.CreateSandboxRequest{Runtime: client.RuntimeNamespaces})
	_, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces})
	var apiErr *client.APIError
	if !client.IsTooManySandboxes(err) || !asAPIError(err, &apiErr) || apiErr.Status != 429 || apiErr.RetryAfter <= 0 {
		t.Fatalf("third create: %v", err)
	}
	// Queued with a deadline that passes: 429 after waiting.
	start := time.Now()
	_, err = c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces, WaitSeconds: 1})
	if !client.IsTooManySandboxes(err) || time.Since(start) < 900*time.Millisecond {
		t.Fatalf("queued create with passing deadline: %v after %v", err, time.Since(start))
	}
	// Queued: admitted when a slot frees.
	done := make(chan *client.Sandbox, 1)
	errc := make(chan error, 1)
	go func() {
		sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces, WaitSeconds: 60})
		if err != nil {
			errc <- err
			return
		}
		done <- sb
	}()
	time.Sleep(300 * time.Millisecond)
	if err := c.DeleteSandbox(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case sb := <-done:
		t.Cleanup(func() { _ = c.DeleteSandbox(context.Background(), sb.ID); assertGone(t, srv, sb.ID) })
	case err := <-errc:
		t.Fatalf("queued create: %v", err)
	case <-ctx.Done():
		t.Fatal("queued create never admitted")
	}
}

func asAPIError(err error, target **client.APIError) bool {
	e, ok := err.(*client.APIError)
	if ok {
		*target = e
	}
	return ok
}

func TestConcurrentExecLimitQueues(t *testing.T) {
	t.Parallel()
	c, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 4, MaxConcurrentExec: 1})
	sb := mustCreate(t, c, client.CreateSandboxRequest{Runtime: client.RuntimeNamespaces})
	var wg sync.WaitGroup
	spans := make([][2]float64, 3)
	for i := range spans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := c.Exec(ctxT(t, time.Minute), sb.ID, client.ExecRequest{Cmd: "date +%s.%N; sleep 0.3; date +%s.%N"})
			if err != nil {
				t.Error(err)
				return
			}
			f := strings.Fields(r.Stdout)
			spans[i][0], _ = strconv.ParseFloat(f[0], 64)
			spans[i][1], _ = strconv.ParseFloat(f[1], 64)
		}()
	}
	wg.Wait()
	sort.Slice(spans, func(i, j int) bool { return spans[i][0] < spans[j][0] })
	for i := 1; i < len(spans); i++ {
		if spans[i][0] < spans[i-1][1] {
			t.Fatalf("execs overlapped with a limit of 1: %v", spans)
		}
	}
	// A background process holds the slot until it ends.
	ctx := ctxT(t, time.Minute)
	if _, err := c.StartProcess(ctx, sb.ID, client.ExecRequest{Cmd: "sleep 0.5; date +%s.%N > /tmp/bg-end"}); err != nil {
		t.Fatal(err)
	}
	r, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "date +%s.%N; cat /tmp/bg-end"})
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(r.Stdout)
	if len(f) != 2 {
		t.Fatalf("the exec ran before the background process ended: %q", r.Stdout)
	}
	started, _ := strconv.ParseFloat(f[0], 64)
	bgEnd, _ := strconv.ParseFloat(f[1], 64)
	if started < bgEnd {
		t.Fatalf("exec started at %f, before the background process ended at %f", started, bgEnd)
	}
}

func TestTTLReaper(t *testing.T) {
	t.Parallel()
	c := defaultTeam(t)
	for _, rt := range runtimes {
		sb := mustCreate(t, c, client.CreateSandboxRequest{Runtime: rt, Timeout: 1})
		deadline := time.Now().Add(30 * time.Second)
		for {
			got, err := c.GetSandbox(context.Background(), sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.State == client.StateExpired {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: still %s after its TTL", rt, got.State)
			}
			time.Sleep(100 * time.Millisecond)
		}
		assertGone(t, srv, sb.ID)
		if _, err := c.Exec(context.Background(), sb.ID, client.ExecRequest{Cmd: "true"}); !client.IsSandboxNotRunning(err) {
			t.Fatalf("exec in expired sandbox: %v", err)
		}
	}
}

func TestBulkDeleteByMetadata(t *testing.T) {
	t.Parallel()
	c := defaultTeam(t)
	a := mustCreate(t, c, client.CreateSandboxRequest{Runtime: client.RuntimeNamespaces, Metadata: map[string]string{"run": "r1"}})
	b := mustCreate(t, c, client.CreateSandboxRequest{Runtime: client.RuntimeGVisor, Metadata: map[string]string{"run": "r1"}})
	keep := mustCreate(t, c, client.CreateSandboxRequest{Runtime: client.RuntimeNamespaces, Metadata: map[string]string{"run": "r2"}})
	deleted, err := c.DeleteSandboxes(ctxT(t, time.Minute), map[string]string{"run": "r1"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{a.ID, b.ID}
	sort.Strings(want)
	if strings.Join(deleted, ",") != strings.Join(want, ",") {
		t.Fatalf("deleted %v, want %v", deleted, want)
	}
	assertGone(t, srv, a.ID)
	assertGone(t, srv, b.ID)
	if got, err := c.GetSandbox(context.Background(), keep.ID); err != nil || got.State != client.StateRunning {
		t.Fatalf("unmatched sandbox: %+v %v", got, err)
	}
}

// TestRestartRecovery kills the server hard with live sandboxes, restarts it
// on the same data dir, and expects them recorded as lost and removed.
func TestRestartRecovery(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s1, err := startServer(serverOptions{dataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, rt := range runtimes {
		sb, err := s1.admin.CreateSandbox(ctxT(t, 2*time.Minute), client.CreateSandboxRequest{Template: "base", Runtime: rt})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	if err := s1.kill(); err != nil {
		t.Fatal(err)
	}
	s2, err := startServer(serverOptions{dataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s2.stop(); err != nil {
			t.Error(err)
		}
	}()
	for _, id := range ids {
		got, err := s2.admin.GetSandbox(context.Background(), id)
		if err != nil || got.State != client.StateLost {
			t.Fatalf("after restart %s = %+v, %v", id, got, err)
		}
		assertGone(t, s2, id)
	}
	// The swept sandboxes hold no host capacity.
	if c, err := s2.admin.Capacity(context.Background()); err != nil || c.Sandboxes != 0 || c.Pids.Reserved != 0 || c.MemoryMB.Reserved != 0 {
		t.Fatalf("capacity after the restart's sweep: %+v, %v", c, err)
	}
	// The admin key survived the restart, and the server works.
	sb, err := s2.admin.CreateSandbox(ctxT(t, 2*time.Minute), client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces})
	if err != nil {
		t.Fatal(err)
	}
	if c, err := s2.admin.Capacity(context.Background()); err != nil || c.Sandboxes != 1 || c.Pids.Reserved != 1024 {
		t.Fatalf("capacity with one namespaces sandbox: %+v, %v", c, err)
	}
	if err := s2.admin.DeleteSandbox(context.Background(), sb.ID); err != nil {
		t.Fatal(err)
	}
	assertGone(t, s2, sb.ID)
	if c, err := s2.admin.Capacity(context.Background()); err != nil || c.Sandboxes != 0 || c.Pids.Reserved != 0 {
		t.Fatalf("capacity after the delete: %+v, %v", c, err)
	}
}

// TestWarmPool checks that creates are served from the pool, and that a
// pooled sandbox is never handed out twice: every trial starts clean.
func TestWarmPool(t *testing.T) {
	t.Parallel()
	s, err := startServer(serverOptions{args: []string{"--pool", "base:namespaces=2,base:gvisor=1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.stop(); err != nil {
			t.Error(err)
		}
	}()
	for _, rt := range runtimes {
		seen := map[string]bool{}
		for i := 0; i < 3; i++ {
			var sb *client.Sandbox
			deadline := time.Now().Add(2 * time.Minute)
			for {
				sb, err = s.admin.CreateSandbox(ctxT(t, 2*time.Minute), client.CreateSandboxRequest{Template: "base", Runtime: rt})
				if err != nil {
					t.Fatal(err)
				}
				if sb.FromPool || time.Now().After(deadline) {
					break
				}
				// The pool was still filling: a cold start served it.
				_ = s.admin.DeleteSandbox(context.Background(), sb.ID)
				time.Sleep(200 * time.Millisecond)
			}
			if !sb.FromPool {
				t.Fatalf("%s: no create was served from the pool", rt)
			}
			if seen[sb.ID] {
				t.Fatalf("%s: sandbox %s handed out twice", rt, sb.ID)
			}
			seen[sb.ID] = true
			r, err := s.admin.Exec(ctxT(t, time.Minute), sb.ID, client.ExecRequest{Cmd: "ls /work; touch /work/dirty"})
			if err != nil || r.Stdout != "" {
				t.Fatalf("%s: pooled sandbox not clean: %+v %v", rt, r, err)
			}
			if err := s.admin.DeleteSandbox(context.Background(), sb.ID); err != nil {
				t.Fatal(err)
			}
			assertGone(t, s, sb.ID)
		}
	}
}

// TestCLI runs the README's sequence with the real binary.
func TestCLI(t *testing.T) {
	t.Parallel()
	_, _, key := newTeam(t, srv, client.Limits{MaxSandboxes: 5, MaxConcurrentExec: 5})
	run := func(stdin string, args ...string) (string, string, int) {
		return runCLI(t, context.Background(), key, stdin, args...)
	}
	out, errs, code := run("", "sandbox", "create", "--template", "base")
	if code != 0 {
		t.Fatalf("create: %d %s", code, errs)
	}
	id := strings.TrimSpace(out)
	t.Cleanup(func() { assertGone(t, srv, id) })
	out, errs, code = run("", "sandbox", "exec", id, "--", "sh", "-c", "echo hi; echo err >&2; exit 3")
	if out != "hi\n" || errs != "err\n" || code != 3 {
		t.Fatalf("exec: %q %q %d", out, errs, code)
	}
	local := filepath.Join(t.TempDir(), "local.txt")
	if err := os.WriteFile(local, []byte("payload\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errs, code = run("", "sandbox", "cp", local, id+":/work/local.txt"); code != 0 {
		t.Fatalf("cp up: %s", errs)
	}
	back := filepath.Join(t.TempDir(), "back.txt")
	if _, errs, code = run("", "sandbox", "cp", id+":/work/local.txt", back); code != 0 {
		t.Fatalf("cp down: %s", errs)
	}
	if b, _ := os.ReadFile(back); string(b) != "payload\n" {
		t.Fatalf("round trip: %q", b)
	}
	if out, errs, code = run("", "sandbox", "ls"); code != 0 || !strings.Contains(out, id) {
		t.Fatalf("ls: %d %q %q", code, out, errs)
	}
	if out, _, code = run("", "sandbox", "ls", "--json"); code != 0 || !strings.Contains(out, `"id": "`+id+`"`) && !strings.Contains(out, `"id":"`+id+`"`) {
		t.Fatalf("ls --json: %q", out)
	}
	out, _, code = run("", "sandbox", "exec", id, "--timeout", "1", "--", "sleep", "30")
	if code != 124 {
		t.Fatalf("timed out exec exit code %d", code)
	}
	// Port URLs: the host form (the suite's server has a sandbox domain),
	// or the path form.
	if out, errs, code = run("", "sandbox", "port", id, "8000"); code != 0 || strings.TrimSpace(out) != client.New(srv.url, key).HostPortURL(id, 8000, sandboxDomain) {
		t.Errorf("port: %d %q %q", code, out, errs)
	}
	if out, _, code = run("", "sandbox", "port", id, "8000", "--path"); code != 0 || strings.TrimSpace(out) != srv.url+"/v1/sandboxes/"+id+"/ports/8000/" {
		t.Errorf("port --path: %d %q", code, out)
	}
	if _, errs, code = run("", "sandbox", "port", id, "0"); code != 2 || !strings.Contains(errs, "PORT") {
		t.Errorf("port 0: %d %q", code, errs)
	}
	// Network: none cannot be opened (one line, exit 1); a rules sandbox
	// changes live.
	if _, errs, code = run("", "sandbox", "network", id, "--allow", "pypi.org"); code != 1 || !strings.Contains(errs, "conflict") || strings.Count(strings.TrimSpace(errs), "\n") != 0 {
		t.Errorf("network of a none sandbox: %d %q", code, errs)
	}
	out, errs, code = run("", "sandbox", "create", "--allow", "pypi.org", "--deny", "10.0.0.0/8")
	if code != 0 {
		t.Fatalf("create with rules: %s", errs)
	}
	rid := strings.TrimSpace(out)
	t.Cleanup(func() { run("", "sandbox", "rm", rid) })
	if out, errs, code = run("", "sandbox", "network", rid); code != 0 || out != "mode:  rules\nallow: pypi.org\ndeny:  10.0.0.0/8\n" {
		t.Errorf("network: %d %q %q", code, out, errs)
	}
	if out, errs, code = run("", "sandbox", "network", rid, "--allow", "*.pythonhosted.org", "--allow", "pypi.org"); code != 0 || !strings.Contains(out, "allow: *.pythonhosted.org pypi.org\n") {
		t.Errorf("network update: %d %q %q", code, out, errs)
	}
	if _, errs, code = run("", "sandbox", "network", rid, "--allow", "10.0.0.0/33"); code != 1 || !strings.Contains(errs, `network.allow[0]: "10.0.0.0/33"`) {
		t.Errorf("bad rule: %d %q", code, errs)
	}
	if out, _, code = run("", "sandbox", "network", rid, "--mode", "outbound"); code != 0 || out != "mode:  outbound\n" {
		t.Errorf("to outbound: %d %q", code, out)
	}
	if _, errs, code = run("", "sandbox", "rm", id); code != 0 {
		t.Fatalf("rm: %s", errs)
	}
	_, errs, code = run("", "sandbox", "exec", "sb-nope", "--", "true")
	if code == 0 || strings.Count(strings.TrimSpace(errs), "\n") != 0 || !strings.Contains(errs, "not_found") {
		t.Fatalf("error line: %d %q", code, errs)
	}
}
