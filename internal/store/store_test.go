package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/pgtest"
	"github.com/evalbox/evalbox/pkg/client"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if err := pgtest.StopShared(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

// forEachDSN runs fn once per backend, as the subtests "sqlite" (a new
// file) and "postgres" (a new database on the package's PostgreSQL server,
// see pgtest.Shared: skipped without PostgreSQL, unless
// $EVALBOX_PG_BIN_DIR is set).
func forEachDSN(t *testing.T, fn func(t *testing.T, dsn string)) {
	t.Run(backendSQLite, func(t *testing.T) { fn(t, filepath.Join(t.TempDir(), "state.db")) })
	t.Run(backendPostgres, func(t *testing.T) { fn(t, pgtest.Shared(t)) })
}

// forEachBackend runs fn once per backend with a Store on a new database.
func forEachBackend(t *testing.T, fn func(t *testing.T, s *Store)) {
	forEachDSN(t, func(t *testing.T, dsn string) { fn(t, openTest(t, dsn)) })
}

// openTest opens dsn, closed at t's cleanup.
func openTest(t *testing.T, dsn string) *Store {
	t.Helper()
	s, err := Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func mustTeam(t *testing.T, s *Store, name string) client.Team {
	t.Helper()
	tm, err := s.CreateTeam(context.Background(), client.Team{Name: name, Limits: client.Limits{MaxSandboxes: 5, MaxConcurrentExec: 10}})
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

func newSandbox(team string, meta map[string]string) client.Sandbox {
	return client.Sandbox{
		TeamID:   team,
		Template: "python",
		Runtime:  client.RuntimeNamespaces,
		CPU:      1,
		MemoryMB: 512,
		DiskMB:   1024,
		Network:  client.NetworkNone,
		Metadata: meta,
		// ExpiresAt far ahead so ListExpired ignores it unless a test says otherwise.
		ExpiresAt: time.Now().Add(time.Hour),
	}
}

func TestMigrationsIdempotentOnReopen(t *testing.T) {
	forEachDSN(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		s, err := Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		tm := mustTeam(t, s, "a")
		if _, ok := s.d.(sqliteDialect); ok {
			var mode string
			if err := s.r.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
				t.Fatalf("journal_mode = %q, %v; want wal", mode, err)
			}
			if _, err := s.r.ExecContext(ctx, "DELETE FROM teams"); err == nil {
				t.Fatal("read pool accepted a write")
			}
		}
		if v, err := s.SchemaVersion(ctx); err != nil || v != len(migrations) {
			t.Fatalf("version = %d, %v; want %d", v, err, len(migrations))
		}
		s.Close()
		for range 2 {
			s2, err := Open(ctx, dsn)
			if err != nil {
				t.Fatalf("reopen: %v", err)
			}
			if v, err := s2.SchemaVersion(ctx); err != nil || v != len(migrations) {
				t.Fatalf("version after reopen = %d, %v", v, err)
			}
			got, err := s2.GetTeam(ctx, tm.ID)
			if err != nil || !reflect.DeepEqual(got, tm) {
				t.Fatalf("team after reopen = %+v, %v; want %+v", got, err, tm)
			}
			s2.Close()
		}
	})
}

func TestOpenRejectsNewerSchema(t *testing.T) {
	forEachDSN(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		s, err := Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.inTx(ctx, func(tx *txn) error { return s.d.setSchemaVersion(ctx, tx, len(migrations)+1) }); err != nil {
			t.Fatal(err)
		}
		s.Close()
		if s2, err := Open(ctx, dsn); err == nil {
			s2.Close()
			t.Fatal("Open accepted a database from a newer binary")
		}
	})
}

