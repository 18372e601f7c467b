package namespaces

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/evalbox/evalbox/internal/agentproto"
	"github.com/evalbox/evalbox/internal/runtime"
)

// standinPath is the stand-in agent built by TestMain ("" when the tests
// cannot run).
var standinPath string

func TestMain(m *testing.M) {
	Init()
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	if os.Geteuid() == 0 {
		dir, err := os.MkdirTemp("", "evalbox-ns-standin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		standinPath = filepath.Join(dir, "standin")
		build := exec.Command("go", "build", "-o", standinPath, "./testdata/standin")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build stand-in agent: %v\n%s", err, out)
			return 1
		}
	}
	return m.Run()
}

// testRootFS returns the template root filesystem for tests.
func testRootFS(t testing.TB) string {
	t.Helper()
	p := os.Getenv("EVALBOX_TEST_ROOTFS")
	if p == "" {
		p = "/tmp/tpl-base"
	}
	if _, err := os.Stat(filepath.Join(p, "bin/sh")); err != nil {
		t.Skipf("no test root filesystem at %s (set EVALBOX_TEST_ROOTFS to a Debian rootfs directory, e.g. one built with mmdebstrap --variant=minbase)", p)
	}
	return p
}

func newRuntime(t testing.TB, cfg Config) *Runtime {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the namespaces runtime needs root")
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = fmt.Sprintf("evalbox-ns-test-%d", os.Getpid())
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		for _, d := range r.cg.Dirs() {
			if err := unix.Rmdir(d); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EBUSY) {
				t.Errorf("remove test cgroup parent: %v", err)
			}
		}
	})
	return r
}

func testSpec(t testing.TB, id string) runtime.Spec {
	return runtime.Spec{
		ID:        id,
		RootFS:    testRootFS(t),
		AgentPath: standinPath,
		Env:       []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"},
		StateDir:  t.TempDir(),
		CPU:       1,
		MemoryMB:  256,
		DiskMB:    64,
		Pids:      128,
		Network:   runtime.NetworkNone,
		Hostname:  "sbx-" + id,
	}
}

// agent is a client of the stand-in agent.
type agent struct {
	t  testing.TB
	s  *Sandbox
	br *bufio.Reader
}

// startSandbox starts a sandbox, reads the agent's READY line and registers
// a cleanup that destroys it and checks that nothing is left.
func startSandbox(t testing.TB, r *Runtime, spec runtime.Spec) *agent {
	t.Helper()
	return startWith(t, r, spec, func(ctx context.Context) (runtime.Sandbox, error) { return r.Start(ctx, spec) })
}

func startWith(t testing.TB, r *Runtime, spec runtime.Spec, start func(context.Context) (runtime.Sandbox, error)) *agent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sb, err := start(ctx)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	s := sb.(*Sandbox)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.Destroy(ctx); err != nil {
			t.Errorf("Destroy: %v", err)
		}
		if left := r.Leftovers(spec.ID); len(left) > 0 {
			t.Errorf("leftovers after Destroy: %q", left)
		}
	})
	a := &agent{t: t, s: s, br: bufio.NewReader(s.Conn())}
	line := a.readLine()
	if line != "READY pid=1" {
		t.Fatalf("agent said %q, want READY pid=1 (agent log: %s)", line, readLog(spec))
	}
	return a
}

func readLog(spec runtime.Spec) string {
	b, _ := os.ReadFile(filepath.Join(spec.StateDir, AgentLogName))
	return string(b)
}

func (a *agent) readLine() string {
	a.t.Helper()
	timer := time.AfterFunc(30*time.Second, func() { a.s.Conn().Close() })
	defer timer.Stop()
	line, err := a.br.ReadString('\n')
	if err != nil {
		a.t.Fatalf("read from agent: %v (got %q)", err, line)
	}
	return strings.TrimSuffix(line, "\n")
}

// run runs a shell command line in the sandbox and returns its combined
// output and exit code.
func (a *agent) run(cmd string) (string, int) {
	a.t.Helper()
	if _, err := io.WriteString(a.s.Conn(), cmd+"\n"); err != nil {
		a.t.Fatalf("write to agent: %v", err)
	}
	var out strings.Builder
	for {
		line := a.readLine()
		if rest, ok := strings.CutPrefix(line, "__EXIT__ "); ok {
			code, err := strconv.Atoi(rest)
			if err != nil {
				a.t.Fatalf("bad exit line %q", line)
			}
			return out.String(), code
		}
		out.WriteString(line + "\n")
	}
}

