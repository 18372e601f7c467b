package api

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/pkg/client"
)

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newTestLimiter(cfg RateLimits) (*rateLimiter, *fakeClock) {
	c := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	return newRateLimiter(cfg, c.now), c
}

// refused checks err is rate_limited with a Retry-After of want seconds.
func refused(t *testing.T, err error, want int) {
	t.Helper()
	var ae *apierr.Error
	if !errors.As(err, &ae) || ae.Code != client.CodeRateLimited || ae.RetryAfter != want {
		t.Fatalf("err = %#v, want rate_limited with Retry-After %d", err, want)
	}
}

// burstOf takes requests of p until one is refused, and returns how many
// passed.
func burstOf(t *testing.T, l *rateLimiter, p auth.Principal, create bool) int {
	t.Helper()
	for n := 0; n < 100000; n++ {
		if err := l.allow(p, create); err != nil {
			return n
		}
	}
	t.Fatal("never refused")
	return 0
}

func TestRateLimitBucket(t *testing.T) {
	l, clock := newTestLimiter(RateLimits{RequestsPerMinute: 60})
	a := auth.Principal{TeamID: "team_a", TeamName: "a", KeyID: "key_a1"}
	// 60 a minute: a burst of 10 (10 s' worth), then one a second.
	if n := burstOf(t, l, a, false); n != 10 {
		t.Fatalf("burst = %d, want 10", n)
	}
	refused(t, l.allow(a, false), 1)
	clock.add(500 * time.Millisecond)
	refused(t, l.allow(a, false), 1) // 0.5 s left: rounded up
	clock.add(500 * time.Millisecond)
	if err := l.allow(a, false); err != nil {
		t.Fatalf("after Retry-After: %v", err)
	}
	refused(t, l.allow(a, false), 1)

	// Another team has its own bucket; a second key of team a shares a's.
	b := auth.Principal{TeamID: "team_b", TeamName: "b", KeyID: "key_b"}
	if n := burstOf(t, l, b, false); n != 10 {
		t.Fatalf("team b's burst = %d, want 10", n)
	}
	a2 := a
	a2.KeyID = "key_a2"
	refused(t, l.allow(a2, false), 1)

	// A refused request takes nothing: waiting out its Retry-After is
	// enough however many were refused.
	for range 50 {
		refused(t, l.allow(a, false), 1)
	}
	clock.add(time.Second)
	if err := l.allow(a, false); err != nil {
		t.Fatalf("refusals took tokens: %v", err)
	}

	// A slow rate: its Retry-After is the whole wait, rounded up.
	slow := auth.Principal{TeamID: "team_s", TeamName: "s", Limits: client.Limits{RequestsPerMinute: 4}}
	if n := burstOf(t, l, slow, false); n != 1 {
		t.Fatalf("burst of 4/min = %d, want 1", n)
	}
	refused(t, l.allow(slow, false), 15)
}

func TestRateLimitTeamLimitsAndChanges(t *testing.T) {
	l, clock := newTestLimiter(RateLimits{RequestsPerMinute: 60})
	// The team's own limit wins over the server's.
	p := auth.Principal{TeamID: "team_a", KeyID: "k", Limits: client.Limits{RequestsPerMinute: 600}}
	if n := burstOf(t, l, p, false); n != 100 {
		t.Fatalf("burst = %d, want 100", n)
	}
	// Lowered (PATCH /v1/teams/{id}): the bucket takes the new rate.
	p.Limits.RequestsPerMinute = 6
	clock.add(time.Minute)
	if n := burstOf(t, l, p, false); n != 1 {
		t.Fatalf("burst after lowering = %d, want 1", n)
	}
	refused(t, l.allow(p, false), 10)

	// No server limit and none of the team's: no limit.
	free, _ := newTestLimiter(RateLimits{})
	for range 10000 {
		if err := free.allow(auth.Principal{TeamID: "t", KeyID: "k"}, true); err != nil {
			t.Fatal(err)
		}
	}
	if free.size() != 0 {
		t.Fatalf("%d buckets kept without limits", free.size())
	}
}

func TestRateLimitCreates(t *testing.T) {
	l, clock := newTestLimiter(RateLimits{RequestsPerMinute: 600, CreatesPerMinute: 12})
	p := auth.Principal{TeamID: "team_a", KeyID: "k"}
	// 12 creates a minute: a burst of 2, then one every 5 s.
	if n := burstOf(t, l, p, true); n != 2 {
		t.Fatalf("create burst = %d, want 2", n)
	}
	refused(t, l.allow(p, true), 5)
	// Other requests still pass: the create bucket is apart, and a
	// refused create took no request token.
	if n := burstOf(t, l, p, false); n != 98 {
		t.Fatalf("requests after the creates = %d, want 98 (100 less the 2 creates)", n)
	}
	// Out of request tokens, a create is refused for them (and takes no
	// create token): after 5 s both buckets have room.
	clock.add(5 * time.Second)
	if err := l.allow(p, true); err != nil {
		t.Fatal(err)
	}
}

