// Package api serves the REST API under /v1 (api/openapi.yaml is its
// contract): it authenticates the caller, validates input at the edge, and
// maps requests onto the sandbox service, the store (teams, keys) and the
// template catalog. Errors are always {"error":{"code","message"}}.
package api

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/internal/catalog"
	"github.com/evalbox/evalbox/internal/compat/e2b"
	"github.com/evalbox/evalbox/internal/compat/sandboxfusion"
	"github.com/evalbox/evalbox/internal/evalrun"
	"github.com/evalbox/evalbox/internal/meter"
	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/internal/outbuf"
	"github.com/evalbox/evalbox/internal/quota"
	"github.com/evalbox/evalbox/internal/sandbox"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/internal/trial"
	"github.com/evalbox/evalbox/pkg/client"
	"github.com/prometheus/client_golang/prometheus"
)

// Version is the server version reported by /v1/health.
var Version = "dev"

// Authenticator resolves a bearer header to a principal.
type Authenticator interface {
	Authenticate(ctx context.Context, header string) (auth.Principal, error)
	Invalidate()
}

// Store is what the API needs of the state store directly (teams, keys).
type Store interface {
	CreateTeam(ctx context.Context, t client.Team) (client.Team, error)
	GetTeam(ctx context.Context, id string) (client.Team, error)
	ListTeams(ctx context.Context) ([]client.Team, error)
	UpdateTeamLimits(ctx context.Context, id string, l client.Limits) (client.Team, error)
	InsertKey(ctx context.Context, k store.Key) (store.Key, error)
	ListKeys(ctx context.Context, teamID string) ([]store.Key, error)
	RevokeKey(ctx context.Context, teamID, id string) (store.Key, error)
	// ServerSecret is a secret of the server's (the E2B layer's tokens).
	ServerSecret(ctx context.Context, name string) ([]byte, error)
}

// Pools reports the node's warm pools (a nodeapi.Node does).
type Pools interface {
	Pools(ctx context.Context) ([]nodeapi.PoolStatus, error)
}

// Capacity reports the host capacity sandboxes are admitted against (a
// nodeapi.Node does).
type Capacity interface {
	Capacity(ctx context.Context) (nodeapi.CapacityStatus, error)
}

// Server is the HTTP API.
type Server struct {
	pools    Pools
	capacity Capacity
	// runtimesNow and noBuilds: Config.RuntimesNow, NoTemplateBuilds.
	runtimesNow func() []string
	noBuilds    string
	ports       *httputil.ReverseProxy // port URLs (ports.go)
	e2b         *e2b.Handler           // E2B's API (internal/compat/e2b)
	fusion      *sandboxfusion.Handler // SandboxFusion's API (internal/compat/sandboxfusion)
	domain      string                 // Config.SandboxDomain
	svc         *sandbox.Service
	store       Store
	secrets     TeamSecrets
	metering    Metering
	meter       *meter.Meter
	// defaultTariff is Config.DefaultTariff, which cannot be deleted.
	defaultTariff string
	auth          Authenticator
	templates     *catalog.Service
	trials        *trial.Runner
	evals         *evalrun.Service
	storage       *quota.Storage
	runtimes      []string
	defaults      client.Limits
	log           *slog.Logger
	mux           *http.ServeMux
	// outputBudget bounds the command output held for buffered answers.
	outputBudget *outbuf.Budget
	// limiter holds the request rate limits' buckets (ratelimit.go).
	limiter *rateLimiter
	// metrics are the API's series (metrics.go), on gatherer (nil: not
	// served); auditLog keeps the audit log (audit.go; nil: none).
	metrics        *httpMetrics
	gatherer       prometheus.Gatherer
	metricsHandler http.Handler
	auditLog       AuditLog
}