// mustRun runs cmd and fails the test unless it exits 0.
func (a *agent) mustRun(cmd string) string {
	a.t.Helper()
	out, code := a.run(cmd)
	if code != 0 {
		a.t.Fatalf("%q exited %d: %s", cmd, code, out)
	}
	return out
}

func TestSandboxIsolation(t *testing.T) {
	r := newRuntime(t, Config{})
	spec := testSpec(t, "iso")
	canaryDir := t.TempDir()
	canary := filepath.Join(canaryDir, "canary")
	if err := os.WriteFile(canary, []byte("host secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	a := startSandbox(t, r, spec)

	t.Run("pid1", func(t *testing.T) {
		a.t = t
		// The agent runs from a sealed memfd: no host path of it exists
		// in the sandbox.
		if got := strings.TrimSpace(a.mustRun("readlink /proc/1/exe")); !strings.HasPrefix(got, "/memfd:evalbox-agent") {
			t.Errorf("/proc/1/exe = %q", got)
		}
		// Only the sandbox's processes are visible: agent, sh, ls.
		out := a.mustRun("ls /proc | grep -c '^[0-9]'")
		if n, _ := strconv.Atoi(strings.TrimSpace(out)); n == 0 || n > 5 {
			t.Errorf("%d processes visible in /proc", n)
		}
	})
	t.Run("host root not visible", func(t *testing.T) {
		a.t = t
		out, code := a.run("cat " + canary)
		if code == 0 || strings.Contains(out, "host secret") {
			t.Fatalf("canary readable from the sandbox: %q", out)
		}
		if _, code := a.run("test -e " + canaryDir); code == 0 {
			t.Errorf("host temp dir %s exists in the sandbox", canaryDir)
		}
		if _, code := a.run("test -e " + spec.StateDir + "/upper"); code == 0 {
			t.Error("overlay upper dir reachable from the sandbox")
		}
	})
	t.Run("overlay", func(t *testing.T) {
		a.t = t
		a.mustRun("echo written > /etc/evalbox-test-file && rm /etc/os-release && mkdir -p /evalbox-test-dir && echo x > /evalbox-test-dir/f")
		if got := a.mustRun("cat /etc/evalbox-test-file"); got != "written\n" {
			t.Errorf("read back %q", got)
		}
		if _, err := os.Stat(filepath.Join(spec.RootFS, "etc/evalbox-test-file")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("write reached the template: %v", err)
		}
		if _, err := os.Stat(filepath.Join(spec.RootFS, "etc/os-release")); err != nil {
			t.Errorf("delete reached the template: %v", err)
		}
		if _, err := os.Stat(filepath.Join(spec.RootFS, "evalbox-test-dir")); err == nil {
			t.Error("mkdir reached the template")
		}
		// The agent binary cannot be changed.
		if out, code := a.run("echo x >> /proc/1/exe"); code == 0 {
			t.Errorf("agent binary writable: %q", out)
		}
	})
	t.Run("no host paths", func(t *testing.T) {
		a.t = t
		out := a.mustRun("cat /proc/self/mountinfo")
		hostRoot := hostRootSource(t)
		for _, p := range []string{spec.RootFS, spec.StateDir, standinPath, filepath.Dir(standinPath), r.mntPoint, hostRoot} {
			if p != "" && strings.Contains(out, p) {
				t.Errorf("mountinfo shows the host path %s:\n%s", p, out)
			}
		}
		for _, f := range []string{"/proc/slabinfo", "/proc/vmallocinfo", "/proc/kpageflags"} {
			if out, code := a.run("head -c 64 " + f + " | wc -c"); code != 0 || strings.TrimSpace(out) != "0" {
				t.Errorf("%s readable: %q", f, out)
			}
		}
	})
	t.Run("user namespace", func(t *testing.T) {
		a.t = t
		want := fmt.Sprintf("0 %d %d", a.s.ids.hostID, idBlockSize)
		for _, f := range []string{"uid_map", "gid_map"} {
			if got := strings.Join(strings.Fields(a.mustRun("cat /proc/self/"+f)), " "); got != want {
				t.Errorf("%s = %q, want %q", f, got, want)
			}
		}
		// Host side: the agent runs as the block's first id, not as root.
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", a.s.Pid()))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(st), fmt.Sprintf("\nUid:\t%d\t%d\t%d\t%d\n", a.s.ids.hostID, a.s.ids.hostID, a.s.ids.hostID, a.s.ids.hostID)) {
			t.Errorf("agent's host status:\n%s", st)
		}
		// The namespace is owned by that id too (limits counted against
		// it in the host namespace, not against root).
		fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", a.s.Pid()), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		owner, err := unix.IoctlGetInt(fd, unix.NS_GET_OWNER_UID)
		unix.Close(fd)
		if err != nil || uint32(owner) != a.s.ids.hostID {
			t.Errorf("user namespace owner %d (%v), want %d", owner, err, a.s.ids.hostID)
		}
	})
	t.Run("environment", func(t *testing.T) {
		a.t = t
		if got := strings.TrimSpace(a.mustRun("hostname")); got != spec.Hostname {
			t.Errorf("hostname = %q, want %q", got, spec.Hostname)
		}
		if got := a.mustRun("head -c 16 /dev/urandom | wc -c; echo hi > /dev/null; head -c 3 /dev/zero | wc -c"); got != "16\n3\n" {
			t.Errorf("devices: %q", got)
		}
		if got := strings.TrimSpace(a.mustRun("echo $HOME")); got != "/root" {
			t.Errorf("HOME = %q", got)
		}
		a.mustRun("test -d /dev/pts && test -d /dev/shm && test -L /dev/fd && touch /dev/shm/x && touch /tmp/x")
		// No network but loopback.
		out := a.mustRun("cat /proc/net/dev")
		var ifaces []string
		for _, l := range strings.Split(out, "\n") {
			if name, _, ok := strings.Cut(l, ":"); ok {
				ifaces = append(ifaces, strings.TrimSpace(name))
			}
		}
		if !slices.Equal(ifaces, []string{"lo"}) {
			t.Errorf("interfaces %q, want only lo", ifaces)
		}
	})
	t.Run("hardening", func(t *testing.T) {
		a.t = t
		out := a.mustRun("grep -E '^(CapBnd|CapEff|CapInh|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status")
		var keep uint64
		for _, c := range keepCaps {
			keep |= 1 << c
		}
		want := map[string]string{
			"CapBnd": fmt.Sprintf("%016x", keep), "CapEff": fmt.Sprintf("%016x", keep),
			"CapInh": "0000000000000000", "CapAmb": "0000000000000000",
			"NoNewPrivs": "1", "Seccomp": "2",
		}
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			k, v, _ := strings.Cut(l, ":")
			if w := want[k]; strings.TrimSpace(v) != w {
				t.Errorf("%s = %q, want %q", k, strings.TrimSpace(v), w)
			}
		}
		for _, cmd := range []string{
			"echo /tmp/core > /proc/sys/kernel/core_pattern",
			"echo h > /proc/sysrq-trigger",
			`[ "$(cat /proc/timer_list /proc/keys /proc/kcore 2>/dev/null | wc -c)" -gt 0 ]`,
		} {
			if out, code := a.run(cmd + " && echo WROTE"); code == 0 || strings.Contains(out, "WROTE") {
				t.Errorf("%q succeeded: %q", cmd, out)
			}
		}
	})
	t.Run("usage", func(t *testing.T) {
		u, err := a.s.Usage(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if u.MemoryBytes <= 0 || u.RSSBytes <= 0 {
			t.Errorf("usage %+v", u)
		}
	})
}

// hostRootSource is the device (or source) of the host's root mount, e.g.
// /dev/vda.
func hostRootSource(t *testing.T) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(l, " - ")
		pf, sf := strings.Fields(pre), strings.Fields(post)
		if ok && len(pf) >= 5 && pf[4] == "/" && len(sf) >= 2 && strings.HasPrefix(sf[1], "/") {
			return sf[1]
		}
	}
	return ""
}

