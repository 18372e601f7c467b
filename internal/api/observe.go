package api

import (
	"context"
	"net/http"
	"time"

	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/internal/compat/e2b"
	"github.com/evalbox/evalbox/pkg/client"
)

// What every request passes through, whichever API serves it (evalbox's
// /v1, E2B's, SandboxFusion's): ServeHTTP gives the request a requestInfo,
// the Authenticator wrapper (observedAuth) fills in who it is and applies
// the rate limits (ratelimit.go), and after the handler the request is
// counted (metrics.go) and, when it changes something, audited (audit.go).

// requestInfo is what is learnt about a request while it is served.
type requestInfo struct {
	// req is the request being served (its Pattern is set once the mux
	// has routed it).
	req *http.Request
	// principal is the caller, once authenticated (authed).
	principal auth.Principal
	authed    bool
	// target names what the request made, when its path does not (the id
	// of a created sandbox): set by the handler through setTarget.
	target string
}

type requestInfoKey struct{}

// infoOf returns the request's requestInfo (nil outside ServeHTTP).
func infoOf(ctx context.Context) *requestInfo {
	ri, _ := ctx.Value(requestInfoKey{}).(*requestInfo)
	return ri
}

// setTarget records what a request made (its audit target).
func setTarget(ctx context.Context, target string) {
	if ri := infoOf(ctx); ri != nil {
		ri.target = target
	}
}

// observedAuth is the Authenticator every API of the server uses: it
// records the principal in the request's requestInfo and applies the rate
// limits to it.
type observedAuth struct {
	Authenticator
	s *Server
}

func (a observedAuth) Authenticate(ctx context.Context, header string) (auth.Principal, error) {
	p, err := a.Authenticator.Authenticate(ctx, header)
	if err != nil {
		return p, err
	}
	if ri := infoOf(ctx); ri != nil {
		ri.principal, ri.authed = p, true
	}
	if err := a.s.rateLimit(ctx, p); err != nil {
		return auth.Principal{}, err
	}
	return p, nil
}

// observe runs after every request: metrics, then the audit log.
func (s *Server) observe(r *http.Request, rw *statusWriter, ri *requestInfo, took time.Duration) {
	code := rw.Header().Get(client.HeaderError)
	route := routeLabel(r)
	if r.Pattern == "" {
		// Routed before the mux (ServeHTTP): by header or by host.
		if e2b.IsSandboxRequest(r) {
			route = routeSandboxTraffic
		} else if _, _, ok := s.portHost(r.Host); ok {
			route = routePortHost
		}
	}
	s.countRequest(r, route, rw.status, code, took)
	s.audit(r, ri, rw.status, code)
}
