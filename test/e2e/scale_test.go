package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/evalbox/evalbox/internal/pgtest"
	"github.com/evalbox/evalbox/pkg/client"
)

// TestScaleDatabaseStatements counts the SQL statements a real `evalbox
// serve` runs on PostgreSQL for one sandbox create and delete, and for one
// trial-mode eval sample: PostgreSQL logs every statement of the server's
// database (log_statement = all, set on that database alone), and the test
// sorts the log's lines by verb and table between marks. docs/scale.md
// turns the counts into a write rate. A scale measurement, run only with
// EVALBOX_SCALE_BENCH=1:
//
//	EVALBOX_SCALE_BENCH=1 go test -run TestScaleDatabaseStatements -v ./test/e2e
func TestScaleDatabaseStatements(t *testing.T) {
	if os.Getenv("EVALBOX_SCALE_BENCH") != "1" {
		t.Skip("a scale measurement: set EVALBOX_SCALE_BENCH=1 to run it")
	}
	ctx := ctxT(t, 20*time.Minute)
	pg, err := pgtest.NewServer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := pg.Stop(); err != nil {
			t.Error(err)
		}
	}()
	dsn, err := pg.CreateDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	db := pgx.Identifier{strings.TrimPrefix(u.Path, "/")}.Sanitize()
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+db+" SET log_statement = 'all'"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	pglog := &statementLog{path: filepath.Join(pg.Dir(), "postgres.log")}

	s, err := startServer(serverOptions{args: []string{"--database", dsn}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.stop() }()
	c, _, _ := newTeam(t, s, client.Limits{MaxSandboxes: 8, MaxConcurrentExec: 8})

	// What the server runs with nothing asked of it (its reaper, pools),
	// to subtract.
	mark := pglog.mark(t)
	idle := 20 * time.Second
	time.Sleep(idle)
	background := pglog.since(t, mark)
	perSecond := float64(background.total()) / idle.Seconds()
	t.Logf("idle server: %.2f statements/s (%s)", perSecond, background)

	const cycles = 20
	mark = pglog.mark(t)
	start := time.Now()
	for range cycles {
		sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	got := pglog.since(t, mark)
	t.Logf("sandbox create + delete (POST and DELETE /v1/sandboxes, %d cycles, %v, ~%.0f background statements in that time): per cycle %s",
		cycles, time.Since(start).Round(time.Second), perSecond*time.Since(start).Seconds(), got.per(cycles))

	// Two runs of different sizes: the difference per sample is what a
	// sample costs, without the run's own rows (create, finish).
	var runs [2]counts
	sizes := [2]int{10, 50}
	for i, n := range sizes {
		mark = pglog.mark(t)
		start := time.Now()
		runEval(t, ctx, c, n)
		runs[i] = pglog.since(t, mark)
		t.Logf("trial-mode eval run of %d samples (%v, ~%.0f background statements in that time): %s",
			n, time.Since(start).Round(time.Second), perSecond*time.Since(start).Seconds(), runs[i])
	}
	t.Logf("trial-mode eval, per sample (the difference of the two runs over %d samples): %s",
		sizes[1]-sizes[0], runs[1].minus(runs[0]).per(sizes[1]-sizes[0]))
}

// runEval runs a trial-mode eval of n passing samples of one small problem
// on the namespaces runtime, and follows it to its end on one stream (no
// polling, whose reads would be counted).
func runEval(t *testing.T, ctx context.Context, c *client.Client, n int) {
	t.Helper()
	req := client.CreateEvalRequest{
		Problems: []client.EvalProblem{{TaskID: "scale/0", Prompt: "def add(a, b):\n", EntryPoint: "add",
			Test: "def check(candidate):\n    assert candidate(1, 2) == 3\n"}},
		Runtime: client.RuntimeNamespaces, Mode: client.EvalModeTrial, Concurrency: 4,
	}
	completion := "    return a + b\n"
	for range n {
		req.Samples = append(req.Samples, client.EvalSample{TaskID: "scale/0", Completion: &completion})
	}
	run, err := c.CreateEval(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var end *client.EvalRun
	if err := c.EvalProgressEvents(ctx, run.ID, func(ev client.EvalEvent) error {
		if ev.Type == client.EvalEventEnd {
			end = ev.Run
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if end == nil || end.State != client.EvalStateSucceeded || end.Done != n || end.Counts["passed"] != n {
		t.Fatalf("eval run ended as %+v", end)
	}
}

// statementLog reads the statements PostgreSQL logged.
type statementLog struct{ path string }

// mark returns where the log ends now.
func (l *statementLog) mark(t *testing.T) int64 {
	t.Helper()
	time.Sleep(500 * time.Millisecond) // what is in flight lands before the mark
	fi, err := os.Stat(l.path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// The log line of a statement: "... LOG:  statement: <sql>" (simple
// protocol) or "... LOG:  execute <name>: <sql>" (extended, as pgx runs
// most). Parameters follow on DETAIL lines, multi-line SQL on lines
// without a prefix: neither is counted.
var (
	logStatement = regexp.MustCompile(`LOG:  (?:statement|execute [^:]+): (.*)$`)
	writeTable   = regexp.MustCompile(`(?i)^(?:insert\s+into|update|delete\s+from)\s+"?([a-z_]+)`)
)

// since counts the statements logged after mark.
func (l *statementLog) since(t *testing.T, mark int64) counts {
	t.Helper()
	time.Sleep(500 * time.Millisecond)
	f, err := os.Open(l.path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(mark, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	c := counts{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		m := logStatement.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		sql := strings.TrimSpace(m[1])
		verb, _, _ := strings.Cut(sql, " ")
		verb = strings.ToUpper(verb)
		switch verb {
		case "SELECT", "INSERT", "UPDATE", "DELETE", "BEGIN", "COMMIT", "ROLLBACK", "WITH":
		default:
			verb = "other"
		}
		c[verb]++
		if tm := writeTable.FindStringSubmatch(sql); tm != nil {
			c[verb+" "+strings.ToLower(tm[1])]++
		}
		if verb != "INSERT" && verb != "UPDATE" && verb != "DELETE" {
			// Reads and the rest by their text, to say what they are.
			shape := strings.Join(strings.Fields(sql), " ")
			if len(shape) > 70 {
				shape = shape[:70] + "…"
			}
			c["("+shape+")"]++
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return c
}

// counts are statements by verb ("SELECT") and writes by verb and table
// ("INSERT sandboxes").
type counts map[string]float64

func (c counts) total() float64 {
	var n float64
	for k, v := range c {
		if !strings.Contains(k, " ") && !strings.HasPrefix(k, "(") {
			n += v
		}
	}
	return n
}

func (c counts) writes() float64 { return c["INSERT"] + c["UPDATE"] + c["DELETE"] }

func (c counts) minus(o counts) counts {
	out := counts{}
	for k, v := range c {
		out[k] = v - o[k]
	}
	for k, v := range o {
		if _, ok := c[k]; !ok {
			out[k] = -v
		}
	}
	return out
}

func (c counts) per(n int) counts {
	out := counts{}
	for k, v := range c {
		out[k] = v / float64(n)
	}
	return out
}

func (c counts) String() string {
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range c {
			if !yield(k) {
				return
			}
		}
	})
	var b strings.Builder
	fmt.Fprintf(&b, "%.2f statements, %.2f writes, %.2f transactions [", c.total(), c.writes(), c["BEGIN"])
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %.2f", k, c[k])
	}
	b.WriteString("]")
	return b.String()
}
