package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// The figures of TestHostCapacityForkBombs: bombs fork bombs, half on each
// runtime, across two teams, on a server whose sandboxes have bombPids
// pids each (gVisor: plus the Sentry's 256 on the host) and whose host
// budget takes exactly them, one more namespaces sandbox and a remainder
// too small for another.
const (
	bombs       = 32
	bombPids    = 512
	gvisorExtra = 256 // internal/runtime/gvisor sentryTasks
	remainder   = 256
	// hostPids is the --host-pids of the server: 16 namespaces sandboxes
	// (512 each), 16 gVisor ones (768) and a 33rd (namespaces, 512).
	hostPids = bombs/2*bombPids + bombs/2*(bombPids+gvisorExtra) + bombPids + remainder
)

// TestHostCapacityForkBombs runs fork bombs in 32 sandboxes of two teams
// at once, on a server whose host pids budget (--host-pids) they fill.
// The host admits no more pids limits than its budget, so while every
// bomb runs: the host has free pids and can fork, the sandboxes' tasks stay
// within the budget, a new sandbox admitted into the rest still starts and
// runs a command, a create past the budget is answered 503
// insufficient_capacity at once (or, with wait_seconds, once a sandbox is
// deleted), and at the end nothing is left, nor reserved. It loads the
// whole host, so it does not run in parallel with other tests.
func TestHostCapacityForkBombs(t *testing.T) {
	s, err := startServer(serverOptions{args: []string{"--pids", strconv.Itoa(bombPids),
		"--host-pids", strconv.Itoa(hostPids), "--max-sandboxes", "20"}})
	if err != nil {
		t.Fatal(err)
	}
	stopOnCleanup(t, s)
	teamA, _, _ := newTeam(t, s, client.Limits{MaxSandboxes: 20, MaxConcurrentExec: 20})
	teamB, _, _ := newTeam(t, s, client.Limits{MaxSandboxes: 20, MaxConcurrentExec: 20})
	ctx := ctxT(t, 10*time.Minute)

	capacity := func() *client.Capacity {
		t.Helper()
		c, err := s.admin.Capacity(ctx)
		if err != nil {
			t.Fatalf("capacity: %v", err)
		}
		return c
	}
	if c := capacity(); c.Pids.Budget != hostPids || c.Pids.Reserved != 0 {
		t.Fatalf("capacity of the fresh server: %+v", c)
	}

	// 32 sandboxes: each team 8 namespaces and 8 gVisor ones.
	type bombed struct {
		c  *client.Client
		sb *client.Sandbox
	}
	var (
		mu  sync.Mutex
		all []bombed
		wg  sync.WaitGroup
		sem = make(chan struct{}, 8)
	)
	for i := range bombs {
		c, rt := teamA, client.RuntimeNamespaces
		if i%2 == 1 {
			c = teamB
		}
		if i%4 >= 2 {
			rt = client.RuntimeGVisor
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			sb := mustCreateOnAsync(t, s, c, client.CreateSandboxRequest{Runtime: rt, Timeout: 1800})
			if sb != nil {
				mu.Lock()
				all = append(all, bombed{c, sb})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("%d sandboxes created", len(all))
	want := bombs/2*bombPids + bombs/2*(bombPids+gvisorExtra)
	if c := capacity(); c.Pids.Reserved != want || c.Sandboxes != bombs {
		t.Fatalf("32 sandboxes reserve %d pids (%d sandboxes), want %d", c.Pids.Reserved, c.Sandboxes, want)
	}
	// Their host cgroups' limits are what was reserved.
	limits := 0
	for _, b := range all {
		limits += cgroupPids(t, b.sb.ID, "pids.max")
	}
	if limits != want {
		t.Fatalf("the sandboxes' pids.max add up to %d, the reservations to %d", limits, want)
	}

	// Each process of the bomb forks two copies of itself, then blocks
	// reading a pipe nobody writes to: the tree grows exponentially until
	// fork fails (EAGAIN at the sandbox's limit) and then holds every pid
	// it got, asleep — the worst case for the host's pids. The classic
	// `bomb | bomb &` also churns, its processes exiting and forking
	// again, which with 16,000 of them only measures the scheduler of a
	// shared 2-core machine (the sandboxes' CPU limits have their own
	// test, TestCPULimitApplied).
	const bomb = "exec 3< <(exec sleep 100000); bomb() { bomb & bomb & read -r -u 3; }; bomb"
	baseline := hostTasks(t)
	for _, b := range all {
		if _, err := b.c.StartProcess(ctx, b.sb.ID, client.ExecRequest{Argv: []string{"bash", "-c", bomb}}); err != nil {
			t.Fatalf("start the bomb in %s: %v", b.sb.ID, err)
		}
	}
	// Until every namespaces bomb is at its sandbox's limit (a gVisor
	// bomb meets its guest limit first: a quarter of Pids, in the Sentry).
	deadline := time.Now().Add(3 * time.Minute)
	for {
		full := 0
		for _, b := range all {
			cur, ok := readCgroupPids(b.sb.ID, "pids.current")
			if !ok {
				got, err := b.c.GetSandbox(ctx, b.sb.ID)
				t.Fatalf("%s sandbox %s with a fork bomb is gone: %+v %v", b.sb.Runtime, b.sb.ID, got, err)
			}
			if (b.sb.Runtime == client.RuntimeNamespaces && cur >= bombPids*9/10) ||
				(b.sb.Runtime == client.RuntimeGVisor && cur >= bombPids/4) {
				full++
			}
		}
		if full == bombs {
			t.Logf("every bomb fills its sandbox")
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 3 minutes only %d of %d bombs fill their sandboxes", full, bombs)
		}
		time.Sleep(time.Second)
	}

	// While they all run: the sandboxes' tasks are within the budget, the
	// host has free pids, and it can fork.
	tasks := 0
	for _, b := range all {
		tasks += cgroupPids(t, b.sb.ID, "pids.current")
	}
	pidMax := readInt(t, "/proc/sys/kernel/pid_max")
	during := hostTasks(t)
	t.Logf("bombs hold %d host tasks (budget %d); host tasks %d before, %d during; pid_max %d", tasks, hostPids, baseline, during, pidMax)
	if tasks > hostPids {
		t.Errorf("the bombs hold %d host tasks, past the budget of %d", tasks, hostPids)
	}
	if free := pidMax - during; free < 1024 {
		t.Errorf("the host has %d free pids of %d while the bombs run", free, pidMax)
	}
	for i := range 20 {
		if err := exec.Command("/bin/true").Run(); err != nil {
			t.Fatalf("the host cannot fork (run %d of /bin/true): %v", i, err)
		}
	}

	// A 33rd sandbox fits the rest of the budget: it starts and runs a
	// command while the bombs run.
	extra := mustCreateOn(t, s, teamA, client.CreateSandboxRequest{Runtime: client.RuntimeNamespaces})
	if r := mustExecOn(t, teamA, extra.ID, "echo ok"); r.Stdout != "ok\n" || r.ExitCode != 0 {
		t.Fatalf("new sandbox beside the bombs: %+v", r)
	}
	if c := capacity(); c.Pids.Reserved != hostPids-remainder || c.Pids.Free != remainder {
		t.Fatalf("after the 33rd sandbox: %+v (a bombed sandbox was lost?)", c.Pids)
	}

	// A 34th does not fit: 503 insufficient_capacity at once, nothing made
	// (team B is far below its own limit of 20).
	start := time.Now()
	_, err = teamB.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces})
	var apiErr *client.APIError
	if !client.IsInsufficientCapacity(err) || !errors.As(err, &apiErr) || apiErr.Status != 503 || apiErr.RetryAfter <= 0 ||
		!strings.Contains(apiErr.Message, "not enough host pids") || !strings.Contains(apiErr.Message, fmt.Sprintf("of the node's %d are reserved", hostPids)) {
		t.Fatalf("create past the host budget: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("the 503 took %s", d)
	}
	// With wait_seconds it queues, and gets in once a sandbox is deleted.
	type created struct {
		sb  *client.Sandbox
		err error
		d   time.Duration
	}
	done := make(chan created, 1)
	go func() {
		start := time.Now()
		sb, err := teamB.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces, WaitSeconds: 120})
		done <- created{sb, err, time.Since(start)}
	}()
	waitUntil(t, time.Minute, func() bool { return capacity().Waiting == 1 })
	select {
	case r := <-done:
		t.Fatalf("the waiting create returned before any delete: %+v", r)
	case <-time.After(time.Second):
	}
	var victim bombed
	for _, b := range all {
		if b.sb.Runtime == client.RuntimeNamespaces {
			victim = b
			break
		}
	}
	if err := victim.c.DeleteSandbox(ctx, victim.sb.ID); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("waiting create after a delete: %v", r.err)
	}
	t.Logf("the waiting create got in after %s", r.d)
	if res := mustExecOn(t, teamB, r.sb.ID, "echo queued"); res.Stdout != "queued\n" {
		t.Fatalf("queued sandbox: %+v", res)
	}

	// Everything goes: nothing of any sandbox stays, nor any reservation.
	ids := []string{extra.ID, r.sb.ID, victim.sb.ID}
	_ = teamB.DeleteSandbox(ctx, r.sb.ID)
	_ = teamA.DeleteSandbox(ctx, extra.ID)
	for _, b := range all {
		if err := b.c.DeleteSandbox(ctx, b.sb.ID); err != nil {
			t.Errorf("delete %s: %v", b.sb.ID, err)
		}
		ids = append(ids, b.sb.ID)
	}
	for _, id := range ids {
		assertGone(t, s, id)
	}
	if c := capacity(); c.Pids.Reserved != 0 || c.MemoryMB.Reserved != 0 || c.Sandboxes != 0 || c.Waiting != 0 {
		t.Fatalf("after every delete: %+v", c)
	}
}

