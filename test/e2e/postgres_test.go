package e2e

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/pgtest"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/pkg/client"
)

// TestServeOnPostgres: `evalbox serve --database postgres://…` keeps its
// state in a real PostgreSQL server (pgtest's) and none in the data dir:
// sandboxes are created, run commands and are deleted on every runtime, an
// eval run is judged and recorded, all as on SQLite; another Store on the
// database sees the rows; the log never shows the password; and a
// restarted server on the same database still knows the run.
func TestServeOnPostgres(t *testing.T) {
	t.Parallel()
	dsn := pgtest.Start(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	password, _ := u.User.Password()
	dataDir := t.TempDir()
	opts := serverOptions{dataDir: dataDir, args: []string{"--database", dsn}}
	s, err := startServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	running := true
	defer func() {
		if running {
			_ = s.stop()
		}
	}()
	ctx := ctxT(t, 5*time.Minute)
	c, team, key := newTeam(t, s, client.Limits{MaxSandboxes: 4, MaxConcurrentExec: 4})

	for _, rt := range runtimes {
		sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: rt, Metadata: map[string]string{"db": "postgres"}})
		if err != nil {
			t.Fatalf("%s: create: %v", rt, err)
		}
		r, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "echo hi; echo err >&2; exit 3"})
		if err != nil || r.Stdout != "hi\n" || r.Stderr != "err\n" || r.ExitCode != 3 {
			t.Errorf("%s: exec = %+v, %v", rt, r, err)
		}
		if l, err := c.ListSandboxes(ctx, client.ListOptions{Metadata: map[string]string{"db": "postgres"}}); err != nil || len(l) != 1 || l[0].ID != sb.ID {
			t.Errorf("%s: list by metadata = %+v, %v", rt, l, err)
		}
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatalf("%s: delete: %v", rt, err)
		}
		assertGone(t, s, sb.ID)
		if got, err := c.GetSandbox(ctx, sb.ID); err != nil || got.State != client.StateDeleted {
			t.Errorf("%s: the deleted sandbox's row: %+v, %v", rt, got, err)
		}
	}

	req := evalInput(t, "example_problem.jsonl", "example_samples.jsonl")
	req.K = []int{1}
	run, err := c.CreateEval(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	run = waitEval(t, c, run.ID, 3*time.Minute)
	if run.State != client.EvalStateSucceeded || run.Summary == nil || fmt.Sprintf("%.4f", run.Summary.PassAtK["pass@1"]) != "0.5000" || run.Done != 6 {
		t.Fatalf("eval run %+v, summary %+v", run, run.Summary)
	}
	if rs := evalResults(t, c, run.ID); len(rs) != 6 || rs[1].Status != "timed_out" || rs[3].Status != "passed" {
		t.Errorf("results %+v", rs)
	}

	// The rows are in PostgreSQL, where another Store (a replica) reads
	// them while the server runs; nothing went to an SQLite file.
	st, err := store.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if counts, err := st.EvalCounts(ctx, team.ID, run.ID); err != nil || counts["passed"] != 3 {
		t.Errorf("trials in PostgreSQL: %v, %v", counts, err)
	}
	// One sandbox per runtime above and one per trial (more if a trial was
	// retried), all ended.
	if n, err := st.CountByState(ctx, team.ID, client.StateDeleted); err != nil || n < len(runtimes)+6 {
		t.Errorf("deleted sandboxes in PostgreSQL: %d, %v; want at least %d", n, err, len(runtimes)+6)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "evalbox.db")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an SQLite database in the data dir: %v", err)
	}
	log, err := os.ReadFile(s.logPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "backend=postgres") || strings.Contains(string(log), password) {
		t.Errorf("server log: want backend=postgres and no password:\n%s", tail(s.logPath, 20))
	}

	running = false
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	s, err = startServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	running = true
	got, err := client.New(s.url, key).GetEval(ctx, run.ID)
	if err != nil || got.State != client.EvalStateSucceeded || got.Done != 6 {
		t.Errorf("after a restart on the same database: %+v, %v", got, err)
	}
}
