package quota

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// ErrStorage: what a team stores would pass its storage limit. The API
// maps it to 413 storage_quota_exceeded.
var ErrStorage = errors.New("storage quota exceeded")

// StorageError is an ErrStorage with the numbers.
type StorageError struct {
	Used  int64 // stored and held by requests in flight
	Want  int64 // the bytes asked for
	Limit int64
}

func (e *StorageError) Error() string {
	return fmt.Sprintf("storage quota exceeded: the team stores %s and would store %s more, over its limit of %s",
		mib(e.Used), mib(e.Want), mib(e.Limit))
}

func (e *StorageError) Unwrap() error { return ErrStorage }

func mib(n int64) string {
	if n < 1<<20 {
		return fmt.Sprintf("%d bytes", n)
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// StorageSource reports what a team stores now, for one kind of thing
// (templates, eval inputs).
type StorageSource func(ctx context.Context, teamID string) (int64, error)

// Storage accounts for the bytes each team stores, against its limit:
// what its sources report (stored templates, eval runs' inputs) plus what
// requests in flight hold (Reservation: an upload being saved, a build
// context, an import or build writing its files). A request asks for its
// bytes before it stores them, so that one past the limit fails before
// anything is kept.
//
// The sources are asked at every Reserve; between two, a team's stored
// bytes are those of the last Reserve plus what Persist added (a delete
// only counts at the next Reserve: the count errs on the high side). A
// Persist holds the team's lock while the caller writes its row, and a
// Reserve while it asks the sources, so that a row is never counted
// neither as held nor as stored. It is safe for concurrent use.
type Storage struct {
	limit   func(ctx context.Context, teamID string) (int64, error)
	mu      sync.Mutex
	sources []StorageSource
	teams   map[string]*storageTeam
}

type storageTeam struct {
	mu     sync.Mutex // held while the sources are asked and while a Persist writes
	stored int64
	held   int64
	users  int // reservations and calls using the entry
}

// NewStorage returns the accountant; limit gives a team's limit in bytes
// (<= 0: none).
func NewStorage(limit func(ctx context.Context, teamID string) (int64, error)) *Storage {
	return &Storage{limit: limit, teams: map[string]*storageTeam{}}
}

// AddSource adds a kind of stored thing; call it before the first Reserve.
func (s *Storage) AddSource(src StorageSource) {
	s.mu.Lock()
	s.sources = append(s.sources, src)
	s.mu.Unlock()
}

func (s *Storage) team(teamID string) *storageTeam {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.teams[teamID]
	if t == nil {
		t = &storageTeam{}
		s.teams[teamID] = t
	}
	t.users++
	return t
}

func (s *Storage) done(teamID string, t *storageTeam) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.users--; t.users == 0 {
		delete(s.teams, teamID)
	}
}

// refresh asks the sources what the team stores; t.mu is held.
func (s *Storage) refresh(ctx context.Context, teamID string, t *storageTeam) error {
	s.mu.Lock()
	sources := s.sources
	s.mu.Unlock()
	var n int64
	for _, src := range sources {
		m, err := src(ctx, teamID)
		if err != nil {
			return fmt.Errorf("quota: storage of team %s: %w", teamID, err)
		}
		n += m
	}
	t.stored = n
	return nil
}

// Usage returns what the team stores now (sources and requests in flight)
// and its limit (<= 0: none).
func (s *Storage) Usage(ctx context.Context, teamID string) (used, limit int64, err error) {
	limit, err = s.limit(ctx, teamID)
	if err != nil {
		return 0, 0, err
	}
	t := s.team(teamID)
	defer s.done(teamID, t)
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := s.refresh(ctx, teamID, t); err != nil {
		return 0, 0, err
	}
	return t.stored + t.held, limit, nil
}

// Reserve holds n bytes for the team, failing with a *StorageError
// (ErrStorage) if what it stores and holds would pass its limit. The
// reservation is ended by Release or Persist.
func (s *Storage) Reserve(ctx context.Context, teamID string, n int64) (*Reservation, error) {
	limit, err := s.limit(ctx, teamID)
	if err != nil {
		return nil, err
	}
	t := s.team(teamID)
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := s.refresh(ctx, teamID, t); err != nil {
		s.done(teamID, t)
		return nil, err
	}
	if limit > 0 && t.stored+t.held+n > limit {
		s.done(teamID, t)
		return nil, &StorageError{Used: t.stored + t.held, Want: n, Limit: limit}
	}
	t.held += n
	return &Reservation{s: s, teamID: teamID, t: t, n: n, limit: limit}, nil
}

// Reservation is bytes a request holds for a team until it stores them
// (Persist) or gives up (Release). Its methods are safe for concurrent
// use.
type Reservation struct {
	s      *Storage
	teamID string
	t      *storageTeam
	limit  int64

	mu   sync.Mutex
	n    int64
	over bool // Release or Persist ran
}

// Grow holds n more bytes, failing with a *StorageError if the team would
// pass its limit (then nothing more is held).
func (r *Reservation) Grow(n int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.over {
		return errors.New("quota: reservation already released")
	}
	r.t.mu.Lock()
	defer r.t.mu.Unlock()
	if r.limit > 0 && r.t.stored+r.t.held+n > r.limit {
		return &StorageError{Used: r.t.stored + r.t.held, Want: n, Limit: r.limit}
	}
	r.t.held += n
	r.n += n
	return nil
}

// Shrink gives back n of the bytes held (what was freed on the way).
func (r *Reservation) Shrink(n int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.over {
		return
	}
	n = min(n, r.n)
	r.t.mu.Lock()
	r.t.held -= n
	r.t.mu.Unlock()
	r.n -= n
}

// Held returns the bytes the reservation holds.
func (r *Reservation) Held() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

// Persist ends the reservation by storing bytes: write (which records
// them where a source reports them, e.g. a store row) runs under the
// team's lock, unless the team would pass its limit with them in place of
// what the reservation holds (then a *StorageError, and write does not
// run). The reservation is over in every case.
func (r *Reservation) Persist(bytes int64, write func() error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.over {
		return errors.New("quota: reservation already released")
	}
	r.over = true
	defer r.s.done(r.teamID, r.t)
	r.t.mu.Lock()
	defer r.t.mu.Unlock()
	r.t.held -= r.n
	others := r.t.stored + r.t.held
	r.n = 0
	if r.limit > 0 && others+bytes > r.limit {
		return &StorageError{Used: others, Want: bytes, Limit: r.limit}
	}
	if err := write(); err != nil {
		return err
	}
	r.t.stored += bytes
	return nil
}

// Release gives back what the reservation holds; calling it again, or
// after Persist, does nothing.
func (r *Reservation) Release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.over {
		return
	}
	r.over = true
	r.t.mu.Lock()
	r.t.held -= r.n
	r.t.mu.Unlock()
	r.n = 0
	r.s.done(r.teamID, r.t)
}
