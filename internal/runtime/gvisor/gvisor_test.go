package gvisor

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/evalbox/evalbox/internal/agentproto"
	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/internal/runtime"
	"github.com/evalbox/evalbox/internal/runtime/network"
	"github.com/evalbox/evalbox/internal/runtime/network/networktest"
)

// testBinaries returns runsc and the agent ($EVALBOX_BIN_DIR, default
// <repo>/bin, built by scripts/build.sh) and the template root filesystem
// ($EVALBOX_TEST_ROOTFS, default /tmp/tpl-base), or skips the test.
func testBinaries(t testing.TB) (runsc, agent, rootfs string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("runsc needs root")
	}
	bin := os.Getenv("EVALBOX_BIN_DIR")
	if bin == "" {
		bin, _ = filepath.Abs("../../../bin")
	}
	runsc, agent = filepath.Join(bin, "runsc"), filepath.Join(bin, "evalbox-agent")
	for _, p := range []string{runsc, agent} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("%s missing: run scripts/build.sh (or set EVALBOX_BIN_DIR)", p)
		}
	}
	rootfs = os.Getenv("EVALBOX_TEST_ROOTFS")
	if rootfs == "" {
		rootfs = "/tmp/tpl-base"
	}
	if _, err := os.Stat(filepath.Join(rootfs, "bin/sh")); err != nil {
		t.Skipf("no test root filesystem at %s (set EVALBOX_TEST_ROOTFS to a Debian rootfs directory)", rootfs)
	}
	return runsc, agent, rootfs
}

type testEnv struct {
	runsc, agent, rootfs string
	rootDir              string
	netm                 *network.Manager
}

func (e *testEnv) newRuntime(t testing.TB) *Runtime {
	t.Helper()
	r, err := New(Config{Runsc: e.runsc, RootDir: e.rootDir, CgroupParent: fmt.Sprintf("evalbox-gv-test-%d", os.Getpid()), Network: e.netm})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// runtime is newRuntime, closed at cleanup.
func (e *testEnv) runtime(t testing.TB) *Runtime {
	t.Helper()
	r := e.newRuntime(t)
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("close runtime: %v", err)
		}
	})
	return r
}

// sbx is a started sandbox with an agent client.
type sbx struct {
	sb    *sandbox
	agent *agentproto.Client
}

// start starts a sandbox and registers its destruction, and the check that
// nothing of it is left, at cleanup.
func (e *testEnv) start(t *testing.T, r *Runtime, id, netMode string) *sbx {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t0 := time.Now()
	rsb, err := r.Start(ctx, runtime.Spec{
		ID: id, RootFS: e.rootfs, AgentPath: e.agent, AgentArgs: []string{"--workdir", "/", "--user", "root"},
		Env:      []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"},
		StateDir: t.TempDir(), CPU: 1, MemoryMB: 256, DiskMB: 64, Pids: 128, Network: netMode, Hostname: id,
	})
	if err != nil {
		t.Fatalf("Start %s: %v", id, err)
	}
	s := &sbx{sb: rsb.(*sandbox)}
	for _, f := range []*os.File{s.sb.in, s.sb.out} {
		if n := pipeSize(t, f); n != agentPipeSize {
			t.Errorf("agent pipe of %s holds %d bytes, want %d", id, n, agentPipeSize)
		}
	}
	t.Cleanup(func() {
		if s.agent != nil {
			s.agent.Close()
		}
		if err := s.sb.Destroy(context.Background()); err != nil {
			t.Errorf("Destroy %s: %v", id, err)
		}
		if left := r.Leftovers(id); len(left) > 0 {
			t.Errorf("leftovers of %s after Destroy: %q", id, left)
		}
	})
	if s.agent, err = agentproto.Dial(rsb.Conn()); err != nil {
		t.Fatal(err)
	}
	if err := s.agent.Ping(ctx); err != nil {
		t.Fatalf("agent of %s: %v", id, err)
	}
	t.Logf("%s (%s) started and answering in %v", id, netMode, time.Since(t0).Round(time.Millisecond))
	return s
}

// pipeSize returns the capacity of the pipe f is an end of.
func pipeSize(t *testing.T, f *os.File) int {
	t.Helper()
	rc, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var ferr error
	if err := rc.Control(func(fd uintptr) { n, ferr = unix.FcntlInt(fd, unix.F_GETPIPE_SZ, 0) }); err != nil || ferr != nil {
		t.Fatal(err, ferr)
	}
	return n
}