// Sandboxes get distinct id blocks, and the kernel's per-user limits of
// one (here inotify instances, 128 per user by default) are its own: a
// sandbox that takes all of its allowance leaves host root and other
// sandboxes theirs. Without a user namespace the sandbox's root was host
// root, and host root got EMFILE.
func TestUserNamespaceLimits(t *testing.T) {
	r := newRuntime(t, Config{})
	a := startSandbox(t, r, testSpec(t, "limits-a"))
	b := startSandbox(t, r, testSpec(t, "limits-b"))
	if a.s.ids.hostID == b.s.ids.hostID {
		t.Fatalf("two sandboxes share host ids %d", a.s.ids.hostID)
	}
	max, err := os.ReadFile("/proc/sys/fs/inotify/max_user_instances")
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(max)))
	out := a.mustRun(fmt.Sprintf("standin inotify %d > /tmp/inotify.out 2>&1 & sleep 1; cat /tmp/inotify.out", n+10))
	if !strings.Contains(out, fmt.Sprintf("inotify %d\n", n)) {
		t.Errorf("sandbox a opened %q inotify instances, want its own limit of %d", out, n)
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Fatalf("host root cannot make an inotify instance while a sandbox holds %d: %v", n, err)
	}
	unix.Close(fd)
	if out := b.mustRun("standin inotify 8 > /tmp/inotify.out 2>&1 & sleep 0.5; cat /tmp/inotify.out"); !strings.Contains(out, "inotify 8") {
		t.Fatalf("sandbox b after a took its allowance: %q", out)
	}
}

