// Package store keeps the control plane's state (teams, API keys,
// sandboxes, the teams' template names and their builds, eval runs and
// their trials' results) in a SQL database: an embedded SQLite file (the
// default) or a PostgreSQL server (Open's DSN says which).
//
// One Store, two dialects. Every method is written once, over
// database/sql, in SQL that both databases accept; a small dialect
// (sqlite.go, postgres.go) holds the rest: placeholders (queries are
// written with ?, rewritten to $1, $2, … for PostgreSQL), the lock clause
// of a read that a transaction then writes on, the JSON table function of
// ListSandboxes, the classification of unique and foreign key violations
// (ErrConflict, ErrNotFound), the column types of the migrations, and where
// the schema version lives. A Go interface with an implementation per
// database would have copied every method; the queries differ in so little
// that one copy is easier to keep right.
//
// The schema is the same on both: ids are TEXT, booleans are 0/1 integers,
// times are integer microseconds since the Unix epoch (UTC), JSON is stored
// as TEXT, an eval run's input as bytes. Every row carries a team_id, and
// the per-team methods filter on it, so another team's row reads as
// ErrNotFound. Migrations are one list, written in SQLite's type names;
// PostgreSQL gets them with BIGINT for INTEGER (its INTEGER is 32 bits:
// microsecond times need 64), DOUBLE PRECISION for REAL, BYTEA for BLOB,
// and TEXT COLLATE "C" for TEXT, which compares and sorts as SQLite's
// BINARY does (ORDER BY name means the same order on both).
//
// Concurrency on SQLite: the database runs in WAL mode. All writes go
// through a pool of exactly one connection whose transactions begin
// IMMEDIATE, so writers in this process queue in database/sql instead of
// failing with SQLITE_BUSY; reads use a separate read-only pool and run in
// parallel with the writer, their statements prepared once (stmtcache.go).
// busy_timeout covers another process holding the lock.
//
// Concurrency on PostgreSQL: several Stores (API replicas) may share one
// database, and their writers run at once. Transactions run at READ
// COMMITTED (set per connection, whatever the server's default), and no
// method relies on being the only writer: a single statement decides what
// it changes in its WHERE clause (MarkEnded, FinishEval, SetExpiry), which
// PostgreSQL re-checks on the row's newest version after waiting for its
// lock, and the transactions that read a row and then write on what they
// read lock it first (lockClause: SELECT … FOR UPDATE; a no-op on SQLite,
// where IMMEDIATE already serialises them): PutTemplate, DeleteEval; or
// take what they return from the write itself (DeleteTemplate's
// RETURNING). Rows are locked in one order (a template row; a run's row,
// then its trials), so transactions do not deadlock, and READ COMMITTED
// with row locks raises no serialization failures: nothing is retried.
// Migrations run under a transaction-scoped advisory lock, so replicas
// starting at once apply them once. What replicas must agree on is
// decided here too: a team's active-sandbox admission (slots.go: the team
// row locked, its running rows and slot rows counted) and which replica
// runs an eval run (evals.go: leases, claimed and renewed by single
// UPDATEs; a verdict written only under its writer's lease, the first one
// kept).
//
// Text: PostgreSQL's text holds neither NUL characters nor invalid UTF-8;
// SQLite's holds both. So that no input makes a write fail on one database
// and not on the other (a sample's stderr becomes a trial's detail, and a
// hostile sample could print either), strings bound on PostgreSQL have
// them replaced by U+FFFD — which the JSON API already shows for invalid
// UTF-8 on SQLite too; only a NUL reads back differently.
package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base32"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"
)

// Sentinel errors; test with errors.Is.
var (
	// ErrNotFound: no such row, or it belongs to another team.
	ErrNotFound = errors.New("not found")
	// ErrConflict: the row would violate a uniqueness rule.
	ErrConflict = errors.New("conflict")
	// ErrNotRunning: the sandbox exists but has already ended.
	ErrNotRunning = errors.New("sandbox not running")
)