// Config configures the API.
type Config struct {
	Service *sandbox.Service
	Store   Store
	Auth    Authenticator
	// Secrets keeps the teams' stored secrets (nil: none are kept).
	Secrets TeamSecrets
	// Metering keeps the tariffs, the metered usage and the balances'
	// ledgers; Meter bills them (internal/meter). Both or neither.
	Metering Metering
	Meter    *meter.Meter
	// DefaultTariff is the tariff of sandboxes created without one (""
	// = meter.DefaultTariff): it cannot be deleted.
	DefaultTariff string
	Templates     *catalog.Service
	Evals         *evalrun.Service
	// Storage reports a team's storage (GET /v1/teams/{id} usage); nil:
	// not reported.
	Storage  *quota.Storage
	Runtimes []string
	// RuntimesNow, when set, answers the health check's runtimes instead
	// of Runtimes (a fleet's change as nodes come and go).
	RuntimesNow func() []string
	// NoTemplateBuilds, when set, is why this server builds and imports
	// no templates: those requests answer 501 not_implemented with it.
	NoTemplateBuilds string
	Pools            Pools
	Capacity         Capacity
	// SandboxDomain, when set, serves the host form of port URLs:
	// requests whose Host is {port}-{id}.{SandboxDomain} (wildcard DNS
	// pointing at this server) go to that sandbox port.
	SandboxDomain string
	// E2BFilesDir keeps the uploads of the E2B template build API.
	E2BFilesDir string
	// PublicURL, when set, is the server's URL as clients reach it: the
	// upload URLs the E2B layer hands out are built on it.
	PublicURL string
	// SandboxFusionKeyless, when set, is the team of SandboxFusion
	// requests (POST /run_code, /run_jupyter) from programs on this host
	// without credentials (serve --sandbox-fusion-loopback-team).
	SandboxFusionKeyless func(ctx context.Context) (auth.Principal, error)
	// DefaultLimits are given to teams created without limits.
	DefaultLimits client.Limits
	// RateLimits are the server's request rate limits (ratelimit.go),
	// those of the teams whose own are 0.
	RateLimits RateLimits
	// OutputBudget bounds the memory of command output held for buffered
	// (JSON) answers, server-wide; nil = no bound.
	OutputBudget *outbuf.Budget
	// Metrics is the server's registry: the API registers its series on
	// it and serves it at GET /metrics (admin key); nil: no metrics.
	Metrics *prometheus.Registry
	// TrialMetrics counts the trials of /v1/execute and SandboxFusion's
	// /run_code (nil: not counted).
	TrialMetrics *trial.Metrics
	// Audit keeps the audit log of state-changing requests (nil: none).
	Audit  AuditLog
	Logger *slog.Logger
}

// New returns the API handler.
func New(cfg Config) *Server {
	s := &Server{runtimesNow: cfg.RuntimesNow, noBuilds: cfg.NoTemplateBuilds, pools: cfg.Pools, capacity: cfg.Capacity, svc: cfg.Service, store: cfg.Store, secrets: cfg.Secrets, metering: cfg.Metering, meter: cfg.Meter, defaultTariff: cmp.Or(cfg.DefaultTariff, meter.DefaultTariff), auth: cfg.Auth, templates: cfg.Templates,
		evals: cfg.Evals, storage: cfg.Storage, runtimes: cfg.Runtimes, defaults: cfg.DefaultLimits, log: cfg.Logger, mux: http.NewServeMux(),
		outputBudget: cfg.OutputBudget, domain: strings.ToLower(strings.TrimSuffix(cfg.SandboxDomain, "."))}
	if s.log == nil {
		s.log = slog.Default()
	}
	if cfg.Auth != nil {
		s.auth = observedAuth{Authenticator: cfg.Auth, s: s}
	}
	s.limiter = newRateLimiter(cfg.RateLimits, nil)
	s.metrics, s.auditLog = newHTTPMetrics(), cfg.Audit
	if cfg.Metrics != nil {
		if err := s.metrics.register(cfg.Metrics); err != nil {
			s.log.Error("api: registering metrics", "err", err)
		}
		s.gatherer, s.metricsHandler = cfg.Metrics, MetricsHandler(cfg.Metrics)
	}
	s.trials = trial.New(cfg.Service, s.log)
	s.trials.Metrics, s.trials.Source = cfg.TrialMetrics, "execute"
	s.ports = s.newPortProxy()
	watch := func(ctx context.Context, teamID, id, path string, recursive bool) (e2b.Watcher, error) {
		return cfg.Service.WatchDir(ctx, teamID, id, path, recursive)
	}
	e2bCfg := e2b.Config{Sandboxes: cfg.Service, Watch: watch, Auth: s.auth, Secrets: cfg.Store,
		Ports: s.servePortAs, Domain: s.domain, Logger: s.log, NoBuilds: cfg.NoTemplateBuilds, FilesDir: cfg.E2BFilesDir, PublicURL: cfg.PublicURL,
		Created: setTarget}
	if cfg.Templates != nil {
		e2bCfg.Templates = cfg.Templates
	}
	s.e2b = e2b.New(e2bCfg)
	fusionCfg := sandboxfusion.Config{Trials: s.trials, Auth: s.auth, Keyless: s.rateLimited(cfg.SandboxFusionKeyless), Output: s.outputBudget, Logger: s.log}
	if cfg.Service != nil {
		fusionCfg.Sandboxes, fusionCfg.Dial = cfg.Service, s.dialPort
	}
	s.fusion = sandboxfusion.New(fusionCfg)
	s.routes()
	return s
}

