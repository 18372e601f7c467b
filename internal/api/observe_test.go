package api

import (
	"context"
	"errors"
	"go/ast"
	"go/constant"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/pkg/client"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// auditActionConsts returns pkg/client's AuditAction* constants.
func auditActionConsts(t *testing.T) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join("..", "..", "pkg", "client", "types.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok {
			return true
		}
		for i, name := range vs.Names {
			if i >= len(vs.Values) {
				break
			}
			if lit, ok := vs.Values[i].(*ast.BasicLit); ok && strings.HasPrefix(name.Name, "AuditAction") {
				out[name.Name] = constant.StringVal(constant.MakeFromLiteral(lit.Value, lit.Kind, 0))
			}
		}
		return true
	})
	return out
}

// TestAuditActions: every line of the table is a route the server serves,
// every action is one AuditAction* constant and each names one route.
func TestAuditActions(t *testing.T) {
	s := New(Config{})
	consts := auditActionConsts(t)
	if len(consts) == 0 {
		t.Fatal("no AuditAction constants in pkg/client/types.go")
	}
	used := map[string]string{}
	for pattern, action := range auditActions {
		method, path, _ := strings.Cut(pattern, " ")
		// A request of the pattern, its wildcards filled in.
		var segs []string
		for _, seg := range strings.Split(path, "/") {
			if strings.HasPrefix(seg, "{") {
				seg = "x1"
			}
			segs = append(segs, seg)
		}
		r := httptest.NewRequest(method, strings.Join(segs, "/"), nil)
		if _, got := s.mux.Handler(r); got != pattern {
			t.Errorf("%s: the mux routes it to %q", pattern, got)
		}
		if prev, ok := used[action]; ok {
			t.Errorf("action %s names %s and %s", action, prev, pattern)
		}
		used[action] = pattern
	}
	for name, v := range consts {
		if _, ok := used[v]; !ok {
			t.Errorf("%s (%s) is no route's action", name, v)
		}
	}
	for v, pattern := range used {
		found := false
		for _, c := range consts {
			found = found || c == v
		}
		if !found {
			t.Errorf("%s: action %s is not an AuditAction constant", pattern, v)
		}
	}
}

// TestEveryChangeIsClassified: every POST, PUT, PATCH and DELETE route of
// the server's mux (evalbox's, E2B's and SandboxFusion's, as their
// sources register them) is audited or left out on purpose (notAudited),
// so that a new route decides.
func TestEveryChangeIsClassified(t *testing.T) {
	route := regexp.MustCompile(`HandleFunc\("((?:POST|PUT|PATCH|DELETE) [^"]+)"`)
	n := 0
	for _, f := range []string{"api.go", "../compat/e2b/e2b.go", "../compat/e2b/templates.go", "../compat/sandboxfusion/sandboxfusion.go"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range route.FindAllSubmatch(b, -1) {
			n++
			p := string(m[1])
			_, audited := auditActions[p]
			switch {
			case audited && notAudited[p]:
				t.Errorf("%s: in auditActions and notAudited", p)
			case !audited && !notAudited[p]:
				t.Errorf("%s (%s): add it to auditActions (with an AuditAction constant and the spec's enum) or to notAudited", p, f)
			}
		}
	}
	if n < 40 {
		t.Errorf("only %d routes found: the pattern no longer matches the sources", n)
	}
	for p := range notAudited {
		method, path, _ := strings.Cut(p, " ")
		r := httptest.NewRequest(method, strings.ReplaceAll(strings.ReplaceAll(path, "{id}", "x1"), "{pid}", "p1"), nil)
		if _, got := New(Config{}).mux.Handler(r); got != p {
			t.Errorf("notAudited %s: the mux routes it to %q", p, got)
		}
	}
}

// fakeAuth knows two keys: "admin" and "user".
type fakeAuth struct{}

func (fakeAuth) Authenticate(_ context.Context, header string) (auth.Principal, error) {
	switch header {
	case "Bearer admin":
		return auth.Principal{TeamID: "team_admin", KeyID: "key_admin", KeyName: "root", Admin: true}, nil
	case "Bearer user":
		return auth.Principal{TeamID: "team_u", KeyID: "key_u", KeyName: "ci"}, nil
	}
	return auth.Principal{}, auth.ErrUnauthorized
}

func (fakeAuth) Invalidate() {}

// memAudit is an audit log in memory.
type memAudit struct {
	mu   sync.Mutex
	rows []client.AuditEvent
	fail bool
}

func (m *memAudit) InsertAudit(_ context.Context, e client.AuditEvent) (client.AuditEvent, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail {
		return e, errors.New("disk full")
	}
	m.rows = append(m.rows, e)
	return e, nil
}

func (m *memAudit) ListAudit(_ context.Context, f store.AuditFilter) ([]client.AuditEvent, string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if f.Cursor == "bad" {
		return nil, "", store.ErrBadCursor
	}
	var out []client.AuditEvent
	for _, e := range slices.Backward(m.rows) {
		if f.TeamID == "" || e.TeamID == f.TeamID {
			out = append(out, e)
		}
	}
	return out, "", nil
}

func newObservedServer(t *testing.T) (*Server, *prometheus.Registry, *memAudit) {
	t.Helper()
	reg := prometheus.NewRegistry()
	log := &memAudit{}
	s := New(Config{Auth: fakeAuth{}, Metrics: reg, Audit: log})
	return s, reg, log
}