// TestHostCapacityDefaults fills a server with default flags with idle
// namespaces sandboxes of two teams (each below its own limit) until the
// host refuses one: the pids limits admitted never add up past
// min(kernel.pid_max, kernel.threads-max) less the default reserve
// (max(4096, 1/8)), so fork bombs in all of them would leave the host that
// reserve. (Before host admission, two teams' 20 sandboxes each — 40 of
// 1024 pids — were admitted on a host whose pid_max is 32768.)
func TestHostCapacityDefaults(t *testing.T) {
	t.Parallel()
	hostLimit := min(readInt(t, "/proc/sys/kernel/pid_max"), readInt(t, "/proc/sys/kernel/threads-max"))
	budget := hostLimit - max(4096, hostLimit/8)
	fit := budget / 1024 // sandbox.DefaultPids
	if fit > 60 {
		t.Skipf("%d default sandboxes fit this host (pid_max %d): too many to fill in a test", fit, hostLimit)
	}
	s, err := startServer(serverOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.stop(); err != nil {
			t.Error(err)
		}
	})
	teams := [2]*client.Client{}
	for i := range teams {
		teams[i], _, _ = newTeam(t, s, client.Limits{MaxSandboxes: fit + 1, MaxConcurrentExec: 4})
	}
	ctx := ctxT(t, 10*time.Minute)
	var ids []string
	for i := 0; i <= fit; i++ {
		c := teams[i%2]
		sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces})
		if err != nil {
			if i < fit || !client.IsInsufficientCapacity(err) {
				t.Fatalf("sandbox %d of %d that fit: %v", i+1, fit, err)
			}
			break
		}
		t.Cleanup(func() {
			_ = c.DeleteSandbox(context.Background(), sb.ID)
			assertGone(t, s, sb.ID)
		})
		ids = append(ids, sb.ID)
		limits := 0
		for _, id := range ids {
			limits += cgroupPids(t, id, "pids.max")
		}
		if limits > budget {
			t.Fatalf("%d sandboxes admitted, whose pids limits add up to %d, past the host budget %d (kernel limit %d less the reserve)",
				len(ids), limits, budget, hostLimit)
		}
	}
	if len(ids) != fit {
		t.Fatalf("%d default sandboxes admitted, want %d", len(ids), fit)
	}
}