func (s *Server) routes() {
	s.mux.HandleFunc("GET /v1/health", s.health)
	a := func(h func(http.ResponseWriter, *http.Request, auth.Principal)) http.HandlerFunc {
		return s.authed(h)
	}
	s.mux.HandleFunc("POST /v1/sandboxes", a(s.createSandbox))
	s.mux.HandleFunc("GET /v1/sandboxes", a(s.listSandboxes))
	s.mux.HandleFunc("DELETE /v1/sandboxes", a(s.bulkDeleteSandboxes))
	s.mux.HandleFunc("GET /v1/sandboxes/{id}", a(s.getSandbox))
	s.mux.HandleFunc("DELETE /v1/sandboxes/{id}", a(s.deleteSandbox))
	s.mux.HandleFunc("POST /v1/sandboxes/{id}/timeout", a(s.setTimeout))
	s.mux.HandleFunc("POST /v1/sandboxes/{id}/exec", a(s.exec))
	s.mux.HandleFunc("POST /v1/sandboxes/{id}/processes", a(s.startProcess))
	s.mux.HandleFunc("GET /v1/sandboxes/{id}/processes", a(s.listProcesses))
	s.mux.HandleFunc("GET /v1/sandboxes/{id}/processes/{pid}", a(s.getProcess))
	s.mux.HandleFunc("POST /v1/sandboxes/{id}/processes/{pid}/wait", a(s.waitProcess))
	s.mux.HandleFunc("GET /v1/sandboxes/{id}/processes/{pid}/stream", a(s.streamProcess))
	s.mux.HandleFunc("POST /v1/sandboxes/{id}/processes/{pid}/signal", a(s.signalProcess))
	s.mux.HandleFunc("POST /v1/sandboxes/{id}/processes/{pid}/stdin", a(s.writeStdin))
	s.mux.HandleFunc("DELETE /v1/sandboxes/{id}/processes/{pid}", a(s.killProcess))
	s.mux.HandleFunc("PUT /v1/sandboxes/{id}/files", a(s.writeFile))
	s.mux.HandleFunc("GET /v1/sandboxes/{id}/files", a(s.readFile))
	s.mux.HandleFunc("DELETE /v1/sandboxes/{id}/files", a(s.removeFile))
	s.mux.HandleFunc("GET /v1/sandboxes/{id}/files/stat", a(s.statFile))
	s.mux.HandleFunc("GET /v1/sandboxes/{id}/files/list", a(s.listFiles))
	s.mux.HandleFunc("POST /v1/sandboxes/{id}/files/mkdir", a(s.mkdir))
	s.mux.HandleFunc("POST /v1/sandboxes/{id}/files/rename", a(s.renameFile))
	s.mux.HandleFunc("GET /v1/sandboxes/{id}/files/watch", a(s.watchDir))
	s.mux.HandleFunc("PUT /v1/sandboxes/{id}/network", a(s.setNetwork))
	s.mux.HandleFunc("PUT /v1/sandboxes/{id}/ports", a(s.setPorts))
	s.mux.HandleFunc("POST /v1/sandboxes/{id}/traffic-token", a(s.rotateTrafficToken))
	s.mux.HandleFunc("POST /v1/sandboxes/{id}/snapshots", a(s.snapshotSandbox))
	s.mux.HandleFunc("POST /v1/sandboxes/{id}/fork", a(s.forkSandbox))
	s.mux.HandleFunc("POST /v1/sandboxes/{id}/pause", a(s.pauseSandbox))
	s.mux.HandleFunc("POST /v1/sandboxes/{id}/resume", a(s.resumeSandbox))
	s.mux.HandleFunc("GET /v1/snapshots", a(s.listSnapshots))
	s.mux.HandleFunc("GET /v1/snapshots/{id}", a(s.getSnapshot))
	s.mux.HandleFunc("DELETE /v1/snapshots/{id}", a(s.deleteSnapshot))
	// Port URLs authenticate themselves (ports.go): the API key, the
	// sandbox's traffic token, or a public port.
	s.mux.HandleFunc("/v1/sandboxes/{id}/ports/{port}", s.portRoot)
	s.mux.HandleFunc("/v1/sandboxes/{id}/ports/{port}/{path...}", s.portPath)
	s.mux.HandleFunc("POST /v1/execute", a(s.execute))
	s.mux.HandleFunc("POST /v1/evals", a(s.createEval))
	s.mux.HandleFunc("GET /v1/evals", a(s.listEvals))
	s.mux.HandleFunc("GET /v1/evals/{id}", a(s.getEval))
	s.mux.HandleFunc("DELETE /v1/evals/{id}", a(s.deleteEval))
	s.mux.HandleFunc("GET /v1/evals/{id}/results", a(s.evalResults))
	s.mux.HandleFunc("GET /v1/evals/{id}/events", a(s.evalEvents))
	s.mux.HandleFunc("POST /v1/evals/{id}/cancel", a(s.cancelEval))
	s.mux.HandleFunc("POST /v1/teams", a(s.createTeam))
	s.mux.HandleFunc("GET /v1/teams", a(s.listTeams))
	s.mux.HandleFunc("GET /v1/teams/{id}", a(s.getTeam))
	s.mux.HandleFunc("PATCH /v1/teams/{id}", a(s.updateTeam))
	s.mux.HandleFunc("GET /v1/tariffs", a(s.listTariffs))
	s.mux.HandleFunc("GET /v1/tariffs/{name}", a(s.getTariff))
	s.mux.HandleFunc("PUT /v1/tariffs/{name}", a(s.putTariff))
	s.mux.HandleFunc("DELETE /v1/tariffs/{name}", a(s.deleteTariff))
	s.mux.HandleFunc("GET /v1/usage", a(s.getUsage))
	s.mux.HandleFunc("GET /v1/balance", a(s.getBalance))
	s.mux.HandleFunc("GET /v1/balance/ledger", a(s.listLedger))
	s.mux.HandleFunc("POST /v1/teams/{id}/balance", a(s.topUp))
	s.mux.HandleFunc("GET /v1/secrets", a(s.listSecrets))
	s.mux.HandleFunc("PUT /v1/secrets/{name}", a(s.putSecret))
	s.mux.HandleFunc("DELETE /v1/secrets/{name}", a(s.deleteSecret))
	s.mux.HandleFunc("POST /v1/keys", a(s.createKey))
	s.mux.HandleFunc("GET /v1/keys", a(s.listKeys))
	s.mux.HandleFunc("DELETE /v1/keys/{id}", a(s.revokeKey))
	s.mux.HandleFunc("GET /v1/templates", a(s.listTemplates))
	s.mux.HandleFunc("POST /v1/templates", a(s.buildTemplate))
	s.mux.HandleFunc("POST /v1/templates/import", a(s.importTemplate))
	s.mux.HandleFunc("GET /v1/templates/{name}", a(s.getTemplate))
	s.mux.HandleFunc("DELETE /v1/templates/{name}", a(s.deleteTemplate))
	s.mux.HandleFunc("GET /v1/templates/{name}/tags", a(s.templateTags))
	s.mux.HandleFunc("POST /v1/templates/{name}/tags", a(s.tagTemplate))
	s.mux.HandleFunc("GET /v1/templates/{name}/builds/{id}", a(s.getBuild))
	s.mux.HandleFunc("GET /v1/templates/{name}/builds/{id}/logs", a(s.buildLogs))
	s.mux.HandleFunc("GET /v1/pools", a(s.listPools))
	s.mux.HandleFunc("GET /v1/capacity", a(s.getCapacity))
	s.mux.HandleFunc("GET /v1/audit", a(s.listAudit))
	s.mux.HandleFunc("GET /metrics", a(s.serveMetrics))
	// E2B's control plane, beside /v1 (docs/e2b.md).
	s.e2b.Register(s.mux)
	// SandboxFusion's (POST /run_code), at the root as its clients call it.
	s.fusion.Register(s.mux)
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, errorf(client.CodeNotFound, "no route %s %s", r.Method, r.URL.Path))
	})
}