// The agent's stderr lands in StateDir/agent.log, capped; no host fd leaks
// into the sandbox.
func TestAgentLogAndFds(t *testing.T) {
	r := newRuntime(t, Config{AgentLogLimit: 1000})
	leak := filepath.Join(t.TempDir(), "leaked-fd-canary")
	fd, err := unix.Open(leak, unix.O_CREAT|unix.O_RDWR, 0o600) // no O_CLOEXEC
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	spec := testSpec(t, "logs")
	a := startSandbox(t, r, spec)
	out := a.mustRun("ls -l /proc/1/fd/")
	if strings.Contains(out, "leaked-fd-canary") {
		t.Fatalf("host fd visible in the agent: %s", out)
	}
	// The agent's stderr is a host pipe the sandbox cannot reopen (its
	// owner, host root, is not mapped in the sandbox): the stand-in
	// writes to it on request.
	if out, code := a.run("head -c 1 /dev/zero > /proc/1/fd/2"); code == 0 {
		t.Errorf("the sandbox reopened the agent's stderr: %q", out)
	}
	a.mustRun("@stderr 5000")
	if err := a.s.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	log := readLog(spec)
	if !strings.HasPrefix(log, "standin: started\n") {
		t.Errorf("agent.log starts with %.40q", log)
	}
	if len(log) > 1100 || !strings.Contains(log, "agent log truncated") {
		t.Errorf("agent.log is %d bytes, want it cut at 1000 with a note: %.60q", len(log), log[len(log)-min(len(log), 60):])
	}
}

func TestSeccomp(t *testing.T) {
	r := newRuntime(t, Config{})
	a := startSandbox(t, r, testSpec(t, "seccomp"))
	out := a.mustRun("standin sys")
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		k, v, _ := strings.Cut(l, "=")
		got[k] = v
	}
	want := map[string]string{
		"mount": "EPERM", "umount2": "EPERM", "unshare_user": "EPERM", "unshare_net": "EPERM",
		"setns": "EPERM", "clone_newuser": "EPERM", "fork": "ok", "clone3": "EINVAL",
		"bpf": "EPERM", "perf_event_open": "EPERM", "io_uring_setup": "EPERM", "keyctl": "EPERM",
		"ptrace": "EPERM", "chroot": "EPERM", "pivot_root": "EPERM", "open_tree": "EPERM",
		"personality_norandom": "EPERM", "personality_query": "ok", "sethostname": "EPERM",
		"mknod": "EPERM", "userfaultfd": "EPERM", "settimeofday": "EPERM", "syslog": "EPERM",
		// clone3 is allowed (the agent puts commands in cgroups with it),
		// but the sandbox's user namespace allows no nested one.
		"clone3_newuser": "ENOSPC",
		// No controlling terminal, no injection into any terminal.
		"open_tty": "ENXIO", "tiocsti": "EPERM", "tiocsti_high": "EPERM", "tioclinux": "EPERM", "tcgets": "ok",
		// Socket families no network namespace covers are refused.
		"socket_unix": "ok", "socket_inet": "ok", "socket_inet6": "ok", "socket_netlink": "ok",
		"socket_vsock": "EAFNOSUPPORT", "socket_alg": "EAFNOSUPPORT", "socket_packet": "EAFNOSUPPORT",
		"socket_vsock_high": "EAFNOSUPPORT", "socketpair_vsock": "EAFNOSUPPORT",
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: got %q, want %s", k, got[k], w)
		}
	}
	// A 32-bit syscall (int 0x80) kills the process instead of slipping
	// past the x86-64 rules.
	if goruntime.GOARCH == "amd64" {
		out, code := a.run("standin int80")
		if code != 128+int(syscall.SIGSYS) {
			t.Errorf("int 0x80: exit %d, output %q; want death by SIGSYS", code, out)
		}
	}
}