// TestHostCapacityMemory runs a server whose host memory reserve is all
// but 64 MiB of the host's: its memory budget is tiny and MemAvailable is
// below the reserve, so no sandbox starts and each refusal says why; the
// warm pool waits (and says so once) instead of spinning.
func TestHostCapacityMemory(t *testing.T) {
	t.Parallel()
	total := meminfoMB(t, "MemTotal")
	s, err := startServer(serverOptions{args: []string{"--host-reserve-memory-mb", strconv.Itoa(total - 64), "--pool", "base:namespaces=1"}})
	if err != nil {
		t.Fatal(err)
	}
	stopOnCleanup(t, s)
	ctx := ctxT(t, 5*time.Minute)
	c, _, _ := newTeam(t, s, client.Limits{MaxSandboxes: 5, MaxConcurrentExec: 5})

	// A gVisor sandbox's memory limit (512 + 1024 disk + the Sentry's) is
	// more than the whole budget: refused at once, even with a wait.
	start := time.Now()
	_, err = c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeGVisor, WaitSeconds: 30})
	if !client.IsInsufficientCapacity(err) || !strings.Contains(err.Error(), "more than the node's whole memory budget") || time.Since(start) > 5*time.Second {
		t.Fatalf("a sandbox above the memory budget: %v after %s", err, time.Since(start))
	}
	// A small one fits the budget, but the host is short of memory.
	_, err = c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces, MemoryMB: 32})
	if !client.IsInsufficientCapacity(err) || !strings.Contains(err.Error(), "the host is short of memory") {
		t.Fatalf("a sandbox on a host short of memory: %v", err)
	}
	// Waiting for memory that does not come: 503 once the wait is over.
	start = time.Now()
	_, err = c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces, MemoryMB: 32, WaitSeconds: 2})
	if d := time.Since(start); !client.IsInsufficientCapacity(err) || !strings.Contains(err.Error(), "waited") || d < 2*time.Second || d > 10*time.Second {
		t.Fatalf("a waiting create on a host short of memory: %v after %s", err, d)
	}
	// Nothing was made, and the pool waits: it said so once in 3 s.
	time.Sleep(3 * time.Second)
	if l, err := c.ListSandboxes(ctx, client.ListOptions{All: true}); err != nil || len(l) != 0 {
		t.Fatalf("sandboxes after refused creates: %v %v", l, err)
	}
	pools, err := s.admin.ListPools(ctx)
	if err != nil || len(pools) != 1 || pools[0].Ready != 0 {
		t.Fatalf("pools: %+v %v", pools, err)
	}
	log, _ := os.ReadFile(s.logPath)
	if n := strings.Count(string(log), "warm pool waits for host capacity"); n != 1 {
		t.Fatalf("the pool logged its wait %d times, want once", n)
	}
	if cp, err := s.admin.Capacity(ctx); err != nil || cp.Sandboxes != 0 || cp.Pids.Reserved != 0 || cp.MemoryMB.Reserved != 0 ||
		cp.MemoryReserveMB != total-64 || cp.MemoryAvailableMB <= 0 || cp.MemoryAvailableMB >= cp.MemoryReserveMB {
		t.Fatalf("capacity: %+v %v", cp, err)
	}
}