// ServeHTTP implements http.Handler, logging each request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	ri := &requestInfo{}
	r = r.WithContext(context.WithValue(r.Context(), requestInfoKey{}, ri))
	ri.req = r
	if e2b.IsSandboxRequest(r) {
		// E2B's sandbox traffic (envd, or a port), by header: before
		// the mux, whatever the path or host.
		s.e2b.ServeSandbox(rw, r)
	} else if id, port, ok := s.portHost(r.Host); ok {
		// The host form of a port URL: before the mux, whatever the path.
		s.portByHost(rw, r, id, port)
	} else {
		s.mux.ServeHTTP(rw, r)
	}
	took := time.Since(start)
	s.observe(r, rw, ri, took)
	level := slog.LevelDebug
	if rw.status >= 500 {
		level = slog.LevelError
	}
	s.log.Log(r.Context(), level, "http", "method", r.Method, "route", r.Pattern, "status", rw.status,
		"duration", took)
}

type statusWriter struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wroteHeader {
		w.status, w.wroteHeader = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	w.wroteHeader = true
	return w.ResponseWriter.Write(p)
}

// Flush lets streaming handlers flush through the wrapper.
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap gives http.ResponseController the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (s *Server) authed(h func(http.ResponseWriter, *http.Request, auth.Principal)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if p, ok := s.authenticate(w, r); ok {
			h(w, r, p)
		}
	}
}

