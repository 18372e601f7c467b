package quota

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

// fakeRows is a source: rows a Persist writes, per team.
type fakeRows struct {
	mu   sync.Mutex
	rows map[string]int64
}

func (f *fakeRows) source(_ context.Context, teamID string) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rows[teamID], nil
}

func (f *fakeRows) add(teamID string, n int64) func() error {
	return func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.rows[teamID] += n
		return nil
	}
}

func newTestStorage(limit int64) (*Storage, *fakeRows) {
	rows := &fakeRows{rows: map[string]int64{}}
	s := NewStorage(func(context.Context, string) (int64, error) { return limit, nil })
	s.AddSource(rows.source)
	return s, rows
}

func TestStorageLimit(t *testing.T) {
	ctx := context.Background()
	s, rows := newTestStorage(100)
	r, err := s.Reserve(ctx, "a", 60)
	if err != nil {
		t.Fatal(err)
	}
	// Held bytes count: 60 + 50 > 100.
	_, err = s.Reserve(ctx, "a", 50)
	var se *StorageError
	if !errors.As(err, &se) || !errors.Is(err, ErrStorage) || se.Used != 60 || se.Want != 50 || se.Limit != 100 {
		t.Fatalf("over the limit: %v", err)
	}
	// Another team is apart.
	if r2, err := s.Reserve(ctx, "b", 100); err != nil {
		t.Fatal(err)
	} else {
		r2.Release()
	}
	if err := r.Grow(40); err != nil {
		t.Fatal(err)
	}
	if err := r.Grow(1); !errors.Is(err, ErrStorage) {
		t.Fatalf("grow past: %v", err)
	}
	if r.Held() != 100 {
		t.Errorf("held %d", r.Held())
	}
	r.Shrink(30)
	// Persist stores 20 in place of the 70 held.
	if err := r.Persist(20, rows.add("a", 20)); err != nil {
		t.Fatal(err)
	}
	if used, limit, err := s.Usage(ctx, "a"); err != nil || used != 20 || limit != 100 {
		t.Errorf("usage %d/%d %v", used, limit, err)
	}
	// A persist that does not fit does not write.
	r, _ = s.Reserve(ctx, "a", 0)
	wrote := false
	if err := r.Persist(81, func() error { wrote = true; return nil }); !errors.Is(err, ErrStorage) || wrote {
		t.Errorf("persist past the limit: %v, wrote %v", err, wrote)
	}
	// A failing write stores nothing.
	r, _ = s.Reserve(ctx, "a", 10)
	errWrite := errors.New("disk")
	if err := r.Persist(10, func() error { return errWrite }); !errors.Is(err, errWrite) {
		t.Errorf("persist write error: %v", err)
	}
	r.Release() // after Persist: nothing
	if used, _, _ := s.Usage(ctx, "a"); used != 20 {
		t.Errorf("usage after failures: %d", used)
	}
	if err := r.Grow(1); err == nil {
		t.Error("grow after the end")
	}
	// A delete counts at the next Reserve.
	rows.add("a", -20)()
	if r, err := s.Reserve(ctx, "a", 100); err != nil {
		t.Errorf("after the delete: %v", err)
	} else {
		r.Release()
	}
	if len(s.teams) != 0 {
		t.Errorf("entries left: %v", s.teams)
	}
}

func TestStorageNoLimit(t *testing.T) {
	s, _ := newTestStorage(0)
	r, err := s.Reserve(context.Background(), "a", 1<<50)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Grow(1 << 50); err != nil {
		t.Fatal(err)
	}
	r.Release()
}

// TestStorageConcurrent: reservations and persists of one team, at once,
// never let it pass its limit, and what they stored is what the source
// reports at the end.
func TestStorageConcurrent(t *testing.T) {
	ctx := context.Background()
	const limit = 1000
	s, rows := newTestStorage(limit)
	var stored atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				r, err := s.Reserve(ctx, "a", 5)
				if err != nil {
					continue
				}
				if r.Grow(5) != nil {
					r.Release()
					continue
				}
				if err := r.Persist(3, rows.add("a", 3)); err == nil {
					stored.Add(3)
				}
				if used, _, _ := s.Usage(ctx, "a"); used > limit {
					t.Errorf("used %d > %d", used, limit)
				}
			}
		}()
	}
	wg.Wait()
	if got, _ := rows.source(ctx, "a"); got != stored.Load() || got > limit {
		t.Errorf("stored %d, persisted %d", got, stored.Load())
	}
}
