package membership

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/evalbox/evalbox/internal/kubetest"
)

// ScaleBenchEnv turns on the scale measurements of docs/scale.md, which
// take minutes and most of a small machine: unset, they skip.
const ScaleBenchEnv = "EVALBOX_SCALE_BENCH"

// scaleCapacity is a node's capacity as a large host would write it: 64
// CPUs, 256 GiB, both runtimes, 50 templates held, 180 sandboxes running.
func scaleCapacity() Capacity {
	c := Capacity{
		CPUs: 64, MemoryMB: 262144, Pids: 4000000,
		Free:      Resources{MemoryMB: 170000, Pids: 3800000},
		Runtimes:  []string{"gvisor", "namespaces"},
		Sandboxes: 180,
	}
	for i := range 50 {
		c.Templates = append(c.Templates, fmt.Sprintf("sha256:%064x", 0x5eed0000+i))
	}
	return c
}

// TestScaleLeases measures what node Leases cost a real kube-apiserver and
// etcd (kubetest's): (a) the size of one Lease with a realistic capacity,
// as JSON, as protobuf and as etcd stores it; (b) for N nodes renewing
// every R, with two replicas watching, the servers' CPU and memory, the
// renewals' latency as the nodes see it, and how stale the replicas' view
// is (a renewal's renewTime to its arrival on a watch). Run it with
//
//	EVALBOX_SCALE_BENCH=1 EVALBOX_KUBE_BIN_DIR=$(bash scripts/kube.sh) \
//	  go test -run TestScaleLeases -v -timeout 60m ./internal/fleet/membership
//
// EVALBOX_SCALE_LEASES ("N/R,…", default 100/1s,200/1s,500/1s,1000/5s)
// and EVALBOX_SCALE_SECONDS (each row's measured window, default 60) change
// what is run. docs/scale.md has the results.
func TestScaleLeases(t *testing.T) {
	if os.Getenv(ScaleBenchEnv) != "1" {
		t.Skipf("a scale measurement: set %s=1 to run it", ScaleBenchEnv)
	}
	rows := "100/1s,200/1s,500/1s,1000/5s"
	if v := os.Getenv("EVALBOX_SCALE_LEASES"); v != "" {
		rows = v
	}
	window := 60 * time.Second
	if v := os.Getenv("EVALBOX_SCALE_SECONDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("EVALBOX_SCALE_SECONDS=%q", v)
		}
		window = time.Duration(n) * time.Second
	}

	env := kubetest.Start(t)
	admin := clientset(t, env.Config)
	etcdPid, apiPid := env.Pids()

	t.Run("LeaseSize", func(t *testing.T) {
		leases := namespace(t, admin, "size")
		hb := startHeartbeat(t, leases, HeartbeatConfig{NodeID: "node-0000", Address: "10.20.30.40:7070"}, scaleCapacity())
		var l *coordinationv1.Lease
		deadlineAt := time.Now().Add(deadline)
		for {
			got, err := leases.Get(context.Background(), "node-0000", metav1.GetOptions{})
			if err == nil {
				l = got
				break
			}
			if time.Now().After(deadlineAt) {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		js, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		stored := etcdValueSize(t, env, "/registry/leases/size/node-0000")
		t.Logf("lease size: capacity annotation %d B (50 template digests), Lease as JSON %d B (managedFields included), as protobuf %d B, stored in etcd %d B",
			len(l.Annotations[AnnotationCapacity]), len(js), l.Size(), stored)
		_ = hb.stop()
	})

	for _, row := range strings.Split(rows, ",") {
		nStr, rStr, ok := strings.Cut(strings.TrimSpace(row), "/")
		n, err1 := strconv.Atoi(nStr)
		renew, err2 := time.ParseDuration(rStr)
		if !ok || err1 != nil || err2 != nil {
			t.Fatalf("EVALBOX_SCALE_LEASES row %q: want N/DURATION", row)
		}
		t.Run(fmt.Sprintf("%dnodes_%v", n, renew), func(t *testing.T) {
			measureLeases(t, env, admin, etcdPid, apiPid, n, renew, window)
		})
	}
}

// measureLeases runs n Heartbeats renewing every renew and two Watchers,
// and logs what the window cost.
func measureLeases(t *testing.T, env *kubetest.Env, admin *kubernetes.Clientset, etcdPid, apiPid, n int, renew, window time.Duration) {
	nsName := fmt.Sprintf("scale-%d-%d", n, renew.Milliseconds())
	namespace(t, admin, nsName)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Two replicas, each with its own connection, as two API pods.
	var watchers []*Watcher
	var wg sync.WaitGroup
	for range 2 {
		w := NewWatcher(ownClient(t, env).CoordinationV1().Leases(nsName), WatcherConfig{Logger: testLogger(t)})
		watchers = append(watchers, w)
		wg.Go(func() { _ = w.Run(ctx) })
	}
	// A third watch, raw, for the view's staleness: how long after a
	// node wrote its renewTime a watcher sees the renewal.
	lag := &recorder{}
	staleCtx, stopStale := context.WithCancel(ctx)
	wg.Go(func() { watchLag(staleCtx, ownClient(t, env).CoordinationV1().Leases(nsName), lag) })

	// The nodes, each with its own client and connection, as n hosts.
	updates := &recorder{}
	var hbs []*runningHeartbeat
	for i := range n {
		leases := &timedLeases{Leases: ownClient(t, env).CoordinationV1().Leases(nsName), updates: updates}
		cfg := HeartbeatConfig{NodeID: fmt.Sprintf("node-%04d", i), Address: fmt.Sprintf("10.%d.%d.%d:7070", i>>16&255, i>>8&255, i&255),
			LeaseDuration: 15 * time.Second, RenewInterval: renew}
		hbs = append(hbs, startHeartbeat(t, leases, cfg, scaleCapacity()))
	}
	// Every node live in both views, then one more round, before the
	// window starts.
	for _, w := range watchers {
		waitFor(t, 2*time.Minute, func() bool { return len(w.Nodes()) == n })
	}
	time.Sleep(renew)

	updates.reset()
	lag.reset()
	cpu0 := cpuTicks(t, etcdPid, apiPid, os.Getpid())
	start := time.Now()
	time.Sleep(window)
	cpu1 := cpuTicks(t, etcdPid, apiPid, os.Getpid())
	wall := time.Since(start)
	ups, lags := updates.take(), lag.take()
	live := [2]int{len(watchers[0].Nodes()), len(watchers[1].Nodes())}

	share := func(i int) float64 { return float64(cpu1[i]-cpu0[i]) / clockTicks / wall.Seconds() * 100 }
	fails, sample := updates.failed()
	t.Logf("leases: %d nodes renewing every %v, 2 watching replicas, %v window: %.0f renewals/s (%d failed: %q)",
		n, renew, wall.Round(time.Second), float64(len(ups))/wall.Seconds(), fails, sample)
	t.Logf("leases: CPU (%% of one core) etcd %.1f, kube-apiserver %.1f, this test process (nodes and replicas) %.1f; RSS etcd %d MiB, kube-apiserver %d MiB",
		share(0), share(1), share(2), rssMiB(t, etcdPid), rssMiB(t, apiPid))
	t.Logf("leases: renewal (Update) latency p50 %v p99 %v max %v; view staleness (renewTime → watch event) p50 %v p99 %v max %v; live in the replicas' views: %v of %d",
		pct(ups, 50), pct(ups, 99), pct(ups, 100), pct(lags, 50), pct(lags, 99), pct(lags, 100), live, n)
	t.Logf("leases: etcd database %s; host CPU pressure (/proc/pressure/cpu, some) %s", etcdStatus(t, env), cpuPressure())
	if live != [2]int{n, n} {
		// A result, not a failure of the test: on a machine whose CPU
		// is taken, renewals miss their deadline and nodes expire.
		t.Logf("leases: NODES EXPIRED: the replicas see %v live nodes of %d", live, n)
	}

	stopStale()
	for _, hb := range hbs {
		hb.cancel()
	}
	var stopFailed int
	var firstStopErr error
	for _, hb := range hbs {
		if err := hb.stop(); err != nil {
			stopFailed++
			if firstStopErr == nil {
				firstStopErr = err
			}
		}
	}
	if stopFailed > 0 {
		t.Logf("leases: %d of %d nodes could not delete their Lease in time at the end (it expires instead): %v", stopFailed, n, firstStopErr)
	}
	cancel()
	wg.Wait()
}

// ownClient returns an admin client with a connection of its own: client-go
// shares one transport (one HTTP/2 connection) among clients of equal
// configs, which a host each would not. A Proxy function makes the config
// uncacheable; it proxies nothing.
func ownClient(t *testing.T, env *kubetest.Env) *kubernetes.Clientset {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.Proxy = func(*http.Request) (*url.URL, error) { return nil, nil }
	return clientset(t, cfg)
}

// timedLeases times every Update (a renewal) a Heartbeat makes.
type timedLeases struct {
	Leases
	updates *recorder
}

func (l *timedLeases) Update(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	start := time.Now()
	out, err := l.Leases.Update(ctx, lease, opts)
	l.updates.add(time.Since(start), err)
	return out, err
}

// watchLag records, for every renewal a watch delivers, how long after its
// renewTime it arrived (one host, one clock).
func watchLag(ctx context.Context, leases leaseClient, r *recorder) {
	for ctx.Err() == nil {
		w, err := leases.Watch(ctx, metav1.ListOptions{})
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for ev := range w.ResultChan() {
			l, ok := ev.Object.(*coordinationv1.Lease)
			if ev.Type == watch.Modified && ok && l.Spec.RenewTime != nil {
				r.add(time.Since(l.Spec.RenewTime.Time), nil)
			}
		}
		w.Stop()
	}
}

// recorder collects durations.
type recorder struct {
	mu     sync.Mutex
	ds     []time.Duration
	fails  int
	sample []string // the first few failures
}

func (r *recorder) add(d time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.fails++
		if len(r.sample) < 3 {
			r.sample = append(r.sample, err.Error())
		}
		return
	}
	r.ds = append(r.ds, d)
}

