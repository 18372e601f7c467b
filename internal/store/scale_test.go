package store

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/pgtest"
	"github.com/evalbox/evalbox/pkg/client"
)

// TestScaleAdmission measures admission in the database, on a real
// PostgreSQL server (pgtest's): concurrent creates of one team take its
// slot (TakeSlot: the team's row locked, its running sandboxes and slots
// counted, a slot row inserted) and swap it for the running row
// (InsertSandboxInSlot), as sandbox.Service does around a node's start,
// then end the row at once (MarkEnded, no lock of the team), so that the
// team stays at a steady number of running sandboxes. docs/scale.md says
// from it how many creates a second one team's row admits, with and
// without a long history of ended rows. pgtest's server does not fsync:
// the disk's fsync time, which a durable commit adds while the row stays
// locked, is measured apart (pg_test_fsync). A scale measurement, run only
// with EVALBOX_SCALE_BENCH=1:
//
//	EVALBOX_SCALE_BENCH=1 go test -run TestScaleAdmission -v ./internal/store
func TestScaleAdmission(t *testing.T) {
	if os.Getenv("EVALBOX_SCALE_BENCH") != "1" {
		t.Skip("a scale measurement: set EVALBOX_SCALE_BENCH=1 to run it")
	}
	window := 20 * time.Second
	ctx := context.Background()
	s := openTest(t, pgtest.Start(t))
	var teams []string
	for i := range 8 {
		tm, err := s.CreateTeam(ctx, client.Team{Name: fmt.Sprintf("team%d", i), Limits: client.Limits{MaxSandboxes: 100000}})
		if err != nil {
			t.Fatal(err)
		}
		teams = append(teams, tm.ID)
	}
	// Every team runs 1,000 sandboxes throughout.
	for _, team := range teams {
		fill(t, s, team, 1000, client.StateRunning)
	}

	run := func(name string, workers int, teamsUsed []string) {
		var mu sync.Mutex
		var lat []time.Duration
		var failed int
		var firstErr error
		end := time.Now().Add(window)
		var wg sync.WaitGroup
		for w := range workers {
			team := teamsUsed[w%len(teamsUsed)]
			wg.Go(func() {
				for time.Now().Before(end) {
					start := time.Now()
					id, err := admit(ctx, s, team)
					d := time.Since(start)
					if err == nil {
						_, err = s.MarkEnded(ctx, id, client.StateDeleted, "deleted", now())
					}
					mu.Lock()
					if err != nil {
						failed++
						if firstErr == nil {
							firstErr = err
						}
					} else {
						lat = append(lat, d)
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		slices.Sort(lat)
		t.Logf("admission %s: %d workers on %d team(s): %.0f creates/s admitted (%d failed: %v); slot and row p50 %v p99 %v",
			name, workers, len(teamsUsed), float64(len(lat))/window.Seconds(), failed, firstErr, pctile(lat, 50), pctile(lat, 99))
	}

	run("one team, no history", 32, teams[:1])
	run("8 teams, no history", 32, teams)
	// A team that ran 300,000 sandboxes before: ended rows stay (they
	// are the history GET /v1/sandboxes lists).
	fill(t, s, teams[0], 300000, client.StateDeleted)
	if _, err := s.exec(ctx, `ANALYZE sandboxes`); err != nil {
		t.Fatal(err)
	}
	run("one team, 300,000 ended rows", 32, teams[:1])

	// What a durable commit adds while the row is locked: one WAL flush.
	if bin, err := pgtest.BinDir(); err == nil {
		dir := t.TempDir()
		out, err := exec.Command(filepath.Join(bin, "pg_test_fsync"), "-s", "2", "-f", filepath.Join(dir, "fsync.test")).CombinedOutput()
		if err != nil {
			t.Logf("pg_test_fsync: %v", err)
		}
		// The first block: one 8 kB write then a flush, by each
		// method; fdatasync is what PostgreSQL uses on Linux.
		for line := range strings.SplitSeq(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 0 && f[0] == "fdatasync" {
				t.Logf("pg_test_fsync, one 8 kB write and fdatasync, on the disk of this machine's temporary directory: %s", strings.Join(f[1:], " "))
				break
			}
		}
	}
	t.Logf("host CPU pressure over the last minute (/proc/pressure/cpu, some avg60): %s", cpuPressure())
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

// admit is one create's admission as sandbox.Service runs it around the
// node's start: the team's slot, then the running row in its place.
func admit(ctx context.Context, s *Store, team string) (string, error) {
	slot, err := s.TakeSlot(ctx, team, "bench", time.Minute)
	if err != nil {
		return "", err
	}
	sb, err := s.InsertSandboxInSlot(ctx, client.Sandbox{TeamID: team, Template: "base", Runtime: "gvisor", CPU: 1, MemoryMB: 512,
		DiskMB: 1024, Network: "none", ExpiresAt: now().Add(time.Hour), NodeID: "node-a"}, slot)
	return sb.ID, err
}

// fill inserts n sandbox rows of team in state, in one statement.
func fill(t *testing.T, s *Store, team string, n int, state string) {
	t.Helper()
	at := toDB(now())
	ended := "NULL"
	if state != client.StateRunning {
		ended = fmt.Sprint(at)
	}
	_, err := s.exec(context.Background(), `INSERT INTO sandboxes (`+sandboxCols+`)
		SELECT 'sb_fill_' || ? || '_' || ? || '_' || g, ?, 'base', '', 'gvisor', '', ?, 1, 512, 1024, 'none', '{}', '[]', 0, ?, ?, `+ended+`, '', 'node-a'
		FROM generate_series(1, ?) AS g`, team, state, team, state, at, at, n)
	if err != nil {
		t.Fatal(err)
	}
}

func pctile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := min(max((len(ds)*p+99)/100-1, 0), len(ds)-1)
	return ds[i].Round(10 * time.Microsecond)
}