func TestTeams(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		a := mustTeam(t, s, "a")
		if _, err := s.CreateTeam(ctx, client.Team{Name: "a"}); !errors.Is(err, ErrConflict) {
			t.Fatalf("duplicate name: %v, want ErrConflict", err)
		}
		b := mustTeam(t, s, "b")
		got, err := s.GetTeamByName(ctx, "b")
		if err != nil || !reflect.DeepEqual(got, b) {
			t.Fatalf("GetTeamByName = %+v, %v", got, err)
		}
		if _, err := s.GetTeam(ctx, "team_nope"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("GetTeam unknown: %v", err)
		}
		if _, err := s.GetTeamByName(ctx, "nope"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("GetTeamByName unknown: %v", err)
		}
		l := client.Limits{MaxSandboxes: 100, MaxConcurrentExec: 7, MaxStorageMB: 512, RequestsPerMinute: 60, CreatesPerMinute: 5}
		up, err := s.UpdateTeamLimits(ctx, a.ID, l)
		if err != nil || up.Limits != l || up.Name != "a" {
			t.Fatalf("UpdateTeamLimits = %+v, %v", up, err)
		}
		// A key's lookup brings its team's limits, rate limits included.
		if _, err := s.InsertKey(ctx, Key{TeamID: a.ID, Name: "k", Prefix: "eb_tttt", Hash: "h-teams"}); err != nil {
			t.Fatal(err)
		}
		if _, tm, err := s.KeyByHash(ctx, "h-teams"); err != nil || tm.Limits != l {
			t.Fatalf("KeyByHash team = %+v, %v", tm, err)
		}
		if _, err := s.UpdateTeamLimits(ctx, "team_nope", l); !errors.Is(err, ErrNotFound) {
			t.Fatalf("UpdateTeamLimits unknown: %v", err)
		}
		all, err := s.ListTeams(ctx)
		if err != nil || len(all) != 2 || all[0].ID != a.ID || all[0].Limits != l || all[1].ID != b.ID {
			t.Fatalf("ListTeams = %+v, %v", all, err)
		}
	})
}

func TestKeys(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		a, b := mustTeam(t, s, "a"), mustTeam(t, s, "b")
		ka, err := s.InsertKey(ctx, Key{TeamID: a.ID, Name: "ci", Prefix: "eb_aaaa", Hash: "h-a", Admin: true})
		if err != nil {
			t.Fatal(err)
		}
		kb, err := s.InsertKey(ctx, Key{TeamID: b.ID, Name: "dev", Prefix: "eb_bbbb", Hash: "h-b"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.InsertKey(ctx, Key{TeamID: b.ID, Hash: "h-a"}); !errors.Is(err, ErrConflict) {
			t.Fatalf("duplicate hash: %v", err)
		}
		if _, err := s.InsertKey(ctx, Key{TeamID: "team_nope", Hash: "h-x"}); !errors.Is(err, ErrNotFound) {
			t.Fatalf("unknown team: %v", err)
		}

		k, tm, err := s.KeyByHash(ctx, "h-a")
		if err != nil || !reflect.DeepEqual(k, ka) || !reflect.DeepEqual(tm, a) {
			t.Fatalf("KeyByHash = %+v %+v %v", k, tm, err)
		}
		if _, _, err := s.KeyByHash(ctx, "h-nope"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("KeyByHash unknown: %v", err)
		}

		if l, err := s.ListKeys(ctx, a.ID); err != nil || len(l) != 1 || l[0].ID != ka.ID {
			t.Fatalf("ListKeys(a) = %+v, %v", l, err)
		}
		if l, err := s.ListKeys(ctx, ""); err != nil || len(l) != 2 {
			t.Fatalf("ListKeys(all) = %+v, %v", l, err)
		}

		// Team isolation: b cannot revoke a's key.
		if _, err := s.RevokeKey(ctx, b.ID, ka.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("revoke other team's key: %v", err)
		}
		if _, _, err := s.KeyByHash(ctx, "h-a"); err != nil {
			t.Fatalf("key revoked by another team: %v", err)
		}
		r, err := s.RevokeKey(ctx, b.ID, kb.ID)
		if err != nil || r.RevokedAt == nil || r.ID != kb.ID {
			t.Fatalf("RevokeKey = %+v, %v", r, err)
		}
		if _, _, err := s.KeyByHash(ctx, "h-b"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("revoked key still found: %v", err)
		}
		r2, err := s.RevokeKey(ctx, b.ID, kb.ID)
		if err != nil || !r2.RevokedAt.Equal(*r.RevokedAt) {
			t.Fatalf("second revoke = %+v, %v; want first time kept", r2, err)
		}
		if l, err := s.ListKeys(ctx, b.ID); err != nil || len(l) != 1 || l[0].RevokedAt == nil {
			t.Fatalf("ListKeys(b) after revoke = %+v, %v", l, err)
		}
		// teamID "" (admin) revokes any team's key.
		if r, err := s.RevokeKey(ctx, "", ka.ID); err != nil || r.RevokedAt == nil || r.TeamID != a.ID {
			t.Fatalf("admin RevokeKey = %+v, %v", r, err)
		}
		if _, err := s.RevokeKey(ctx, "", "key_nope"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("RevokeKey unknown: %v", err)
		}
		if api := ka.API(); api.ID != ka.ID || api.Key != "" || !api.Admin {
			t.Fatalf("API() = %+v", api)
		}
	})
}