// sh runs a shell command in the sandbox and returns stdout+stderr.
func (s *sbx) sh(t *testing.T, cmd string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	if _, err := s.agent.Exec(ctx, agentproto.ExecRequest{Shell: cmd, TimeoutMs: 20_000}, nil, &out, &out); err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	return out.String()
}

// dial connects from the sandbox to addr and returns the first line read,
// or a line starting with "dial error".
func (s *sbx) dial(t *testing.T, addr string) string {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	return strings.TrimSpace(s.sh(t, fmt.Sprintf(`if out=$(timeout 5 bash -c 'exec 3<>/dev/tcp/%s/%s && head -n1 <&3' 2>&1); then echo "$out"; else echo "dial error $?: $out" | tr '\n' ' '; fi`, host, port)))
}

func TestOutbound(t *testing.T) {
	runsc, agent, rootfs := testBinaries(t)
	inet := networktest.Setup(t)
	netm := networktest.Manager(t, network.Config{
		Scope: fmt.Sprintf("evalbox-gv-test-%d", os.Getpid()),
		Pool:  netip.MustParsePrefix("10.233.0.0/24"),
		DNS:   []netip.Addr{},
		// EgressDeny: the default, as the server uses it.
	})
	e := &testEnv{runsc: runsc, agent: agent, rootfs: rootfs, rootDir: t.TempDir(), netm: netm}
	r := e.runtime(t)

	// A host service on every address.
	hostLn, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hostLn.Close()
	go func() {
		for {
			c, err := hostLn.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, "host service")
			c.Close()
		}
	}()
	hostPort := hostLn.Addr().(*net.TCPAddr).Port

	a := e.start(t, r, "gv-out-a", runtime.NetworkOutbound)
	b := e.start(t, r, "gv-out-b", runtime.NetworkOutbound)
	none := e.start(t, r, "gv-none", runtime.NetworkNone)
	la, lb := a.sb.net.lease, b.sb.net.lease
	if la.Prefix() == lb.Prefix() {
		t.Fatalf("two sandboxes share %v", la.Prefix())
	}

	// Inside: eth0 with the lease's address, lo, the resolv.conf.
	if out := a.sh(t, "cat /proc/net/dev /etc/resolv.conf; hostname -I"); !strings.Contains(out, "eth0") || !strings.Contains(out, "lo:") ||
		!strings.Contains(out, "no DNS resolver") || !strings.Contains(out, la.GuestAddr().String()) {
		t.Fatalf("sandbox network config:\n%s", out)
	}
	// IPv6 only on lo (the host end has none: it would bypass the rules).
	if out := a.sh(t, "cat /proc/net/if_inet6"); strings.Contains(out, "eth0") || !strings.Contains(out, "lo") {
		t.Errorf("IPv6 addresses in the sandbox:\n%s", out)
	}
	if out := a.sh(t, "echo x > /etc/resolv.conf 2>&1; cat /etc/resolv.conf"); !strings.Contains(out, "no DNS resolver") {
		t.Errorf("resolv.conf written from inside: %q", out)
	}
	// A service in sandbox b, reachable there.
	bPort := 8000
	if _, err := b.agent.Start(context.Background(), agentproto.ExecRequest{Argv: []string{"perl", "-MIO::Socket::INET", "-e",
		fmt.Sprintf(`$s = IO::Socket::INET->new(Listen => 5, LocalPort => %d, ReuseAddr => 1) or die "listen: $!"; while ($c = $s->accept) { print $c "sandbox b\n"; close $c }`, bPort)}}); err != nil {
		t.Fatal(err)
	}
	bAddr := fmt.Sprintf("%s:%d", lb.GuestAddr(), bPort)
	var got string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if got = b.dial(t, bAddr); got == "sandbox b" {
			break
		}
	}
	if got != "sandbox b" {
		t.Fatalf("sandbox b's own service: %q", got)
	}

	// Out to the fake internet, NAT'd to the host's address on that link.
	inetAddr := fmt.Sprintf("%s:%d", inet.Server, inet.Port)
	if got := a.dial(t, inetAddr); !strings.HasPrefix(got, inet.Gateway.String()+":") {
		t.Fatalf("internet from an outbound sandbox: %q, want a connection from %s", got, inet.Gateway)
	}
	// Not to private ranges, the host itself, or another sandbox.
	for _, addr := range []string{
		fmt.Sprintf("%s:%d", inet.Private, inet.Port),
		fmt.Sprintf("%s:%d", inet.Gateway, hostPort),
		fmt.Sprintf("%s:%d", la.HostAddr(), hostPort),
		bAddr,
	} {
		t0 := time.Now()
		got := a.dial(t, addr)
		t.Logf("dial %s: %s (%v)", addr, got, time.Since(t0).Round(time.Millisecond))
		if !strings.HasPrefix(got, "dial error") {
			t.Errorf("dial %s from an outbound sandbox: %q, want an error", addr, got)
		}
	}
	// Network none: nothing.
	if got := none.dial(t, inetAddr); !strings.HasPrefix(got, "dial error") {
		t.Errorf("internet from a sandbox without network: %q", got)
	}

	// Leftovers name the namespace file and the link of a live sandbox.
	left := r.Leftovers("gv-out-a")
	if !slices.Contains(left, "netns file "+r.netnsPath("gv-out-a")) || !slices.Contains(left, "link "+la.HostLink()) {
		t.Errorf("Leftovers of a live outbound sandbox = %q", left)
	}

	// After a restart (a second Runtime on the same root, no handles),
	// Sweep removes an outbound sandbox completely and leaves the others.
	r2 := e.newRuntime(t)
	removed, err := r2.Sweep(context.Background(), func(id string) bool { return id != "gv-out-b" })
	if err != nil || !slices.Equal(removed, []string{"gv-out-b"}) {
		t.Fatalf("Sweep = %v, %v", removed, err)
	}
	if left := r2.Leftovers("gv-out-b"); len(left) > 0 {
		t.Fatalf("leftovers after Sweep: %q", left)
	}
	if _, err := netlink.LinkByName(lb.HostLink()); err == nil {
		t.Fatalf("%s still exists after Sweep", lb.HostLink())
	}
	if got := a.dial(t, inetAddr); !strings.HasPrefix(got, inet.Gateway.String()+":") {
		t.Fatalf("sandbox a after sweeping b: %q", got)
	}
}

