package e2e

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/instance"
	"github.com/evalbox/evalbox/pkg/client"
)

// TestServerLimitsAndShutdown runs a server with small limits: uploads past
// the maximum get 413 and leave no file, TTLs are bounded by the flags, and
// a graceful shutdown removes every live sandbox.
func TestServerLimitsAndShutdown(t *testing.T) {
	t.Parallel()
	s, err := startServer(serverOptions{args: []string{"--max-file-bytes", "1048576", "--max-timeout", "60", "--default-timeout", "30", "--exec-wait", "0"}})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = s.stop()
		}
	}()
	ctx := ctxT(t, 3*time.Minute)
	var ids []string
	// The server's first gVisor sandboxes, started at once: runsc stacks
	// its shared empty network namespace mount then, and shutdown must
	// still leave no mount.
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := s.admin.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeGVisor})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			ids = append(ids, sb.ID)
			mu.Unlock()
		}()
	}
	wg.Wait()
	for _, rt := range runtimes {
		sb, err := s.admin.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: rt})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
		if ttl := sb.ExpiresAt.Sub(sb.CreatedAt); ttl != 30*time.Second {
			t.Errorf("default TTL %v, want 30s", ttl)
		}
		big := bytes.Repeat([]byte("x"), 2<<20)
		_, err = s.admin.WriteFile(ctx, sb.ID, "/work/big", bytes.NewReader(big), int64(len(big)), 0o644)
		if client.ErrorCode(err) != client.CodePayloadTooLarge {
			t.Errorf("%s: upload with Content-Length past the max: %v", rt, err)
		}
		// Without a length (chunked), the cut comes while streaming.
		_, err = s.admin.WriteFile(ctx, sb.ID, "/work/big", io.MultiReader(bytes.NewReader(big)), -1, 0o644)
		if client.ErrorCode(err) != client.CodePayloadTooLarge {
			t.Errorf("%s: chunked upload past the max: %v", rt, err)
		}
		if _, err := s.admin.StatFile(ctx, sb.ID, "/work/big"); !client.IsNotFound(err) {
			t.Errorf("%s: an oversize upload left a file: %v", rt, err)
		}
		r, err := s.admin.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "ls -A /work"})
		if err != nil || r.Stdout != "" {
			t.Errorf("%s: /work after failed uploads: %+v %v", rt, r, err)
		}
		if _, err := s.admin.SetTimeout(ctx, sb.ID, 61*time.Second); client.ErrorCode(err) != client.CodeBadRequest {
			t.Errorf("timeout past --max-timeout: %v", err)
		}
	}
	if _, err := s.admin.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Timeout: 61}); client.ErrorCode(err) != client.CodeBadRequest {
		t.Errorf("create past --max-timeout: %v", err)
	}
	// With --exec-wait 0, a command over the team's exec limit is refused
	// at once with 429 rate_limited (a running background process holds
	// the one slot).
	tc, _, _ := newTeam(t, s, client.Limits{MaxSandboxes: 1, MaxConcurrentExec: 1})
	tsb, err := tc.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces})
	if err != nil {
		t.Fatal(err)
	}
	ids = append(ids, tsb.ID)
	if _, err := tc.StartProcess(ctx, tsb.ID, client.ExecRequest{Cmd: "sleep 30"}); err != nil {
		t.Fatal(err)
	}
	var apiErr *client.APIError
	if _, err := tc.Exec(ctx, tsb.ID, client.ExecRequest{Cmd: "true"}); !client.IsRateLimited(err) || !asAPIError(err, &apiErr) || apiErr.Status != 429 {
		t.Errorf("exec over the team's exec limit: %v", err)
	}
	// Graceful shutdown with live sandboxes: nothing of them stays.
	stopped = true
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if left := hostLeftovers(s, id); len(left) > 0 {
			t.Errorf("after shutdown, %s left:\n  %s", id, strings.Join(left, "\n  "))
		}
	}
	// Nor does anything of the instance: no mount under its data dir, and
	// no cgroup parent (they are named by a hash of the data dir).
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(mi), s.dataDir) {
		t.Errorf("after shutdown, mounts under %s are left", s.dataDir)
	}
	parents, _ := filepath.Glob("/sys/fs/cgroup/*/evalbox-*-" + instance.ID(s.dataDir))
	if len(parents) > 0 {
		t.Errorf("after shutdown, cgroup parents are left: %v", parents)
	}
}