func TestDiskLimit(t *testing.T) {
	r := newRuntime(t, Config{})
	spec := testSpec(t, "disk")
	spec.DiskMB = 16
	a := startSandbox(t, r, spec)
	out, code := a.run("dd if=/dev/zero of=/big bs=1M count=64")
	if code == 0 || !strings.Contains(out, "No space left on device") {
		t.Fatalf("64 MiB write to a 16 MiB disk: exit %d, %q", code, out)
	}
	a.mustRun("rm /big && echo ok > /small")
}

func TestMemoryLimit(t *testing.T) {
	r := newRuntime(t, Config{})
	spec := testSpec(t, "mem")
	spec.MemoryMB = 64
	a := startSandbox(t, r, spec)
	out, code := a.run("standin hog 512")
	if code != 128+int(syscall.SIGKILL) || strings.Contains(out, "survived") {
		t.Fatalf("512 MiB hog in 64 MiB: exit %d, %q; want OOM kill", code, out)
	}
	// The sandbox (and its agent) survive the hog.
	if got := a.mustRun("echo alive"); got != "alive\n" {
		t.Fatalf("after OOM: %q", got)
	}
	out = a.mustRun("standin hog 16")
	if !strings.Contains(out, "survived 16") {
		t.Fatalf("16 MiB in 64 MiB: %q", out)
	}
}

func TestForkBomb(t *testing.T) {
	r := newRuntime(t, Config{})
	spec := testSpec(t, "forkbomb")
	spec.Pids = 64
	a := startSandbox(t, r, spec)
	// A bomb that keeps forking and ignores failures, in the background.
	a.mustRun("standin bomb > /dev/null 2>&1 &")
	var pids []int
	deadline := time.Now().Add(10 * time.Second)
	for len(pids) < 8 {
		if time.Now().After(deadline) {
			t.Fatalf("bomb did not grow: %v", pids)
		}
		time.Sleep(20 * time.Millisecond)
		var err error
		if pids, err = a.s.cg.Procs(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond)
	tasks := 0
	for _, pid := range pids {
		if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid)); err == nil {
			tasks += len(ents)
		}
	}
	if tasks > spec.Pids {
		t.Fatalf("%d tasks with a limit of %d", tasks, spec.Pids)
	}
	// Destroy (in the cleanup) must kill a live bomb and leave nothing.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	if err := a.s.Destroy(ctx); err != nil {
		t.Fatalf("Destroy during fork bomb: %v", err)
	}
	t.Logf("destroyed a fork bomb of %d processes (%d tasks) in %v", len(pids), tasks, time.Since(start))
}

