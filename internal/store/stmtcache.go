package store

import (
	"context"
	"database/sql"
	"errors"
	"sync"
)

// maxCachedStmts bounds a stmtCache. The Store's queries are a fixed set
// but for a few with IN lists, which vary with their length; past the
// bound a query is prepared each time, as without the cache.
const maxCachedStmts = 256

// stmtCache keeps the prepared statements of a pool's queries by their
// SQL. SQLite (modernc) parses and plans a statement for every query that
// is not prepared, which costs as much as running a primary-key lookup:
// half of GetSandbox, which every port URL request makes. database/sql
// prepares a cached statement once on each connection that runs it.
// PostgreSQL needs none: pgx caches its statements itself.
type stmtCache struct {
	db *sql.DB
	mu sync.RWMutex
	m  map[string]*sql.Stmt
}

func newStmtCache(db *sql.DB) *stmtCache {
	return &stmtCache{db: db, m: make(map[string]*sql.Stmt)}
}

// get returns q's statement, prepared on first use; nil when the cache is
// full or q does not prepare (then running it unprepared reports why).
func (c *stmtCache) get(ctx context.Context, q string) *sql.Stmt {
	// Every read of the Store comes here: the common case, a hit, shares
	// the lock.
	c.mu.RLock()
	st, ok := c.m[q]
	c.mu.RUnlock()
	if ok {
		return st
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if st, ok := c.m[q]; ok {
		return st
	}
	if len(c.m) >= maxCachedStmts {
		return nil
	}
	st, err := c.db.PrepareContext(ctx, q)
	if err != nil {
		return nil
	}
	c.m[q] = st
	return st
}

// close closes the statements; the cache is not used after.
func (c *stmtCache) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for q, st := range c.m {
		errs = append(errs, st.Close())
		delete(c.m, q)
	}
	return errors.Join(errs...)
}
