package store

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
)

// dialect is what the Store's SQL needs to know of its database. The
// queries themselves are written once (see the package doc); keep this
// interface to what cannot be.
type dialect interface {
	// name is the backend's name ("sqlite", "postgres").
	name() string
	// rebind returns q, written with ? placeholders, in the database's
	// placeholder syntax. Queries never hold a ? of their own (on
	// PostgreSQL some JSONB operators are spelled so: not used here).
	rebind(q string) string
	// args returns the arguments as the database can take them.
	args(a []any) []any
	// lockClause ends a SELECT, in a transaction, whose rows the
	// transaction then writes on: it locks them until the end.
	lockClause() string
	// jsonEach is a table function of the (key, value) pairs of the JSON
	// object in column col, whose value column is the text of a string
	// value.
	jsonEach(col string) string
	// violation classifies err: a uniqueness or a foreign key violation,
	// or neither.
	violation(err error) violationKind

	// Migrations. beginMigration, first in a migration's transaction,
	// makes the other Stores' migrations of this database wait until it
	// ends, and makes sure that the schema version can be read;
	// schemaVersion and setSchemaVersion read and write the number of
	// migrations applied; ddl returns a migration, written in SQLite's
	// types, in the database's.
	beginMigration(ctx context.Context, t *txn) error
	schemaVersion(ctx context.Context, q queryRower) (int, error)
	setSchemaVersion(ctx context.Context, t *txn, v int) error
	ddl(migration string) string
}

type violationKind int

const (
	noViolation violationKind = iota
	uniqueViolation
	foreignKeyViolation
)

// queryRower is a Store or a txn.
type queryRower interface {
	queryRow(ctx context.Context, q string, args ...any) *sql.Row
}

// rebindDollar rewrites the ? placeholders of q as $1, $2, …, leaving
// those in quoted literals and identifiers alone.
func rebindDollar(q string) string {
	if !strings.Contains(q, "?") {
		return q
	}
	var b strings.Builder
	b.Grow(len(q) + 16)
	n := 0
	var quote byte // the quote of the literal or identifier we are in
	for i := 0; i < len(q); i++ {
		c := q[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0 // a doubled quote ('') leaves and re-enters
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '?':
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}
