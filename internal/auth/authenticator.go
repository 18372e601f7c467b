package auth

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/pkg/client"
)

// Cache bounds: how long a successful lookup is trusted, and how many are
// kept.
const (
	cacheTTL  = 5 * time.Second
	cacheSize = 4096
)

// KeyStore finds a non-revoked key by hash with its team; an unknown or
// revoked key is store.ErrNotFound. *store.Store implements it.
type KeyStore interface {
	KeyByHash(ctx context.Context, hash string) (store.Key, client.Team, error)
}

// Principal is who a request acts as.
type Principal struct {
	TeamID   string
	TeamName string
	KeyID    string
	// KeyName is the key's name (the audit log's actor).
	KeyName string
	Admin   bool
	// Limits are the team's limits when the key was looked up: at most 5 s
	// old, or current if Invalidate is called after every change.
	Limits client.Limits
}

// Authenticator resolves API keys to principals. Successful lookups are
// cached for 5 s in a bounded cache, so the hot request path does not query
// the database; failures are never cached. A revocation or limit change
// takes effect at once if Invalidate is called after it (otherwise within
// 5 s). It is safe for concurrent use.
type Authenticator struct {
	ks   KeyStore
	ttl  time.Duration
	size int

	mu    sync.RWMutex
	cache map[string]cached // by key hash
	// gen counts invalidations; a lookup started before one does not fill
	// the cache, so a key revoked during its lookup cannot be re-cached.
	gen uint64
}

type cached struct {
	p       Principal
	expires time.Time
}

// NewAuthenticator returns an Authenticator over ks.
func NewAuthenticator(ks KeyStore) *Authenticator {
	return &Authenticator{ks: ks, ttl: cacheTTL, size: cacheSize, cache: make(map[string]cached)}
}

// Authenticate returns the principal of an Authorization header value
// ("Bearer <key>"). A missing, malformed, unknown or revoked key is
// ErrUnauthorized; other errors are the store's.
func (a *Authenticator) Authenticate(ctx context.Context, header string) (Principal, error) {
	key, err := ParseBearer(header)
	if err != nil {
		return Principal{}, err
	}
	return a.AuthenticateKey(ctx, key)
}

// AuthenticateKey is Authenticate for the bare API key.
func (a *Authenticator) AuthenticateKey(ctx context.Context, secret string) (Principal, error) {
	if !wellFormed(secret) {
		return Principal{}, fmt.Errorf("%w: malformed API key", ErrUnauthorized)
	}
	hash := HashKey(secret)
	a.mu.RLock()
	c, ok := a.cache[hash]
	gen := a.gen
	a.mu.RUnlock()
	now := time.Now()
	if ok && now.Before(c.expires) {
		return c.p, nil
	}

	k, t, err := a.ks.KeyByHash(ctx, hash)
	if errors.Is(err, store.ErrNotFound) {
		return Principal{}, fmt.Errorf("%w: unknown or revoked API key", ErrUnauthorized)
	}
	if err != nil {
		return Principal{}, fmt.Errorf("auth: look up key: %w", err)
	}
	p := Principal{TeamID: t.ID, TeamName: t.Name, KeyID: k.ID, KeyName: k.Name, Admin: k.Admin, Limits: t.Limits}

	a.mu.Lock()
	if a.gen == gen {
		if len(a.cache) >= a.size {
			a.evictLocked(now)
		}
		a.cache[hash] = cached{p: p, expires: now.Add(a.ttl)}
	}
	a.mu.Unlock()
	return p, nil
}

// evictLocked drops expired entries and, if none had expired, one
// arbitrary entry. a.mu must be held.
func (a *Authenticator) evictLocked(now time.Time) {
	n := len(a.cache)
	for h, c := range a.cache {
		if !now.Before(c.expires) {
			delete(a.cache, h)
		}
	}
	if len(a.cache) < n {
		return
	}
	for h := range a.cache {
		delete(a.cache, h)
		return
	}
}

// Invalidate empties the cache; call it after revoking a key or changing
// a team's limits. A lookup in flight during the call does not fill the
// cache, so a key revoked before Invalidate cannot be re-cached.
func (a *Authenticator) Invalidate() {
	a.mu.Lock()
	a.gen++
	clear(a.cache)
	a.mu.Unlock()
}