func TestSandboxRoundTripAndIsolation(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		a, b := mustTeam(t, s, "a"), mustTeam(t, s, "b")
		in := newSandbox(a.ID, map[string]string{"run": "r1"})
		in.EnvKeys = []string{"Z", "A"}
		in.SecretNames = []string{"TOKEN", "API_KEY"}
		in.TemplateDigest = "sha256:abc"
		in.RuntimeVersion = "6.1"
		in.FromPool = true
		in.NodeID = "node-1"
		sb, err := s.InsertSandbox(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		if sb.State != client.StateRunning || sb.ID == "" || !reflect.DeepEqual(sb.EnvKeys, []string{"A", "Z"}) ||
			!reflect.DeepEqual(sb.SecretNames, []string{"API_KEY", "TOKEN"}) {
			t.Fatalf("inserted = %+v", sb)
		}
		if in.EnvKeys[0] != "Z" {
			t.Fatal("InsertSandbox modified the caller's EnvKeys")
		}
		got, err := s.GetSandbox(ctx, a.ID, sb.ID)
		if err != nil || !reflect.DeepEqual(got, sb) {
			t.Fatalf("GetSandbox =\n%+v, %v\nwant\n%+v", got, err, sb)
		}
		if _, err := s.InsertSandbox(ctx, sb); !errors.Is(err, ErrConflict) {
			t.Fatalf("duplicate id: %v", err)
		}
		if _, err := s.InsertSandbox(ctx, newSandbox("team_nope", nil)); !errors.Is(err, ErrNotFound) {
			t.Fatalf("unknown team: %v", err)
		}

		// Another team sees nothing.
		if _, err := s.GetSandbox(ctx, b.ID, sb.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("GetSandbox other team: %v", err)
		}
		if l, err := s.ListSandboxes(ctx, b.ID, SandboxFilter{}); err != nil || len(l) != 0 {
			t.Fatalf("ListSandboxes other team = %+v, %v", l, err)
		}
		if err := s.SetExpiry(ctx, b.ID, sb.ID, time.Now()); !errors.Is(err, ErrNotFound) {
			t.Fatalf("SetExpiry other team: %v", err)
		}
		if n, err := s.CountByState(ctx, b.ID, client.StateRunning); err != nil || n != 0 {
			t.Fatalf("CountByState other team = %d, %v", n, err)
		}

		// Empty metadata reads back as an empty map, no env keys as nil.
		e, err := s.InsertSandbox(ctx, newSandbox(a.ID, nil))
		if err != nil {
			t.Fatal(err)
		}
		got, err = s.GetSandbox(ctx, a.ID, e.ID)
		if err != nil || got.Metadata == nil || len(got.Metadata) != 0 || got.EnvKeys != nil || got.SecretNames != nil {
			t.Fatalf("empty sandbox = %+v, %v", got, err)
		}
	})
}

// TestListRunningOn: a node's running rows, for draining it when it is
// lost; other nodes' and ended rows are not listed.
func TestListRunningOn(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		a := mustTeam(t, s, "a")
		var on1 []string
		for i, node := range []string{"n1", "n2", "n1", "n1"} {
			in := newSandbox(a.ID, nil)
			in.NodeID = node
			sb, err := s.InsertSandbox(ctx, in)
			if err != nil {
				t.Fatal(err)
			}
			if node == "n1" && i != 3 {
				on1 = append(on1, sb.ID)
			}
			if i == 3 {
				if _, err := s.MarkEnded(ctx, sb.ID, client.StateDeleted, "deleted", time.Now()); err != nil {
					t.Fatal(err)
				}
			}
		}
		if n, err := s.SandboxNode(ctx, on1[0]); err != nil || n != "n1" {
			t.Fatalf("SandboxNode = %q, %v", n, err)
		}
		if _, err := s.SandboxNode(ctx, "sb_nope"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("SandboxNode of no sandbox: %v", err)
		}
		rows, err := s.ListRunningOn(ctx, "n1")
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range rows {
			got = append(got, r.ID)
		}
		slices.Sort(got)
		slices.Sort(on1)
		if !slices.Equal(got, on1) {
			t.Fatalf("running on n1: %v, want %v", got, on1)
		}
	})
}

