package auth

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/pkg/client"
)

func openStore(t *testing.T, dir string) *store.Store {
	t.Helper()
	s, err := store.Open(context.Background(), filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// countingStore is the real store, counting KeyByHash calls to observe
// the cache.
type countingStore struct {
	*store.Store
	lookups atomic.Int64
}

func (c *countingStore) KeyByHash(ctx context.Context, hash string) (store.Key, client.Team, error) {
	c.lookups.Add(1)
	return c.Store.KeyByHash(ctx, hash)
}

// newTeamKey creates a team and a key for it, returning the key's secret.
func newTeamKey(t *testing.T, s *store.Store, team string, admin bool) (string, store.Key, client.Team) {
	t.Helper()
	ctx := context.Background()
	tm, err := s.GetTeamByName(ctx, team)
	if errors.Is(err, store.ErrNotFound) {
		tm, err = s.CreateTeam(ctx, client.Team{Name: team, Limits: client.Limits{MaxSandboxes: 3, MaxConcurrentExec: 4}})
	}
	if err != nil {
		t.Fatal(err)
	}
	secret, prefix, hash := NewKey()
	k, err := s.InsertKey(ctx, store.Key{TeamID: tm.ID, Name: "k", Prefix: prefix, Hash: hash, Admin: admin})
	if err != nil {
		t.Fatal(err)
	}
	return secret, k, tm
}

func TestNewKey(t *testing.T) {
	seen := map[string]bool{}
	for range 200 {
		secret, prefix, hash := NewKey()
		if !wellFormed(secret) || len(secret) != KeyLen {
			t.Fatalf("malformed key %q", secret)
		}
		if !strings.HasPrefix(secret, prefix) || len(prefix) != displayLen {
			t.Fatalf("prefix %q of %q", prefix, secret)
		}
		if hash != HashKey(secret) || len(hash) != 64 || strings.Contains(hash, secret) {
			t.Fatalf("hash %q", hash)
		}
		if seen[secret] {
			t.Fatal("duplicate key")
		}
		seen[secret] = true
	}
	// The digits are spread over the whole alphabet, not stuck at one end.
	var all strings.Builder
	for s := range seen {
		all.WriteString(s[len(KeyPrefix):])
	}
	for _, c := range []string{"0", "Z", "a", "z"} {
		if !strings.Contains(all.String(), c) {
			t.Fatalf("digit %q never produced", c)
		}
	}
}

func TestParseBearer(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"Bearer eb_abc", "eb_abc"},
		{"bearer eb_abc", "eb_abc"},
		{"BEARER   eb_abc  ", "eb_abc"},
	} {
		got, err := ParseBearer(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseBearer(%q) = %q, %v", c.in, got, err)
		}
	}
	for _, in := range []string{"", "Bearer", "Bearer ", "Basic eb_abc", "eb_abc", "Bearer a b"} {
		if _, err := ParseBearer(in); !errors.Is(err, ErrUnauthorized) {
			t.Errorf("ParseBearer(%q) err = %v, want ErrUnauthorized", in, err)
		}
	}
}

func TestAuthenticate(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, t.TempDir())
	secret, k, tm := newTeamKey(t, s, "a", false)
	a := NewAuthenticator(s)

	p, err := a.Authenticate(ctx, "Bearer "+secret)
	want := Principal{TeamID: tm.ID, TeamName: "a", KeyID: k.ID, KeyName: k.Name, Limits: tm.Limits}
	if err != nil || p != want {
		t.Fatalf("Authenticate = %+v, %v; want %+v", p, err, want)
	}

	other, _, _ := NewKey()
	for name, h := range map[string]string{
		"missing":   "",
		"malformed": "Bearer eb_short",
		"unknown":   "Bearer " + other,
		"wrong":     "Bearer " + secret[:len(secret)-1] + "x",
		"no prefix": "Bearer " + "xx_" + secret[3:],
	} {
		if _, err := a.Authenticate(ctx, h); !errors.Is(err, ErrUnauthorized) {
			t.Errorf("%s key: err = %v, want ErrUnauthorized", name, err)
		}
	}

	// Admin flag comes through.
	adm, ak, _ := newTeamKey(t, s, "ops", true)
	if p, err := a.AuthenticateKey(ctx, adm); err != nil || !p.Admin || p.KeyID != ak.ID {
		t.Fatalf("admin key = %+v, %v", p, err)
	}

	// A store failure is not reported as ErrUnauthorized.
	s.Close()
	fresh := NewAuthenticator(s)
	if _, err := fresh.AuthenticateKey(ctx, secret); err == nil || errors.Is(err, ErrUnauthorized) {
		t.Fatalf("closed store: err = %v, want a non-auth error", err)
	}
}

