// Package e2b serves E2B's wire protocol, so that the official E2B SDKs
// (PyPI e2b and e2b-code-interpreter, npm e2b) run unchanged against
// evalbox (docs/design/e2b.md, docs/e2b.md): the control plane's REST API
// (sandboxes.go) beside /v1, and the in-sandbox daemon envd (envd.go: its
// Connect-RPC services process.go and filesystem.go, and files.go), served
// on the host. It is a translation at the edge: every call becomes a call
// of the services /v1 uses, with their checks, limits and team scoping.
package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/pkg/client"
)

// EnvdVersion is the envd version evalbox advertises: the SDKs gate
// features on it, so it is the newest whose features are all served
// (docs/e2b.md). 0.5.7: a default user when none is sent (0.4.0), the
// stdin flag (0.3.0), CloseStdin (0.5.2), octet-stream and gzip uploads
// (0.5.7); not file metadata (0.6.2) or watch events' entries (0.6.3),
// which the SDKs then refuse before sending.
const EnvdVersion = "0.5.7"

// EnvdPort is the port the SDKs address envd on.
const EnvdPort = 49983

// Headers of the SDKs' requests.
const (
	headerAPIKey       = "X-API-KEY"
	headerSandboxID    = "E2b-Sandbox-Id"
	headerSandboxPort  = "E2b-Sandbox-Port"
	headerAccessToken  = "X-Access-Token"
	headerTrafficToken = "E2B-Traffic-Access-Token"
	// headerShouldRetry tells the SDK whether to retry a 429 or a 5xx.
	headerShouldRetry = "Should-Retry"
)

// Sandboxes is what the layer needs of the sandbox service.
type Sandboxes interface {
	Create(ctx context.Context, teamID string, req client.CreateSandboxRequest) (client.Sandbox, error)
	Get(ctx context.Context, teamID, id string) (client.Sandbox, error)
	// Lookup reads a sandbox of any team: for envd calls, whose only
	// credential is the sandbox's access token.
	Lookup(ctx context.Context, id string) (client.Sandbox, error)
	List(ctx context.Context, teamID string, metadata map[string]string, all bool) ([]client.Sandbox, error)
	Delete(ctx context.Context, teamID, id string) error
	SetTimeout(ctx context.Context, teamID, id string, timeout int) (client.Sandbox, error)

	// Snapshots, forks, pause and resume (snapshots.go).
	Snapshot(ctx context.Context, teamID, id string) (client.Snapshot, error)
	ListSnapshots(ctx context.Context, teamID string) ([]client.Snapshot, error)
	DeleteSnapshot(ctx context.Context, teamID, id string) error
	Fork(ctx context.Context, teamID, id string, req client.ForkRequest) (client.ForkResult, error)
	Pause(ctx context.Context, teamID, id string) (client.Sandbox, error)
	Resume(ctx context.Context, teamID, id string, waitSeconds int) (client.Sandbox, error)

	StartProcess(ctx context.Context, teamID, id string, req client.ExecRequest) (client.Process, error)
	ListProcesses(ctx context.Context, teamID, id string) ([]client.Process, error)
	AttachProcess(ctx context.Context, teamID, id, pid string, stdout, stderr io.Writer) (client.ExecResult, error)
	SignalProcess(ctx context.Context, teamID, id, pid, signal string) error
	WriteStdin(ctx context.Context, teamID, id, pid string, data []byte, closeAfter bool) error

	WriteFile(ctx context.Context, teamID, id, path, mode string, r io.Reader) (client.FileInfo, error)
	OpenFile(ctx context.Context, teamID, id, path string) (client.FileInfo, io.ReadCloser, error)
	StatFile(ctx context.Context, teamID, id, path string) (client.FileInfo, error)
	ListFiles(ctx context.Context, teamID, id, path string) ([]client.FileInfo, error)
	Mkdir(ctx context.Context, teamID, id string, req client.MkdirRequest) (client.FileInfo, error)
	RenameFile(ctx context.Context, teamID, id string, req client.RenameRequest) (client.FileInfo, error)
	RemoveFile(ctx context.Context, teamID, id, path string, recursive bool) error
}

// Authenticator resolves an API key (an Authorization header value).
type Authenticator interface {
	Authenticate(ctx context.Context, authorization string) (auth.Principal, error)
}

// Secrets gives the server's secret that the access tokens derive from.
type Secrets interface {
	ServerSecret(ctx context.Context, name string) ([]byte, error)
}

// Config configures a Handler.
type Config struct {
	Sandboxes Sandboxes
	Auth      Authenticator
	Secrets   Secrets
	// Ports serves a request to a port of a sandbox other than envd's,
	// for the team (the port proxy of port URLs).
	Ports func(w http.ResponseWriter, r *http.Request, teamID, id string, port int)
	// Watch opens a watch of a sandbox's directory (sandbox.Service's
	// WatchDir); nil: envd's watches are unimplemented.
	Watch func(ctx context.Context, teamID, id, path string, recursive bool) (Watcher, error)
	// Templates is the template catalog, for the build API (nil: none).
	Templates Templates
	// NoBuilds, when set, is why this server builds no templates (a
	// fleet whose replicas do not store them): builds are refused with it.
	NoBuilds string
	// FilesDir keeps the build API's uploads ("" with Templates nil).
	FilesDir string
	// PublicURL is the server's URL as the SDKs reach it, for the upload
	// URLs ("": the request's scheme and Host).
	PublicURL string
	// Domain is the sandbox domain of port URLs' host form, returned as
	// the sandboxes' domain ("" = none: the SDKs then need
	// E2B_SANDBOX_URL).
	Domain string
	// Created, when set, is told the id of a sandbox a create made (the
	// audit log's target).
	Created func(ctx context.Context, id string)
	Logger  *slog.Logger
}