func TestListSandboxesFilter(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		a := mustTeam(t, s, "a")
		base := time.Now().Add(-time.Hour)
		metas := []map[string]string{
			{"run": "r1", "task": "t1"},
			{"run": "r1", "task": "t2"},
			{"run": "r2", "task": "t1"},
			{"run": "r1", "task": "t1", "odd key.\"$[0]": "v"},
			nil,
		}
		var ids []string
		for i, m := range metas {
			sb := newSandbox(a.ID, m)
			sb.CreatedAt = base.Add(time.Duration(i) * time.Second)
			sb, err := s.InsertSandbox(ctx, sb)
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, sb.ID)
		}
		if _, err := s.MarkEnded(ctx, ids[1], client.StateDeleted, "user", time.Now()); err != nil {
			t.Fatal(err)
		}
		list := func(f SandboxFilter) []string {
			t.Helper()
			l, err := s.ListSandboxes(ctx, a.ID, f)
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, sb := range l {
				out = append(out, sb.ID)
			}
			return out
		}
		cases := []struct {
			name string
			f    SandboxFilter
			want []string
		}{
			{"all newest first", SandboxFilter{}, []string{ids[4], ids[3], ids[2], ids[1], ids[0]}},
			{"one pair", SandboxFilter{Metadata: map[string]string{"run": "r1"}}, []string{ids[3], ids[1], ids[0]}},
			{"all pairs must match", SandboxFilter{Metadata: map[string]string{"run": "r1", "task": "t1"}}, []string{ids[3], ids[0]}},
			{"odd key", SandboxFilter{Metadata: map[string]string{"odd key.\"$[0]": "v"}}, []string{ids[3]}},
			{"no match", SandboxFilter{Metadata: map[string]string{"run": "r3"}}, nil},
			{"missing key", SandboxFilter{Metadata: map[string]string{"nope": ""}}, nil},
			{"state", SandboxFilter{Metadata: map[string]string{"run": "r1"}, States: []string{client.StateRunning}}, []string{ids[3], ids[0]}},
			{"states", SandboxFilter{States: []string{client.StateDeleted, client.StateLost}}, []string{ids[1]}},
			{"limit", SandboxFilter{Limit: 2}, []string{ids[4], ids[3]}},
		}
		for _, c := range cases {
			if got := list(c.f); !reflect.DeepEqual(got, c.want) {
				t.Errorf("%s: got %v, want %v", c.name, got, c.want)
			}
		}
	})
}

func TestMarkEndedAndExpiry(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		a, b := mustTeam(t, s, "a"), mustTeam(t, s, "b")
		now := time.Now()
		past := newSandbox(a.ID, nil)
		past.ExpiresAt = now.Add(-time.Minute)
		p, err := s.InsertSandbox(ctx, past)
		if err != nil {
			t.Fatal(err)
		}
		past2 := newSandbox(b.ID, nil)
		past2.ExpiresAt = now.Add(-2 * time.Minute)
		p2, err := s.InsertSandbox(ctx, past2)
		if err != nil {
			t.Fatal(err)
		}
		f, err := s.InsertSandbox(ctx, newSandbox(a.ID, nil))
		if err != nil {
			t.Fatal(err)
		}

		exp, err := s.ListExpired(ctx, now)
		if err != nil || len(exp) != 2 || exp[0].ID != p2.ID || exp[1].ID != p.ID {
			t.Fatalf("ListExpired = %+v, %v", exp, err)
		}
		// Extending moves it out of the expired list.
		if err := s.SetExpiry(ctx, a.ID, p.ID, now.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		if exp, err := s.ListExpired(ctx, now); err != nil || len(exp) != 1 || exp[0].ID != p2.ID {
			t.Fatalf("ListExpired after SetExpiry = %+v, %v", exp, err)
		}
		if n, err := s.CountByState(ctx, a.ID, client.StateRunning); err != nil || n != 2 {
			t.Fatalf("CountByState = %d, %v", n, err)
		}
		at := now.Add(time.Second)
		changed, err := s.MarkEnded(ctx, f.ID, client.StateExpired, "ttl", at)
		if err != nil || !changed {
			t.Fatalf("MarkEnded = %v, %v", changed, err)
		}
		changed, err = s.MarkEnded(ctx, f.ID, client.StateDeleted, "user", at.Add(time.Second))
		if err != nil || changed {
			t.Fatalf("second MarkEnded = %v, %v; want false", changed, err)
		}
		got, err := s.GetSandbox(ctx, a.ID, f.ID)
		if err != nil || got.State != client.StateExpired || got.EndReason != "ttl" || got.EndedAt == nil || !got.EndedAt.Equal(norm(at)) {
			t.Fatalf("ended sandbox = %+v, %v", got, err)
		}
		if changed, err := s.MarkEnded(ctx, "sb_nope", client.StateLost, "x", at); err != nil || changed {
			t.Fatalf("MarkEnded unknown = %v, %v", changed, err)
		}
		if _, err := s.MarkEnded(ctx, p.ID, client.StateRunning, "x", at); err == nil {
			t.Fatal("MarkEnded accepted state running")
		}
		if err := s.SetExpiry(ctx, a.ID, f.ID, now); !errors.Is(err, ErrNotRunning) {
			t.Fatalf("SetExpiry on ended sandbox: %v", err)
		}
		if n, err := s.CountByState(ctx, a.ID, client.StateRunning); err != nil || n != 1 {
			t.Fatalf("CountByState after end = %d, %v", n, err)
		}

		running, err := s.ListByState(ctx, client.StateRunning)
		if err != nil || len(running) != 2 {
			t.Fatalf("ListByState(running) = %+v, %v", running, err)
		}
		expired, err := s.ListByState(ctx, client.StateExpired)
		if err != nil || len(expired) != 1 || expired[0].ID != f.ID {
			t.Fatalf("ListByState(expired) = %+v, %v", expired, err)
		}
	})
}

