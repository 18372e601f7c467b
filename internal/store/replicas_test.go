package store

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// TestTakeSlotHoldsTheLimitAcrossStores: creates racing on two Stores
// (replicas) never take more than the team's max_sandboxes slots; running
// rows and slots count alike; a slot becomes its sandbox's row in one
// step; released, ended and expired slots free the team's room; a slot
// renewed does not expire; a swept slot cannot be recorded.
func TestTakeSlotHoldsTheLimitAcrossStores(t *testing.T) {
	forEachDSN(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		stores := openN(t, dsn, 2)
		team, err := stores[0].CreateTeam(ctx, client.Team{Name: "slots", Limits: client.Limits{MaxSandboxes: 3, MaxConcurrentExec: 1}})
		if err != nil {
			t.Fatal(err)
		}
		for round := range 5 {
			var took atomic.Int64
			slots := make(chan string, 24)
			race(stores, 24, func(i int, s *Store) {
				id, err := s.TakeSlot(ctx, team.ID, fmt.Sprintf("r%d", i%2), time.Minute)
				var le *LimitError
				switch {
				case err == nil:
					took.Add(1)
					slots <- id
				case errors.As(err, &le) && errors.Is(err, ErrTeamLimit) && le.Limit == 3:
				default:
					t.Errorf("round %d: TakeSlot: %v", round, err)
				}
			})
			close(slots)
			if took.Load() != 3 {
				t.Fatalf("round %d: %d slots taken, want 3", round, took.Load())
			}
			for id := range slots {
				if err := stores[round%2].ReleaseSlot(ctx, id); err != nil {
					t.Fatal(err)
				}
			}
		}

		// A slot becomes a running row: still one of the team's 3.
		a, err := stores[0].TakeSlot(ctx, team.ID, "r0", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		sb, err := stores[0].InsertSandboxInSlot(ctx, onNode(newSandbox(team.ID, nil), "node-a"), a)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := stores[1].CountSlots(ctx, team.ID); err != nil || n != 0 {
			t.Fatalf("slots after the insert: %d, %v", n, err)
		}
		if node, err := stores[1].SandboxNode(ctx, sb.ID); err != nil || node != "node-a" {
			t.Fatalf("SandboxNode = %q, %v", node, err)
		}
		if _, err := stores[1].InsertSandboxInSlot(ctx, onNode(newSandbox(team.ID, nil), "node-a"), a); !errors.Is(err, ErrSlotLost) {
			t.Fatalf("a slot used twice: %v", err)
		}
		// Two more fit, then none.
		_, err = stores[1].TakeSlot(ctx, team.ID, "r1", 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		expiring, err := stores[0].TakeSlot(ctx, team.ID, "r0", 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stores[1].TakeSlot(ctx, team.ID, "r1", time.Minute); !errors.Is(err, ErrTeamLimit) {
			t.Fatalf("a fourth slot: %v", err)
		}
		// r1 renews its slot, r0 (a dead replica) does not: r0's expires and
		// is swept by the next admission, which gets its room.
		if err := stores[1].RenewSlots(ctx, "r1", time.Minute); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		if _, err := stores[1].TakeSlot(ctx, team.ID, "r1", time.Minute); err != nil {
			t.Fatalf("after a slot expired: %v", err)
		}
		if _, err := stores[0].InsertSandboxInSlot(ctx, onNode(newSandbox(team.ID, nil), "node-a"), expiring); !errors.Is(err, ErrSlotLost) {
			t.Fatalf("an expired, swept slot recorded: %v", err)
		}
		if _, err := stores[0].TakeSlot(ctx, team.ID, "r0", time.Minute); !errors.Is(err, ErrTeamLimit) {
			t.Fatalf("the renewed slot expired: %v", err)
		}
		// Ending the sandbox gives its slot back.
		if ok, err := stores[1].MarkEnded(ctx, sb.ID, client.StateDeleted, "deleted", time.Now()); !ok || err != nil {
			t.Fatal(ok, err)
		}
		if _, err := stores[0].TakeSlot(ctx, team.ID, "r0", time.Minute); err != nil {
			t.Fatalf("after the sandbox ended: %v", err)
		}
		if _, err := stores[0].TakeSlot(ctx, "team_nope", "r0", time.Minute); !errors.Is(err, ErrNotFound) {
			t.Fatalf("unknown team: %v", err)
		}
	})
}

// TestListRunningOnNode: a replica recovers its own node's rows and those
// from before rows had a node, never another node's.
func TestListRunningOnNode(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		team := mustTeam(t, s, "nodes")
		ids := map[string]string{}
		for _, node := range []string{"a", "b", ""} {
			sb := newSandbox(team.ID, nil)
			if node == "" {
				var err error
				if sb, err = s.InsertSandbox(ctx, sb); err != nil {
					t.Fatal(err)
				}
			} else {
				slot, err := s.TakeSlot(ctx, team.ID, "r", time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				if sb, err = s.InsertSandboxInSlot(ctx, onNode(sb, node), slot); err != nil {
					t.Fatal(err)
				}
			}
			ids[node] = sb.ID
		}
		got, err := s.ListRunningOnNode(ctx, "a")
		if err != nil || len(got) != 2 || got[0].ID != ids["a"] || got[1].ID != ids[""] {
			t.Fatalf("ListRunningOnNode(a) = %+v, %v; want %s, %s", got, err, ids["a"], ids[""])
		}
	})
}

// TestEvalLeaseRaces: of replicas claiming a run at once exactly one gets
// it; only the owner renews it and records verdicts; an expired lease is
// taken over, after which the old owner can neither renew, record nor
// finish; each sample keeps its first verdict, whoever races to write it.
func TestEvalLeaseRaces(t *testing.T) {
	forEachDSN(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		stores := openN(t, dsn, 2)
		team := mustTeam(t, stores[0], "leases")
		for round := range 5 {
			run, err := stores[0].InsertEval(ctx, EvalRow{Input: []byte(`{}`), Run: client.EvalRun{TeamID: team.ID, State: client.EvalStateRunning, K: []int{1}}})
			if err != nil {
				t.Fatal(err)
			}
			if got, err := stores[1].ListClaimableEvals(ctx, time.Now()); err != nil || len(got) != 1 || got[0].ID != run.ID {
				t.Fatalf("round %d: claimable = %+v, %v", round, got, err)
			}
			now := time.Now()
			var winner atomic.Value
			race(stores, 16, func(i int, s *Store) {
				owner := fmt.Sprintf("r%d", i)
				ok, err := s.ClaimEval(ctx, run.ID, owner, now, now.Add(time.Hour))
				if err != nil {
					t.Errorf("round %d: claim: %v", round, err)
				}
				if ok && winner.Swap(owner) != nil {
					t.Errorf("round %d: two replicas claimed the run", round)
				}
			})
			a, _ := winner.Load().(string)
			if a == "" {
				t.Fatalf("round %d: nobody claimed the run", round)
			}
			if owner, until, err := stores[1].EvalLease(ctx, run.ID); err != nil || owner != a || until.Before(now.Add(59*time.Minute)) {
				t.Fatalf("round %d: lease %q until %v, %v; want %q", round, owner, until, err, a)
			}
			if got, err := stores[1].ListClaimableEvals(ctx, time.Now()); err != nil || len(got) != 0 {
				t.Fatalf("round %d: a leased run claimable: %+v, %v", round, got, err)
			}
			if ok, err := stores[1].ClaimEval(ctx, run.ID, "other", time.Now(), time.Now().Add(time.Hour)); ok || err != nil {
				t.Fatalf("round %d: a held lease claimed: %v, %v", round, ok, err)
			}
			if ok, err := stores[1].RenewEval(ctx, run.ID, "other", time.Now().Add(time.Hour)); ok || err != nil {
				t.Fatalf("round %d: another replica renewed: %v, %v", round, ok, err)
			}
			if _, err := stores[1].PutEvalTrial(ctx, team.ID, run.ID, "other", client.EvalResult{CompletionID: 0, Status: "passed"}, TrialEnv{}); !errors.Is(err, ErrLeaseLost) {
				t.Fatalf("round %d: a verdict from a replica without the lease: %v", round, err)
			}
			// The owner's verdicts race one another on one sample: one stays.
			var wrote atomic.Int64
			race(stores, 8, func(i int, s *Store) {
				ok, err := s.PutEvalTrial(ctx, team.ID, run.ID, a, client.EvalResult{CompletionID: 0, TaskID: "t", Status: []string{"passed", "failed"}[i%2]}, TrialEnv{})
				if err != nil {
					t.Errorf("round %d: PutEvalTrial: %v", round, err)
				}
				if ok {
					wrote.Add(1)
				}
			})
			if wrote.Load() != 1 {
				t.Fatalf("round %d: %d verdicts of one sample written", round, wrote.Load())
			}
			// The lease runs out (a's replica died, or stalled): b takes over.
			if ok, err := stores[0].RenewEval(ctx, run.ID, a, time.Now().Add(-time.Second)); !ok || err != nil {
				t.Fatalf("round %d: renew: %v, %v", round, ok, err)
			}
			if got, err := stores[1].ListClaimableEvals(ctx, time.Now()); err != nil || len(got) != 1 {
				t.Fatalf("round %d: an expired lease not claimable: %+v, %v", round, got, err)
			}
			var took atomic.Int64
			race(stores, 8, func(i int, s *Store) {
				if ok, err := s.ClaimEval(ctx, run.ID, "b", time.Now(), time.Now().Add(time.Hour)); err != nil {
					t.Errorf("round %d: takeover: %v", round, err)
				} else if ok {
					took.Add(1)
				}
			})
			if took.Load() == 0 {
				t.Fatalf("round %d: nobody took the expired lease over", round)
			}
			if ok, err := stores[0].RenewEval(ctx, run.ID, a, time.Now().Add(time.Hour)); ok || err != nil {
				t.Fatalf("round %d: the old owner renewed after a takeover: %v, %v", round, ok, err)
			}
			if _, err := stores[0].PutEvalTrial(ctx, team.ID, run.ID, a, client.EvalResult{CompletionID: 1, Status: "passed"}, TrialEnv{}); !errors.Is(err, ErrLeaseLost) {
				t.Fatalf("round %d: the old owner recorded after a takeover: %v", round, err)
			}
			if err := stores[0].FinishOwnedEval(ctx, team.ID, run.ID, a, client.EvalStateSucceeded, "", nil); !errors.Is(err, ErrLeaseLost) {
				t.Fatalf("round %d: the old owner finished after a takeover: %v", round, err)
			}
			if ok, err := stores[1].PutEvalTrial(ctx, team.ID, run.ID, "b", client.EvalResult{CompletionID: 0, Status: "timed_out"}, TrialEnv{}); ok || err != nil {
				t.Fatalf("round %d: the new owner replaced a verdict: %v, %v", round, ok, err)
			}
			if ok, err := stores[1].PutEvalTrial(ctx, team.ID, run.ID, "b", client.EvalResult{CompletionID: 1, Status: "passed"}, TrialEnv{}); !ok || err != nil {
				t.Fatalf("round %d: the new owner's verdict: %v, %v", round, ok, err)
			}
			if counts, err := stores[0].EvalCounts(ctx, team.ID, run.ID); err != nil || counts["passed"]+counts["failed"] != 2 || counts["timed_out"] != 0 {
				t.Fatalf("round %d: counts %v, %v", round, counts, err)
			}
			if err := stores[1].FinishOwnedEval(ctx, team.ID, run.ID, "b", client.EvalStateSucceeded, "", nil); err != nil {
				t.Fatalf("round %d: finish: %v", round, err)
			}
			if owner, until, err := stores[0].EvalLease(ctx, run.ID); err != nil || owner != "" || !until.IsZero() {
				t.Fatalf("round %d: lease after the end: %q %v %v", round, owner, until, err)
			}
			if ok, err := stores[0].ClaimEval(ctx, run.ID, a, time.Now(), time.Now().Add(time.Hour)); ok || err != nil {
				t.Fatalf("round %d: a finished run claimed: %v, %v", round, ok, err)
			}
			if err := stores[0].FinishOwnedEval(ctx, team.ID, run.ID, "b", client.EvalStateSucceeded, "", nil); !errors.Is(err, ErrConflict) {
				t.Fatalf("round %d: finished twice: %v", round, err)
			}
		}
		// Release: another replica may claim at once.
		run, err := stores[0].InsertEval(ctx, EvalRow{Input: []byte(`{}`), Run: client.EvalRun{TeamID: team.ID, State: client.EvalStateRunning, K: []int{1}}})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := stores[0].ClaimEval(ctx, run.ID, "a", time.Now(), time.Now().Add(time.Hour)); !ok || err != nil {
			t.Fatal(ok, err)
		}
		if err := stores[0].ReleaseEval(ctx, run.ID, "a"); err != nil {
			t.Fatal(err)
		}
		if ok, err := stores[1].ClaimEval(ctx, run.ID, "b", time.Now(), time.Now().Add(time.Hour)); !ok || err != nil {
			t.Fatalf("claim after a release: %v, %v", ok, err)
		}
	})
}

// onNode returns sb placed on node id.
func onNode(sb client.Sandbox, id string) client.Sandbox {
	sb.NodeID = id
	return sb
}