func TestCacheAndRevocation(t *testing.T) {
	ctx := context.Background()
	cs := &countingStore{Store: openStore(t, t.TempDir())}
	secret, k, tm := newTeamKey(t, cs.Store, "a", false)
	secret2, _, _ := newTeamKey(t, cs.Store, "a", false)
	a := NewAuthenticator(cs)

	for range 10 {
		if _, err := a.AuthenticateKey(ctx, secret); err != nil {
			t.Fatal(err)
		}
	}
	if n := cs.lookups.Load(); n != 1 {
		t.Fatalf("10 authentications did %d lookups, want 1 (cached)", n)
	}

	// Revoked in the store: the cache still answers until invalidated.
	if _, err := cs.RevokeKey(ctx, tm.ID, k.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := a.AuthenticateKey(ctx, secret); err != nil {
		t.Fatalf("cached key before invalidation: %v", err)
	}
	a.Invalidate()
	if _, err := a.AuthenticateKey(ctx, secret); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("revoked key after Invalidate: %v, want ErrUnauthorized", err)
	}
	// Failures are not cached.
	before := cs.lookups.Load()
	a.AuthenticateKey(ctx, secret)
	if cs.lookups.Load() != before+1 {
		t.Fatal("a failed lookup was cached")
	}

	// Team limit changes show after Invalidate.
	if _, err := a.AuthenticateKey(ctx, secret2); err != nil {
		t.Fatal(err)
	}
	l := client.Limits{MaxSandboxes: 99, MaxConcurrentExec: 98}
	if _, err := cs.UpdateTeamLimits(ctx, tm.ID, l); err != nil {
		t.Fatal(err)
	}
	a.Invalidate()
	if p, err := a.AuthenticateKey(ctx, secret2); err != nil || p.Limits != l {
		t.Fatalf("after Invalidate = %+v, %v", p, err)
	}
}

func TestCacheExpiresAndIsBounded(t *testing.T) {
	ctx := context.Background()
	cs := &countingStore{Store: openStore(t, t.TempDir())}
	secret, k, tm := newTeamKey(t, cs.Store, "a", false)
	a := NewAuthenticator(cs)
	a.ttl, a.size = 50*time.Millisecond, 3
	if _, err := a.AuthenticateKey(ctx, secret); err != nil {
		t.Fatal(err)
	}
	// Revoked without invalidation: effective once the TTL passes.
	if _, err := cs.RevokeKey(ctx, tm.ID, k.ID); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := a.AuthenticateKey(ctx, secret)
		if errors.Is(err, ErrUnauthorized) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("revoked key still accepted long after the cache TTL")
		}
		time.Sleep(10 * time.Millisecond)
	}

	for range 10 {
		s, _, _ := newTeamKey(t, cs.Store, "a", false)
		if _, err := a.AuthenticateKey(ctx, s); err != nil {
			t.Fatal(err)
		}
		a.mu.RLock()
		n := len(a.cache)
		a.mu.RUnlock()
		if n > 3 {
			t.Fatalf("cache grew to %d entries, bound is 3", n)
		}
	}
}

// A key revoked and invalidated while its lookup is in flight must not be
// put back into the cache by that lookup.
func TestInvalidateDuringLookup(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, t.TempDir())
	secret, k, tm := newTeamKey(t, s, "a", false)
	bs := &blockingStore{Store: s, entered: make(chan struct{}), proceed: make(chan struct{})}
	a := NewAuthenticator(bs)

	var wg sync.WaitGroup
	wg.Go(func() {
		if _, err := a.AuthenticateKey(ctx, secret); err != nil {
			t.Errorf("in-flight lookup: %v", err)
		}
	})
	<-bs.entered // the lookup has read the (still valid) key
	if _, err := s.RevokeKey(ctx, tm.ID, k.ID); err != nil {
		t.Fatal(err)
	}
	a.Invalidate()
	close(bs.proceed)
	wg.Wait()
	if _, err := a.AuthenticateKey(ctx, secret); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("revoked key re-cached by an in-flight lookup: %v", err)
	}
}

// blockingStore holds the first KeyByHash, after the real lookup, until
// told to proceed.
type blockingStore struct {
	*store.Store
	once             sync.Once
	entered, proceed chan struct{}
}