// TestSecretsStayOutOfLogs checks that env values given at create and exec
// time never reach the server's log, and are never returned by the API.
func TestSecretsStayOutOfLogs(t *testing.T) {
	t.Parallel()
	c := defaultTeam(t)
	const secret = "s3cr3t-value-7f1c2a"
	for _, rt := range runtimes {
		sb := mustCreate(t, c, client.CreateSandboxRequest{Runtime: rt, Env: map[string]string{"API_TOKEN": secret}})
		r := mustExec(t, c, sb.ID, client.ExecRequest{Cmd: `test "$API_TOKEN" = "` + secret + `" && test "$X" = "` + secret + `x" && echo ok`,
			Env: map[string]string{"X": secret + "x"}})
		if r.Stdout != "ok\n" {
			t.Fatalf("%s: env not seen by the process: %+v", rt, r)
		}
		got, err := c.GetSandbox(context.Background(), sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := jsonOf(got)
		if strings.Contains(b, secret) {
			t.Fatalf("the API returned an env value: %s", b)
		}
	}
	logs, err := os.ReadFile(srv.logPath)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(logs, []byte(secret)) {
		t.Fatal("an env value reached the server log")
	}
	// Nor the database.
	db, _ := os.ReadFile(filepath.Join(srv.dataDir, "evalbox.db"))
	wal, _ := os.ReadFile(filepath.Join(srv.dataDir, "evalbox.db-wal"))
	if bytes.Contains(db, []byte(secret)) || bytes.Contains(wal, []byte(secret)) {
		t.Fatal("an env value reached the database")
	}
}

// TestCPULimitApplied reads the sandbox's cgroup on the host.
func TestCPULimitApplied(t *testing.T) {
	t.Parallel()
	c := defaultTeam(t)
	for _, rt := range runtimes {
		sb := mustCreate(t, c, client.CreateSandboxRequest{Runtime: rt, CPU: 0.5, MemoryMB: 200})
		quota := readCgroupFile(t, "cpu", sb.ID, "cpu.cfs_quota_us", "cpu.max")
		if !strings.HasPrefix(quota, "50000") {
			t.Errorf("%s: cpu quota %q, want 50000 (0.5 of a 100000 period)", rt, quota)
		}
		mem := readCgroupFile(t, "memory", sb.ID, "memory.limit_in_bytes", "memory.max")
		if mem == "" || mem == "max" || mem == "9223372036854771712" {
			t.Errorf("%s: no memory limit (%q)", rt, mem)
		}
		// Under host memory pressure, sandboxes go before the server.
		procs := strings.Fields(readCgroupFile(t, "memory", sb.ID, "cgroup.procs"))
		if len(procs) == 0 {
			t.Errorf("%s: no process in the sandbox's cgroup", rt)
		}
		for _, pid := range procs {
			if b, err := os.ReadFile("/proc/" + pid + "/oom_score_adj"); err == nil && strings.TrimSpace(string(b)) != "800" {
				t.Errorf("%s: process %s has oom_score_adj %s, want 800", rt, pid, strings.TrimSpace(string(b)))
			}
		}
	}
}

// readCgroupFile finds the sandbox's cgroup in the v1 hierarchy of
// controller (or the unified one) and reads the first file that exists.
func readCgroupFile(t *testing.T, controller, id string, files ...string) string {
	t.Helper()
	for _, pat := range []string{"/sys/fs/cgroup/" + controller + "/*/" + id, "/sys/fs/cgroup/*/" + id} {
		dirs, _ := filepath.Glob(pat)
		for _, d := range dirs {
			for _, f := range files {
				if b, err := os.ReadFile(filepath.Join(d, f)); err == nil {
					return strings.TrimSpace(string(b))
				}
			}
		}
	}
	t.Fatalf("no cgroup of %s for %s", controller, id)
	return ""
}

// TestDataDirPrivate: the data dir (database, admin key, templates, logs)
// is its owner's alone, even when it existed with a wider mode: the dir
// 0700, the database and its WAL files and the admin key 0600.
func TestDataDirPrivate(t *testing.T) {
	dir, err := os.MkdirTemp("", "evalbox-e2e-datadir-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := startServer(serverOptions{dataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s.stop()
	c, _, _ := newTeam(t, s, client.Limits{MaxSandboxes: 2, MaxConcurrentExec: 2})
	for _, rt := range runtimes {
		sb, err := c.CreateSandbox(ctxT(t, time.Minute), client.CreateSandboxRequest{Template: "base", Runtime: rt})
		if err != nil {
			t.Fatal(err)
		}
		if r, err := c.Exec(ctxT(t, time.Minute), sb.ID, client.ExecRequest{Cmd: "echo ok"}); err != nil || r.Stdout != "ok\n" {
			t.Fatalf("%s sandbox with a private data dir: %+v %v", rt, r, err)
		}
		if err := c.DeleteSandbox(ctxT(t, time.Minute), sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]os.FileMode{".": 0o700, "evalbox.db": 0o600, "evalbox.db-wal": 0o600, "evalbox.db-shm": 0o600, "admin.key": 0o600}
	for name, mode := range want {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if st.Mode().Perm() != mode {
			t.Errorf("%s has mode %v, want %v", name, st.Mode().Perm(), mode)
		}
	}
}