func (r *recorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ds, r.fails, r.sample = nil, 0, nil
}

func (r *recorder) take() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	ds := slices.Clone(r.ds)
	slices.Sort(ds)
	return ds
}

// failed returns how many failed, and the first few failures.
func (r *recorder) failed() (int, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fails, slices.Clone(r.sample)
}

// pct returns the p-th percentile of sorted ds.
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := (len(ds)*p + 99) / 100
	i = min(max(i-1, 0), len(ds)-1)
	return ds[i].Round(10 * time.Microsecond)
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times: 100 on
// every Linux architecture Go runs on.
const clockTicks = 100

// cpuTicks returns utime+stime of each process.
func cpuTicks(t *testing.T, pids ...int) []int64 {
	t.Helper()
	var out []int64
	for _, pid := range pids {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil {
			t.Fatal(err)
		}
		// The fields after the command (which may hold spaces) in
		// parentheses: state is field 3, utime 14, stime 15.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		out = append(out, u+s)
	}
	return out
}

func rssMiB(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb >> 10
		}
	}
	return 0
}

// etcdPost posts a request to etcd's JSON gateway.
func etcdPost(t *testing.T, env *kubetest.Env, path string, req any, resp any) {
	t.Helper()
	body, _ := json.Marshal(req)
	r, err := http.Post(env.EtcdURL()+path, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	if r.StatusCode != http.StatusOK {
		t.Fatalf("etcd %s: %s: %s", path, r.Status, b)
	}
	if err := json.Unmarshal(b, resp); err != nil {
		t.Fatalf("etcd %s: %v", path, err)
	}
}

// etcdValueSize returns the size of the value etcd holds for key.
func etcdValueSize(t *testing.T, env *kubetest.Env, key string) int {
	t.Helper()
	var resp struct {
		Kvs []struct {
			Value []byte `json:"value"` // base64 in JSON: decoded by encoding/json
		} `json:"kvs"`
	}
	etcdPost(t, env, "/v3/kv/range", map[string]string{"key": base64.StdEncoding.EncodeToString([]byte(key))}, &resp)
	if len(resp.Kvs) != 1 {
		t.Fatalf("etcd holds %d values for %s", len(resp.Kvs), key)
	}
	return len(resp.Kvs[0].Value)
}

// etcdStatus returns etcd's database size and revision.
func etcdStatus(t *testing.T, env *kubetest.Env) string {
	t.Helper()
	var resp struct {
		DBSize      string `json:"dbSize"`
		DBSizeInUse string `json:"dbSizeInUse"`
		Header      struct {
			Revision string `json:"revision"`
		} `json:"header"`
	}
	etcdPost(t, env, "/v3/maintenance/status", map[string]string{}, &resp)
	size, _ := strconv.ParseInt(resp.DBSize, 10, 64)
	inUse, _ := strconv.ParseInt(resp.DBSizeInUse, 10, 64)
	return fmt.Sprintf("%d MiB (%d MiB in use), revision %s", size>>20, inUse>>20, resp.Header.Revision)
}

func waitFor(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("not so after %v", d)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cpuPressure returns the host's CPU pressure over the last minute (the
// share of time some runnable task waited for a CPU), to tell a quiet
// machine's numbers from a busy one's.
func cpuPressure() string {
	b, err := os.ReadFile("/proc/pressure/cpu")
	if err != nil {
		return "unknown"
	}
	for f := range strings.FieldsSeq(string(b)) {
		if v, ok := strings.CutPrefix(f, "avg60="); ok {
			return v + " %"
		}
	}
	return "unknown"
}