func TestDestroy(t *testing.T) {
	r := newRuntime(t, Config{})
	spec := testSpec(t, "destroy")
	a := startSandbox(t, r, spec)
	a.mustRun("sleep 1000 > /dev/null 2>&1 & sleep 1000 > /dev/null 2>&1 &")
	pids, _ := a.s.cg.Procs()
	if len(pids) < 3 {
		t.Fatalf("expected the agent and two sleeps, got %v", pids)
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { errs[i] = a.s.Destroy(ctx) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("concurrent Destroy: %v", err)
		}
	}
	select {
	case <-a.s.Done():
	default:
		t.Fatal("Done not closed after Destroy")
	}
	for _, pid := range pids {
		if err := unix.Kill(pid, 0); err == nil {
			t.Errorf("process %d still alive", pid)
		}
	}
	if left := r.Leftovers(spec.ID); len(left) > 0 {
		t.Fatalf("leftovers: %q", left)
	}
	if _, err := a.s.Conn().Read(make([]byte, 1)); err == nil {
		t.Fatal("Conn still readable after Destroy")
	}
	if err := a.s.Destroy(ctx); err != nil {
		t.Fatalf("Destroy again: %v", err)
	}
}

// The agent dying on its own is noticed: Done closes, Conn reads EOF.
func TestAgentDeath(t *testing.T) {
	r := newRuntime(t, Config{})
	a := startSandbox(t, r, testSpec(t, "death"))
	if err := unix.Kill(a.s.Pid(), unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.s.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed after the agent died")
	}
	if _, err := a.br.ReadByte(); err != io.EOF {
		t.Fatalf("read after agent death: %v, want EOF", err)
	}
	if a.s.Err() == nil {
		t.Fatal("Err() = nil after SIGKILL")
	}
}

func TestSweep(t *testing.T) {
	r := newRuntime(t, Config{})
	ctx := context.Background()
	keepSpec := testSpec(t, "sweep-keep")
	kept := startSandbox(t, r, keepSpec)

	t.Run("dropped handle", func(t *testing.T) {
		spec := testSpec(t, "sweep-dropped")
		if _, err := r.Start(ctx, spec); err != nil {
			t.Fatal(err)
		}
		removed, err := r.Sweep(ctx, func(id string) bool { return id != spec.ID })
		if err != nil || !slices.Equal(removed, []string{spec.ID}) {
			t.Fatalf("Sweep = %v, %v", removed, err)
		}
		if left := r.Leftovers(spec.ID); len(left) > 0 {
			t.Fatalf("leftovers: %q", left)
		}
	})
	t.Run("after restart", func(t *testing.T) {
		// A second Runtime stands for the process after a restart: it has
		// no handle and must find the sandbox by its cgroup.
		spec := testSpec(t, "sweep-orphan")
		sb, err := r.Start(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := New(Config{CgroupParent: fmt.Sprintf("evalbox-ns-test-%d", os.Getpid())})
		if err != nil {
			t.Fatal(err)
		}
		removed, err := r2.Sweep(ctx, func(id string) bool { return id != spec.ID })
		if err != nil || !slices.Equal(removed, []string{spec.ID}) {
			t.Fatalf("Sweep = %v, %v", removed, err)
		}
		select {
		case <-sb.(*Sandbox).Done():
		case <-time.After(10 * time.Second):
			t.Fatal("swept sandbox still running")
		}
		if left := r2.Leftovers(spec.ID); len(left) > 0 {
			t.Fatalf("leftovers: %q", left)
		}
		if err := sb.Destroy(ctx); err != nil {
			t.Fatalf("Destroy after Sweep: %v", err)
		}
	})
	// The kept sandbox is untouched.
	if got := kept.mustRun("echo still here"); got != "still here\n" {
		t.Fatalf("kept sandbox: %q", got)
	}
}

func TestStartErrors(t *testing.T) {
	r := newRuntime(t, Config{})
	ctx := context.Background()
	for name, mod := range map[string]func(*runtime.Spec){
		"bad id":        func(s *runtime.Spec) { s.ID = "Bad/ID" },
		"no rootfs":     func(s *runtime.Spec) { s.RootFS = "/nonexistent" },
		"no agent":      func(s *runtime.Spec) { s.AgentPath = "/nonexistent" },
		"agent dir":     func(s *runtime.Spec) { s.AgentPath = "/tmp" },
		"bad network":   func(s *runtime.Spec) { s.Network = "bridge" },
		"relative path": func(s *runtime.Spec) { s.StateDir = "state" },
		// The init stage fails: procfs cannot be an overlay lower layer.
		"init failure": func(s *runtime.Spec) { s.RootFS = "/proc/sys" },
	} {
		t.Run(name, func(t *testing.T) {
			spec := testSpec(t, "err-"+strings.ReplaceAll(name, " ", "-"))
			mod(&spec)
			sb, err := r.Start(ctx, spec)
			if err == nil {
				sb.Destroy(ctx)
				t.Fatal("Start succeeded")
			}
			t.Logf("error: %v", err)
			if left := r.Leftovers(spec.ID); len(left) > 0 {
				t.Fatalf("leftovers: %q", left)
			}
		})
	}
	// A duplicate live id is refused.
	spec := testSpec(t, "dup")
	startSandbox(t, r, spec)
	if _, err := r.Start(ctx, spec); err == nil {
		t.Fatal("second Start with the same id succeeded")
	}
}

func TestParallelStarts(t *testing.T) {
	r := newRuntime(t, Config{})
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			spec := testSpec(t, fmt.Sprintf("par-%d", i))
			ctx := context.Background()
			sb, err := r.Start(ctx, spec)
			if err != nil {
				t.Errorf("Start %d: %v", i, err)
				return
			}
			br := bufio.NewReader(sb.Conn())
			if l, err := br.ReadString('\n'); err != nil || l != "READY pid=1\n" {
				t.Errorf("sandbox %d: %q %v", i, l, err)
			}
			if err := sb.Destroy(ctx); err != nil {
				t.Errorf("Destroy %d: %v", i, err)
			}
			if left := r.Leftovers(spec.ID); len(left) > 0 {
				t.Errorf("leftovers %d: %q", i, left)
			}
		})
	}
	wg.Wait()
}