// Handler serves the E2B routes.
type Handler struct {
	cfg Config
	log *slog.Logger

	keyMu sync.Mutex
	key   []byte // the server secret, once read

	envdOnce sync.Once
	envd     *http.ServeMux // envdMux

	builds   builds     // the template builds requested
	files    *fileCache // their uploads
	watchers watchers   // the polled watchers (CreateWatcher)
}

// New returns a Handler.
func New(cfg Config) *Handler {
	h := &Handler{cfg: cfg, log: cfg.Logger}
	if h.log == nil {
		h.log = slog.Default()
	}
	h.files = &fileCache{dir: cfg.FilesDir, max: func() int64 {
		if cfg.Templates == nil {
			return 0
		}
		return cfg.Templates.MaxContextBytes()
	}}
	return h
}

// Register adds the control plane's routes to mux.
func (h *Handler) Register(mux *http.ServeMux) {
	a := h.authed
	mux.HandleFunc("POST /v2/sandboxes", a(h.createSandbox))
	mux.HandleFunc("GET /v2/sandboxes", a(h.listSandboxes))
	mux.HandleFunc("GET /sandboxes", a(h.listSandboxesV1))
	mux.HandleFunc("GET /sandboxes/{id}", a(h.getSandbox))
	mux.HandleFunc("DELETE /sandboxes/{id}", a(h.killSandbox))
	mux.HandleFunc("POST /sandboxes/{id}/timeout", a(h.setTimeout))
	mux.HandleFunc("POST /v2/sandboxes/{id}/connect", a(h.connectSandbox))
	mux.HandleFunc("POST /sandboxes/{id}/connect", a(h.connectSandbox))
	mux.HandleFunc("POST /sandboxes/{id}/pause", a(h.pauseSandbox))
	mux.HandleFunc("POST /sandboxes/{id}/resume", a(h.resumeSandbox))
	mux.HandleFunc("POST /sandboxes/{id}/fork", a(h.forkSandbox))
	mux.HandleFunc("POST /sandboxes/{id}/snapshots", a(h.snapshotSandbox))
	mux.HandleFunc("GET /snapshots", a(h.listSnapshots))
	mux.HandleFunc("GET /sandboxes/{id}/metrics", a(h.metrics))
	h.registerTemplates(mux)
}

// IsSandboxRequest reports whether r is sandbox traffic of the
// E2B_SANDBOX_URL form (routed by header), which ServeSandbox serves.
func IsSandboxRequest(r *http.Request) bool { return r.Header.Get(headerSandboxID) != "" }

// authed resolves X-API-KEY (or a bearer Authorization) to a team.
func (h *Handler) authed(fn func(http.ResponseWriter, *http.Request, auth.Principal)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		authz := r.Header.Get("Authorization")
		if key := r.Header.Get(headerAPIKey); key != "" {
			authz = "Bearer " + key
		}
		p, err := h.cfg.Auth.Authenticate(r.Context(), authz)
		if err != nil {
			if errors.Is(err, auth.ErrUnauthorized) {
				err = apierr.Errorf(client.CodeUnauthorized, "missing or invalid API key (X-API-KEY)")
			}
			h.writeError(w, err)
			return
		}
		fn(w, r, p)
	}
}

func (h *Handler) notYet(what string) func(http.ResponseWriter, *http.Request, auth.Principal) {
	return func(w http.ResponseWriter, r *http.Request, _ auth.Principal) {
		h.writeError(w, apierr.Errorf(client.CodeNotImplemented, "evalbox does not support %s yet", what))
	}
}

// errorBody is the control plane's error, as the SDKs parse it on every
// status an endpoint documents: both fields are required.
type errorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// writeError answers err in the control plane's form. The SDKs retry 429,
// 502, 503 and 504 three times unless told not to: only a full host
// (insufficient capacity) and a queue are worth it.
func (h *Handler) writeError(w http.ResponseWriter, err error) {
	status, msg, retryAfter := describe(err)
	if status >= 500 && !errors.As(err, new(*apierr.Error)) {
		h.log.Error("e2b: internal error", "err", err)
	}
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	}
	retry := "false"
	if apierr.Code(err) == client.CodeInsufficientCapacity {
		retry = "true"
	}
	w.Header().Set(headerShouldRetry, retry)
	w.Header().Set(client.HeaderError, apierr.Code(err))
	writeJSON(w, status, errorBody{Code: status, Message: msg})
}

// describe is err's status, message and Retry-After; an internal error's
// text is not shown.
func describe(err error) (int, string, int) {
	var e *apierr.Error
	switch {
	case errors.As(err, &e):
		return apierr.Status(e.Code), e.Message, e.RetryAfter
	case errors.Is(err, context.Canceled):
		return 499, "request cancelled", 0
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, "deadline exceeded", 0
	}
	return http.StatusInternalServerError, "internal error", 0
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// maxJSONBody bounds the control plane's request bodies.
const maxJSONBody = 1 << 20

// decode reads a JSON object (unknown fields ignored: the SDKs send fields
// of features evalbox does not have, which the handlers check by name).
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		return apierr.Errorf(client.CodeBadRequest, "Content-Type must be application/json, got %q", ct)
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxJSONBody))
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // an empty body is an empty request (connect, pause)
		}
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return apierr.Errorf(client.CodePayloadTooLarge, "request body is over %d bytes", maxJSONBody)
		}
		return apierr.Errorf(client.CodeBadRequest, "invalid JSON body: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	return nil
}

// errorf is apierr.Errorf.
func errorf(code, format string, args ...any) error { return apierr.Errorf(code, format, args...) }
