package node

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/agent"
	"github.com/evalbox/evalbox/internal/runtime"
	"github.com/evalbox/evalbox/internal/template"
)

// fakeRuntime is a driver whose sandboxes are the real agent served
// in-process over a pipe; its host cost is the spec's Pids and MemoryMB.
type fakeRuntime struct {
	starts    atomic.Int64
	failStart atomic.Bool // Start fails
	failKill  atomic.Bool // Destroy fails and leaves something behind
	mu        sync.Mutex
	left      map[string]bool // ids whose destroy failed, until cleaned
}

func (f *fakeRuntime) Name() string    { return "fake" }
func (f *fakeRuntime) Version() string { return "test" }
func (f *fakeRuntime) HostCost(s runtime.Spec) runtime.Resources {
	return runtime.Resources{Pids: int64(s.Pids), MemoryBytes: int64(s.MemoryMB) << 20}
}

func (f *fakeRuntime) Start(ctx context.Context, spec runtime.Spec) (runtime.Sandbox, error) {
	f.starts.Add(1)
	if f.failStart.Load() {
		return nil, errors.New("fake: start failed")
	}
	host, guest := net.Pipe()
	actx, cancel := context.WithCancel(context.Background())
	sb := &fakeSandbox{f: f, id: spec.ID, conn: host, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(sb.done)
		_ = agent.Serve(actx, guest, agent.Config{Workdir: "/", Logger: slog.New(slog.DiscardHandler)})
	}()
	return sb, nil
}

func (f *fakeRuntime) Sweep(ctx context.Context, keep func(string) bool) ([]string, error) {
	return nil, nil
}

func (f *fakeRuntime) Leftovers(id string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.left[id] {
		return []string{"fake process of " + id}
	}
	return nil
}

func (f *fakeRuntime) clean(id string) {
	f.mu.Lock()
	delete(f.left, id)
	f.mu.Unlock()
}

type fakeSandbox struct {
	f      *fakeRuntime
	id     string
	conn   net.Conn
	cancel context.CancelFunc
	done   chan struct{}
}

func (s *fakeSandbox) Conn() io.ReadWriteCloser { return s.conn }
func (s *fakeSandbox) Destroy(ctx context.Context) error {
	s.cancel()
	s.conn.Close()
	<-s.done
	if s.f.failKill.Load() {
		s.f.mu.Lock()
		s.f.left[s.id] = true
		s.f.mu.Unlock()
		return errors.New("fake: kill failed")
	}
	return nil
}
func (s *fakeSandbox) Usage(context.Context) (runtime.Usage, error) { return runtime.Usage{}, nil }
func (s *fakeSandbox) OOMKills() (int64, error)                     { return 0, nil }

