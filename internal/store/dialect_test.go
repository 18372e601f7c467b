package store

import (
	"context"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/evalbox/evalbox/internal/pgtest"
	"github.com/evalbox/evalbox/pkg/client"
)

func TestParseDSN(t *testing.T) {
	for _, c := range []struct{ dsn, kind, target string }{
		{"/var/lib/evalbox/evalbox.db", backendSQLite, "/var/lib/evalbox/evalbox.db"},
		{"state.db", backendSQLite, "state.db"},
		{"sqlite:/var/lib/evalbox/evalbox.db", backendSQLite, "/var/lib/evalbox/evalbox.db"},
		{"postgres://u:pw@db:5432/evalbox?sslmode=require", backendPostgres, "postgres://u:pw@db:5432/evalbox?sslmode=require"},
		{"postgresql://db/evalbox", backendPostgres, "postgresql://db/evalbox"},
	} {
		kind, target, err := parseDSN(c.dsn)
		if err != nil || kind != c.kind || target != c.target {
			t.Errorf("parseDSN(%q) = %q, %q, %v; want %q, %q", c.dsn, kind, target, err, c.kind, c.target)
		}
	}
	for _, dsn := range []string{
		"", "sqlite:", "sqlite://h/x.db", "mysql://u:secret@h/db", "http://u:secret@h/db",
		"host=db user=u password=secret", " dbname = x password=secret", "state.db?mode=ro",
	} {
		s, err := Open(context.Background(), dsn)
		if err == nil {
			s.Close()
			t.Errorf("Open(%q) succeeded", dsn)
			continue
		}
		if !strings.HasPrefix(err.Error(), "store: ") || strings.Contains(err.Error(), "secret") {
			t.Errorf("Open(%q): %v; want a store: error without the password", dsn, err)
		}
	}
}

func TestRedact(t *testing.T) {
	for dsn, want := range map[string]string{
		"/var/lib/evalbox/evalbox.db":                     "/var/lib/evalbox/evalbox.db",
		"postgres://u:secret@db:5432/evalbox":             "postgres://u:xxxxx@db:5432/evalbox",
		"postgres://u@db/evalbox?sslmode=require":         "postgres://u@db/evalbox?sslmode=require",
		"postgresql://db/evalbox?password=secret&x=1#f":   "postgresql://db/evalbox?password=xxxxx&x=1",
		"postgres://db/e?sslpassword=secret":              "postgres://db/e?sslpassword=xxxxx",
		"postgres://u:sec%zzret@db/evalbox":               "postgres://(unparsable)",
		"host=db password=secret":                         "(invalid database)",
		"mysql://u:secret@h/db":                           "(invalid database)",
		"postgres://u:se:cret@db/evalbox?sslmode=disable": "postgres://u:xxxxx@db/evalbox?sslmode=disable",
	} {
		if got := Redact(dsn); got != want {
			t.Errorf("Redact(%q) = %q, want %q", dsn, got, want)
		}
	}
}