func call(s *Server, method, path, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, strings.NewReader(`{"name":"k1","secret":"s3cr3t-value"}`))
	r.RemoteAddr = "192.0.2.7:4567"
	if key != "" {
		r.Header.Set("Authorization", "Bearer "+key)
	}
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	return w
}

// TestAuditRecords: refusals of authenticated callers are recorded with
// their code, unauthenticated requests and reads are not, and no body.
func TestAuditRecords(t *testing.T) {
	s, _, log := newObservedServer(t)
	// A user's team creation: refused (admin only), recorded.
	if w := call(s, "POST", "/v1/teams", "user"); w.Code != http.StatusForbidden {
		t.Fatalf("team create by a user: %d %s", w.Code, w.Body)
	}
	// Without a key, or a read: nothing.
	if w := call(s, "POST", "/v1/teams", ""); w.Code != http.StatusUnauthorized {
		t.Fatalf("team create without a key: %d", w.Code)
	}
	if w := call(s, "GET", "/v1/audit", "admin"); w.Code != http.StatusOK {
		t.Fatalf("audit list: %d %s", w.Code, w.Body)
	}
	// A key revocation by a path id (refused: the key is the caller's).
	if w := call(s, "DELETE", "/v1/keys/key_u", "user"); w.Code != http.StatusConflict {
		t.Fatalf("self revoke: %d %s", w.Code, w.Body)
	}
	want := []client.AuditEvent{
		{TeamID: "team_u", KeyID: "key_u", KeyName: "ci", RemoteAddr: "192.0.2.7", Action: client.AuditActionTeamCreate,
			Status: http.StatusForbidden, Code: client.CodeForbidden},
		{TeamID: "team_u", KeyID: "key_u", KeyName: "ci", RemoteAddr: "192.0.2.7", Action: client.AuditActionKeyRevoke,
			Target: "key_u", Status: http.StatusConflict, Code: client.CodeConflict},
	}
	if !slices.Equal(log.rows, want) {
		t.Errorf("rows:\n%+v\nwant\n%+v", log.rows, want)
	}
	for _, e := range log.rows {
		if strings.Contains(e.Target+e.Action+e.KeyName, "s3cr3t") {
			t.Errorf("a body value in a row: %+v", e)
		}
	}
	// A failing audit log fails no request.
	log.fail = true
	if w := call(s, "POST", "/v1/teams", "user"); w.Code != http.StatusForbidden {
		t.Fatalf("with the audit log failing: %d", w.Code)
	}
}

func TestAuditList(t *testing.T) {
	s, _, _ := newObservedServer(t)
	call(s, "POST", "/v1/teams", "user")
	if w := call(s, "GET", "/v1/audit", "user"); w.Code != http.StatusForbidden || w.Header().Get(client.HeaderError) != client.CodeForbidden {
		t.Errorf("a user's list: %d %s", w.Code, w.Body)
	}
	for _, q := range []string{"since=yesterday", "until=1", "limit=0", "limit=1001", "limit=x", "team=a&team=b", "colour=red",
		"since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z", "cursor=bad"} {
		if w := call(s, "GET", "/v1/audit?"+q, "admin"); w.Code != http.StatusBadRequest || w.Header().Get(client.HeaderError) != client.CodeBadRequest {
			t.Errorf("%s: %d %s", q, w.Code, w.Body)
		}
	}
	w := call(s, "GET", "/v1/audit?team=team_u&since=2026-01-02T00:00:00Z&limit=10", "admin")
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"action":"team.create"`) {
		t.Errorf("list: %d %s", w.Code, w.Body)
	}
}

// TestRequestMetrics: requests are counted by route pattern (no ids),
// errors by code; /metrics needs an admin key.
func TestRequestMetrics(t *testing.T) {
	s, reg, _ := newObservedServer(t)
	call(s, "POST", "/v1/teams", "user")
	call(s, "POST", "/v1/teams", "user")
	call(s, "GET", "/v1/teams/team_123", "")
	call(s, "GET", "/no/such/path", "user")
	if got := testutil.ToFloat64(s.metrics.requests.WithLabelValues("/v1/teams", "POST", "403")); got != 2 {
		t.Errorf("POST /v1/teams 403: %v", got)
	}
	if got := testutil.ToFloat64(s.metrics.requests.WithLabelValues("/v1/teams/{id}", "GET", "401")); got != 1 {
		t.Errorf("GET /v1/teams/{id} 401: %v", got)
	}
	if got := testutil.ToFloat64(s.metrics.errors.WithLabelValues(client.CodeForbidden)); got != 2 {
		t.Errorf("forbidden errors: %v", got)
	}
	if got := testutil.ToFloat64(s.metrics.errors.WithLabelValues(client.CodeNotFound)); got != 1 {
		t.Errorf("not_found errors: %v", got)
	}
	if n := testutil.CollectAndCount(s.metrics.duration); n != 3 {
		t.Errorf("%d duration series, want 3", n)
	}
	for key, want := range map[string]int{"": http.StatusUnauthorized, "user": http.StatusForbidden, "admin": http.StatusOK} {
		w := call(s, "GET", "/metrics", key)
		if w.Code != want {
			t.Errorf("/metrics with key %q: %d, want %d", key, w.Code, want)
		}
		if want == http.StatusOK && !strings.Contains(w.Body.String(), `evalbox_http_requests_total{method="POST",route="/v1/teams",status="403"} 2`) {
			t.Errorf("/metrics:\n%s", w.Body)
		}
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %+v", err, problems)
	}
}
