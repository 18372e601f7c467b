package api

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/internal/limits"
	"github.com/evalbox/evalbox/pkg/client"
)

// Request rate limits (docs/limits.md): token buckets, per team and per
// key, in this replica's memory, applied by observedAuth once a request is
// authenticated, whichever API it came through. They bound how fast a team
// calls the control plane, not what it runs: the active-sandbox and
// concurrent-exec limits stay the sandbox service's (too_many_sandboxes,
// rate_limited after exec-wait). Behind N replicas a team gets up to N
// times its rate: the buckets are not shared (SECURITY.md).
//
// Exempt: admin keys (the operator's: an admin whose own team is flooded
// must still be able to raise its limits), and port URLs (a sandbox's own
// traffic, which its traffic token reaches unbounded too).

// RateLimits are the server's request rates, per minute (`evalbox serve
// --rate-limit-*`). A team whose own limit (client.Limits) is 0 has the
// server's; 0 here is no limit.
type RateLimits struct {
	// RequestsPerMinute bounds a team's authenticated requests, all its
	// keys together; CreatesPerMinute, its creates (isCreate), which also
	// count as requests.
	RequestsPerMinute int
	CreatesPerMinute  int
	// KeyRequestsPerMinute bounds one key's requests within its team's
	// (0: only the team's).
	KeyRequestsPerMinute int
}

// createRoutes are the mux patterns of creates: what starts a sandbox
// that outlives the request, or an eval run. /v1/execute and
// SandboxFusion's run_code are not: their sandbox lives for the request,
// bounded by the concurrent-exec limit, and code-verification loops call
// them hundreds of times a second.
var createRoutes = map[string]bool{
	"POST /v1/sandboxes":             true,
	"POST /v1/sandboxes/{id}/fork":   true,
	"POST /v1/sandboxes/{id}/resume": true,
	"POST /v1/evals":                 true,
	// E2B's (internal/compat/e2b).
	"POST /v2/sandboxes":          true,
	"POST /sandboxes/{id}/fork":   true,
	"POST /sandboxes/{id}/resume": true,
}

// routeOf is the mux pattern of the request being served ("" outside
// ServeHTTP, or not routed by the mux: the host form of a port URL). The
// mux sets it on the request it passes its handler, the same
// *http.Request as requestInfo.req, before the handler authenticates.
func routeOf(ctx context.Context) (string, bool) {
	ri := infoOf(ctx)
	if ri == nil || ri.req == nil {
		return "", false
	}
	return ri.req.Pattern, true
}

// isPortRoute reports whether a route serves a sandbox port.
func isPortRoute(pattern string) bool {
	return pattern == "" || strings.Contains(pattern, "/ports/{port}")
}

// rateLimit refuses a request of p past its rate limits: 429 rate_limited
// with the seconds after which it would pass.
func (s *Server) rateLimit(ctx context.Context, p auth.Principal) error {
	if s.limiter == nil || p.Admin {
		return nil
	}
	create := false
	if route, ok := routeOf(ctx); ok {
		if isPortRoute(route) {
			return nil
		}
		create = createRoutes[route]
	}
	return s.limiter.allow(p, create)
}

// rateLimited applies the rate limits to the principals of resolve (the
// keyless SandboxFusion team's, which no Authenticate resolves).
func (s *Server) rateLimited(resolve func(context.Context) (auth.Principal, error)) func(context.Context) (auth.Principal, error) {
	if resolve == nil {
		return nil
	}
	return func(ctx context.Context) (auth.Principal, error) {
		p, err := resolve(ctx)
		if err != nil {
			return p, err
		}
		if err := s.rateLimit(ctx, p); err != nil {
			return auth.Principal{}, err
		}
		return p, nil
	}
}

// rateLimiter holds the buckets. One mutex over all of them keeps a
// request's takes from its team's and its key's buckets together: taken
// from all, or from none.
type rateLimiter struct {
	cfg RateLimits
	now func() time.Time

	mu        sync.Mutex
	buckets   map[bucketKey]*bucket
	lastSweep time.Time
}

// bucketKey names a bucket: a team's requests or creates, or a key's
// requests.
type bucketKey struct {
	kind string // "team", "create" or "key"
	id   string
}

type bucket struct {
	lim       *rate.Limiter
	perMinute int
}