// mustCreateOnAsync is mustCreateOn for goroutines: it reports a failure
// with Errorf and returns nil.
func mustCreateOnAsync(t *testing.T, s *server, c *client.Client, req client.CreateSandboxRequest) *client.Sandbox {
	req.Template = "base"
	sb, err := c.CreateSandbox(ctxT(t, 3*time.Minute), req)
	if err != nil {
		t.Errorf("create sandbox %+v: %v", req, err)
		return nil
	}
	t.Cleanup(func() {
		if err := c.DeleteSandbox(context.Background(), sb.ID); err != nil && !client.IsNotFound(err) {
			t.Errorf("delete %s: %v", sb.ID, err)
		}
		assertGone(t, s, sb.ID)
	})
	return sb
}

func mustExecOn(t *testing.T, c *client.Client, id, cmd string) *client.ExecResult {
	t.Helper()
	return mustExec(t, c, id, client.ExecRequest{Cmd: cmd, Timeout: 30})
}

// cgroupPids reads a pids controller file (pids.max, pids.current) of a
// sandbox's host cgroup: cgroup v1 (pids/<parent>/<id>) or v2
// (<parent>/<id>).
func cgroupPids(t *testing.T, id, file string) int {
	t.Helper()
	n, ok := readCgroupPids(id, file)
	if !ok {
		t.Fatalf("no %s for sandbox %s", file, id)
	}
	return n
}

func readCgroupPids(id, file string) (int, bool) {
	for _, pat := range []string{"/sys/fs/cgroup/pids/*/" + id + "/" + file, "/sys/fs/cgroup/*/" + id + "/" + file} {
		m, _ := filepath.Glob(pat)
		if len(m) != 1 {
			continue
		}
		b, err := os.ReadFile(m[0])
		if err != nil {
			return 0, false
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		return n, err == nil
	}
	return 0, false
}

// hostTasks is the number of tasks on the host (the 4th field of
// /proc/loadavg: running/total).
func hostTasks(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	_, total, ok := strings.Cut(f[3], "/")
	n, err := strconv.Atoi(total)
	if !ok || err != nil {
		t.Fatalf("/proc/loadavg: %q", b)
	}
	return n
}

func readInt(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return n
}

func meminfoMB(t *testing.T, field string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if k, v, ok := strings.Cut(line, ":"); ok && k == field {
			kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			if err != nil {
				t.Fatalf("meminfo %s: %q", field, v)
			}
			return kb >> 10
		}
	}
	t.Fatalf("no %s in /proc/meminfo", field)
	return 0
}

func waitUntil(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met in %s", d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stopOnCleanup stops s at the end of t, after logging the end of its log
// when t failed.
func stopOnCleanup(t *testing.T, s *server) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("server log:\n%s", tail(s.logPath, 60))
		}
		if err := s.stop(); err != nil {
			t.Error(err)
		}
	})
}
