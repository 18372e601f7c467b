package e2e

import (
	"context"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/pgtest"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/pkg/client"
)

// startReplicas starts two `evalbox serve` processes on one PostgreSQL
// database, each with its own data dir (its own node), stopped at t's end
// unless a test killed one.
func startReplicas(t *testing.T, dsn string, extra ...string) [2]*server {
	t.Helper()
	var rs [2]*server
	for i := range rs {
		dir := t.TempDir()
		sweepOnCleanup(t, dir)
		args := append([]string{"--database", dsn, "--replica-id", []string{"r1", "r2"}[i]}, extra...)
		s, err := startServer(serverOptions{dataDir: dir, args: args})
		if err != nil {
			t.Fatal(err)
		}
		rs[i] = s
		t.Cleanup(func() {
			if s.cmd.ProcessState != nil {
				return // killed by the test
			}
			if err := s.stop(); err != nil {
				t.Error(err)
			}
		})
	}
	return rs
}

// TestReplicasHoldATeamLimit: a team's max_sandboxes holds across two API
// replicas on one PostgreSQL database. 3N creates at once, spread over
// both, without waiting: N get a sandbox, the others 429
// too_many_sandboxes. Then 3N creates that queue (wait_seconds) and each
// hold their sandbox a moment: all get one in turn. Never, by the store
// or by either replica's API, are more than N of the team's sandboxes
// running at once.
func TestReplicasHoldATeamLimit(t *testing.T) {
	t.Parallel()
	dsn := pgtest.Start(t)
	rs := startReplicas(t, dsn)
	const n = 3
	c1, team, key := newTeam(t, rs[0], client.Limits{MaxSandboxes: n, MaxConcurrentExec: 4 * n})
	cs := [2]*client.Client{c1, client.New(rs[1].url, key)}
	st, err := store.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := ctxT(t, 5*time.Minute)

	// The watch: the team's running sandboxes, by the store and the APIs.
	var most atomic.Int64
	watchCtx, stopWatch := context.WithCancel(ctx)
	var watch sync.WaitGroup
	note := func(k int) {
		for {
			m := most.Load()
			if int64(k) <= m || most.CompareAndSwap(m, int64(k)) {
				return
			}
		}
	}
	watch.Go(func() {
		for watchCtx.Err() == nil {
			if k, err := st.CountByState(watchCtx, team.ID, client.StateRunning); err == nil {
				note(k)
			}
			for _, c := range cs {
				if l, err := c.ListSandboxes(watchCtx, client.ListOptions{}); err == nil {
					note(len(l))
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	})

	create := func(i, wait int) (*client.Sandbox, error) {
		return cs[i%2].CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces, WaitSeconds: wait})
	}
	// Phase 1: no waiting; every sandbox is kept until all answered.
	var mu sync.Mutex
	var got []*client.Sandbox
	var refused atomic.Int64
	var wg sync.WaitGroup
	for i := range 3 * n {
		wg.Go(func() {
			sb, err := create(i, 0)
			switch {
			case err == nil:
				mu.Lock()
				got = append(got, sb)
				mu.Unlock()
			case apierr.Code(err) == client.CodeTooManySandboxes || strings.Contains(err.Error(), client.CodeTooManySandboxes):
				refused.Add(1)
			default:
				t.Errorf("create %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if len(got) != n || refused.Load() != 2*n {
		t.Errorf("without waiting: %d created, %d refused; want %d and %d", len(got), refused.Load(), n, 2*n)
	}
	if k, err := st.CountSlots(ctx, team.ID); err != nil || k != 0 {
		t.Errorf("slots held after the creates answered: %d, %v", k, err)
	}
	// Each replica deletes what its own node runs; the other one cannot
	// reach that node and says so (503 unavailable) rather than answer
	// that it deleted it.
	for _, sb := range got {
		for _, c := range cs {
			if err := c.DeleteSandbox(ctx, sb.ID); err != nil && client.ErrorCode(err) != client.CodeUnavailable {
				t.Error(err)
			}
		}
		if row, err := st.GetSandbox(ctx, team.ID, sb.ID); err != nil || row.State != client.StateDeleted {
			t.Errorf("sandbox %s after a delete through each replica: %+v, %v", sb.ID, row, err)
		}
	}

	// Phase 2: queued creates, each holding its sandbox for a moment.
	var made atomic.Int64
	for i := range 3 * n {
		wg.Go(func() {
			sb, err := create(i, 120)
			if err != nil {
				t.Errorf("queued create %d: %v", i, err)
				return
			}
			made.Add(1)
			time.Sleep(500 * time.Millisecond)
			if err := cs[i%2].DeleteSandbox(ctx, sb.ID); err != nil {
				// The other replica runs it: delete there.
				if err := cs[(i+1)%2].DeleteSandbox(ctx, sb.ID); err != nil {
					t.Errorf("delete %s: %v", sb.ID, err)
				}
			}
		})
	}
	wg.Wait()
	stopWatch()
	watch.Wait()
	if made.Load() != 3*n {
		t.Errorf("queued: %d of %d created", made.Load(), 3*n)
	}
	if m := most.Load(); m > n || m == 0 {
		t.Errorf("at most %d of the team's sandboxes running at once; want %d at most (and some)", m, n)
	}
	t.Logf("most running at once: %d (limit %d)", most.Load(), n)
}

// TestReplicaTakesOverEvalRun: an eval run started on replica 1, which is
// killed (kill -9) halfway: replica 2 takes the run over once its lease
// ran out and finishes it, every sample judged once with the verdict a
// clean run gives; replica 1's sandboxes are not marked lost by replica 2.
func TestReplicaTakesOverEvalRun(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat(sharedData); err != nil {
		t.Skipf("no HumanEval data in %s", sharedData)
	}
	dsn := pgtest.Start(t)
	const lease = 3 * time.Second
	rs := startReplicas(t, dsn, "--eval-lease", lease.String())
	// Replica 1's sandboxes stay running rows after its death (its node
	// is gone with it, and no other replica may end them): room for them.
	c1, team, key := newTeam(t, rs[0], client.Limits{MaxSandboxes: 16, MaxConcurrentExec: 16})
	c2 := client.New(rs[1].url, key)
	st, err := store.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := ctxT(t, 10*time.Minute)

	req, want := evalKillInput(t)
	req.Runtime, req.Concurrency, req.K = client.RuntimeNamespaces, 2, []int{1}
	run, err := c1.CreateEval(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if owner, _, err := st.EvalLease(ctx, run.ID); err != nil || owner != "r1" {
		t.Fatalf("lease of the new run: %q, %v", owner, err)
	}
	n := len(req.Samples)
	for {
		r, err := c2.GetEval(ctx, run.ID)
		if err != nil {
			t.Fatal(err)
		}
		if r.State != client.EvalStateRunning {
			t.Fatalf("the run ended before the kill: %+v", r)
		}
		if r.Done >= n/3 {
			// Killed with trials in flight: their rows are running.
			if k, err := st.CountByState(ctx, team.ID, client.StateRunning); err == nil && k > 0 {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	before := map[int]client.EvalResult{}
	for _, r := range evalResults(t, c2, run.ID) {
		before[r.CompletionID] = r
	}
	if err := rs[0].crash(); err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now()
	left1, err := st.ListSandboxes(ctx, team.ID, store.SandboxFilter{States: []string{client.StateRunning}})
	if err != nil {
		t.Fatal(err)
	}

	// Replica 2 takes it over after the lease and finishes it.
	var tookAt time.Time
	for {
		if tookAt.IsZero() {
			if owner, _, err := st.EvalLease(ctx, run.ID); err == nil && owner == "r2" {
				tookAt = time.Now()
			}
		}
		r, err := c2.GetEval(ctx, run.ID)
		if err != nil {
			t.Fatal(err)
		}
		if r.State != client.EvalStateRunning {
			run = r
			break
		}
		if time.Since(killedAt) > 8*time.Minute {
			t.Fatalf("the run did not finish on replica 2: %+v\n%s", r, tail(rs[1].logPath, 30))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if run.State != client.EvalStateSucceeded || run.Done != n {
		t.Fatalf("run after the takeover: %+v\n%s", run, tail(rs[1].logPath, 30))
	}
	if !tookAt.IsZero() && tookAt.Sub(killedAt) > 4*lease {
		t.Errorf("taken over %v after the kill (lease %v)", tookAt.Sub(killedAt), lease)
	}
	results := evalResults(t, c2, run.ID)
	if len(results) != n {
		t.Fatalf("%d results, want %d", len(results), n)
	}
	counts := map[string]int{}
	for i, r := range results {
		if r.CompletionID != i {
			t.Fatalf("result %d is sample %d (a sample twice, or one missing)", i, r.CompletionID)
		}
		if r.Status != want[i] {
			t.Errorf("sample %d: %s, want %s (%s)", i, r.Status, want[i], r.Detail)
		}
		if b, ok := before[i]; ok && (b.Status != r.Status || b.Detail != r.Detail) {
			t.Errorf("sample %d changed across the takeover: %+v → %+v", i, b, r)
		}
		counts[r.Status]++
	}
	if counts["passed"] != 24 || counts["timed_out"] != 8 || counts["failed"] != 16 {
		t.Errorf("counts %v", counts)
	}
	if sc, err := st.EvalCounts(ctx, team.ID, run.ID); err != nil || sc["passed"]+sc["timed_out"]+sc["failed"] != n {
		t.Errorf("trials in the store: %v, %v", sc, err)
	}
	if owner, _, err := st.EvalLease(ctx, run.ID); err != nil || owner != "" {
		t.Errorf("lease after the end: %q, %v", owner, err)
	}
	log, err := os.ReadFile(rs[1].logPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "eval run resumed") || !strings.Contains(string(log), "owner=r2") {
		t.Errorf("replica 2's log does not say it resumed the run:\n%s", tail(rs[1].logPath, 30))
	}
	// Replica 2 never marked replica 1's sandboxes lost (a restart of
	// replica 1 on its data dir does; sweepOnCleanup sweeps the host).
	for _, sb := range left1 {
		if got, err := st.GetSandbox(ctx, team.ID, sb.ID); err != nil || got.State != client.StateRunning {
			t.Errorf("replica 1's sandbox %s after the takeover: %+v, %v; want it left running", sb.ID, got, err)
		}
	}
	t.Logf("taken over %v after the kill; replica 1 left %d running rows", tookAt.Sub(killedAt), len(left1))
}
