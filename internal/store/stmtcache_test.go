package store

import (
	"context"
	"fmt"
	"testing"
)

// TestStmtCache: reads run prepared from the cache, which stays within its
// bound; queries past it, and queries that do not prepare, still run (or
// fail) as they would unprepared.
func TestStmtCache(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		for i := range maxCachedStmts + 10 {
			for range 2 { // the second time from the cache
				var got int
				if err := s.queryRow(ctx, fmt.Sprintf("SELECT %d + ?", i), 1).Scan(&got); err != nil {
					t.Fatal(err)
				}
				if got != i+1 {
					t.Fatalf("query %d: got %d", i, got)
				}
			}
		}
		if err := s.queryRow(ctx, "SELECT nope FROM nowhere").Scan(new(int)); err == nil {
			t.Fatal("a bad query ran")
		}
		if s.reads == nil {
			return // PostgreSQL: pgx caches
		}
		s.reads.mu.Lock()
		n := len(s.reads.m)
		s.reads.mu.Unlock()
		if n != maxCachedStmts {
			t.Fatalf("%d statements cached, want the bound %d", n, maxCachedStmts)
		}
	})
}
