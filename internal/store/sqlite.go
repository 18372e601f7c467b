package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"strings"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// busyTimeoutMS is how long a connection waits for another process's lock.
const busyTimeoutMS = 10000

// private creates the database file (and makes it and the WAL files of an
// existing one) readable and writable by the owner only.
func private(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	f.Close()
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		if err := os.Chmod(p, 0o600); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("store: %w", err)
		}
	}
	return nil
}

// openSQLite opens (creating if needed, owner-only) the database file at
// path and applies any pending schema migrations.
func openSQLite(ctx context.Context, path string) (*Store, error) {
	if path == "" || strings.ContainsAny(path, "?#") {
		return nil, fmt.Errorf("store: invalid database path %q", path)
	}
	// The database holds key hashes and every team's data: owner only.
	// SQLite gives its -wal and -shm files the database file's mode.
	if err := private(path); err != nil {
		return nil, err
	}
	base := fmt.Sprintf("%s?_busy_timeout=%d&_foreign_keys=1", path, busyTimeoutMS)
	w, err := sql.Open("sqlite", base+"&_journal_mode=WAL&_synchronous=NORMAL&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	s := &Store{d: sqliteDialect{}, w: w}
	// Migrate with the writer before any reader opens: the readers are
	// query_only and rely on the file already being in WAL mode.
	if err := s.migrate(ctx); err != nil {
		w.Close()
		return nil, fmt.Errorf("store: %s: %w", path, err)
	}
	r, err := sql.Open("sqlite", base+"&_query_only=1")
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	n := max(4, runtime.GOMAXPROCS(0))
	r.SetMaxOpenConns(n)
	r.SetMaxIdleConns(n)
	if err := r.PingContext(ctx); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	s.r = r
	s.reads = newStmtCache(r)
	return s, nil
}

// sqliteDialect: the queries are written in it.
type sqliteDialect struct{}

func (sqliteDialect) name() string           { return backendSQLite }
func (sqliteDialect) rebind(q string) string { return q }
func (sqliteDialect) args(a []any) []any     { return a }

// lockClause: a write transaction begins IMMEDIATE, holding the database's
// one write lock until it ends; its reads need no lock of their own.
func (sqliteDialect) lockClause() string { return "" }

// jsonEach: SQLite's json_each gives a string value as its text.
func (sqliteDialect) jsonEach(col string) string { return "json_each(" + col + ")" }

func (sqliteDialect) violation(err error) violationKind {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return noViolation
	}
	switch se.Code() {
	case sqlite3.SQLITE_CONSTRAINT_UNIQUE, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
		return uniqueViolation
	case sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY:
		return foreignKeyViolation
	}
	return noViolation
}

// beginMigration: the migration's IMMEDIATE transaction already holds the
// write lock, and user_version always exists.
func (sqliteDialect) beginMigration(context.Context, *txn) error { return nil }

// The schema version is the database's PRAGMA user_version.
func (sqliteDialect) schemaVersion(ctx context.Context, q queryRower) (int, error) {
	var v int
	err := q.queryRow(ctx, `PRAGMA user_version`).Scan(&v)
	return v, err
}

func (sqliteDialect) setSchemaVersion(ctx context.Context, t *txn, v int) error {
	// PRAGMA takes no parameters; the value is an int we control.
	_, err := t.exec(ctx, fmt.Sprintf(`PRAGMA user_version = %d`, v))
	return err
}

func (sqliteDialect) ddl(m string) string { return m }
