package cgroups

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("cgroup tests need root")
	}
}

// testParent returns a parent name unique to this test run and removes the
// parent directories at the end.
func testParent(t *testing.T) string {
	return fmt.Sprintf("evalbox-test-%d-%s", os.Getpid(), strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")))
}

func cleanupManager(t *testing.T, m *Manager) {
	t.Cleanup(func() {
		for _, d := range slices.Concat(m.dirs, m.others) {
			if err := unix.Rmdir(d); err != nil && !errors.Is(err, unix.ENOENT) {
				t.Errorf("remove test parent %s: %v", d, err)
			}
		}
	})
}

func newTestManager(t *testing.T) *Manager {
	t.Helper()
	requireRoot(t)
	m, err := New(testParent(t))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	cleanupManager(t, m)
	return m
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// startBlocked starts sh running script after a line arrives on its stdin,
// so the caller can place it in a cgroup before it does anything.
func startBlocked(t *testing.T, attr *syscall.SysProcAttr, script string) (*exec.Cmd, io.WriteCloser) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", "read go; "+script)
	cmd.SysProcAttr = attr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd, in
}

func readInt(t *testing.T, path string) int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.Fields(string(b))[0], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestLifecycle(t *testing.T) {
	m := newTestManager(t)
	ctx := ctxT(t)
	const id = "life-1"
	c, err := m.Create(id, Limits{CPU: 0.5, MemoryBytes: 64 << 20, Pids: 16})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if _, err := m.Create(id, Limits{}); !errors.Is(err, ErrExist) {
		t.Fatalf("second Create: got %v, want ErrExist", err)
	}
	if !m.Exists(id) {
		t.Fatal("Exists = false after Create")
	}
	ids, err := m.List()
	if err != nil || !slices.Equal(ids, []string{id}) {
		t.Fatalf("List = %v, %v", ids, err)
	}

	// Limits landed in the files.
	switch m.Version() {
	case V1:
		if q := readInt(t, filepath.Join(c.dir("cpu"), "cpu.cfs_quota_us")); q != 50000 {
			t.Errorf("cfs_quota_us = %d", q)
		}
		if v := readInt(t, filepath.Join(c.dir("memory"), "memory.limit_in_bytes")); v != 64<<20 {
			t.Errorf("memory.limit_in_bytes = %d", v)
		}
		if p := filepath.Join(c.dir("memory"), "memory.memsw.limit_in_bytes"); fileExists(p) {
			if v := readInt(t, p); v != 64<<20 {
				t.Errorf("memsw = %d", v)
			}
		}
	case V2:
		if q := readInt(t, filepath.Join(c.dirs[0], "cpu.max")); q != 50000 {
			t.Errorf("cpu.max quota = %d", q)
		}
		if v := readInt(t, filepath.Join(c.dirs[0], "memory.max")); v != 64<<20 {
			t.Errorf("memory.max = %d", v)
		}
	}
	if v := readInt(t, filepath.Join(c.dir("pids"), "pids.max")); v != 16 {
		t.Errorf("pids.max = %d", v)
	}

	// A process joins before it runs, and its children follow it.
	attr := &syscall.SysProcAttr{}
	inside, release, err := c.PrepareClone(attr)
	if err != nil {
		t.Fatal(err)
	}
	cmd, in := startBlocked(t, attr, "sleep 100 & sleep 100 & wait")
	release()
	if !inside {
		if err := c.AddProc(cmd.Process.Pid); err != nil {
			t.Fatalf("AddProc: %v", err)
		}
	}
	io.WriteString(in, "go\n")
	waitFor(t, func() bool {
		pids, _ := c.Procs()
		return len(pids) == 3
	}, "3 processes in the cgroup")
	pids, _ := c.Procs()
	if !slices.Contains(pids, cmd.Process.Pid) {
		t.Fatalf("Procs = %v, want to contain %d", pids, cmd.Process.Pid)
	}
	if n, err := c.MemoryUsage(); err != nil || n <= 0 {
		t.Fatalf("MemoryUsage = %d, %v", n, err)
	}

	if err := c.KillAll(ctx); err != nil {
		t.Fatalf("KillAll: %v", err)
	}
	if pids, err := c.Procs(); err != nil || len(pids) != 0 {
		t.Fatalf("after KillAll Procs = %v, %v", pids, err)
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("wait: %v, want killed by SIGKILL", err)
	}
	if err := c.Remove(ctx); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if err := c.Remove(ctx); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
	if m.Exists(id) {
		t.Fatal("Exists after Remove")
	}
	for _, p := range c.Paths() {
		if fileExists(p) {
			t.Fatalf("%s still exists", p)
		}
	}
}

// A limit the kernel rejects makes Create fail and leave nothing behind.
func TestCreateFailureLeavesNothing(t *testing.T) {
	m := newTestManager(t)
	if _, err := m.Create("bad-limits", Limits{CPU: 1e12, Pids: 3}); err == nil {
		t.Fatal("Create with an absurd CPU quota succeeded")
	}
	for _, id := range []string{"", ".", "..", "a/b"} {
		if _, err := m.Create(id, Limits{}); err == nil {
			t.Errorf("Create(%q) succeeded", id)
		}
	}
	if ids, err := m.List(); err != nil || len(ids) != 0 {
		t.Fatalf("leftovers: %v, %v", ids, err)
	}
}

func TestPidsLimit(t *testing.T) {
	m := newTestManager(t)
	ctx := ctxT(t)
	c, err := m.Create("pids", Limits{Pids: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Remove(ctx)
	defer c.KillAll(ctx)
	attr := &syscall.SysProcAttr{}
	inside, release, err := c.PrepareClone(attr)
	if err != nil {
		t.Fatal(err)
	}
	// Try to start 10 sleepers; at most 4 tasks (sh included) may exist.
	cmd := exec.Command("/bin/sh", "-c", "read go; for i in 1 2 3 4 5 6 7 8 9 10; do sleep 30 & done; echo started; wait")
	cmd.SysProcAttr = attr
	in, _ := cmd.StdinPipe()
	out, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	release()
	if !inside {
		if err := c.AddProc(cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
	}
	io.WriteString(in, "go\n")
	in.Close()
	// dash gives up on the first failed fork ("Cannot fork").
	waitFor(t, func() bool {
		b, _ := os.ReadFile(out.Name())
		return strings.Contains(string(b), "fork")
	}, "a fork failure")
	if b, _ := os.ReadFile(out.Name()); strings.Contains(string(b), "started") {
		t.Fatalf("all 10 forks succeeded: %q", b)
	}
	if pids, _ := c.Procs(); len(pids) > 4 || len(pids) == 0 {
		t.Fatalf("%d processes in a cgroup limited to 4", len(pids))
	}
	if err := c.KillAll(ctx); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
}

// TestV2Mechanics exercises the cgroup v2 code path (CLONE_INTO_CGROUP,
// cgroup.kill, the freezer fallback, removal) on a hybrid host's cgroup2
// mount, which has no controllers, so no limits are set.
func TestV2Mechanics(t *testing.T) {
	requireRoot(t)
	mounts, err := readCgroupMounts()
	if err != nil {
		t.Fatal(err)
	}
	if mounts.v2 == "" {
		t.Skip("no cgroup2 mount")
	}
	var st unix.Statfs_t
	if err := unix.Statfs(mounts.v2, &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		t.Skip("cgroup2 mount not usable")
	}
	m, err := newV2(mounts.v2, testParent(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	cleanupManager(t, m)
	ctx := ctxT(t)
	for _, useKill := range []bool{true, false} {
		if useKill && !m.killFile {
			continue
		}
		m.killFile = useKill
		id := fmt.Sprintf("v2-kill-%v", useKill)
		c, err := m.Create(id, Limits{})
		if err != nil {
			t.Fatal(err)
		}
		attr := &syscall.SysProcAttr{}
		inside, release, err := c.PrepareClone(attr)
		if err != nil || !inside {
			t.Fatalf("PrepareClone = %v, %v", inside, err)
		}
		cmd, in := startBlocked(t, attr, "sleep 100 & sleep 100 & wait")
		release()
		// Born inside: already a member before it was released.
		pids, err := c.Procs()
		if err != nil || !slices.Equal(pids, []int{cmd.Process.Pid}) {
			t.Fatalf("Procs = %v, %v, want [%d]", pids, err, cmd.Process.Pid)
		}
		io.WriteString(in, "go\n")
		waitFor(t, func() bool { p, _ := c.Procs(); return len(p) == 3 }, "3 processes")
		if err := c.KillAll(ctx); err != nil {
			t.Fatalf("KillAll(cgroup.kill=%v): %v", useKill, err)
		}
		cmd.Wait()
		if err := c.Remove(ctx); err != nil {
			t.Fatal(err)
		}
		if m.Exists(id) {
			t.Fatal("exists after Remove")
		}
	}
}

func TestParseMountinfo(t *testing.T) {
	const hybrid = `25 30 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
27 25 0:24 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
28 25 0:25 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
29 25 0:26 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
30 25 0:27 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer
31 25 0:28 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
`
	m, err := parseMountinfo(strings.NewReader(hybrid))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"cpu": "/sys/fs/cgroup/cpu,cpuacct", "cpuacct": "/sys/fs/cgroup/cpu,cpuacct", "memory": "/sys/fs/cgroup/memory", "pids": "/sys/fs/cgroup/pids", "freezer": "/sys/fs/cgroup/freezer"}
	if fmt.Sprint(m.v1) != fmt.Sprint(want) || m.v2 != "/sys/fs/cgroup/unified" {
		t.Fatalf("hybrid: %+v", m)
	}
	if want := []string{"/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids", "/sys/fs/cgroup/freezer", "/sys/fs/cgroup/systemd"}; !slices.Equal(m.v1All, want) {
		t.Fatalf("hybrid v1 hierarchies %q, want %q", m.v1All, want)
	}
	const unified = `30 1 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
40 1 0:26 / /mnt/my\040cg rw - cgroup2 cgroup2 rw
`
	m, err = parseMountinfo(strings.NewReader(unified))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.v1) != 0 || m.v2 != "/sys/fs/cgroup" {
		t.Fatalf("unified: %+v", m)
	}
	if got := unescapeMount(`/mnt/my\040cg`); got != "/mnt/my cg" {
		t.Fatalf("unescape = %q", got)
	}
}

// TestOtherHierarchies: on a v1 host, a sandbox cgroup that runsc left
// only in hierarchies evalbox sets no limits in (cpuset, devices,
// name=systemd: what a runsc killed before its delete leaves) is still
// listed, and Remove removes it; nothing is created there.
func TestOtherHierarchies(t *testing.T) {
	requireRoot(t)
	m := newTestManager(t)
	if m.Version() != V1 || len(m.others) == 0 {
		t.Skip("a v1 host with hierarchies beyond cpu, memory, pids and freezer is needed")
	}
	c, err := m.Create("sb-others", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range c.others {
		if fileExists(d) {
			t.Fatalf("Create made %s", d)
		}
	}
	if err := c.Remove(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	// What runsc leaves: the cgroup in the other hierarchies alone.
	left := m.cgroup("sb-others")
	for _, d := range left.others {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if ids, err := m.List(); err != nil || !slices.Contains(ids, "sb-others") || !m.Exists("sb-others") {
		t.Fatalf("List %q %v: the cgroup left in %q is not seen", ids, err, left.others)
	}
	open, err := m.Open("sb-others")
	if err != nil {
		t.Fatal(err)
	}
	if err := open.Remove(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	for _, d := range left.others {
		if fileExists(d) {
			t.Errorf("%s left after Remove", d)
		}
	}
}

func fileExists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// WithUnified: a v1 host's cgroup also lives in its cgroup2 hierarchy,
// where it can be delegated, where its delegate's child cgroups hold
// processes, and from where KillAll and Remove take those too.
func TestUnifiedDelegation(t *testing.T) {
	requireRoot(t)
	m, err := New(testParent(t), WithUnified())
	if err != nil {
		t.Fatal(err)
	}
	cleanupManager(t, m)
	if !m.Unified() {
		t.Skip("no cgroup2 hierarchy on this host")
	}
	ctx := ctxT(t)
	c, err := m.Create("delegated", Limits{Pids: 64})
	if err != nil {
		t.Fatal(err)
	}
	attr := &syscall.SysProcAttr{}
	inside, release, err := c.PrepareClone(attr)
	if err != nil || inside != (m.Version() == V2) {
		t.Fatalf("PrepareClone = %v, %v", inside, err)
	}
	cmd, in := startBlocked(t, attr, "sleep 100 & sleep 100 & wait")
	release()
	if !inside {
		if err := c.AddProc(cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
	}
	const uid = 0x60000000
	if err := c.Delegate(uid, uid); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{c.UnifiedPath(), filepath.Join(c.UnifiedPath(), "cgroup.procs")} {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil || st.Uid != uid || st.Gid != uid {
			t.Errorf("%s owned by %d:%d (%v), want the delegate", p, st.Uid, st.Gid, err)
		}
	}
	// The delegate (here: us) moves the process into a child cgroup.
	child := filepath.Join(c.UnifiedPath(), "proc-x")
	if err := os.Mkdir(child, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(child, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	io.WriteString(in, "go\n")
	waitFor(t, func() bool { p, _ := c.Procs(); return len(p) == 3 }, "3 processes")
	if err := c.KillAll(ctx); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if err := c.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if m.Exists("delegated") {
		t.Fatal("exists after Remove")
	}
}

// TestCPU measures a spinning process by the cgroup's CPU usage and halves
// its CPU limit while it runs (the CPU-abuse rule's measure and throttle),
// with and without the cgroup2 directory of a v1 host.
func TestCPU(t *testing.T) {
	requireRoot(t)
	for _, unified := range []bool{false, true} {
		t.Run(fmt.Sprintf("unified=%v", unified), func(t *testing.T) {
			var opts []Option
			if unified {
				opts = append(opts, WithUnified())
			}
			m, err := New(testParent(t), opts...)
			if err != nil {
				t.Fatal(err)
			}
			cleanupManager(t, m)
			ctx := ctxT(t)
			c, err := m.Create("cpu-1", Limits{CPU: 0.5})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Destroy(context.Background()) })
			if lim, err := c.CPULimit(); err != nil || lim != 0.5 {
				t.Fatalf("CPULimit = %v, %v", lim, err)
			}
			if _, err := c.CPUUsage(); m.Version() == V1 && !m.Unified() {
				// v1 without cgroup2: only runsc's cpuacct cgroups count.
				if !errors.Is(err, ErrNoCPUAccounting) && !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("CPUUsage without accounting: %v", err)
				}
				return
			} else if err != nil {
				t.Fatal(err)
			}
			attr := &syscall.SysProcAttr{}
			inside, release, err := c.PrepareClone(attr)
			if err != nil {
				t.Fatal(err)
			}
			cmd, in := startBlocked(t, attr, "while :; do :; done")
			release()
			if !inside {
				if err := c.AddProc(cmd.Process.Pid); err != nil {
					t.Fatal(err)
				}
			}
			io.WriteString(in, "go\n")
			u0, _ := c.CPUUsage()
			t0 := time.Now()
			time.Sleep(time.Second)
			u1, err := c.CPUUsage()
			if err != nil {
				t.Fatal(err)
			}
			rate := float64(u1-u0) / float64(time.Since(t0))
			if rate < 0.2 || rate > 0.6 {
				t.Errorf("a spinning process under a 0.5 CPU limit used %.2f CPU", rate)
			}
			if err := c.SetCPULimit(0.25); err != nil {
				t.Fatal(err)
			}
			if lim, err := c.CPULimit(); err != nil || lim != 0.25 {
				t.Fatalf("CPULimit after SetCPULimit = %v, %v", lim, err)
			}
			u0, t0 = u1, time.Now()
			time.Sleep(time.Second)
			u1, _ = c.CPUUsage()
			if rate := float64(u1-u0) / float64(time.Since(t0)); rate > 0.35 {
				t.Errorf("throttled to 0.25 CPU, it used %.2f", rate)
			}
			if err := c.KillAll(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestParseCPU(t *testing.T) {
	if d, err := parseUsageUsec([]byte("usage_usec 1500\nuser_usec 1000\n")); err != nil || d != 1500*time.Microsecond {
		t.Errorf("parseUsageUsec = %v, %v", d, err)
	}
	for in, want := range map[string]float64{"max 100000\n": 0, "50000 100000\n": 0.5, "200000 100000": 2} {
		if got, err := parseCPUMax([]byte(in)); err != nil || got != want {
			t.Errorf("parseCPUMax(%q) = %v, %v", in, got, err)
		}
	}
}