// authenticate resolves the request's API key, or answers the refusal
// (false).
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) (auth.Principal, bool) {
	p, err := s.auth.Authenticate(r.Context(), r.Header.Get("Authorization"))
	if err != nil {
		if errors.Is(err, auth.ErrUnauthorized) {
			err = errorf(client.CodeUnauthorized, "missing or invalid API key")
		}
		writeError(w, err)
		return auth.Principal{}, false
	}
	return p, true
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	rts := s.runtimes
	if s.runtimesNow != nil {
		rts = s.runtimesNow()
	}
	writeJSON(w, http.StatusOK, client.Health{Status: "ok", Version: Version, Runtimes: rts, SandboxDomain: s.domain})
}

// apiError is an error with a stable code raised by the API layer itself.
func errorf(code, format string, args ...any) *apierr.Error {
	return &apierr.Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// errorDetail maps err to its status, body and Retry-After seconds. Unknown
// errors are internal and their text is not shown to the caller.
func errorDetail(err error) (int, client.ErrorDetail, int) {
	var se *apierr.Error
	switch {
	case errors.As(err, &se):
		return apierr.Status(se.Code), client.ErrorDetail{Code: se.Code, Message: se.Message}, se.RetryAfter
	case errors.Is(err, context.Canceled):
		// The client went away; nobody reads this.
		return 499, client.ErrorDetail{Code: client.CodeBadRequest, Message: "request cancelled"}, 0
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, client.ErrorDetail{Code: client.CodeTimeout, Message: "deadline exceeded"}, 0
	default:
		slog.Error("internal error", "err", err)
		return http.StatusInternalServerError, client.ErrorDetail{Code: client.CodeInternal, Message: "internal error"}, 0
	}
}

// writeError answers err with its code.
func writeError(w http.ResponseWriter, err error) {
	status, detail, retryAfter := errorDetail(err)
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	}
	writeErrorBody(w, status, detail)
}

// writeErrorBody answers an error of evalbox's own, with its code also in
// the client.HeaderError header (which tells it from a sandbox's answer
// through a port URL).
func writeErrorBody(w http.ResponseWriter, status int, detail client.ErrorDetail) {
	w.Header().Set(client.HeaderError, detail.Code)
	writeJSON(w, status, client.ErrorBody{Error: detail})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// maxJSONBody bounds JSON request bodies.
const maxJSONBody = 4 << 20

// decode reads one JSON object with no unknown fields and nothing after it.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	return decodeLimit(w, r, v, maxJSONBody)
}

// decodeLimit is decode with a body of at most limit bytes.
func decodeLimit(w http.ResponseWriter, r *http.Request, v any, limit int64) error {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		return errorf(client.CodeBadRequest, "Content-Type must be application/json, got %q", ct)
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errorf(client.CodePayloadTooLarge, "request body is over %d bytes", limit)
		}
		if errors.Is(err, io.EOF) {
			return errorf(client.CodeBadRequest, "request body is empty; expected a JSON object")
		}
		return errorf(client.CodeBadRequest, "invalid JSON body: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	if dec.More() {
		return errorf(client.CodeBadRequest, "invalid JSON body: data after the object")
	}
	return nil
}

func requireAdmin(p auth.Principal) error {
	if !p.Admin {
		return errorf(client.CodeForbidden, "this needs an admin key")
	}
	return nil
}
