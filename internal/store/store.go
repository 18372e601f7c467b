// Package store keeps the control plane's state (teams, API keys,
// sandboxes, the teams' template names and their builds, eval runs and
// their trials' results) in an embedded SQLite database.
//
// The SQL is kept close to what PostgreSQL also accepts: ids are TEXT,
// booleans are 0/1 integers, times are INTEGER microseconds since the Unix
// epoch (UTC), JSON is stored as TEXT. Every row carries a team_id, and the
// per-team methods filter on it, so another team's row reads as ErrNotFound.
//
// Concurrency: the database runs in WAL mode. All writes go through a pool
// of exactly one connection whose transactions begin IMMEDIATE, so writers
// in this process queue in database/sql instead of failing with
// SQLITE_BUSY; reads use a separate read-only pool and run in parallel with
// the writer. busy_timeout covers another process holding the lock.
package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base32"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
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

// busyTimeoutMS is how long a connection waits for another process's lock.
const busyTimeoutMS = 10000

// Store is the state database. Its methods are safe for concurrent use.
type Store struct {
	w *sql.DB // writer: one connection, BEGIN IMMEDIATE
	r *sql.DB // readers: query_only connections
}

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

// Open opens (creating if needed, owner-only) the database file at path and
// applies any pending schema migrations.
func Open(ctx context.Context, path string) (*Store, error) {
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
	s := &Store{w: w}
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
	return s, nil
}

// Close closes the database.
func (s *Store) Close() error {
	return errors.Join(s.r.Close(), s.w.Close())
}

// NewID returns a random id "<prefix>_<16 base32 chars>" (80 bits).
func NewID(prefix string) string {
	var b [10]byte
	rand.Read(b[:])
	return prefix + "_" + idEncoding.EncodeToString(b[:])
}

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// inTx runs fn in a write transaction and commits it if fn succeeds.
func (s *Store) inTx(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// sqliteCode returns the extended SQLite result code of err, or 0.
func sqliteCode(err error) int {
	var se *sqlite.Error
	if errors.As(err, &se) {
		return se.Code()
	}
	return 0
}

// mapConstraint turns uniqueness and foreign key violations into the
// package's sentinel errors; what names the referenced row (e.g. "team").
func mapConstraint(err error, what string) error {
	switch sqliteCode(err) {
	case sqlite3.SQLITE_CONSTRAINT_UNIQUE, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
		return fmt.Errorf("%w: %v", ErrConflict, err)
	case sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY:
		return fmt.Errorf("%s %w", what, ErrNotFound)
	}
	return err
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