// Store is the state database. Its methods are safe for concurrent use.
type Store struct {
	d dialect
	w *sql.DB // writes and transactions (SQLite: one connection, BEGIN IMMEDIATE)
	r *sql.DB // reads (SQLite: query_only connections; PostgreSQL: w)
	// reads caches r's prepared statements (SQLite; nil on PostgreSQL).
	reads *stmtCache
}

// Open opens the database dsn names and applies any pending schema
// migrations:
//   - a file path, or sqlite:PATH: an SQLite database file, created if
//     needed (owner-only);
//   - postgres://… or postgresql://…: a PostgreSQL database (a libpq
//     connection URL; the password may instead come from PGPASSWORD or
//     ~/.pgpass, which keeps it out of the URL).
//
// Errors and logs show a DSN only through Redact.
func Open(ctx context.Context, dsn string) (*Store, error) {
	kind, target, err := parseDSN(dsn)
	if err != nil {
		return nil, err
	}
	if kind == backendPostgres {
		return openPostgres(ctx, target)
	}
	return openSQLite(ctx, target)
}

// CheckDSN reports whether Open would know what dsn names, without opening
// it: for a command line's usage errors.
func CheckDSN(dsn string) error {
	_, _, err := parseDSN(dsn)
	return err
}

// Backends Open knows.
const (
	backendSQLite   = "sqlite"
	backendPostgres = "postgres"
)

// Backend returns "sqlite" or "postgres".
func (s *Store) Backend() string { return s.d.name() }

// keyValueDSN matches the start of a libpq key=value connection string.
var keyValueDSN = regexp.MustCompile(`^\s*[A-Za-z_]+\s*=`)

// parseDSN returns the backend dsn names and what to open on it.
func parseDSN(dsn string) (kind, target string, err error) {
	switch {
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		return backendPostgres, dsn, nil
	case strings.HasPrefix(dsn, "sqlite:"):
		path := strings.TrimPrefix(dsn, "sqlite:")
		if path == "" || strings.HasPrefix(path, "//") {
			return "", "", fmt.Errorf("store: database %q: want sqlite:PATH, e.g. sqlite:/var/lib/evalbox/evalbox.db", dsn)
		}
		return backendSQLite, path, nil
	case strings.Contains(dsn, "://"):
		scheme, _, _ := strings.Cut(dsn, "://")
		return "", "", fmt.Errorf("store: database %s://…: unsupported scheme %q (want a file path, sqlite:PATH or postgres://…)", scheme, scheme)
	case keyValueDSN.MatchString(dsn):
		// A path this looks like is far less likely than a libpq
		// key=value string, which would otherwise become a file named
		// after it (password included).
		return "", "", errors.New("store: database: a key=value connection string is not supported (want a postgres:// URL)")
	}
	return backendSQLite, dsn, nil
}

// Redact returns dsn as it may be logged: a URL's password replaced by
// "xxxxx" (in its user info, or a password or sslpassword parameter); a
// path as it is.
func Redact(dsn string) string {
	kind, _, err := parseDSN(dsn)
	if err != nil {
		return "(invalid database)"
	}
	if kind == backendSQLite {
		return dsn
	}
	u, err := url.Parse(dsn)
	if err != nil {
		scheme, _, _ := strings.Cut(dsn, "://")
		return scheme + "://(unparsable)"
	}
	if q := u.Query(); q.Has("password") || q.Has("sslpassword") {
		for _, k := range []string{"password", "sslpassword"} {
			if q.Has(k) {
				q.Set(k, "xxxxx")
			}
		}
		u.RawQuery = q.Encode()
	}
	u.Fragment = ""
	return u.Redacted()
}

// Close closes the database.
func (s *Store) Close() error {
	var cached error
	if s.reads != nil {
		cached = s.reads.close()
	}
	if s.r == s.w {
		return errors.Join(cached, s.w.Close())
	}
	return errors.Join(cached, s.r.Close(), s.w.Close())
}

// NewID returns a random id "<prefix>_<16 base32 chars>" (80 bits).
func NewID(prefix string) string {
	var b [10]byte
	rand.Read(b[:])
	return prefix + "_" + idEncoding.EncodeToString(b[:])
}