// A start that fails after the network is set up leaves nothing.
func TestOutboundStartFailure(t *testing.T) {
	runsc, agent, _ := testBinaries(t)
	networktest.Setup(t)
	netm := networktest.Manager(t, network.Config{Scope: fmt.Sprintf("evalbox-gv-test-%d", os.Getpid()),
		Pool: netip.MustParsePrefix("10.233.0.0/24"), DNS: []netip.Addr{}})
	e := &testEnv{runsc: runsc, agent: agent, rootDir: t.TempDir(), netm: netm}
	r := e.runtime(t)
	_, err := r.Start(context.Background(), runtime.Spec{ID: "gv-fail", RootFS: "/nonexistent-rootfs", AgentPath: agent,
		StateDir: t.TempDir(), MemoryMB: 128, DiskMB: 16, Network: runtime.NetworkOutbound})
	if err == nil {
		t.Fatal("Start with a missing root filesystem succeeded")
	}
	if left := r.Leftovers("gv-fail"); len(left) > 0 {
		t.Fatalf("leftovers after a failed Start: %q", left)
	}
	if _, err := r.Start(context.Background(), runtime.Spec{ID: "../x", Network: runtime.NetworkOutbound}); err == nil {
		t.Fatal("Start with id ../x succeeded")
	}
}

