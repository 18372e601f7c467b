package membership

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/evalbox/evalbox/internal/kubetest"
)

// Tests use short leases, and deadlines far longer than any of them: a
// deadline only bounds how long a broken test waits, on a machine that may
// be busy compiling.
const (
	testLease = 2 * time.Second
	deadline  = 60 * time.Second
)

func TestMembership(t *testing.T) {
	env := kubetest.Start(t)
	cs := clientset(t, env.Config)

	t.Run("Register", func(t *testing.T) {
		t.Parallel()
		leases := namespace(t, cs, "register")
		evs := startWatcher(t, leases)
		c := testCapacity(0)
		startHeartbeat(t, leases, HeartbeatConfig{NodeID: "node-a", Address: "10.1.2.3:7000", LeaseDuration: testLease}, c)

		e := evs.next(t, func(e Event) bool { return e.Node.ID == "node-a" })
		if e.Type != NodeAdded || e.Node.Address != "10.1.2.3:7000" || !reflect.DeepEqual(e.Node.Capacity, c) || e.Node.LeaseDuration != testLease {
			t.Fatalf("first event %+v, want node-a added with its address, capacity and lease duration", e)
		}
		ns := evs.w.Nodes()
		if len(ns) != 1 || ns[0].ID != "node-a" {
			t.Fatalf("Nodes() = %+v, want node-a", ns)
		}
		l, err := leases.Get(context.Background(), "node-a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if *l.Spec.HolderIdentity != "node-a" || *l.Spec.LeaseDurationSeconds != 2 || l.Labels[LabelRole] != RoleNode {
			t.Errorf("Lease %+v", l)
		}
	})

	t.Run("IgnoresOtherLeases", func(t *testing.T) {
		t.Parallel()
		leases := namespace(t, cs, "others")
		evs := startWatcher(t, leases)
		ctx := context.Background()
		holder, secs, now := "someone", int32(3600), metav1.NowMicro()
		spec := coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs, RenewTime: &now}
		// Unlabelled (another program's), and labelled but not a
		// node's (holder is not its name): neither is a node.
		for _, l := range []*coordinationv1.Lease{
			{ObjectMeta: metav1.ObjectMeta{Name: "leader"}, Spec: spec},
			{ObjectMeta: metav1.ObjectMeta{Name: "forged", Labels: map[string]string{LabelRole: RoleNode}}, Spec: spec},
		} {
			if _, err := leases.Create(ctx, l, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		startHeartbeat(t, leases, HeartbeatConfig{NodeID: "real", LeaseDuration: testLease}, testCapacity(0))
		if e := evs.next(t, func(Event) bool { return true }); e.Node.ID != "real" {
			t.Fatalf("event %+v, want only node real's", e)
		}
		if ns := evs.w.Nodes(); len(ns) != 1 {
			t.Fatalf("Nodes() = %+v, want node real only", ns)
		}
	})

	t.Run("CapacityUpdate", func(t *testing.T) {
		t.Parallel()
		leases := namespace(t, cs, "capacity")
		evs := startWatcher(t, leases)
		hb := startHeartbeat(t, leases, HeartbeatConfig{NodeID: "node-c", LeaseDuration: testLease}, testCapacity(0))
		evs.next(t, func(e Event) bool { return e.Type == NodeAdded })

		c := testCapacity(7)
		c.Templates = append(c.Templates, "sha256:"+strings.Repeat("b", 64))
		if err := hb.SetCapacity(c); err != nil {
			t.Fatal(err)
		}
		e := evs.next(t, func(e Event) bool { return e.Type != NodeAdded })
		if e.Type != NodeUpdated || !reflect.DeepEqual(e.Node.Capacity, c) {
			t.Fatalf("event %+v, want node-c updated to %+v", e, c)
		}
		if got := evs.w.Nodes()[0].Capacity; !reflect.DeepEqual(got, c) {
			t.Errorf("Nodes() capacity %+v, want %+v", got, c)
		}

		big := testCapacity(0)
		for i := range MaxCapacityBytes / 64 {
			big.Templates = append(big.Templates, fmt.Sprintf("sha256:%064x", i))
		}
		if err := hb.SetCapacity(big); err == nil {
			t.Error("SetCapacity took a capacity over MaxCapacityBytes")
		}
	})

	t.Run("KilledNodeExpires", func(t *testing.T) {
		t.Parallel()
		leases := namespace(t, cs, "kill")
		evs := startWatcher(t, leases)
		helper := startHelper(t, env.Kubeconfig, "kill", "node-k", testLease)
		evs.next(t, func(e Event) bool { return e.Type == NodeAdded && e.Node.ID == "node-k" })

		// kill -9: the Lease stays, unrenewed.
		if err := helper.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		_ = helper.Wait()
		l, err := leases.Get(context.Background(), "node-k", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the Lease of a killed node: %v", err)
		}
		lastRenewal := l.Spec.RenewTime.Time

		e := evs.next(t, func(e Event) bool { return e.Node.ID == "node-k" })
		expired := time.Now()
		if e.Type != NodeExpired {
			t.Fatalf("event %+v after the kill, want expired", e)
		}
		// One host, one clock: the Watcher must not have judged the
		// node expired before its last renewal's lease ran out.
		if expired.Before(lastRenewal.Add(testLease)) {
			t.Errorf("expired at %v, before the last renewal %v + %v", expired, lastRenewal, testLease)
		}
		if ns := evs.w.Nodes(); len(ns) != 0 {
			t.Errorf("Nodes() = %+v after the expiry", ns)
		}
	})

	t.Run("CleanStopLeavesAtOnce", func(t *testing.T) {
		t.Parallel()
		leases := namespace(t, cs, "leave")
		evs := startWatcher(t, leases)
		// A lease far longer than the deadline below: only the delete
		// can make the node go in time.
		long := 10 * time.Minute
		hb := startHeartbeat(t, leases, HeartbeatConfig{NodeID: "node-l", LeaseDuration: long}, testCapacity(0))
		evs.next(t, func(e Event) bool { return e.Type == NodeAdded })

		if err := hb.stop(); err != nil {
			t.Fatalf("Run = %v, want nil after a clean stop", err)
		}
		if _, err := leases.Get(context.Background(), "node-l", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("the Lease after a clean stop: %v, want not found", err)
		}
		if e := evs.next(t, func(Event) bool { return true }); e.Type != NodeLeft || e.Node.ID != "node-l" {
			t.Fatalf("event %+v, want node-l left", e)
		}
		if ns := evs.w.Nodes(); len(ns) != 0 {
			t.Errorf("Nodes() = %+v after the node left", ns)
		}
	})

	t.Run("TwoNodes", func(t *testing.T) {
		t.Parallel()
		leases := namespace(t, cs, "two")
		evs := startWatcher(t, leases)
		ca, cb := testCapacity(1), testCapacity(2)
		hb1 := startHeartbeat(t, leases, HeartbeatConfig{NodeID: "node-1", Address: "a:1", LeaseDuration: testLease}, ca)
		startHeartbeat(t, leases, HeartbeatConfig{NodeID: "node-2", Address: "b:2", LeaseDuration: testLease}, cb)
		added := map[string]bool{}
		for len(added) < 2 {
			e := evs.next(t, func(e Event) bool { return e.Type == NodeAdded })
			added[e.Node.ID] = true
		}
		ns := evs.w.Nodes()
		if len(ns) != 2 || ns[0].ID != "node-1" || ns[1].ID != "node-2" ||
			!reflect.DeepEqual(ns[0].Capacity, ca) || !reflect.DeepEqual(ns[1].Capacity, cb) || ns[0].Address != "a:1" || ns[1].Address != "b:2" {
			t.Fatalf("Nodes() = %+v, want node-1 and node-2 with their capacities", ns)
		}
		if err := hb1.stop(); err != nil {
			t.Fatal(err)
		}
		if e := evs.next(t, func(e Event) bool { return e.Type != NodeUpdated }); e.Type != NodeLeft || e.Node.ID != "node-1" {
			t.Fatalf("event %+v, want node-1 left", e)
		}
		if ns := evs.w.Nodes(); len(ns) != 1 || ns[0].ID != "node-2" {
			t.Fatalf("Nodes() = %+v, want node-2 only", ns)
		}
	})

	t.Run("RestartTakesOver", func(t *testing.T) {
		t.Parallel()
		leases := namespace(t, cs, "takeover")
		evs := startWatcher(t, leases)
		// A node killed and started again within its lease duration:
		// the new process takes the Lease, the Watcher sees a new
		// incarnation, and the old process (here still running)
		// stops.
		old := startHeartbeat(t, leases, HeartbeatConfig{NodeID: "node-r", LeaseDuration: testLease}, testCapacity(0))
		first := evs.next(t, func(e Event) bool { return e.Type == NodeAdded })
		startHeartbeat(t, leases, HeartbeatConfig{NodeID: "node-r", LeaseDuration: testLease}, testCapacity(1))

		if e := evs.next(t, func(e Event) bool { return e.Type != NodeUpdated }); e.Type != NodeExpired || !e.Node.AcquireTime.Equal(first.Node.AcquireTime) {
			t.Fatalf("event %+v, want the first incarnation expired", e)
		}
		e := evs.next(t, func(e Event) bool { return e.Type != NodeUpdated })
		if e.Type != NodeAdded || !e.Node.AcquireTime.After(first.Node.AcquireTime) {
			t.Fatalf("event %+v, want a new incarnation added", e)
		}
		select {
		case <-old.exited:
			if !errors.Is(old.err, ErrTakenOver) {
				t.Fatalf("the old process's Run = %v, want ErrTakenOver", old.err)
			}
		case <-time.After(deadline):
			t.Fatal("the old process still runs after its Lease was taken over")
		}
		if _, err := leases.Get(context.Background(), "node-r", metav1.GetOptions{}); err != nil {
			t.Fatalf("the old process deleted the new one's Lease: %v", err)
		}
	})
}

// TestMembershipSurvivesOutage stops etcd and the apiserver under a running
// heartbeat and watcher: the node expires (nobody can renew), and once the
// servers are back both resume on their own and the node is live again.
func TestMembershipSurvivesOutage(t *testing.T) {
	env := kubetest.Start(t)
	cs := clientset(t, env.Config)
	leases := namespace(t, cs, "outage")
	evs := startWatcher(t, leases)
	var lapses atomic.Int32
	hb := startHeartbeat(t, leases, HeartbeatConfig{NodeID: "node-o", LeaseDuration: testLease, OnLapse: func() { lapses.Add(1) }}, testCapacity(0))
	evs.next(t, func(e Event) bool { return e.Type == NodeAdded })
	// A renewal after the create: the heartbeat has heard that it holds
	// the Lease (a create whose answer the outage cuts off leaves it
	// never having held one, and so with nothing to lapse).
	for end := time.Now().Add(deadline); ; time.Sleep(50 * time.Millisecond) {
		l, err := leases.Get(context.Background(), "node-o", metav1.GetOptions{})
		if err == nil && l.Spec.RenewTime != nil && l.Spec.AcquireTime != nil && l.Spec.RenewTime.After(l.Spec.AcquireTime.Time) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the heartbeat did not renew its Lease: %v", err)
		}
	}

	env.StopServers(t)
	if e := evs.next(t, func(e Event) bool { return e.Type != NodeUpdated }); e.Type != NodeExpired {
		t.Fatalf("event %+v during the outage, want expired", e)
	}
	// Long enough that the heartbeat's own view lapses too.
	time.Sleep(2 * testLease)
	env.StartServers(t)

	e := evs.next(t, func(e Event) bool { return e.Type != NodeUpdated })
	if e.Type != NodeAdded || e.Node.ID != "node-o" {
		t.Fatalf("event %+v after the outage, want node-o added again", e)
	}
	if n := lapses.Load(); n != 1 {
		t.Errorf("OnLapse called %d times over one lapse, want 1", n)
	}
	select {
	case <-hb.exited:
		t.Fatalf("the heartbeat stopped: %v", hb.err)
	default:
	}
	if err := hb.stop(); err != nil {
		t.Fatal(err)
	}
	if e := evs.next(t, func(e Event) bool { return e.Type != NodeUpdated }); e.Type != NodeLeft {
		t.Fatalf("event %+v, want left", e)
	}
}

