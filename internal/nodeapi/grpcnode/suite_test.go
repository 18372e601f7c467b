package grpcnode

// The behavioural suite of the node contract, run against both
// implementations with real sandboxes: node.Local in process, and node.Local
// served over gRPC on a loopback TCP listener to a Client. It needs root,
// the agent binary ($EVALBOX_BIN_DIR, default <repo>/bin: scripts/build.sh)
// and a template root filesystem ($EVALBOX_TEST_ROOTFS); runsc in the same
// bin directory adds a gVisor smoke test.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/node"
	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/internal/runtime"
	"github.com/evalbox/evalbox/internal/runtime/gvisor"
	"github.com/evalbox/evalbox/internal/runtime/namespaces"
	"github.com/evalbox/evalbox/internal/runtime/network"
	"github.com/evalbox/evalbox/internal/runtime/network/networktest"
	"github.com/evalbox/evalbox/internal/template"
	"github.com/evalbox/evalbox/pkg/client"
)

func TestMain(m *testing.M) {
	// A namespaces sandbox's init stage is this binary, re-executed.
	namespaces.Init()
	os.Exit(m.Run())
}

// testDigest is the digest of the test's one template (newRealNode).
var testDigest string

// testRegistry returns a registry whose built-in "base" is rootfs: the
// registry rootfs is in (<dir>/base/rootfs, as scripts/test.sh's
// templates dir), read only; else a registry in dir whose base links to
// rootfs (gVisor refuses such a root: its smoke test then fails).
func testRegistry(t testing.TB, dir, rootfs string) *template.Registry {
	t.Helper()
	if filepath.Base(rootfs) == "rootfs" && filepath.Base(filepath.Dir(rootfs)) == "base" {
		reg, err := template.Open(filepath.Dir(filepath.Dir(rootfs)), nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := reg.Get("base"); err == nil {
			return reg
		}
	}
	tdir := filepath.Join(dir, "templates", "base")
	if err := os.MkdirAll(tdir, 0o755); err != nil {
		t.Fatal(err)
	}
	meta := `{"name":"base","digest":"sha256:` + strings.Repeat("7", 64) + `","defaults":{"cpu":1,"memory_mb":512,"disk_mb":256,"workdir":"/","user":"root",` +
		`"env":{"PATH":"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin","HOME":"/root"}}}`
	if err := os.WriteFile(filepath.Join(tdir, "template.json"), []byte(meta), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(rootfs, filepath.Join(tdir, "rootfs")); err != nil {
		t.Fatal(err)
	}
	reg, err := template.Open(filepath.Join(dir, "templates"), nil)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// realEnv finds what real sandboxes need, or skips the test.
func realEnv(t testing.TB) (agent, runsc, rootfs string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("real sandboxes need root")
	}
	bin := os.Getenv("EVALBOX_BIN_DIR")
	if bin == "" {
		bin, _ = filepath.Abs("../../../bin")
	}
	agent, runsc = filepath.Join(bin, "evalbox-agent"), filepath.Join(bin, "runsc")
	if _, err := os.Stat(agent); err != nil {
		t.Skipf("%s missing: run scripts/build.sh (or set EVALBOX_BIN_DIR)", agent)
	}
	if _, err := os.Stat(runsc); err != nil {
		runsc = ""
	}
	rootfs = os.Getenv("EVALBOX_TEST_ROOTFS")
	if rootfs == "" {
		rootfs = "/tmp/tpl-base"
	}
	if _, err := os.Stat(filepath.Join(rootfs, "bin/sh")); err != nil {
		t.Skipf("no test root filesystem at %s (set EVALBOX_TEST_ROOTFS)", rootfs)
	}
	return agent, runsc, rootfs
}

// newRealNode returns a node whose one template (testDigest, a built-in
// "base" of the test rootfs) runs on namespaces, and on gVisor when
// withGVisor and runsc is there. It is closed, and checked for leftovers,
// at the end of t.
func newRealNode(t testing.TB, capCfg node.CapacityConfig, withGVisor bool) *node.Node {
	t.Helper()
	agent, runsc, rootfs := realEnv(t)
	dir := t.TempDir()
	reg := testRegistry(t, dir, rootfs)
	tpl, err := reg.Get("base")
	if err != nil {
		t.Fatal(err)
	}
	testDigest = tpl.Digest
	log := slog.New(slog.DiscardHandler)
	scope := fmt.Sprintf("evalbox-grpcnode-test-%d", os.Getpid())
	// Test link and chain names (no rule is installed: these sandboxes
	// have no network), so that nothing of the host's servers is touched.
	netm, err := network.New(network.Config{Scope: scope, LinkPrefix: networktest.LinkPrefix, ChainPrefix: networktest.ChainPrefix, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ns, err := namespaces.New(namespaces.Config{CgroupParent: scope + "-ns", Network: netm, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	rts := []runtime.Runtime{ns}
	var gv *gvisor.Runtime
	if withGVisor && runsc != "" {
		gv, err = gvisor.New(gvisor.Config{Runsc: runsc, RootDir: filepath.Join(dir, "runsc"), CgroupParent: scope + "-gv", Network: netm, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		rts = append(rts, gv)
	}
	capacity, err := node.NewCapacity(capCfg)
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.New(node.Config{Runtimes: rts, Templates: reg, AgentPath: agent, StateDir: filepath.Join(dir, "state"),
		SnapshotDir: filepath.Join(dir, "snapshots"), Capacity: capacity, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(context.Background()); err != nil {
			t.Errorf("close node: %v", err)
		}
		ns.Close()
		if gv != nil {
			gv.Close()
		}
	})
	return n
}

// impls are the two implementations of the contract over one node.
func impls(t *testing.T, n *node.Node) map[string]nodeapi.Node {
	local := node.NewLocal(n)
	return map[string]nodeapi.Node{"inprocess": local, "grpc": dial(t, serve(t, local, ServerConfig{}), ClientConfig{})}
}

var testShape = nodeapi.Shape{CPU: 1, MemoryMB: 512, DiskMB: 256, Pids: 256, Network: nodeapi.NetworkNone}

func testSpec(rt string) nodeapi.Spec {
	return nodeapi.Spec{Template: testDigest, Runtime: rt, Shape: testShape}
}

// create starts a sandbox and destroys it at the end of t.
func create(t *testing.T, n nodeapi.Node, rt string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	info, err := n.Create(ctx, nodeapi.CreateRequest{Spec: testSpec(rt), Env: map[string]string{"SUITE_ENV": "create", "SUITE_OVER": "create"}})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if info.ID == "" || info.Runtime != rt || info.RuntimeVersion == "" || info.StartedAt.IsZero() {
		t.Errorf("create: info %+v", info)
	}
	t.Cleanup(func() {
		if err := n.Destroy(context.Background(), info.ID); err != nil {
			t.Errorf("destroy %s: %v", info.ID, err)
		}
	})
	return info.ID
}

// run runs sh -c cmd and returns its stdout.
func run(t *testing.T, n nodeapi.Node, id, cmd string) string {
	t.Helper()
	var out, errb bytes.Buffer
	x, err := n.Exec(t.Context(), id, nodeapi.ExecRequest{Shell: cmd, TimeoutMs: 30000}, nil, &out, &errb)
	if err != nil || x.Status != nodeapi.StatusExited || x.ExitCode != 0 {
		t.Fatalf("%s: %+v %v (stderr %q)", cmd, x, err, errb.String())
	}
	return out.String()
}

// sleepers counts the sandbox's processes named sleep.
const sleepers = `n=0; for c in /proc/[0-9]*/comm; do [ "$(cat $c 2>/dev/null)" = sleep ] && n=$((n+1)); done; echo $n`

// noSleepers waits until no sleep process is left in the sandbox.
func noSleepers(t *testing.T, n nodeapi.Node, id string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := strings.TrimSpace(run(t, n, id, sleepers))
		if got == "0" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s sleep processes left", got)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func agentCode(err error) string {
	var ae *nodeapi.AgentError
	if errors.As(err, &ae) {
		return ae.Code
	}
	return ""
}

// snapshots: a snapshot of a gVisor sandbox restores into new sandboxes
// with its files and processes; a pause takes the sandbox's calls away
// until its resume, twice; bad input is refused; a namespaces sandbox's
// snapshot carries its files, and it cannot be paused (400).
func snapshots(t *testing.T, n nodeapi.Node) {
	ctx := t.Context()
	src := create(t, n, "gvisor")
	run(t, n, src, "echo prepared > /root/state")
	bg, err := n.StartProcess(ctx, src, nodeapi.ExecRequest{Argv: []string{"sleep", "600"}, Tag: "keep"})
	if err != nil {
		t.Fatal(err)
	}
	info, err := n.Snapshot(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	if !node.ValidSnapshotID(info.ID) || info.Source != src || info.Spec != testSpec("gvisor") || !info.Memory || info.SizeBytes <= 0 || info.CreatedAt.IsZero() {
		t.Fatalf("snapshot info %+v", info)
	}
	defer func() {
		if err := n.DeleteSnapshot(context.Background(), info.ID); err != nil {
			t.Errorf("delete snapshot: %v", err)
		}
	}()
	run(t, n, src, "echo after > /root/state")
	restored, err := n.Create(ctx, nodeapi.CreateRequest{Spec: testSpec("gvisor"), Snapshot: info.ID})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Destroy(context.Background(), restored.ID)
	if got := run(t, n, restored.ID, "cat /root/state"); got != "prepared\n" {
		t.Errorf("restored /root/state %q", got)
	}
	ps, err := n.ListProcesses(ctx, restored.ID)
	if err != nil || !hasProc(ps, bg.ID, "keep") {
		t.Errorf("restored processes %+v %v", ps, err)
	}
	if got := run(t, n, src, "cat /root/state"); got != "after\n" {
		t.Errorf("source /root/state %q", got)
	}
	// A snapshot of another spec, or none, is refused.
	if _, err := n.Create(ctx, nodeapi.CreateRequest{Spec: testSpec("namespaces"), Snapshot: info.ID}); apiCode(err) != client.CodeBadRequest {
		t.Errorf("create from a snapshot of another spec: %v", err)
	}
	if _, err := n.Create(ctx, nodeapi.CreateRequest{Spec: testSpec("gvisor"), Snapshot: node.NewSnapshotID()}); !errors.Is(err, nodeapi.ErrSnapshotNotFound) {
		t.Errorf("create from a missing snapshot: %v", err)
	}
	if _, err := n.Snapshot(ctx, "sb-nope"); !errors.Is(err, nodeapi.ErrSandboxNotFound) {
		t.Errorf("snapshot of an unknown sandbox: %v", err)
	}
	// A namespaces sandbox's snapshot holds its files, not its processes;
	// it cannot be paused.
	nsb := create(t, n, "namespaces")
	run(t, n, nsb, "echo ns > /root/state")
	nsInfo, err := n.Snapshot(ctx, nsb)
	if err != nil {
		t.Fatalf("snapshot of a namespaces sandbox: %v", err)
	}
	defer func() {
		if err := n.DeleteSnapshot(context.Background(), nsInfo.ID); err != nil {
			t.Errorf("delete snapshot: %v", err)
		}
	}()
	if nsInfo.Memory || nsInfo.Spec != testSpec("namespaces") || nsInfo.SizeBytes <= 0 {
		t.Errorf("namespaces snapshot info %+v", nsInfo)
	}
	nsRestored, err := n.Create(ctx, nodeapi.CreateRequest{Spec: testSpec("namespaces"), Snapshot: nsInfo.ID})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Destroy(context.Background(), nsRestored.ID)
	if got := run(t, n, nsRestored.ID, "cat /root/state"); got != "ns\n" {
		t.Errorf("namespaces restored /root/state %q", got)
	}
	if err := n.Pause(ctx, nsb); apiCode(err) != client.CodeBadRequest {
		t.Errorf("pause of a namespaces sandbox: %v", err)
	}

	// Pause, resume, twice: what each run wrote stays.
	for round := 1; round <= 2; round++ {
		run(t, n, src, fmt.Sprintf("echo %d >> /root/rounds", round))
		if err := n.Pause(ctx, src); err != nil {
			t.Fatalf("pause %d: %v", round, err)
		}
		if err := n.Pause(ctx, src); apiCode(err) != client.CodeConflict {
			t.Errorf("pause of a paused sandbox: %v", err)
		}
		if _, err := n.Exec(ctx, src, nodeapi.ExecRequest{Argv: []string{"true"}}, nil, nil, nil); apiCode(err) != client.CodeSandboxNotRunning {
			t.Errorf("exec in a paused sandbox: %v", err)
		}
		if _, err := n.Snapshot(ctx, src); apiCode(err) != client.CodeSandboxNotRunning {
			t.Errorf("snapshot of a paused sandbox: %v", err)
		}
		if err := n.Resume(ctx, src, 0); err != nil {
			t.Fatalf("resume %d: %v", round, err)
		}
		if err := n.Resume(ctx, src, 0); apiCode(err) != client.CodeConflict {
			t.Errorf("resume of a running sandbox: %v", err)
		}
		want := ""
		for i := 1; i <= round; i++ {
			want += fmt.Sprintf("%d\n", i)
		}
		if got := run(t, n, src, "cat /root/rounds"); got != want {
			t.Fatalf("after resume %d: /root/rounds %q, want %q", round, got, want)
		}
	}
	ps, err = n.ListProcesses(ctx, src)
	if err != nil || !hasProc(ps, bg.ID, "keep") {
		t.Errorf("processes after the resumes %+v %v", ps, err)
	}
	// A paused sandbox is destroyed like any.
	if err := n.Pause(ctx, restored.ID); err != nil {
		t.Fatal(err)
	}
	if err := n.Destroy(ctx, restored.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Wait(ctx, restored.ID); !errors.Is(err, nodeapi.ErrSandboxNotFound) {
		t.Errorf("wait of a destroyed paused sandbox: %v", err)
	}
}

func apiCode(err error) string {
	var ae *apierr.Error
	if errors.As(err, &ae) {
		return ae.Code
	}
	return ""
}

// TestContract runs the suite against both implementations.
func TestContract(t *testing.T) {
	n := newRealNode(t, node.CapacityConfig{}, true)
	rts := n.Runtimes()
	for name, impl := range impls(t, n) {
		t.Run(name, func(t *testing.T) {
			suite(t, impl, rts)
		})
	}
}

func suite(t *testing.T, n nodeapi.Node, runtimes []string) {
	t.Run("snapshots", func(t *testing.T) {
		if !strings.Contains(strings.Join(runtimes, ","), "gvisor") {
			t.Skip("no runsc: snapshots need gVisor")
		}
		snapshots(t, n)
	})
	t.Run("node", func(t *testing.T) {
		rts, err := n.Runtimes(t.Context())
		if err != nil || !strings.Contains(strings.Join(rts, ","), "namespaces") {
			t.Errorf("runtimes %v %v", rts, err)
		}
		c, err := n.Capacity(t.Context())
		if err != nil || c.Budget.Pids <= 0 || c.Budget.MemoryBytes <= 0 || c.Free().Pids > c.Budget.Pids {
			t.Errorf("capacity %+v %v", c, err)
		}
		other := "sha256:" + strings.Repeat("8", 64)
		got, err := n.TemplatesPresent(t.Context(), []string{other, testDigest})
		if err != nil || len(got) != 1 || got[0] != testDigest {
			t.Errorf("templates present %v %v", got, err)
		}
		_, err = n.Create(t.Context(), nodeapi.CreateRequest{Spec: nodeapi.Spec{Template: other, Runtime: "namespaces", Shape: testShape}})
		var missing *nodeapi.TemplateMissingError
		if !errors.As(err, &missing) || missing.Digest != other || !errors.Is(err, nodeapi.ErrTemplateMissing) {
			t.Errorf("create of a template the node lacks: %v", err)
		}
		if err := n.SetPool(t.Context(), nodeapi.PoolSpec{Spec: nodeapi.Spec{Template: other, Runtime: "namespaces"}}); !errors.Is(err, nodeapi.ErrTemplateMissing) {
			t.Errorf("pool of a template the node lacks: %v", err)
		}
		if _, err := n.Create(t.Context(), nodeapi.CreateRequest{Spec: testSpec("nope")}); !errors.Is(err, nodeapi.ErrUnknownRuntime) {
			t.Errorf("create on an unknown runtime: %v", err)
		}
		if _, err := n.Exec(t.Context(), "sb-nope", nodeapi.ExecRequest{Argv: []string{"true"}}, nil, nil, nil); !errors.Is(err, nodeapi.ErrSandboxNotFound) {
			t.Errorf("exec in an unknown sandbox: %v", err)
		}
		if _, err := n.Wait(t.Context(), "sb-nope"); !errors.Is(err, nodeapi.ErrSandboxNotFound) {
			t.Errorf("wait for an unknown sandbox: %v", err)
		}
		if err := n.Destroy(t.Context(), "sb-nope"); err != nil {
			t.Errorf("destroy of an unknown sandbox: %v", err)
		}
	})

	t.Run("pool", func(t *testing.T) {
		spec := testSpec("namespaces")
		spec.Shape.Pids = 200 // a pool of its own
		if err := n.SetPool(t.Context(), nodeapi.PoolSpec{Spec: spec, TemplateName: "base", Target: 1}); err != nil {
			t.Fatal(err)
		}
		defer n.SetPool(context.Background(), nodeapi.PoolSpec{Spec: spec, TemplateName: "base", Target: 0})
		deadline := time.Now().Add(time.Minute)
		for {
			ps, err := n.Pools(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			var ready int
			for _, p := range ps {
				if p.Spec == spec && p.TemplateName == "base" {
					ready = p.Ready
				}
			}
			if ready == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("pool never ready: %+v", ps)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err := n.SetPool(t.Context(), nodeapi.PoolSpec{Spec: spec, TemplateName: "base", Target: 0}); err != nil {
			t.Fatal(err)
		}
		info, err := n.Create(t.Context(), nodeapi.CreateRequest{Spec: spec})
		if err != nil || !info.FromPool {
			t.Fatalf("claim: %+v %v", info, err)
		}
		n.Destroy(t.Context(), info.ID)
	})

	id := create(t, n, "namespaces")

	t.Run("the create's env", func(t *testing.T) {
		var out bytes.Buffer
		x, err := n.Exec(t.Context(), id, nodeapi.ExecRequest{Shell: `echo "$SUITE_ENV $SUITE_OVER"`, Env: map[string]string{"SUITE_OVER": "exec"}, TimeoutMs: 30000}, nil, &out, nil)
		if err != nil || x.ExitCode != 0 || out.String() != "create exec\n" {
			t.Errorf("%+v %v: %q, want the create's env under the exec's", x, err, out.String())
		}
	})

	t.Run("connect port", func(t *testing.T) {
		// An echo server in the sandbox (perl-base is in every Debian
		// root), on its loopback: answers what it read once its input
		// ended.
		srv := `perl -MIO::Socket::INET -e '$s=IO::Socket::INET->new(LocalAddr=>"127.0.0.1",LocalPort=>8700,Listen=>5,ReuseAddr=>1) or die "listen: $!"; while($c=$s->accept){ local $/; $d=<$c>; print $c $d; close $c }'`
		if _, err := n.StartProcess(t.Context(), id, nodeapi.ExecRequest{Shell: srv, TimeoutMs: 120000}); err != nil {
			t.Fatal(err)
		}
		var conn nodeapi.PortConn
		deadline := time.Now().Add(20 * time.Second)
		for {
			var err error
			conn, err = n.ConnectPort(t.Context(), id, 8700)
			if err == nil {
				break
			}
			if agentCode(err) != nodeapi.CodeConnRefused || time.Now().After(deadline) {
				t.Fatalf("connect: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		defer conn.Close()
		want := bytes.Repeat([]byte("0123456789abcdef"), 3<<16) // 3 MiB: several messages
		go func() {
			conn.Write(want)
			conn.CloseWrite()
		}()
		got, err := io.ReadAll(conn)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("echo through the port: %d bytes, %v; want %d", len(got), err, len(want))
		}
		if _, err := n.ConnectPort(t.Context(), id, 8701); agentCode(err) != nodeapi.CodeConnRefused {
			t.Errorf("a port with nothing on it: %v", err)
		}
		if _, err := n.ConnectPort(t.Context(), "sb-nope", 8700); !errors.Is(err, nodeapi.ErrSandboxNotFound) {
			t.Errorf("an unknown sandbox: %v", err)
		}
	})

	t.Run("connect port ends with its sandbox", func(t *testing.T) {
		// A server that says nothing; the sandbox is destroyed while a
		// read waits on it: the read ends, it does not hang.
		other := create(t, n, "namespaces")
		silent := `perl -MIO::Socket::INET -e '$s=IO::Socket::INET->new(LocalAddr=>"127.0.0.1",LocalPort=>8702,Listen=>5,ReuseAddr=>1) or die; while($c=$s->accept){ sleep 3600 }'`
		if _, err := n.StartProcess(t.Context(), other, nodeapi.ExecRequest{Shell: silent, TimeoutMs: 120000}); err != nil {
			t.Fatal(err)
		}
		var conn nodeapi.PortConn
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			var err error
			if conn, err = n.ConnectPort(t.Context(), other, 8702); err == nil {
				break
			} else if agentCode(err) != nodeapi.CodeConnRefused || time.Now().After(deadline) {
				t.Fatalf("connect: %v", err)
			}
		}
		defer conn.Close()
		read := make(chan error, 1)
		go func() {
			_, err := conn.Read(make([]byte, 1))
			read <- err
		}()
		if err := n.Destroy(t.Context(), other); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-read:
			if err == nil {
				t.Error("a read after the sandbox's end returned no error")
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a read on a port connection hangs after its sandbox was destroyed")
		}
	})

	t.Run("set egress", func(t *testing.T) {
		// These sandboxes have no network: rules are a conflict, as is a
		// create that asks for them, which leaves nothing; the codes cross
		// the wire. (Rules themselves: internal/runtime/network and the
		// e2e suite.)
		rules := &nodeapi.Egress{Allow: []string{"pypi.org"}, Deny: []string{}}
		if err := n.SetEgress(t.Context(), id, rules); apierr.Code(err) != client.CodeConflict {
			t.Errorf("rules on a sandbox without network: %v, want conflict", err)
		}
		if err := n.SetEgress(t.Context(), "sb-nope", nil); !errors.Is(err, nodeapi.ErrSandboxNotFound) {
			t.Errorf("unknown sandbox: %v", err)
		}
		before, err := n.Capacity(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		_, err = n.Create(t.Context(), nodeapi.CreateRequest{Spec: testSpec("namespaces"), Egress: rules})
		if apierr.Code(err) != client.CodeConflict {
			t.Errorf("a create with rules and no network: %v, want conflict", err)
		}
		if after, err := n.Capacity(t.Context()); err != nil || after.Sandboxes != before.Sandboxes {
			t.Errorf("sandboxes after the failed create: %d, before %d (%v)", after.Sandboxes, before.Sandboxes, err)
		}
	})

	t.Run("stats and throttle", func(t *testing.T) {
		// The CPU-abuse rule's measure and throttle, on every runtime: a
		// spinning process's CPU time shows in Stats, and Throttle lowers
		// the quota Stats reports (never above the shape's).
		for _, rt := range runtimes {
			t.Run(rt, func(t *testing.T) {
				sid := create(t, n, rt)
				st0, err := n.Stats(t.Context(), sid)
				if err != nil || st0.CPU != testShape.CPU || st0.SampledAt.IsZero() {
					t.Fatalf("stats %+v %v", st0, err)
				}
				if _, err := n.StartProcess(t.Context(), sid, nodeapi.ExecRequest{Shell: "while :; do :; done"}); err != nil {
					t.Fatal(err)
				}
				time.Sleep(time.Second)
				st1, err := n.Stats(t.Context(), sid)
				if err != nil {
					t.Fatal(err)
				}
				if f, ok := st1.Fraction(st0); !ok || f < 0.2 {
					t.Errorf("a spinning sandbox used %.2f of its quota (%+v, %+v)", f, st0, st1)
				}
				if err := n.Throttle(t.Context(), sid, testShape.CPU/2); err != nil {
					t.Fatal(err)
				}
				if st, err := n.Stats(t.Context(), sid); err != nil || st.CPU != testShape.CPU/2 {
					t.Errorf("stats after a throttle %+v %v", st, err)
				}
				if err := n.Throttle(t.Context(), sid, 2*testShape.CPU); apierr.Code(err) != client.CodeBadRequest {
					t.Errorf("a throttle above the shape: %v, want bad_request", err)
				}
			})
		}
		if _, err := n.Stats(t.Context(), "sb-nope"); !errors.Is(err, nodeapi.ErrSandboxNotFound) {
			t.Errorf("stats of an unknown sandbox: %v", err)
		}
		if err := n.Throttle(t.Context(), "sb-nope", 0.5); !errors.Is(err, nodeapi.ErrSandboxNotFound) {
			t.Errorf("throttle of an unknown sandbox: %v", err)
		}
	})

	t.Run("exec stdin", func(t *testing.T) {
		var out, errb bytes.Buffer
		in := strings.Repeat("line of input\n", 10000)
		x, err := n.Exec(t.Context(), id, nodeapi.ExecRequest{Shell: "cat; echo done >&2; exit 3", Env: map[string]string{"X": "1"}},
			strings.NewReader(in), &out, &errb)
		if err != nil || x.Status != nodeapi.StatusExited || x.ExitCode != 3 || out.String() != in || errb.String() != "done\n" {
			t.Errorf("%+v %v: stdout %d bytes, stderr %q", x, err, out.Len(), errb.String())
		}
		x, err = n.Exec(t.Context(), id, nodeapi.ExecRequest{Argv: []string{"/nonexistent"}}, nil, nil, nil)
		if err != nil || x.Status != nodeapi.StatusError || x.Error == "" {
			t.Errorf("a command that cannot start: %+v %v", x, err)
		}
	})

	t.Run("large output", func(t *testing.T) {
		var out countWriter
		x, err := n.Exec(t.Context(), id, nodeapi.ExecRequest{Shell: "head -c 50000000 /dev/zero", MaxOutputBytes: 64 << 20}, nil, &out, nil)
		if err != nil || x.ExitCode != 0 || out.n != 50000000 || x.StdoutTruncated {
			t.Errorf("%+v %v: %d bytes", x, err, out.n)
		}
		out.n = 0
		x, err = n.Exec(t.Context(), id, nodeapi.ExecRequest{Shell: "head -c 5000000 /dev/zero", MaxOutputBytes: 1 << 20}, nil, &out, nil)
		if err != nil || out.n != 1<<20 || !x.StdoutTruncated {
			t.Errorf("capped: %+v %v: %d bytes", x, err, out.n)
		}
	})

	t.Run("timeout kills the tree", func(t *testing.T) {
		var out bytes.Buffer
		t0 := time.Now()
		x, err := n.Exec(t.Context(), id, nodeapi.ExecRequest{Shell: "echo partial; sleep 100 & (sleep 101 &); sleep 102", TimeoutMs: 500}, nil, &out, nil)
		if err != nil || x.Status != nodeapi.StatusTimedOut || out.String() != "partial\n" || time.Since(t0) > 20*time.Second {
			t.Errorf("%+v %v %q", x, err, out.String())
		}
		noSleepers(t, n, id)
	})

	t.Run("background", func(t *testing.T) {
		p, err := n.StartProcess(t.Context(), id, nodeapi.ExecRequest{Shell: "echo started; exec sleep 100", Tag: "bg"})
		if err != nil || p.ID == "" || p.Pid <= 0 || !p.Running {
			t.Fatalf("start: %+v %v", p, err)
		}
		ps, err := n.ListProcesses(t.Context(), id)
		if err != nil || !hasProc(ps, p.ID, "bg") {
			t.Errorf("list: %+v %v", ps, err)
		}
		out := &syncBuffer{}
		type res struct {
			x   nodeapi.ExitInfo
			err error
		}
		attached := make(chan res, 1)
		go func() {
			x, err := n.AttachProcess(t.Context(), id, p.ID, out, io.Discard)
			attached <- res{x, err}
		}()
		waitUntil(t, func() bool { return out.String() == "started\n" })
		// Detaching (ending the call) leaves it running.
		ctx, cancel := context.WithCancel(t.Context())
		detached := make(chan error, 1)
		go func() { _, err := n.AttachProcess(ctx, id, p.ID, io.Discard, io.Discard); detached <- err }()
		time.Sleep(100 * time.Millisecond)
		cancel()
		if err := <-detached; !errors.Is(err, context.Canceled) {
			t.Errorf("detach: %v", err)
		}
		if err := n.SignalProcess(t.Context(), id, p.ID, 15); err != nil {
			t.Fatalf("signal: %v", err)
		}
		r := <-attached
		if r.err != nil || r.x.Status != nodeapi.StatusKilled || r.x.Signal != 15 {
			t.Errorf("attach: %+v %v", r.x, r.err)
		}
		x, err := n.WaitProcess(t.Context(), id, p.ID)
		if err != nil || x.Status != nodeapi.StatusKilled {
			t.Errorf("wait: %+v %v", x, err)
		}
		if err := n.SignalProcess(t.Context(), id, "p-nope", 15); agentCode(err) != nodeapi.CodeNotFound {
			t.Errorf("signal an unknown process: %v", err)
		}
		if _, err := n.WaitProcess(t.Context(), id, "p-nope"); agentCode(err) != nodeapi.CodeNotFound {
			t.Errorf("wait for an unknown process: %v", err)
		}
	})

	t.Run("stdin", func(t *testing.T) {
		p, err := n.StartProcess(t.Context(), id, nodeapi.ExecRequest{Shell: "cat; echo eof", Stdin: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.WriteStdin(t.Context(), id, p.ID, []byte("one "), false); err != nil {
			t.Fatal(err)
		}
		if err := n.WriteStdin(t.Context(), id, p.ID, []byte("two\n"), true); err != nil {
			t.Fatal(err)
		}
		out := &syncBuffer{}
		if x, err := n.AttachProcess(t.Context(), id, p.ID, out, io.Discard); err != nil || x.ExitCode != 0 || out.String() != "one two\neof\n" {
			t.Fatalf("attach: %+v %v %q", x, err, out.String())
		}
		if err := n.WriteStdin(t.Context(), id, p.ID, []byte("late"), false); agentCode(err) != nodeapi.CodeNotFound {
			t.Errorf("write after the end: %v", err)
		}
		if err := n.WriteStdin(t.Context(), id, "p-nope", []byte("x"), false); agentCode(err) != nodeapi.CodeNotFound {
			t.Errorf("write to an unknown process: %v", err)
		}
		if err := n.WriteStdin(t.Context(), id, p.ID, make([]byte, nodeapi.MaxStdinBytes+1), false); err == nil {
			t.Error("more than MaxStdinBytes accepted")
		}
	})

	t.Run("large file", func(t *testing.T) {
		const size = 64 << 20
		src := &patternReader{left: size}
		fi, err := n.WriteFile(t.Context(), id, "/tmp/big/file", src, nodeapi.WriteOptions{Mode: 0o640, Parents: true})
		if err != nil || fi.Size != size || fi.Mode != 0o640 || fi.Type != "file" {
			t.Fatalf("write: %+v %v", fi, err)
		}
		info, rc, err := n.OpenFile(t.Context(), id, "/tmp/big/file")
		if err != nil || info.Size != size {
			t.Fatalf("open: %+v %v", info, err)
		}
		h := sha256.New()
		got, err := io.Copy(h, rc)
		rc.Close()
		want := sha256.New()
		io.Copy(want, &patternReader{left: size})
		if err != nil || got != size || !bytes.Equal(h.Sum(nil), want.Sum(nil)) {
			t.Errorf("read back %d bytes, %v, same bytes: %v", got, err, bytes.Equal(h.Sum(nil), want.Sum(nil)))
		}
		// Closing a download midway is fine, and leaves the file.
		_, rc, err = n.OpenFile(t.Context(), id, "/tmp/big/file")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.CopyN(io.Discard, rc, 3<<20); err != nil {
			t.Error(err)
		}
		rc.Close()
		if err := n.Remove(t.Context(), id, "/tmp/big", true); err != nil {
			t.Error(err)
		}
	})

	t.Run("file operations and their errors", func(t *testing.T) {
		ctx := t.Context()
		if _, err := n.Mkdir(ctx, id, "/work/d", nodeapi.MkdirOptions{Mode: 0o700}); err != nil {
			t.Fatal(err)
		}
		if _, err := n.Mkdir(ctx, id, "/work/d", nodeapi.MkdirOptions{}); agentCode(err) != nodeapi.CodeExists {
			t.Errorf("mkdir over a directory: %v", err)
		}
		if fi, err := n.Mkdir(ctx, id, "/work/d/e/f", nodeapi.MkdirOptions{Parents: true}); err != nil || fi.Type != "dir" || fi.Mode != 0o755 {
			t.Errorf("mkdir -p: %+v %v", fi, err)
		}
		if _, err := n.WriteFile(ctx, id, "/work/d/x", strings.NewReader("hello"), nodeapi.WriteOptions{Mode: 0o600}); err != nil {
			t.Fatal(err)
		}
		fi, err := n.Stat(ctx, id, "/work/d/x")
		if err != nil || fi.Size != 5 || fi.Mode != 0o600 || fi.Name != "x" || fi.ModTime.IsZero() {
			t.Errorf("stat: %+v %v", fi, err)
		}
		fs, err := n.ListDir(ctx, id, "/work/d")
		if err != nil || len(fs) != 2 || fs[0].Name != "e" || fs[1].Name != "x" {
			t.Errorf("list: %+v %v", fs, err)
		}
		if _, err := n.Stat(ctx, id, "/work/nope"); agentCode(err) != nodeapi.CodeNotFound {
			t.Errorf("stat of nothing: %v", err)
		}
		if _, err := n.ListDir(ctx, id, "/work/d/x"); agentCode(err) == "" {
			t.Errorf("list a file: %v", err)
		}
		if _, _, err := n.OpenFile(ctx, id, "/work/nope"); agentCode(err) != nodeapi.CodeNotFound {
			t.Errorf("open nothing: %v", err)
		}
		if err := n.Remove(ctx, id, "/work/d", false); agentCode(err) == "" {
			t.Errorf("remove a full directory: %v", err)
		}
		if err := n.Remove(ctx, id, "/", true); agentCode(err) == "" {
			t.Errorf("remove /: %v", err)
		}
		_, err = n.WriteFile(ctx, id, "/work/d/big", strings.NewReader(strings.Repeat("x", 100)), nodeapi.WriteOptions{MaxBytes: 10})
		if agentCode(err) != nodeapi.CodeTooLarge {
			t.Errorf("too large: %v", err)
		}
		if _, err := n.Stat(ctx, id, "/work/d/big"); agentCode(err) != nodeapi.CodeNotFound {
			t.Errorf("a too large upload left %v", err)
		}
		if _, err := n.WriteFile(ctx, id, "/work/nope/x", strings.NewReader("x"), nodeapi.WriteOptions{}); agentCode(err) != nodeapi.CodeNotFound {
			t.Errorf("write without parents: %v", err)
		}
		if fi, err := n.Rename(ctx, id, "/work/d/x", "/work/d/y"); err != nil || fi.Path != "/work/d/y" || fi.Size != 5 {
			t.Errorf("rename: %+v %v", fi, err)
		}
		if _, err := n.Stat(ctx, id, "/work/d/x"); agentCode(err) != nodeapi.CodeNotFound {
			t.Errorf("the old name after a rename: %v", err)
		}
		if _, err := n.Rename(ctx, id, "/work/nope", "/work/d/z"); agentCode(err) != nodeapi.CodeNotFound {
			t.Errorf("rename nothing: %v", err)
		}
		if _, err := n.Rename(ctx, id, "/work/d/y", "/work/d/e"); agentCode(err) == "" {
			t.Errorf("rename a file over a full directory: %v", err)
		}
		if _, err := n.Rename(ctx, id, "/work/d", "/work/d/e/inside"); agentCode(err) != nodeapi.CodeBadRequest {
			t.Errorf("rename into itself: %v", err)
		}
		if _, err := n.Rename(ctx, id, "/", "/work/root"); agentCode(err) != nodeapi.CodeBadRequest {
			t.Errorf("rename /: %v", err)
		}
		if err := n.Remove(ctx, id, "/work/d", true); err != nil {
			t.Error(err)
		}
		if _, err := n.Stat(ctx, id, "/work/d"); agentCode(err) != nodeapi.CodeNotFound {
			t.Errorf("stat after remove: %v", err)
		}
	})

	t.Run("cancel mid-exec", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		out := &syncBuffer{}
		done := make(chan error, 1)
		go func() {
			x, err := n.Exec(ctx, id, nodeapi.ExecRequest{Shell: "echo up; sleep 100 & (sleep 101 &); sleep 102"}, nil, out, nil)
			if err == nil {
				err = fmt.Errorf("exec ended by itself: %+v", x)
			}
			done <- err
		}()
		waitUntil(t, func() bool { return out.String() == "up\n" })
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("exec after cancel: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("exec did not return after cancel")
		}
		noSleepers(t, n, id)
	})

	t.Run("cancel mid-upload", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		src := &cancelReader{left: 8 << 20, cancel: cancel, ctx: ctx}
		_, err := n.WriteFile(ctx, id, "/work/up/file", src, nodeapi.WriteOptions{Parents: true})
		if err == nil {
			t.Fatal("an upload cancelled midway succeeded")
		}
		if _, err := n.Stat(t.Context(), id, "/work/up/file"); agentCode(err) != nodeapi.CodeNotFound {
			t.Errorf("the cancelled upload left the file: %v", err)
		}
		waitUntil(t, func() bool {
			fs, err := n.ListDir(t.Context(), id, "/work/up")
			return err == nil && len(fs) == 0
		})
		// A failing source aborts too.
		_, err = n.WriteFile(t.Context(), id, "/work/up/file", io.MultiReader(strings.NewReader("abc"), errReader{}), nodeapi.WriteOptions{})
		if err == nil {
			t.Fatal("an upload whose source failed succeeded")
		}
		if _, err := n.Stat(t.Context(), id, "/work/up/file"); agentCode(err) != nodeapi.CodeNotFound {
			t.Errorf("the failed upload left the file: %v", err)
		}
	})

	t.Run("death", func(t *testing.T) {
		id := create(t, n, "namespaces")
		ended := make(chan nodeapi.End, 1)
		go func() {
			end, err := n.Wait(t.Context(), id)
			if err != nil {
				t.Errorf("wait: %v", err)
			}
			ended <- end
		}()
		time.Sleep(100 * time.Millisecond)
		// Killed from outside, as by the OOM killer or a crash.
		go func() {
			time.Sleep(200 * time.Millisecond)
			killSandbox(t, id)
		}()
		_, err := n.Exec(t.Context(), id, nodeapi.ExecRequest{Shell: "sleep 30"}, nil, nil, nil)
		if !errors.Is(err, nodeapi.ErrSandboxStopped) {
			t.Errorf("exec that killed its sandbox: %v", err)
		}
		select {
		case end := <-ended:
			if end.Reason == "" || end.Reason == "destroyed" {
				t.Errorf("end %+v", end)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the sandbox's death was not observed")
		}
		if _, err := n.Stat(t.Context(), id, "/"); !errors.Is(err, nodeapi.ErrSandboxStopped) {
			t.Errorf("stat in a dead sandbox: %v", err)
		}
		// Destroyed: Wait returns at once, the id is gone.
		id2 := create(t, n, "namespaces")
		destroyed := make(chan error, 1)
		go func() {
			time.Sleep(200 * time.Millisecond)
			destroyed <- n.Destroy(context.Background(), id2)
		}()
		if end, err := n.Wait(t.Context(), id2); err != nil || end.Reason != "destroyed" {
			t.Errorf("wait on a destroyed sandbox: %+v %v", end, err)
		}
		if err := <-destroyed; err != nil {
			t.Error(err)
		}
		if _, err := n.Stat(t.Context(), id2, "/"); !errors.Is(err, nodeapi.ErrSandboxNotFound) {
			t.Errorf("stat in a destroyed sandbox: %v", err)
		}
	})

	for _, rt := range runtimes {
		if rt == "namespaces" {
			continue
		}
		t.Run(rt+" smoke", func(t *testing.T) {
			id := create(t, n, rt)
			var out bytes.Buffer
			x, err := n.Exec(t.Context(), id, nodeapi.ExecRequest{Shell: "cat"}, strings.NewReader("in gvisor"), &out, nil)
			if err != nil || x.ExitCode != 0 || out.String() != "in gvisor" {
				t.Errorf("exec: %+v %v %q", x, err, out.String())
			}
			if _, err := n.WriteFile(t.Context(), id, "/tmp/f", &patternReader{left: 4 << 20}, nodeapi.WriteOptions{}); err != nil {
				t.Error(err)
			}
			if got := run(t, n, id, "wc -c < /tmp/f"); strings.TrimSpace(got) != "4194304" {
				t.Errorf("size %q", got)
			}
		})
	}
}

// TestContractCapacity: a host that is full refuses a create with a
// *nodeapi.CapacityError through both implementations.
func TestContractCapacity(t *testing.T) {
	n := newRealNode(t, node.CapacityConfig{HostPids: 700}, false)
	for name, impl := range impls(t, n) {
		t.Run(name, func(t *testing.T) {
			spec := testSpec("namespaces")
			spec.Shape.Pids = 400
			a, err := impl.Create(t.Context(), nodeapi.CreateRequest{Spec: spec})
			if err != nil {
				t.Fatal(err)
			}
			defer impl.Destroy(context.Background(), a.ID)
			t0 := time.Now()
			_, err = impl.Create(t.Context(), nodeapi.CreateRequest{Spec: spec, Wait: 300 * time.Millisecond})
			var cerr *nodeapi.CapacityError
			if !errors.As(err, &cerr) || cerr.Resource != "pids" || cerr.Budget != 700 || cerr.Never || !errors.Is(err, nodeapi.ErrInsufficientCapacity) {
				t.Fatalf("create on a full host: %v", err)
			}
			if cerr.Waited < 250*time.Millisecond || time.Since(t0) > 10*time.Second {
				t.Errorf("waited %v (%v)", cerr.Waited, time.Since(t0))
			}
			spec.Shape.Pids = 1000
			if _, err := impl.Create(t.Context(), nodeapi.CreateRequest{Spec: spec}); !errors.As(err, &cerr) || !cerr.Never {
				t.Errorf("create larger than the host: %v", err)
			}
		})
	}
}

// killSandbox kills every host process of sandbox id (those in its
// cgroups).
func killSandbox(t *testing.T, id string) {
	t.Helper()
	pids, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	killed := 0
	for _, f := range pids {
		b, err := os.ReadFile(f)
		if err != nil || !strings.Contains(string(b), id) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			killed++
		}
	}
	if killed == 0 {
		t.Errorf("no process of %s found to kill", id)
	}
}

func hasProc(ps []nodeapi.ProcInfo, id, tag string) bool {
	for _, p := range ps {
		if p.ID == id && p.Tag == tag && p.Running && !p.StartedAt.IsZero() {
			return true
		}
	}
	return false
}

func waitUntil(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// patternReader yields left bytes of a pattern that is not all one byte.
type patternReader struct {
	left int64
	off  int64
}

func (r *patternReader) Read(p []byte) (int, error) {
	if r.left == 0 {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), r.left))
	for i := range n {
		x := uint64(r.off + int64(i))
		p[i] = byte(x*2654435761>>13) ^ byte(x>>20)
	}
	r.off += int64(n)
	r.left -= int64(n)
	return n, nil
}

// cancelReader yields left bytes, then cancels the call and blocks until
// its context is done.
type cancelReader struct {
	left   int
	cancel context.CancelFunc
	ctx    context.Context
}

func (r *cancelReader) Read(p []byte) (int, error) {
	if r.left == 0 {
		r.cancel()
		<-r.ctx.Done()
		return 0, r.ctx.Err()
	}
	n := min(len(p), r.left)
	clear(p[:n])
	r.left -= n
	return n, nil
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("the source broke") }

// BenchmarkFileTransfer writes then reads 64 MiB through each
// implementation (SetBytes: MB/s per direction).
func BenchmarkFileTransfer(b *testing.B) {
	const size = 64 << 20
	n := newRealNode(b, node.CapacityConfig{}, false)
	local := node.NewLocal(n)
	block := make([]byte, 1<<20)
	if _, err := io.ReadFull(&patternReader{left: 1 << 20}, block); err != nil {
		b.Fatal(err)
	}
	for _, impl := range []struct {
		name string
		n    nodeapi.Node
	}{{"inprocess", local}, {"grpc", dial(b, serve(b, local, ServerConfig{}), ClientConfig{})}} {
		b.Run(impl.name, func(b *testing.B) {
			info, err := impl.n.Create(b.Context(), nodeapi.CreateRequest{Spec: testSpec("namespaces")})
			if err != nil {
				b.Fatal(err)
			}
			defer impl.n.Destroy(context.Background(), info.ID)
			b.SetBytes(2 * size)
			for b.Loop() {
				if _, err := impl.n.WriteFile(b.Context(), info.ID, "/tmp/f", io.LimitReader(repeatReader(block), size), nodeapi.WriteOptions{}); err != nil {
					b.Fatal(err)
				}
				_, rc, err := impl.n.OpenFile(b.Context(), info.ID, "/tmp/f")
				if err != nil {
					b.Fatal(err)
				}
				if got, err := io.Copy(io.Discard, rc); err != nil || got != size {
					b.Fatal(got, err)
				}
				rc.Close()
			}
		})
	}
}

// repeatReader repeats a block without end.
type repeatReader []byte

func (r repeatReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		n += copy(p[n:], r)
	}
	return n, nil
}

// TestContractPauseFreesCapacity: a paused sandbox holds none of the
// host's capacity: another sandbox takes its room; its resume then finds
// none (a capacity error, and it stays paused), and gets it back once
// there is.
func TestContractPauseFreesCapacity(t *testing.T) {
	// A gVisor sandbox of testShape costs 256 + 256 pids: one fits.
	n := newRealNode(t, node.CapacityConfig{HostPids: 700}, true)
	if !strings.Contains(strings.Join(n.Runtimes(), ","), "gvisor") {
		t.Skip("no runsc")
	}
	for name, impl := range impls(t, n) {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			a := create(t, impl, "gvisor")
			run(t, impl, a, "echo kept > /root/a")
			if _, err := impl.Create(ctx, nodeapi.CreateRequest{Spec: testSpec("gvisor")}); !errors.Is(err, nodeapi.ErrInsufficientCapacity) {
				t.Fatalf("a second sandbox on a full host: %v", err)
			}
			if err := impl.Pause(ctx, a); err != nil {
				t.Fatal(err)
			}
			b := create(t, impl, "gvisor") // in the paused one's room
			var cerr *nodeapi.CapacityError
			if err := impl.Resume(ctx, a, 200*time.Millisecond); !errors.As(err, &cerr) {
				t.Fatalf("a resume on a full host: %v", err)
			}
			if _, err := impl.Exec(ctx, a, nodeapi.ExecRequest{Argv: []string{"true"}}, nil, nil, nil); apiCode(err) != client.CodeSandboxNotRunning {
				t.Errorf("exec after a refused resume (still paused): %v", err)
			}
			if err := impl.Destroy(ctx, b); err != nil {
				t.Fatal(err)
			}
			if err := impl.Resume(ctx, a, 10*time.Second); err != nil {
				t.Fatalf("resume once there is room: %v", err)
			}
			if got := run(t, impl, a, "cat /root/a"); got != "kept\n" {
				t.Errorf("after the resume: %q", got)
			}
		})
	}
}