// TestOpenPostgresErrorsHideThePassword: a server that refuses the
// password, and one that is not there, give errors that name the database
// but not the password.
func TestOpenPostgresErrorsHideThePassword(t *testing.T) {
	dsn := pgtest.Shared(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	const secret = "not-the-password-1f3a"
	u.User = url.UserPassword(u.User.Username(), secret)
	wrong := u.String()
	u.Host = "127.0.0.1:1"
	gone := u.String()
	for _, dsn := range []string{wrong, gone} {
		s, err := Open(t.Context(), dsn)
		if err == nil {
			s.Close()
			t.Fatalf("Open(%s) succeeded", Redact(dsn))
		}
		if msg := err.Error(); strings.Contains(msg, secret) || !strings.Contains(msg, "xxxxx") {
			t.Errorf("Open(%s): %v", Redact(dsn), err)
		}
	}
}

func TestRebindDollar(t *testing.T) {
	for q, want := range map[string]string{
		`SELECT 1`: `SELECT 1`,
		`UPDATE t SET a = ?, b = COALESCE(b, ?) WHERE id = ? AND (? = '' OR c = ?)`: `UPDATE t SET a = $1, b = COALESCE(b, $2) WHERE id = $3 AND ($4 = '' OR c = $5)`,
		`SELECT '?', "a?b", 'it''s ?', ? FROM x`:                                    `SELECT '?', "a?b", 'it''s ?', $1 FROM x`,
	} {
		if got := rebindDollar(q); got != want {
			t.Errorf("rebindDollar(%q) =\n%q, want\n%q", q, got, want)
		}
	}
}

// TestPostgresSchema: the migrations' SQLite types became 64-bit integers,
// doubles, bytes and C-collated text on PostgreSQL.
func TestPostgresSchema(t *testing.T) {
	s := openTest(t, pgtest.Shared(t))
	rows, err := s.query(t.Context(), `SELECT table_name, column_name, data_type, COALESCE(collation_name, '')
		FROM information_schema.columns WHERE table_schema = current_schema() AND table_name != 'schema_version'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var table, col, typ, coll string
		if err := rows.Scan(&table, &col, &typ, &coll); err != nil {
			t.Fatal(err)
		}
		n++
		ok := typ == "bigint" || typ == "double precision" || typ == "bytea" || typ == "text" && coll == "C"
		if !ok {
			t.Errorf("%s.%s: %s %s", table, col, typ, coll)
		}
	}
	if err := rows.Err(); err != nil || n < 50 {
		t.Fatalf("%d columns, %v", n, err)
	}
}

// TestTextTheDatabaseCannotHold: a trial's detail holds what a sample
// printed, NUL and invalid UTF-8 included. SQLite keeps it; PostgreSQL,
// whose text can hold neither, gets U+FFFD in their place: on neither does
// the write fail. Names and lookups go the same way.
func TestTextTheDatabaseCannotHold(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx := t.Context()
		odd := "a\x00b\xffc"
		want := odd
		if s.Backend() == backendPostgres {
			want = "a\uFFFDb\uFFFDc"
		}
		team, err := s.CreateTeam(ctx, client.Team{Name: odd})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := s.GetTeamByName(ctx, odd); err != nil || got.Name != want {
			t.Errorf("team by name: %q, %v; want %q", got.Name, err, want)
		}
		run, err := s.InsertEval(ctx, EvalRow{Input: []byte("\x00\xff"), Run: client.EvalRun{TeamID: team.ID, State: client.EvalStateRunning, K: []int{1}}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.PutEvalTrial(ctx, team.ID, run.ID, "", client.EvalResult{TaskID: odd, Status: "failed", Detail: odd, Result: "failed: " + odd}, TrialEnv{}); err != nil {
			t.Fatal(err)
		}
		var got client.EvalResult
		if err := s.EvalTrials(ctx, team.ID, run.ID, func(r client.EvalResult) error { got = r; return nil }); err != nil {
			t.Fatal(err)
		}
		if got.TaskID != want || got.Detail != want || got.Result != "failed: "+want {
			t.Errorf("trial read back %+v; want %q", got, want)
		}
		// Bytes are bytes on both.
		if in, err := s.EvalInput(ctx, team.ID, run.ID); err != nil || string(in) != "\x00\xff" {
			t.Errorf("input %q, %v", in, err)
		}
	})
}

// TestSQLitePathForms: a bare path and sqlite:PATH open the same file.
func TestSQLitePathForms(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "state.db")
	s := openTest(t, path)
	tm := mustTeam(t, s, "a")
	s.Close()
	s2 := openTest(t, "sqlite:"+path)
	if s2.Backend() != backendSQLite {
		t.Fatalf("backend %s", s2.Backend())
	}
	if got, err := s2.GetTeam(ctx, tm.ID); err != nil || got.Name != "a" {
		t.Fatalf("team through sqlite:PATH: %+v, %v", got, err)
	}
}