// newTestNode returns a node with the fake runtime and a template "base",
// whose capacity takes hostPids pids.
func newTestNode(t testing.TB, hostPids int64) (*Node, *fakeRuntime) {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "templates", "base", "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "templates", "base", "template.json"),
		[]byte(`{"name":"base","digest":"sha256:0000000000000000000000000000000000000000000000000000000000000000","defaults":{"cpu":1,"memory_mb":512,"disk_mb":1024,"workdir":"/","user":"root"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	reg, err := template.Open(filepath.Join(dir, "templates"), nil)
	if err != nil {
		t.Fatal(err)
	}
	c := newTestCapacity(t, newFakeProc(t, 32768, 32768, 24*gib, 24*gib), CapacityConfig{HostPids: hostPids})
	rt := &fakeRuntime{left: map[string]bool{}}
	n, err := New(Config{Runtimes: []runtime.Runtime{rt}, Templates: reg, StateDir: filepath.Join(dir, "state"),
		Build:    BuildConfig{Runtime: "fake", CPU: 1, MemoryMB: 64, DiskMB: 16, Pids: 100},
		Capacity: c, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(context.Background()); err != nil {
			t.Error(err)
		}
		if s := c.Status(); s.Reserved != (runtime.Resources{}) || s.Sandboxes != 0 {
			t.Errorf("after Close: %+v", s)
		}
	})
	return n, rt
}

var testKey = PoolKey{Template: "sha256:0000000000000000000000000000000000000000000000000000000000000000", Runtime: "fake", Shape: Shape{CPU: 1, MemoryMB: 512, DiskMB: 1024, Pids: 100}}

func TestNodeReservesEverySandbox(t *testing.T) {
	n, rt := newTestNode(t, 250)
	ctx := t.Context()
	a, err := n.Create(ctx, testKey, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := n.Create(ctx, testKey, 0)
	if err != nil {
		t.Fatal(err)
	}
	if s := n.Capacity().Status(); s.Reserved.Pids != 200 || s.Reserved.MemoryBytes != 1024<<20 || s.Sandboxes != 2 {
		t.Fatalf("two sandboxes: %+v", s)
	}
	// A third does not fit (50 free): refused without a start.
	starts := rt.starts.Load()
	_, err = n.Create(ctx, testKey, 0)
	var cerr *CapacityError
	if !errors.As(err, &cerr) || cerr.Resource != "pids" || rt.starts.Load() != starts {
		t.Fatalf("third: %v (starts %d → %d)", err, starts, rt.starts.Load())
	}
	// With a wait it gets in once one is destroyed.
	got := make(chan error, 1)
	go func() {
		sb, err := n.Create(ctx, testKey, 10*time.Second)
		if err == nil {
			err = n.Destroy(ctx, sb.ID)
		}
		got <- err
	}()
	waitFor(t, func() bool { return n.Capacity().Status().Waiting == 1 })
	if err := n.Destroy(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiting create: %v", err)
	}
	if err := n.Destroy(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	if s := n.Capacity().Status(); s.Reserved.Pids != 0 || s.Sandboxes != 0 {
		t.Fatalf("all destroyed: %+v", s)
	}
}

func TestNodeFailedStartReleases(t *testing.T) {
	n, rt := newTestNode(t, 250)
	rt.failStart.Store(true)
	if _, err := n.Create(t.Context(), testKey, 0); err == nil || errors.Is(err, ErrInsufficientCapacity) {
		t.Fatalf("failing start: %v", err)
	}
	if s := n.Capacity().Status(); s.Reserved.Pids != 0 || s.Sandboxes != 0 {
		t.Fatalf("after a failed start: %+v", s)
	}
	// A shape without a pids limit cannot be admitted.
	unlimited := testKey
	unlimited.Shape.Pids = 0
	rt.failStart.Store(false)
	if _, err := n.Create(t.Context(), unlimited, 0); err == nil {
		t.Fatal("a sandbox without a pids limit was started")
	}
}

func TestNodeFailedDestroyHoldsUntilSweep(t *testing.T) {
	n, rt := newTestNode(t, 250)
	ctx := t.Context()
	sb, err := n.Create(ctx, testKey, 0)
	if err != nil {
		t.Fatal(err)
	}
	rt.failKill.Store(true)
	if err := n.Destroy(ctx, sb.ID); err == nil {
		t.Fatal("destroy did not fail")
	}
	rt.failKill.Store(false)
	// Something of it may still run: its capacity stays taken.
	if _, err := n.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if s := n.Capacity().Status(); s.Reserved.Pids != 100 || s.Sandboxes != 1 {
		t.Fatalf("after a failed destroy: %+v", s)
	}
	rt.clean(sb.ID)
	if _, err := n.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if s := n.Capacity().Status(); s.Reserved.Pids != 0 || s.Sandboxes != 0 {
		t.Fatalf("after the sweep found nothing left: %+v", s)
	}
}

func TestNodePoolWaitsForCapacity(t *testing.T) {
	n, rt := newTestNode(t, 250)
	ctx := t.Context()
	n.SetPool(testKey, 3)
	// Two fit; the pool waits for the third without spinning.
	waitFor(t, func() bool { return n.Pools()[0].Ready == 2 })
	time.Sleep(1500 * time.Millisecond)
	if got := rt.starts.Load(); got != 2 {
		t.Fatalf("%d starts for a pool that fits 2", got)
	}
	// A create of another shape waits; the capacity a claim frees goes to
	// it, not to the pool's refill.
	other := testKey
	other.Shape.MemoryMB = 256
	got := make(chan error, 1)
	go func() {
		sb, err := n.Create(ctx, other, 10*time.Second)
		if err == nil && sb.FromPool {
			err = errors.New("served from the pool of another shape")
		}
		got <- err
	}()
	waitFor(t, func() bool { return n.Capacity().Status().Waiting == 1 })
	claimed, err := n.Create(ctx, testKey, 0)
	if err != nil || !claimed.FromPool {
		t.Fatalf("claim: %+v %v", claimed, err)
	}
	if err := n.Destroy(ctx, claimed.ID); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiting create: %v", err)
	}
	if p := n.Pools()[0]; p.Ready != 1 {
		t.Fatalf("pool took the capacity the create waited for: %+v", p)
	}
}

func TestNodeCloseEndsCapacityWaits(t *testing.T) {
	n, _ := newTestNode(t, 150)
	ctx := t.Context()
	sb, err := n.Create(ctx, testKey, 0)
	if err != nil {
		t.Fatal(err)
	}
	_ = sb
	got := make(chan error, 1)
	go func() {
		_, err := n.Create(ctx, testKey, -1)
		got <- err
	}()
	waitFor(t, func() bool { return n.Capacity().Status().Waiting == 1 })
	closed := make(chan error, 1)
	go func() { closed <- n.Close(context.Background()) }()
	select {
	case err := <-got:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("waiting create at close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end the capacity wait")
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}

func TestNodeBuildStepQueuesForCapacity(t *testing.T) {
	n, _ := newTestNode(t, 150)
	ctx := t.Context()
	sb, err := n.Create(ctx, testKey, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := &syncBuffer{}
	type result struct {
		res template.RunResult
		err error
	}
	got := make(chan result, 1)
	go func() {
		res, err := n.RunBuildStep(ctx, template.RunStep{ID: "build-1", RootFS: "/", Shell: "echo built", Workdir: "/", Output: out})
		got <- result{res, err}
	}()
	// The step's 100 pids do not fit beside the sandbox's: it waits, and
	// its log says so.
	waitFor(t, func() bool { return n.Capacity().Status().Waiting == 1 })
	if !strings.Contains(out.String(), "waiting for host capacity: not enough host pids") {
		t.Fatalf("build log: %q", out.String())
	}
	if err := n.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil || r.res.ExitCode != 0 || !strings.Contains(out.String(), "built\n") {
		t.Fatalf("build step: %+v %v, log %q", r.res, r.err, out.String())
	}
	if s := n.Capacity().Status(); s.Reserved.Pids != 0 || s.Sandboxes != 0 {
		t.Fatalf("after the build step: %+v", s)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestNodeDestroyGiven: what Create handed out (claimed from the pool or
// started) is destroyed; the pool's ready sandboxes stay.
func TestNodeDestroyGiven(t *testing.T) {
	n, _ := newTestNode(t, 32768)
	ctx := t.Context()
	n.SetPool(testKey, 2)
	waitFor(t, func() bool { return n.Pools()[0].Ready == 2 })
	claimed, err := n.Create(ctx, testKey, 0)
	if err != nil || !claimed.FromPool {
		t.Fatalf("claim: %+v %v", claimed, err)
	}
	other := testKey
	other.Shape.MemoryMB = 256
	started, err := n.Create(ctx, other, 0)
	if err != nil || started.FromPool {
		t.Fatalf("start: %+v %v", started, err)
	}
	waitFor(t, func() bool { return n.Pools()[0].Ready == 2 }) // refilled
	got, err := n.DestroyGiven(ctx)
	if err != nil || got != 2 {
		t.Fatalf("DestroyGiven = %d, %v; want the 2 handed out", got, err)
	}
	n.mu.Lock()
	for _, sb := range []*Sandbox{claimed, started} {
		if _, live := n.live[sb.ID]; live {
			t.Errorf("%s is live after DestroyGiven", sb.ID)
		}
	}
	n.mu.Unlock()
	if p := n.Pools()[0]; p.Ready != 2 {
		t.Errorf("the pool after DestroyGiven: %+v", p)
	}
}

// TestNodeFailedDestroySweptSoon: a failed destroy does not wait for the
// next periodic sweep: an early one finds what it left once it is gone
// (here: cleaned a moment later) and gives its capacity back.
func TestNodeFailedDestroySweptSoon(t *testing.T) {
	n, rt := newTestNode(t, 250)
	n.SweepEvery(time.Hour)
	ctx := t.Context()
	sb, err := n.Create(ctx, testKey, 0)
	if err != nil {
		t.Fatal(err)
	}
	rt.failKill.Store(true)
	if err := n.Destroy(ctx, sb.ID); err == nil {
		t.Fatal("destroy did not fail")
	}
	rt.failKill.Store(false)
	time.AfterFunc(500*time.Millisecond, func() { rt.clean(sb.ID) })
	waitFor(t, func() bool { return n.Capacity().Status().Reserved.Pids == 0 })
}

// TestSandboxEnv: an exec's environment is the sandbox's env, its secrets
// over it, the exec's own over both; a snapshot's (BaseEnv) has no
// secrets, and no result shares a map with the sandbox.
func TestSandboxEnv(t *testing.T) {
	var sb Sandbox
	if got := sb.ExecEnv(nil); got != nil {
		t.Fatalf("no env = %v", got)
	}
	sb.SetEnv(map[string]string{"A": "env", "B": "env"})
	secrets := map[string]string{"B": "secret", "C": "secret"}
	sb.SetSecrets(secrets)
	secrets["C"] = "changed by the caller"
	got := sb.ExecEnv(map[string]string{"C": "exec"})
	want := map[string]string{"A": "env", "B": "secret", "C": "exec"}
	if !maps.Equal(got, want) {
		t.Fatalf("ExecEnv = %v, want %v", got, want)
	}
	if got := sb.ExecEnv(nil); got["C"] != "secret" {
		t.Fatalf("SetSecrets kept the caller's map: %v", got)
	}
	got["A"] = "x"
	base := sb.BaseEnv()
	if !maps.Equal(base, map[string]string{"A": "env", "B": "env"}) {
		t.Fatalf("BaseEnv = %v: want the env without secrets, unchanged", base)
	}
	sb.SetSecrets(nil)
	if got := sb.ExecEnv(nil); got["B"] != "env" || len(got) != 2 {
		t.Fatalf("after SetSecrets(nil): %v", got)
	}
}