func TestRateLimitPerKey(t *testing.T) {
	l, _ := newTestLimiter(RateLimits{RequestsPerMinute: 600, KeyRequestsPerMinute: 60})
	k1 := auth.Principal{TeamID: "team_a", KeyID: "k1"}
	k2 := auth.Principal{TeamID: "team_a", KeyID: "k2"}
	if n := burstOf(t, l, k1, false); n != 10 {
		t.Fatalf("key burst = %d, want 10", n)
	}
	// The team's bucket still has room for another key of it.
	if n := burstOf(t, l, k2, false); n != 10 {
		t.Fatalf("second key's burst = %d, want 10", n)
	}
	// A refused key took nothing from the team: 80 of 100 remain.
	k3 := auth.Principal{TeamID: "team_a", KeyID: "k3"}
	for range 8 {
		if n := burstOf(t, l, k3, false); n != 10 {
			t.Fatalf("key burst = %d", n)
		}
		k3.KeyID += "x"
	}
	refused(t, l.allow(k3, false), 1)
}

func TestRateLimitEvictsFullBuckets(t *testing.T) {
	l, clock := newTestLimiter(RateLimits{RequestsPerMinute: 60})
	for i := range 1000 {
		_ = l.allow(auth.Principal{TeamID: "team_" + strconv.Itoa(i), KeyID: "k"}, false)
	}
	if l.size() != 1000 {
		t.Fatalf("%d buckets, want 1000", l.size())
	}
	// A bucket in use is kept (it is not full yet); full ones go.
	busy := auth.Principal{TeamID: "busy", KeyID: "k"}
	clock.add(sweepEvery)
	burstOf(t, l, busy, false)
	if l.size() != 1 {
		t.Fatalf("%d buckets after a sweep, want 1 (the busy one)", l.size())
	}
	refused(t, l.allow(busy, false), 1)
}

func TestRateLimitRoutes(t *testing.T) {
	s := &Server{limiter: newRateLimiter(RateLimits{RequestsPerMinute: 6, CreatesPerMinute: 6}, nil)}
	var seen []string
	mux := http.NewServeMux()
	handle := func(pattern string) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			// As a handler authenticates: the mux set the pattern on the
			// request of ServeHTTP's requestInfo.
			route, _ := routeOf(r.Context())
			seen = append(seen, route)
			p := auth.Principal{TeamID: "t", KeyID: "k", Admin: r.Header.Get("Admin") != ""}
			if err := s.rateLimit(r.Context(), p); err != nil {
				writeError(w, err)
			}
		})
	}
	for _, p := range []string{"POST /v1/sandboxes", "GET /v1/sandboxes", "/v1/sandboxes/{id}/ports/{port}/{path...}"} {
		handle(p)
	}
	do := func(method, path string, admin bool) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, path, nil)
		if admin {
			r.Header.Set("Admin", "1")
		}
		ri := &requestInfo{}
		r = r.WithContext(context.WithValue(r.Context(), requestInfoKey{}, ri))
		ri.req = r
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		return w
	}
	// A burst of 1 create: the second is refused, with Retry-After.
	if w := do("POST", "/v1/sandboxes", false); w.Code != 200 {
		t.Fatalf("first create: %d", w.Code)
	}
	w := do("POST", "/v1/sandboxes", false)
	if w.Code != 429 || w.Header().Get("Retry-After") != "10" || w.Header().Get(client.HeaderError) != client.CodeRateLimited {
		t.Fatalf("second create: %d %v %s", w.Code, w.Header(), w.Body)
	}
	if seen[0] != "POST /v1/sandboxes" {
		t.Fatalf("route at auth time = %q", seen[0])
	}
	// The request bucket (burst 1) is spent by the create: a list is
	// refused; port traffic and admin keys are exempt.
	if w := do("GET", "/v1/sandboxes", false); w.Code != 429 {
		t.Fatalf("list: %d", w.Code)
	}
	for range 5 {
		if w := do("GET", "/v1/sandboxes/sb-1/ports/8080/x", false); w.Code != 200 {
			t.Fatalf("port: %d", w.Code)
		}
		if w := do("POST", "/v1/sandboxes", true); w.Code != 200 {
			t.Fatalf("admin create: %d", w.Code)
		}
	}
}