// sweepEvery is how often full buckets are dropped; maxBuckets, how many
// buckets prompt a sweep at once. Buckets are made for authenticated keys
// and teams only, so there are at most as many as live keys and teams.
const (
	sweepEvery = time.Minute
	maxBuckets = 1 << 16
)

func newRateLimiter(cfg RateLimits, now func() time.Time) *rateLimiter {
	if now == nil {
		now = time.Now
	}
	return &rateLimiter{cfg: cfg, now: now, buckets: make(map[bucketKey]*bucket), lastSweep: now()}
}

// allow takes a token from each bucket of p's request (a create's also
// from its team's create bucket), or, when one has none, from none of
// them and answers when the request would pass.
func (l *rateLimiter) allow(p auth.Principal, create bool) error {
	reqs := cmp.Or(p.Limits.RequestsPerMinute, l.cfg.RequestsPerMinute)
	creates := cmp.Or(p.Limits.CreatesPerMinute, l.cfg.CreatesPerMinute)
	keyReqs := l.cfg.KeyRequestsPerMinute
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	l.sweep(now)
	type take struct {
		key       bucketKey
		perMinute int
		what      string
	}
	takes := []take{{bucketKey{"team", p.TeamID}, reqs, fmt.Sprintf("team %s is over its %d requests per minute", p.TeamName, reqs)}}
	if keyReqs > 0 && p.KeyID != "" && (reqs <= 0 || keyReqs < reqs) {
		takes = append(takes, take{bucketKey{"key", p.KeyID}, keyReqs, fmt.Sprintf("API key %s is over its %d requests per minute", p.KeyID, keyReqs)})
	}
	if create {
		takes = append(takes, take{bucketKey{"create", p.TeamID}, creates, fmt.Sprintf("team %s is over its %d creates per minute", p.TeamName, creates)})
	}
	var (
		taken []*rate.Reservation
		wait  time.Duration
		why   string
	)
	for _, t := range takes {
		if t.perMinute <= 0 {
			continue
		}
		// The burst is at least 1: a reservation of 1 is always OK.
		r := l.bucket(t.key, t.perMinute, now).lim.ReserveN(now, 1)
		if d := r.DelayFrom(now); d > 0 {
			r.CancelAt(now)
			if d > wait {
				wait, why = d, t.what
			}
			continue
		}
		taken = append(taken, r)
	}
	if wait == 0 {
		return nil
	}
	for _, r := range taken {
		r.CancelAt(now)
	}
	secs := retryAfterSeconds(wait)
	return &apierr.Error{Code: client.CodeRateLimited, RetryAfter: secs,
		Message: fmt.Sprintf("%s (on this server); retry after %d s", why, secs)}
}

// retryAfterSeconds is a Retry-After for a wait: whole seconds, rounded
// up, at least 1.
func retryAfterSeconds(d time.Duration) int {
	return max(1, int(math.Ceil(d.Seconds())))
}

// bucket returns the bucket of k at perMinute (made full, or re-rated when
// its limit changed). Called with l.mu held.
func (l *rateLimiter) bucket(k bucketKey, perMinute int, now time.Time) *bucket {
	b := l.buckets[k]
	if b == nil {
		b = &bucket{lim: rate.NewLimiter(perSecond(perMinute), limits.Burst(perMinute)), perMinute: perMinute}
		l.buckets[k] = b
	} else if b.perMinute != perMinute {
		b.lim.SetLimitAt(now, perSecond(perMinute))
		b.lim.SetBurstAt(now, limits.Burst(perMinute))
		b.perMinute = perMinute
	}
	return b
}

// sweep drops the buckets that are full again: a new one would be the
// same. Called with l.mu held.
func (l *rateLimiter) sweep(now time.Time) {
	if now.Sub(l.lastSweep) < sweepEvery && len(l.buckets) < maxBuckets {
		return
	}
	l.lastSweep = now
	for k, b := range l.buckets {
		if b.lim.TokensAt(now) >= float64(b.lim.Burst()) {
			delete(l.buckets, k)
		}
	}
}

// size is how many buckets are held (tests).
func (l *rateLimiter) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}

func perSecond(perMinute int) rate.Limit { return rate.Limit(float64(perMinute) / 60) }