// TestHelperHeartbeat is not a test: it is the node process that
// KilledNodeExpires kills with SIGKILL, when run with EVALBOX_MEMBERSHIP_HELPER.
func TestHelperHeartbeat(t *testing.T) {
	spec := os.Getenv("EVALBOX_MEMBERSHIP_HELPER")
	if spec == "" {
		return
	}
	parts := strings.Split(spec, ",")
	if len(parts) != 4 {
		t.Fatalf("EVALBOX_MEMBERSHIP_HELPER=%q", spec)
	}
	kubeconfig, ns, id := parts[0], parts[1], parts[2]
	lease, err := time.ParseDuration(parts[3])
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs := clientset(t, cfg)
	hb, err := NewHeartbeat(cs.CoordinationV1().Leases(ns), HeartbeatConfig{NodeID: id, LeaseDuration: lease}, testCapacity(0))
	if err != nil {
		t.Fatal(err)
	}
	_ = hb.Run(context.Background()) // until killed
}

// startHelper starts TestHelperHeartbeat as a process of its own, dying
// with the test binary.
func startHelper(t *testing.T, kubeconfig, ns, id string, lease time.Duration) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperHeartbeat$", "-test.count=1")
	cmd.Env = append(os.Environ(), "EVALBOX_MEMBERSHIP_HELPER="+strings.Join([]string{kubeconfig, ns, id, lease.String()}, ","))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if t.Failed() {
			t.Logf("helper output:\n%s", out.String())
		}
	})
	return cmd
}