// BenchmarkStart measures Start until the agent answers a ping, per
// network mode, and reports Destroy separately.
func BenchmarkStart(b *testing.B) {
	for _, netMode := range []string{runtime.NetworkNone, runtime.NetworkOutbound} {
		b.Run(netMode, func(b *testing.B) {
			runsc, agent, rootfs := testBinaries(b)
			networktest.Setup(b)
			netm := networktest.Manager(b, network.Config{Scope: fmt.Sprintf("evalbox-gv-test-%d", os.Getpid()),
				Pool: netip.MustParsePrefix("10.233.0.0/24"), DNS: []netip.Addr{}})
			e := &testEnv{runsc: runsc, agent: agent, rootfs: rootfs, rootDir: b.TempDir(), netm: netm}
			r := e.runtime(b)
			ctx := context.Background()
			var destroy time.Duration
			for i := 0; b.Loop(); i++ {
				id := fmt.Sprintf("gv-bench-%d", i)
				sb, err := r.Start(ctx, runtime.Spec{
					ID: id, RootFS: rootfs, AgentPath: agent, AgentArgs: []string{"--workdir", "/", "--user", "root"},
					StateDir: b.TempDir(), CPU: 1, MemoryMB: 256, DiskMB: 64, Pids: 128, Network: netMode,
				})
				if err != nil {
					b.Fatal(err)
				}
				c, err := agentproto.Dial(sb.Conn())
				if err == nil {
					err = c.Ping(ctx)
				}
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				t0 := time.Now()
				c.Close()
				if err := sb.Destroy(ctx); err != nil {
					b.Fatal(err)
				}
				destroy += time.Since(t0)
				if left := r.Leftovers(id); len(left) > 0 {
					b.Fatalf("leftovers: %q", left)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(destroy.Microseconds())/float64(b.N)/1000, "destroy-ms/op")
		})
	}
}

// TestExportUpper checks that a sandbox's changes come out as an overlayfs
// layer: new and changed files with their metadata, a deleted file as a
// 0/0 character device, a replaced directory as opaque.
func TestExportUpper(t *testing.T) {
	runsc, agent, rootfs := testBinaries(t)
	netm, err := network.New(network.Config{Scope: fmt.Sprintf("evalbox-gv-test-%d", os.Getpid())})
	if err != nil {
		t.Fatal(err)
	}
	e := &testEnv{runsc: runsc, agent: agent, rootfs: rootfs, rootDir: t.TempDir(), netm: netm}
	r := e.runtime(t)
	s := e.start(t, r, "gv-upper", runtime.NetworkNone)
	if out := s.sh(t, "set -e; echo new > /etc/added; chown 12:34 /etc/added; chmod 4750 /etc/added; rm /etc/hostname; "+
		"rm -rf /var/cache; mkdir -p /var/cache/fresh; ln -s /etc/added /root/link; echo ok"); !strings.HasSuffix(out, "ok\n") {
		t.Fatalf("changes: %s", out)
	}
	p := filepath.Join(t.TempDir(), "upper.tar")
	if err := s.sb.ExportUpper(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := map[string]*tar.Header{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		got[strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")] = h
	}
	if h := got["etc/added"]; h == nil || h.Typeflag != tar.TypeReg || h.Mode&0o7777 != 0o4750 || h.Uid != 12 || h.Gid != 34 {
		t.Errorf("etc/added: %+v", h)
	}
	if h := got["etc/hostname"]; h == nil || h.Typeflag != tar.TypeChar || h.Devmajor != 0 || h.Devminor != 0 {
		t.Errorf("etc/hostname is not a whiteout: %+v", h)
	}
	if h := got["var/cache"]; h == nil || h.Typeflag != tar.TypeDir || h.PAXRecords["SCHILY.xattr.trusted.overlay.opaque"] != "y" {
		t.Errorf("var/cache is not opaque: %+v", h)
	}
	if h := got["root/link"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "/etc/added" {
		t.Errorf("root/link: %+v", h)
	}
	if _, ok := got["usr/bin/bash"]; ok {
		t.Error("an unchanged file is in the layer")
	}
}

// TestDestroyWithoutRunsc checks the Destroy of a started sandbox, which
// kills it through its cgroup instead of `runsc delete`: every host process
// of it (Sentry, gofer, systrap stubs) is gone, its cgroup is gone from
// every hierarchy (runsc makes one in each, cpuacct and blkio included),
// runsc's state files are gone and `runsc list` no longer knows it.
func TestDestroyWithoutRunsc(t *testing.T) {
	runsc, agent, rootfs := testBinaries(t)
	e := &testEnv{runsc: runsc, agent: agent, rootfs: rootfs, rootDir: t.TempDir()}
	r := e.runtime(t)
	const id = "gv-destroy"
	s := e.start(t, r, id, runtime.NetworkNone)
	// Load the sandbox a little: processes inside, files in its overlay.
	if out := s.sh(t, "for i in 1 2 3; do sleep 600 & done; head -c 1000000 /dev/zero > /tmp/f; echo ok"); !strings.HasSuffix(out, "ok\n") {
		t.Fatalf("setup: %s", out)
	}
	cg, err := r.cg.Open(id)
	if err != nil {
		t.Fatal(err)
	}
	pids, err := cg.Procs()
	if err != nil || len(pids) < 2 {
		t.Fatalf("host processes of the sandbox = %v, %v; want the Sentry and the gofer at least", pids, err)
	}
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", r.cfg.CgroupParent, id))
	if len(dirs) < 2 {
		t.Fatalf("cgroup directories of the sandbox = %q; want one per hierarchy", dirs)
	}
	if !s.sb.started {
		t.Fatal("a started sandbox is not marked started")
	}
	if len(r.stateFiles(id)) == 0 {
		t.Fatal("no runsc state files for a running sandbox")
	}

	s.agent.Close()
	if err := s.sb.Destroy(context.Background()); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	for _, pid := range pids {
		// The processes were not ours: init reaps them. A zombie has no
		// cmdline.
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && len(b) > 0 {
			t.Errorf("process %d still runs after Destroy: %q", pid, b)
		}
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("cgroup %s left after Destroy", d)
		}
	}
	if f := r.stateFiles(id); len(f) > 0 {
		t.Errorf("runsc state files left: %q", f)
	}
	out, err := exec.Command(runsc, "--root", e.rootDir, "list", "--quiet").CombinedOutput()
	if err != nil {
		t.Fatalf("runsc list: %v: %s", err, out)
	}
	if slices.Contains(strings.Fields(string(out)), id) {
		t.Errorf("runsc list still has %s: %q", id, out)
	}
}

// TestForkBombContained: a fork bomb meets the sandbox's RLIMIT_NPROC
// (half its Pids) inside gVisor, before the host pids limit (its Pids)
// would kill the Sentry: the sandbox survives, and answers after the bomb.
func TestForkBombContained(t *testing.T) {
	runsc, agent, rootfs := testBinaries(t)
	e := &testEnv{runsc: runsc, agent: agent, rootfs: rootfs, rootDir: t.TempDir()}
	r := e.runtime(t)
	s := e.start(t, r, "gv-forkbomb", runtime.NetworkNone)
	if out := s.sh(t, "bash -c 'ulimit -u'"); strings.TrimSpace(out) != "32" {
		t.Fatalf("ulimit -u = %q, want a quarter of the sandbox's Pids (128)", out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	res, err := s.agent.Exec(ctx, agentproto.ExecRequest{Shell: `bomb() { bomb | bomb & }; bomb; sleep 10`, TimeoutMs: 3_000}, nil, &out, &out)
	if err != nil {
		t.Fatalf("fork bomb: the sandbox was lost: %v", err)
	}
	t.Logf("fork bomb: %+v", res)
	if res.Status != agentproto.StatusTimedOut {
		t.Fatalf("fork bomb: %+v, want timed out (its tree killed)", res)
	}
	if got := s.sh(t, "echo alive"); got != "alive\n" {
		t.Fatalf("after the fork bomb: %q", got)
	}
}

// TestRootForkBombSparesTheAgent: a fork bomb run as root holds every task
// the guest's RLIMIT_NPROC gives root, the agent's user, while the agent
// is kept busy; the agent, which keeps CAP_SYS_RESOURCE for itself, still
// gets the threads it needs and the sandbox lives on (without it the Go
// runtime died with "fatal error: newosproc" whenever it wanted one more
// thread: seen under a loaded host). Root commands hold neither that
// capability nor a way to raise their limit.
func TestRootForkBombSparesTheAgent(t *testing.T) {
	runsc, agent, rootfs := testBinaries(t)
	e := &testEnv{runsc: runsc, agent: agent, rootfs: rootfs, rootDir: t.TempDir()}
	r := e.runtime(t)
	s := e.start(t, r, "gv-rootbomb", runtime.NetworkNone)

	const sysResource = 24 // CAP_SYS_RESOURCE
	capOf := func(status, field string) uint64 {
		t.Helper()
		for _, l := range strings.Split(status, "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && k == field {
				var c uint64
				if _, err := fmt.Sscanf(strings.TrimSpace(v), "%x", &c); err != nil {
					t.Fatalf("%s: %q: %v", field, v, err)
				}
				return c
			}
		}
		t.Fatalf("no %s in %q", field, status)
		return 0
	}
	agentStatus, self := s.sh(t, "cat /proc/1/status"), s.sh(t, "cat /proc/self/status")
	if c := capOf(agentStatus, "CapEff"); c&(1<<sysResource) == 0 {
		t.Errorf("the agent's CapEff %x lacks CAP_SYS_RESOURCE", c)
	}
	for _, f := range []string{"CapEff", "CapPrm", "CapBnd", "CapInh", "CapAmb"} {
		if c := capOf(self, f); c&(1<<sysResource) != 0 {
			t.Errorf("a root command's %s %x holds CAP_SYS_RESOURCE", f, c)
		}
	}
	if out := s.sh(t, "bash -c 'ulimit -u 1000 2>&1 && echo RAISED; ulimit -u'"); strings.Contains(out, "RAISED") || !strings.HasSuffix(out, "32\n") {
		t.Errorf("a root command raised its RLIMIT_NPROC: %q", out)
	}

	// Each process forks two copies of itself and blocks: the tree holds
	// every task it got until its timeout kills it.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bombDone := make(chan error, 1)
	go func() {
		_, err := s.agent.Exec(ctx, agentproto.ExecRequest{
			Argv:      []string{"bash", "-c", "exec 3< <(exec sleep 100000); bomb() { bomb & bomb & read -r -u 3; }; bomb"},
			TimeoutMs: 15_000,
		}, nil, io.Discard, io.Discard)
		bombDone <- err
	}()
	// Until root's tasks are all taken: a root command cannot fork. (The
	// agent can: it starts the command.)
	deadline := time.Now().Add(time.Minute)
	for {
		var out bytes.Buffer
		if _, err := s.agent.Exec(ctx, agentproto.ExecRequest{Shell: "(true) && echo forked", TimeoutMs: 5_000}, nil, &out, &out); err != nil {
			t.Fatalf("exec during the bomb: %v", err)
		}
		if !strings.Contains(out.String(), "forked") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the bomb never took root's last task")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Keep the agent busy while the bomb holds the limit: every goroutine
	// blocked in a syscall may make the Go runtime want another thread.
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 16 {
		wg.Go(func() {
			for range 4 {
				if _, err := s.agent.ListDir(ctx, "/proc"); err != nil {
					errs <- fmt.Errorf("list /proc: %w", err)
					return
				}
				if _, err := s.agent.Exec(ctx, agentproto.ExecRequest{Argv: []string{"true"}, TimeoutMs: 5_000}, nil, io.Discard, io.Discard); err != nil {
					errs <- fmt.Errorf("exec: %w", err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("during the bomb: %v", err)
	}
	if err := <-bombDone; err != nil {
		t.Fatalf("the bomb's exec: the sandbox was lost: %v", err)
	}
	if got := s.sh(t, "echo alive"); got != "alive\n" {
		t.Fatalf("after the fork bomb: %q", got)
	}
}

func TestAgentCgroupEnv(t *testing.T) {
	if agentCgroupEnv != agentproto.CgroupEnv {
		t.Fatalf("agentCgroupEnv %q, agentproto.CgroupEnv %q", agentCgroupEnv, agentproto.CgroupEnv)
	}
}

// TestHostCostIsTheCgroupLimits holds HostCost, which the node admits
// sandboxes with, equal to the limits runsc gets for the sandbox's cgroup.
func TestHostCostIsTheCgroupLimits(t *testing.T) {
	for _, s := range []runtime.Spec{
		{ID: "a", MemoryMB: 512, DiskMB: 1024, Pids: 1024},
		{ID: "b", MemoryMB: 2048, DiskMB: 4096, Pids: 4096, CPU: 2},
		{ID: "c", MemoryMB: 64, DiskMB: 16},
	} {
		sp := ociSpec(s, "parent", nil)
		got := (&Runtime{}).HostCost(s)
		if want := *sp.Linux.Resources.Memory.Limit; got.MemoryBytes != want {
			t.Errorf("%+v: HostCost memory %d, cgroup limit %d", s, got.MemoryBytes, want)
		}
		var pids int64
		if sp.Linux.Resources.Pids != nil {
			pids = sp.Linux.Resources.Pids.Limit
		}
		if got.Pids != pids {
			t.Errorf("%+v: HostCost pids %d, cgroup limit %d", s, got.Pids, pids)
		}
	}
	if got := hostCost(runtime.Spec{MemoryMB: 512, DiskMB: 1024, Pids: 1024}); got.Pids != 1024+sentryTasks || got.MemoryBytes != (512+1024+sentryOverheadMB)<<20 {
		t.Errorf("default shape: %+v", got)
	}
	// The fleet's placement computes the same cost without the driver.
	for _, s := range []runtime.Spec{{MemoryMB: 512, DiskMB: 1024, Pids: 1024}, {MemoryMB: 64, Pids: 16}, {MemoryMB: 128, DiskMB: 32}} {
		got, want := hostCost(s), nodeapi.HostCost(Name, nodeapi.Shape{MemoryMB: s.MemoryMB, DiskMB: s.DiskMB, Pids: s.Pids})
		if got.Pids != want.Pids || got.MemoryBytes != want.MemoryBytes {
			t.Errorf("%+v: driver's host cost %+v, nodeapi.HostCost %+v", s, got, want)
		}
	}
}