func TestVersion(t *testing.T) {
	r := newRuntime(t, Config{})
	if r.Name() != "namespaces" || !strings.HasPrefix(r.Version(), "namespaces/2 linux/") {
		t.Fatalf("Name %q Version %q", r.Name(), r.Version())
	}
}

// BenchmarkColdStart measures Start until the agent answers a first
// command (cold path: new cgroup, namespaces, overlay, exec), and reports
// Destroy separately.
func BenchmarkColdStart(b *testing.B) {
	benchColdStart(b, newRuntime(b, Config{}), runtime.NetworkNone)
}

// benchColdStart measures Start until the agent has run a command, with
// network mode netMode, and reports Destroy separately.
func benchColdStart(b *testing.B, r *Runtime, netMode string) {
	ctx := context.Background()
	var destroy time.Duration
	for i := 0; b.Loop(); i++ {
		spec := testSpec(b, fmt.Sprintf("bench-%d", i))
		spec.Network = netMode
		sb, err := r.Start(ctx, spec)
		if err != nil {
			b.Fatal(err)
		}
		br := bufio.NewReader(sb.Conn())
		if _, err := br.ReadString('\n'); err != nil { // READY
			b.Fatal(err)
		}
		io.WriteString(sb.Conn(), "true\n")
		if l, err := br.ReadString('\n'); err != nil || l != "__EXIT__ 0\n" {
			b.Fatalf("%q %v", l, err)
		}
		b.StopTimer()
		t0 := time.Now()
		if err := sb.Destroy(ctx); err != nil {
			b.Fatal(err)
		}
		destroy += time.Since(t0)
		b.StartTimer()
	}
	b.ReportMetric(float64(destroy.Microseconds())/float64(b.N)/1000, "destroy-ms/op")
}

func TestAgentCgroupEnv(t *testing.T) {
	if agentCgroupEnv != agentproto.CgroupEnv {
		t.Fatalf("agentCgroupEnv %q, agentproto.CgroupEnv %q", agentCgroupEnv, agentproto.CgroupEnv)
	}
}

// TestHostCostIsTheCgroupLimits holds HostCost, which the node admits
// sandboxes with, equal to the limits of the sandbox's cgroup.
func TestHostCostIsTheCgroupLimits(t *testing.T) {
	s := runtime.Spec{ID: "a", MemoryMB: 512, DiskMB: 1024, Pids: 512, CPU: 1}
	l := cgroupLimits(s)
	got := (&Runtime{}).HostCost(s)
	if got.Pids != int64(l.Pids) || got.MemoryBytes != l.MemoryBytes || got.Pids != 512 || got.MemoryBytes != 512<<20 {
		t.Fatalf("HostCost %+v, cgroup limits %+v", got, l)
	}
}