func testCapacity(sandboxes int) Capacity {
	return Capacity{
		CPUs: 2, MemoryMB: 40960, Pids: 100000,
		Free:      Resources{MemoryMB: 40960 - int64(sandboxes)*512, Pids: 100000 - int64(sandboxes)*1024},
		Runtimes:  []string{"gvisor", "namespaces"},
		Templates: []string{"sha256:" + strings.Repeat("a", 64)},
		Sandboxes: sandboxes,
	}
}

func clientset(t testing.TB, cfg *rest.Config) *kubernetes.Clientset {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// namespace creates a namespace for one test (a subtest's own, so that
// parallel subtests see only their nodes) and returns its Leases.
func namespace(t testing.TB, cs kubernetes.Interface, name string) leaseClient {
	t.Helper()
	_, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cs.CoordinationV1().Leases(name)
}

// leaseClient is both of the package's interfaces, as client-go's
// LeaseInterface is.
type leaseClient interface {
	Leases
	LeaseWatcher
}

// testLogger logs into a buffer that is printed when the test fails: the
// goroutines that log may outlive the test by a moment, where t.Log would
// panic.
func testLogger(t testing.TB) *slog.Logger {
	var mu sync.Mutex
	var buf bytes.Buffer
	t.Cleanup(func() {
		if t.Failed() {
			mu.Lock()
			defer mu.Unlock()
			t.Logf("log:\n%s", buf.String())
		}
	})
	return slog.New(slog.NewTextHandler(&lockedWriter{mu: &mu, w: &buf}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}

// events is a running Watcher and the events it reported.
type events struct {
	w  *Watcher
	ch chan Event
}

// startWatcher starts a Watcher over leases until the test ends, and waits until
// it synced.
func startWatcher(t testing.TB, leases LeaseWatcher) *events {
	t.Helper()
	evs := &events{ch: make(chan Event, 1024)}
	evs.w = NewWatcher(leases, WatcherConfig{Logger: testLogger(t), OnEvent: func(e Event) { evs.ch <- e }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- evs.w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watcher.Run = %v", err)
		}
	})
	select {
	case <-evs.w.Synced():
	case <-time.After(deadline):
		t.Fatal("the Watcher did not sync")
	}
	return evs
}

// next returns the next event that match accepts, skipping (and logging)
// the others.
func (evs *events) next(t testing.TB, match func(Event) bool) Event {
	t.Helper()
	timeout := time.After(deadline)
	for {
		select {
		case e := <-evs.ch:
			if match(e) {
				return e
			}
			t.Logf("skipping event %v %s", e.Type, e.Node.ID)
		case <-timeout:
			t.Fatalf("no matching event in %v (nodes: %+v)", deadline, evs.w.Nodes())
		}
	}
}

// runningHeartbeat is a Heartbeat whose Run runs until stop.
type runningHeartbeat struct {
	*Heartbeat
	cancel context.CancelFunc
	exited chan struct{} // closed when Run returned err
	err    error
}

// stop ends Run and returns what it returned.
func (h *runningHeartbeat) stop() error {
	h.cancel()
	<-h.exited
	return h.err
}

// startHeartbeat runs a Heartbeat until stop or the end of the test.
func startHeartbeat(t testing.TB, leases Leases, cfg HeartbeatConfig, c Capacity) *runningHeartbeat {
	t.Helper()
	cfg.Logger = testLogger(t)
	hb, err := NewHeartbeat(leases, cfg, c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningHeartbeat{Heartbeat: hb, cancel: cancel, exited: make(chan struct{})}
	go func() {
		r.err = hb.Run(ctx)
		close(r.exited)
	}()
	t.Cleanup(func() { _ = r.stop() })
	return r
}
