package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// Several Stores on one database: API replicas on PostgreSQL (each with its
// own connections, so writers run at once), or processes on one SQLite
// file. What one Store's single writer used to serialise must hold across
// them.

// openN opens n Stores on dsn at once, as replicas starting together do:
// the migrations are applied once, and none fails.
//
// A new SQLite file is first put in WAL mode, as every Store leaves it:
// two connections that switch one new file to WAL at the same moment can
// get SQLITE_BUSY (without the busy handler), which one server per data
// dir never does; what is tested is that their migrations and writes
// queue.
func openN(t *testing.T, dsn string, n int) []*Store {
	t.Helper()
	if kind, path, _ := parseDSN(dsn); kind == backendSQLite {
		db, err := sql.Open("sqlite", path)
		if err == nil {
			_, err = db.Exec(`PRAGMA journal_mode = WAL`)
			db.Close()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	stores := make([]*Store, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			stores[i], errs[i] = Open(context.Background(), dsn)
		})
	}
	close(start)
	wg.Wait()
	for i, s := range stores {
		if s != nil {
			t.Cleanup(func() { s.Close() })
		}
		if errs[i] != nil {
			t.Fatalf("Open %d of %d at once: %v", i+1, n, errs[i])
		}
	}
	return stores
}

func TestConcurrentMigrations(t *testing.T) {
	forEachDSN(t, func(t *testing.T, dsn string) {
		ctx := t.Context()
		stores := openN(t, dsn, 4)
		for i, s := range stores {
			if v, err := s.SchemaVersion(ctx); err != nil || v != len(migrations) {
				t.Errorf("store %d: version %d, %v; want %d", i, v, err, len(migrations))
			}
		}
		// Each sees the others' writes: one schema, not one per Store.
		tm := mustTeam(t, stores[0], "a")
		if got, err := stores[3].GetTeam(ctx, tm.ID); err != nil || got.Name != "a" {
			t.Errorf("team from another store: %+v, %v", got, err)
		}
	})
}

// race runs fn(i, store) for i in [0, n) at once, alternating the stores.
func race(stores []*Store, n int, fn func(i int, s *Store)) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			fn(i, stores[i%len(stores)])
		})
	}
	close(start)
	wg.Wait()
}

// TestStoresConflict: inserts of one unique name, hash or id from two
// Stores at once: exactly one wins, the others are ErrConflict (not
// another error); of racing MarkEnded calls exactly one reports the change.
func TestStoresConflict(t *testing.T) {
	forEachDSN(t, func(t *testing.T, dsn string) {
		ctx := t.Context()
		stores := openN(t, dsn, 2)
		const n = 16
		var mu sync.Mutex
		wins := map[string]int{}
		count := func(what string, err error) {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				wins[what]++
			case !errors.Is(err, ErrConflict):
				t.Errorf("%s: %v; want nil or ErrConflict", what, err)
			}
		}
		race(stores, n, func(i int, s *Store) {
			_, err := s.CreateTeam(ctx, client.Team{Name: "same"})
			count("team", err)
		})
		team, err := stores[0].GetTeamByName(ctx, "same")
		if err != nil {
			t.Fatal(err)
		}
		race(stores, n, func(i int, s *Store) {
			_, err := s.InsertKey(ctx, Key{TeamID: team.ID, Hash: "h"})
			count("key", err)
			sb := newSandbox(team.ID, nil)
			sb.ID = "sb_same"
			_, err = s.InsertSandbox(ctx, sb)
			count("sandbox", err)
		})
		race(stores, n, func(i int, s *Store) {
			changed, err := s.MarkEnded(ctx, "sb_same", client.StateDeleted, fmt.Sprint(i), time.Now())
			if err != nil {
				t.Error(err)
			}
			if changed {
				count("end", nil)
			}
		})
		for _, what := range []string{"team", "key", "sandbox", "end"} {
			if wins[what] != 1 {
				t.Errorf("%s: %d of %d racing calls won; want 1", what, wins[what], n)
			}
		}
		if err := stores[1].SetExpiry(ctx, team.ID, "sb_same", time.Now()); !errors.Is(err, ErrNotRunning) {
			t.Errorf("SetExpiry of the ended sandbox: %v", err)
		}
	})
}

// TestPutTemplateRaces: puts and deletes of one template name from two
// Stores at once. Every digest put is reported exactly once as replaced
// (by the next put) or deleted, or is what the name points at in the end:
// none is lost (its files never collected) or reported twice (collected
// while still named).
func TestPutTemplateRaces(t *testing.T) {
	forEachDSN(t, func(t *testing.T, dsn string) {
		ctx := t.Context()
		stores := openN(t, dsn, 2)
		team := mustTeam(t, stores[0], "a")
		const n = 40
		var mu sync.Mutex
		var put, reported []string
		race(stores, n, func(i int, s *Store) {
			if i%4 == 3 {
				d, err := s.DeleteTemplate(ctx, team.ID, "task")
				if errors.Is(err, ErrNotFound) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				reported = append(reported, d)
				mu.Unlock()
				return
			}
			d := fmt.Sprintf("sha256:%02d", i)
			old, err := s.PutTemplate(ctx, TemplateRow{TeamID: team.ID, Name: "task", Digest: d, Source: "build", BuildID: "b"})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			put = append(put, d)
			if old != "" {
				reported = append(reported, old)
			}
			mu.Unlock()
		})
		if r, err := stores[1].GetTemplate(ctx, team.ID, "task"); err == nil {
			reported = append(reported, r.Digest)
		} else if !errors.Is(err, ErrNotFound) {
			t.Fatal(err)
		}
		slices.Sort(put)
		slices.Sort(reported)
		if !slices.Equal(put, reported) {
			t.Errorf("digests put:\n%v\nreported replaced, deleted or final:\n%v", put, reported)
		}
	})
}

// TestDeleteEvalRacesTrials: a run deleted while trials are still being
// recorded for it (from another Store) is deleted whole; a trial recorded
// meanwhile fails as one of an unknown run, and DeleteEval never fails
// with another error.
func TestDeleteEvalRacesTrials(t *testing.T) {
	forEachDSN(t, func(t *testing.T, dsn string) {
		ctx := t.Context()
		stores := openN(t, dsn, 2)
		team := mustTeam(t, stores[0], "a")
		for round := range 5 {
			run, err := stores[0].InsertEval(ctx, EvalRow{Input: []byte(`{}`), Run: client.EvalRun{TeamID: team.ID, State: client.EvalStateRunning, K: []int{1}}})
			if err != nil {
				t.Fatal(err)
			}
			if err := stores[0].FinishEval(ctx, team.ID, run.ID, client.EvalStateCancelled, "", nil); err != nil {
				t.Fatal(err)
			}
			race(stores, 16, func(i int, s *Store) {
				if i == 8 {
					if err := s.DeleteEval(ctx, team.ID, run.ID); err != nil {
						t.Errorf("round %d: DeleteEval: %v", round, err)
					}
					return
				}
				_, err := s.PutEvalTrial(ctx, team.ID, run.ID, "", client.EvalResult{CompletionID: i, TaskID: "t/0", Status: "passed"}, TrialEnv{})
				if err != nil && !errors.Is(err, ErrNotFound) {
					t.Errorf("round %d: PutEvalTrial: %v", round, err)
				}
			})
			if counts, err := stores[1].EvalCounts(ctx, team.ID, run.ID); err != nil || len(counts) != 0 {
				t.Errorf("round %d: trials of the deleted run: %v, %v", round, counts, err)
			}
		}
	})
}