func (b *blockingStore) KeyByHash(ctx context.Context, hash string) (store.Key, client.Team, error) {
	k, t, err := b.Store.KeyByHash(ctx, hash)
	b.once.Do(func() {
		close(b.entered)
		<-b.proceed
	})
	return k, t, err
}

func TestEnsureAdmin(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openStore(t, dir)
	limits := client.Limits{MaxSandboxes: 10, MaxConcurrentExec: 20}

	created, err := EnsureAdmin(ctx, s, dir, limits)
	if err != nil || !created {
		t.Fatalf("first EnsureAdmin = %v, %v", created, err)
	}
	path := filepath.Join(dir, AdminKeyFile)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("admin.key mode = %v, want 0600", fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	secret := strings.TrimSpace(string(b))
	a := NewAuthenticator(s)
	p, err := a.AuthenticateKey(ctx, secret)
	if err != nil || !p.Admin || p.TeamName != AdminTeam || p.Limits != limits {
		t.Fatalf("admin principal = %+v, %v", p, err)
	}
	// No temp files are left behind.
	if ents, _ := os.ReadDir(dir); len(ents) != 4 { // state.db, -wal, -shm, admin.key
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Fatalf("data dir holds %v", names)
	}

	// Restart: the existing key is reused.
	s.Close()
	s = openStore(t, dir)
	created, err = EnsureAdmin(ctx, s, dir, limits)
	if err != nil || created {
		t.Fatalf("second EnsureAdmin = %v, %v; want false", created, err)
	}
	if b2, _ := os.ReadFile(path); string(b2) != string(b) {
		t.Fatal("admin.key rewritten on restart")
	}
	keys, err := s.ListKeys(ctx, "")
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys after restart = %+v, %v", keys, err)
	}

	// Revoked admin key: a new one replaces it in the same team.
	if _, err := s.RevokeKey(ctx, p.TeamID, p.KeyID); err != nil {
		t.Fatal(err)
	}
	created, err = EnsureAdmin(ctx, s, dir, limits)
	if err != nil || !created {
		t.Fatalf("EnsureAdmin after revoke = %v, %v", created, err)
	}
	b3, _ := os.ReadFile(path)
	p3, err := NewAuthenticator(s).AuthenticateKey(ctx, strings.TrimSpace(string(b3)))
	if err != nil || !p3.Admin || p3.TeamID != p.TeamID || p3.KeyID == p.KeyID {
		t.Fatalf("replacement admin = %+v, %v", p3, err)
	}
	if teams, err := s.ListTeams(ctx); err != nil || len(teams) != 1 {
		t.Fatalf("teams = %+v, %v; want just admin", teams, err)
	}

	// A non-admin key in the file does not count.
	plain, _, _ := newTeamKey(t, s, "users", false)
	if err := os.WriteFile(path, []byte(plain), 0o600); err != nil {
		t.Fatal(err)
	}
	if created, err := EnsureAdmin(ctx, s, dir, limits); err != nil || !created {
		t.Fatalf("EnsureAdmin with a non-admin key in the file = %v, %v", created, err)
	}
}

// lateStore is a store whose admin team another server creates just after
// this one looked for it, as when two servers on one database start at
// once.
type lateStore struct {
	*store.Store
	once sync.Once
}

func (l *lateStore) GetTeamByName(ctx context.Context, name string) (client.Team, error) {
	first := false
	l.once.Do(func() { first = true })
	if !first {
		return l.Store.GetTeamByName(ctx, name)
	}
	if _, err := l.Store.CreateTeam(ctx, client.Team{Name: name}); err != nil {
		return client.Team{}, err
	}
	return client.Team{}, store.ErrNotFound
}

// TestEnsureAdminRacingServer: a server that loses the race to create the
// admin team uses the winner's.
func TestEnsureAdminRacingServer(t *testing.T) {
	dir := t.TempDir()
	s := &lateStore{Store: openStore(t, dir)}
	created, err := EnsureAdmin(t.Context(), s, dir, client.Limits{MaxSandboxes: 1, MaxConcurrentExec: 1})
	if err != nil || !created {
		t.Fatalf("EnsureAdmin = %v, %v", created, err)
	}
	teams, err := s.ListTeams(t.Context())
	if err != nil || len(teams) != 1 || teams[0].Name != AdminTeam {
		t.Fatalf("teams %+v, %v", teams, err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, AdminKeyFile))
	if p, err := NewAuthenticator(s).AuthenticateKey(t.Context(), strings.TrimSpace(string(b))); err != nil || !p.Admin || p.TeamID != teams[0].ID {
		t.Fatalf("admin principal = %+v, %v", p, err)
	}
}
