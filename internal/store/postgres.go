package store

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// migrationLock is the advisory lock key under which Stores migrate a
// PostgreSQL database ("evalbox" in ASCII).
const migrationLock = 0x6576616c626f78

// openPostgres connects to the PostgreSQL database of a postgres:// URL and
// applies any pending schema migrations.
func openPostgres(ctx context.Context, dsn string) (*Store, error) {
	// pgx's parse errors show the URL with its passwords masked.
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	// Every transaction at READ COMMITTED, whatever the server's or the
	// database's default: the methods lock what they read and write on,
	// and are written for that level (see the package doc).
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["default_transaction_isolation"] = "read committed"
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "evalbox"
	}
	db := stdlib.OpenDB(*cfg)
	// One pool for reads and writes (PostgreSQL needs no single writer),
	// bounded so that replicas share the server's max_connections.
	n := max(8, 2*runtime.GOMAXPROCS(0))
	db.SetMaxOpenConns(n)
	db.SetMaxIdleConns(n / 2)
	db.SetConnMaxIdleTime(5 * time.Minute)
	s := &Store{d: postgresDialect{}, w: db, r: db}
	where := Redact(dsn)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: open %s: %w", where, err)
	}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: %s: %w", where, err)
	}
	return s, nil
}

// postgresDialect is PostgreSQL's, through pgx's database/sql driver.
type postgresDialect struct{}

func (postgresDialect) name() string           { return backendPostgres }
func (postgresDialect) rebind(q string) string { return rebindDollar(q) }

// args: PostgreSQL's text can hold neither NUL nor invalid UTF-8 (the
// statement would fail); such strings are bound with U+FFFD in their place
// (see the package doc).
func (postgresDialect) args(a []any) []any {
	var out []any
	for i, v := range a {
		s, ok := v.(string)
		if !ok || (utf8.ValidString(s) && !strings.ContainsRune(s, 0)) {
			continue
		}
		if out == nil {
			out = slices.Clone(a)
		}
		out[i] = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
	}
	if out == nil {
		return a
	}
	return out
}

// lockClause: at READ COMMITTED, a row read then written on must be locked
// by the read, or another transaction may change it in between. FOR UPDATE
// also waits for a transaction that holds it, then reads its newest
// version.
func (postgresDialect) lockClause() string { return " FOR UPDATE" }

// jsonEach: json_each_text gives every value as text (a string's without
// its quotes), as SQLite's json_each gives a string.
func (postgresDialect) jsonEach(col string) string { return "json_each_text(" + col + "::json)" }

func (postgresDialect) violation(err error) violationKind {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return noViolation
	}
	switch pe.Code {
	case "23505": // unique_violation (primary keys too)
		return uniqueViolation
	case "23503": // foreign_key_violation
		return foreignKeyViolation
	}
	return noViolation
}

// beginMigration takes the migration lock, a transaction-scoped advisory
// lock (released at commit or rollback, also if the connection drops), and
// makes the version table, one row, if it is not there. DDL is
// transactional on PostgreSQL: a migration that fails leaves nothing.
func (postgresDialect) beginMigration(ctx context.Context, t *txn) error {
	if _, err := t.exec(ctx, `SELECT pg_advisory_xact_lock(?)`, int64(migrationLock)); err != nil {
		return fmt.Errorf("migration lock: %w", err)
	}
	if _, err := t.exec(ctx, `CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)`); err != nil {
		return err
	}
	_, err := t.exec(ctx, `INSERT INTO schema_version (version) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM schema_version)`)
	return err
}

// The schema version is the one row of the table schema_version.
func (postgresDialect) schemaVersion(ctx context.Context, q queryRower) (int, error) {
	var v int
	err := q.queryRow(ctx, `SELECT version FROM schema_version`).Scan(&v)
	return v, err
}

func (postgresDialect) setSchemaVersion(ctx context.Context, t *txn, v int) error {
	_, err := t.exec(ctx, `UPDATE schema_version SET version = ?`, v)
	return err
}

// pgTypes are PostgreSQL's types for the SQLite type names the migrations
// use (upper case, as whole words: column names are lower case).
var (
	pgTypeWord = regexp.MustCompile(`\b(INTEGER|REAL|BLOB|TEXT)\b`)
	pgTypes    = map[string]string{
		"INTEGER": "BIGINT",           // SQLite's INTEGER is 64 bits; PostgreSQL's, 32
		"REAL":    "DOUBLE PRECISION", // SQLite's REAL is 8 bytes
		"BLOB":    "BYTEA",
		"TEXT":    `TEXT COLLATE "C"`, // compares and sorts as SQLite's BINARY
	}
)

func (postgresDialect) ddl(m string) string {
	return pgTypeWord.ReplaceAllStringFunc(m, func(w string) string { return pgTypes[w] })
}