func TestConcurrentWriters(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		const workers, each = 50, 10
		teams := make([]client.Team, workers)
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for i := range workers {
			wg.Go(func() {
				tm, err := s.CreateTeam(ctx, client.Team{Name: fmt.Sprintf("t%d", i)})
				if err != nil {
					errs <- err
					return
				}
				teams[i] = tm
				for j := range each {
					sb, err := s.InsertSandbox(ctx, newSandbox(tm.ID, map[string]string{"j": fmt.Sprint(j)}))
					if err != nil {
						errs <- err
						return
					}
					// Interleave reads and racing updates with the writes.
					if _, err := s.GetSandbox(ctx, tm.ID, sb.ID); err != nil {
						errs <- err
						return
					}
					if j%2 == 0 {
						if _, err := s.MarkEnded(ctx, sb.ID, client.StateDeleted, "user", time.Now()); err != nil {
							errs <- err
							return
						}
					}
					if _, err := s.InsertKey(ctx, Key{TeamID: tm.ID, Hash: fmt.Sprintf("h-%d-%d", i, j)}); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if t.Failed() {
			return
		}
		for _, tm := range teams {
			n, err := s.CountByState(ctx, tm.ID, client.StateRunning)
			if err != nil || n != each/2 {
				t.Fatalf("team %s running = %d, %v", tm.Name, n, err)
			}
		}
		keys, err := s.ListKeys(ctx, "")
		if err != nil || len(keys) != workers*each {
			t.Fatalf("keys = %d, %v", len(keys), err)
		}
	})
}

// TestMarkExpired: the reaper's end of a sandbox holds only while its
// stored expiry has passed: one extended since a reaper listed it, or one
// already ended, is left as it is.
func TestMarkExpired(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		a := mustTeam(t, s, "a")
		now := time.Now()
		in := newSandbox(a.ID, nil)
		in.ExpiresAt = now.Add(-time.Minute)
		extended, err := s.InsertSandbox(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		expired, err := s.InsertSandbox(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.SetExpiry(ctx, a.ID, extended.ID, now.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.MarkExpired(ctx, extended.ID, now); err != nil || ok {
			t.Fatalf("MarkExpired of an extended sandbox = %v, %v", ok, err)
		}
		if ok, err := s.MarkExpired(ctx, expired.ID, now); err != nil || !ok {
			t.Fatalf("MarkExpired = %v, %v", ok, err)
		}
		if got, err := s.GetSandbox(ctx, a.ID, expired.ID); err != nil || got.State != client.StateExpired || got.EndReason != "timeout" || got.EndedAt == nil {
			t.Fatalf("after MarkExpired: %+v, %v", got, err)
		}
		if ok, err := s.MarkExpired(ctx, expired.ID, now); err != nil || ok {
			t.Fatalf("MarkExpired of an ended sandbox = %v, %v", ok, err)
		}
		if got, err := s.GetSandbox(ctx, a.ID, extended.ID); err != nil || got.State != client.StateRunning {
			t.Fatalf("the extended sandbox: %+v, %v", got, err)
		}
	})
}