// IDBytes returns the random bytes of an id NewID(prefix) made, and
// whether id is one.
func IDBytes(prefix, id string) ([10]byte, bool) {
	var b [10]byte
	rest, ok := strings.CutPrefix(id, prefix+"_")
	if !ok || len(rest) != idEncoding.EncodedLen(len(b)) {
		return b, false
	}
	n, err := idEncoding.Decode(b[:], []byte(rest))
	return b, err == nil && n == len(b)
}

// IDFromBytes is the id with prefix whose random bytes are b (IDBytes
// undone).
func IDFromBytes(prefix string, b [10]byte) string {
	return prefix + "_" + idEncoding.EncodeToString(b[:])
}

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// The query helpers take SQL written with ? placeholders and run it in
// the Store's dialect; exec and writeRow on the writer, query and queryRow
// on the readers.

func (s *Store) exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return s.w.ExecContext(ctx, s.d.rebind(q), s.d.args(args)...)
}

// writeRow runs a write that returns a row (… RETURNING).
func (s *Store) writeRow(ctx context.Context, q string, args ...any) *sql.Row {
	return s.w.QueryRowContext(ctx, s.d.rebind(q), s.d.args(args)...)
}

func (s *Store) query(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	q = s.d.rebind(q)
	if st := s.stmt(ctx, q); st != nil {
		return st.QueryContext(ctx, s.d.args(args)...)
	}
	return s.r.QueryContext(ctx, q, s.d.args(args)...)
}

func (s *Store) queryRow(ctx context.Context, q string, args ...any) *sql.Row {
	q = s.d.rebind(q)
	if st := s.stmt(ctx, q); st != nil {
		return st.QueryRowContext(ctx, s.d.args(args)...)
	}
	return s.r.QueryRowContext(ctx, q, s.d.args(args)...)
}

// stmt returns the readers' prepared statement of q, or nil.
func (s *Store) stmt(ctx context.Context, q string) *sql.Stmt {
	if s.reads == nil {
		return nil
	}
	return s.reads.get(ctx, q)
}

// txn is a write transaction with the Store's query helpers.
type txn struct {
	tx *sql.Tx
	d  dialect
}

func (t *txn) exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return t.tx.ExecContext(ctx, t.d.rebind(q), t.d.args(args)...)
}

func (t *txn) queryRow(ctx context.Context, q string, args ...any) *sql.Row {
	return t.tx.QueryRowContext(ctx, t.d.rebind(q), t.d.args(args)...)
}

// inTx runs fn in a write transaction and commits it if fn succeeds. A read
// that fn writes on must lock its rows (lockClause): on PostgreSQL other
// writers run meanwhile.
func (s *Store) inTx(ctx context.Context, fn func(*txn) error) error {
	t, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(&txn{tx: t, d: s.d}); err != nil {
		t.Rollback()
		return err
	}
	return t.Commit()
}

// mapConstraint turns uniqueness and foreign key violations into the
// package's sentinel errors; what names the referenced row (e.g. "team").
func (s *Store) mapConstraint(err error, what string) error {
	switch s.d.violation(err) {
	case uniqueViolation:
		return fmt.Errorf("%w: %v", ErrConflict, err)
	case foreignKeyViolation:
		return fmt.Errorf("%s %w", what, ErrNotFound)
	}
	return err
}

// boolInt is a boolean as stored: 0 or 1 (an INTEGER column on both
// databases, so that the schema is the same).
func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// Times are stored as INTEGER microseconds since the Unix epoch, UTC.

func toDB(t time.Time) int64 { return t.UnixMicro() }

func fromDB(us int64) time.Time { return time.UnixMicro(us).UTC() }

func nullTime(t *time.Time) sql.NullInt64 {
	if t == nil {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: toDB(*t), Valid: true}
}

func timePtr(n sql.NullInt64) *time.Time {
	if !n.Valid {
		return nil
	}
	t := fromDB(n.Int64)
	return &t
}

// now is the creation time given to rows that have none, at the stored
// precision so that what Insert returns equals what Get returns.
func now() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

// norm returns t at the stored precision and in UTC.
func norm(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }
