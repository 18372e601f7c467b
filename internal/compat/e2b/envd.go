package e2b

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"connectrpc.com/connect"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/compat/e2b/envdpb/filesystempb/filesystempbconnect"
	"github.com/evalbox/evalbox/internal/compat/e2b/envdpb/processpb/processpbconnect"
	"github.com/evalbox/evalbox/pkg/client"
)

// call is what an envd request is about: the sandbox its token opened and
// the user it asks for ("" = the template's).
type call struct {
	team, id string
	user     string
}

type callKey struct{}

func callOf(ctx context.Context) call { c, _ := ctx.Value(callKey{}).(call); return c }

// envdMux serves envd's surface for a sandbox whose token was checked:
// the two Connect services, /files and /health.
func (h *Handler) envdMux() *http.ServeMux {
	h.envdOnce.Do(func() {
		mux := http.NewServeMux()
		opts := []connect.HandlerOption{connect.WithReadMaxBytes(maxRPCBytes)}
		mux.Handle(processpbconnect.NewProcessHandler(&processService{h: h}, opts...))
		mux.Handle(filesystempbconnect.NewFilesystemHandler(&filesystemService{h: h}, opts...))
		mux.HandleFunc("GET /files", h.readFiles)
		mux.HandleFunc("POST /files", h.writeFiles)
		mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
		mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			writeEnvdError(w, http.StatusNotFound, "not_found", "envd has no "+r.Method+" "+r.URL.Path)
		})
		h.envd = mux
	})
	return h.envd
}

// maxRPCBytes bounds an envd RPC's request message (a SendInput carries
// stdin; files go through /files).
const maxRPCBytes = 8 << 20

// ServeSandbox serves sandbox traffic routed by E2B's headers
// (E2B_SANDBOX_URL): E2b-Sandbox-Id names the sandbox, E2b-Sandbox-Port the
// port (envd's by default).
func (h *Handler) ServeSandbox(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get(headerSandboxID)
	port := EnvdPort
	if ps := r.Header.Get(headerSandboxPort); ps != "" {
		p, err := strconv.Atoi(ps)
		if err != nil || p < 1 || p > 65535 || strconv.Itoa(p) != ps {
			writeEnvdError(w, http.StatusBadRequest, "invalid_argument", headerSandboxPort+" "+strconv.Quote(ps)+": want a port number")
			return
		}
		port = p
	}
	h.ServePort(w, r, id, port)
}

// ServePort serves a request to a port of sandbox id: envd's is evalbox's
// envd, any other goes to the port proxy.
func (h *Handler) ServePort(w http.ResponseWriter, r *http.Request, id string, port int) {
	ctx := r.Context()
	sb, err := h.cfg.Sandboxes.Lookup(ctx, id)
	if err == nil && sb.State != client.StateRunning {
		err = apierr.Errorf(client.CodeNotFound, "sandbox %s ended", id)
	}
	if err != nil {
		if apierr.Code(err) == client.CodeNotFound {
			// What the SDKs read as a sandbox that is gone.
			writeEnvdError(w, http.StatusBadGateway, "unavailable", "The sandbox "+id+" was not found")
			return
		}
		h.log.Error("e2b: sandbox lookup", "sandbox", id, "err", err)
		writeEnvdError(w, http.StatusInternalServerError, "internal", "internal error")
		return
	}
	envd, err := h.envdToken(ctx, id)
	if err != nil {
		h.log.Error("e2b: envd token", "err", err)
		writeEnvdError(w, http.StatusInternalServerError, "internal", "internal error")
		return
	}
	hasEnvd := equal(r.Header.Get(headerAccessToken), envd)
	if port == EnvdPort {
		if !hasEnvd {
			writeEnvdError(w, http.StatusUnauthorized, "unauthenticated", "missing or invalid "+headerAccessToken+" (the sandbox's envdAccessToken)")
			return
		}
		c := call{team: sb.TeamID, id: id}
		if u, _, ok := r.BasicAuth(); ok {
			c.user = u
		}
		r.Header.Del(headerAccessToken)
		h.envdMux().ServeHTTP(w, r.WithContext(context.WithValue(ctx, callKey{}, c)))
		return
	}
	allowed := hasEnvd || slices.ContainsFunc(sb.Ports, func(p client.PortSpec) bool { return p.Port == port && p.Public })
	if !allowed {
		if t := r.Header.Get(headerTrafficToken); t != "" {
			want, err := h.trafficToken(ctx, sb)
			allowed = err == nil && equal(t, want)
		}
	}
	if !allowed {
		writeEnvdError(w, http.StatusUnauthorized, "unauthenticated",
			"port "+strconv.Itoa(port)+" needs the sandbox's trafficAccessToken ("+headerTrafficToken+") unless it is public")
		return
	}
	// The sandbox's server sees none of evalbox's credentials.
	for _, k := range []string{headerAccessToken, headerTrafficToken, headerSandboxID, headerSandboxPort} {
		r.Header.Del(k)
	}
	h.cfg.Ports(w, r, sb.TeamID, id, port)
}

// writeEnvdError answers an envd or sandbox-traffic error: JSON that the
// SDKs read both as a Connect error (its code string) and as an HTTP API
// error (its message).
func writeEnvdError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set(client.HeaderError, code)
	writeJSON(w, status, map[string]string{"code": code, "message": msg})
}

// connectError is err as a Connect error of the SDKs' mapping.
func connectError(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	var e *apierr.Error
	switch {
	case errors.As(err, &e):
		msg := e.Message
		if e.Code == client.CodeSandboxNotRunning {
			msg = "The sandbox was not found: " + msg // the SDKs' sign of a sandbox gone
		}
		return connect.NewError(connectCode(e.Code), errors.New(msg))
	case errors.Is(err, context.DeadlineExceeded):
		return connect.NewError(connect.CodeDeadlineExceeded, errors.New("deadline exceeded"))
	case errors.Is(err, context.Canceled):
		return connect.NewError(connect.CodeCanceled, errors.New("request cancelled"))
	}
	return connect.NewError(connect.CodeInternal, errors.New("internal error"))
}

// connectCode maps evalbox's codes onto Connect's.
func connectCode(code string) connect.Code {
	switch code {
	case client.CodeBadRequest:
		return connect.CodeInvalidArgument
	case client.CodeUnauthorized:
		return connect.CodeUnauthenticated
	case client.CodeForbidden:
		return connect.CodePermissionDenied
	case client.CodeNotFound:
		return connect.CodeNotFound
	case client.CodeConflict:
		return connect.CodeAlreadyExists
	case client.CodeTooManySandboxes, client.CodeRateLimited, client.CodeOutputBudgetExhausted,
		client.CodePayloadTooLarge, client.CodeStorageQuotaExceeded, client.CodeNoSpace:
		return connect.CodeResourceExhausted
	case client.CodeSandboxNotRunning:
		return connect.CodeUnavailable
	case client.CodeTimeout:
		return connect.CodeDeadlineExceeded
	case client.CodeUnavailable, client.CodeInsufficientCapacity:
		return connect.CodeUnavailable
	case client.CodeNotImplemented:
		return connect.CodeUnimplemented
	}
	if strings.HasSuffix(code, "_not_found") {
		return connect.CodeNotFound
	}
	return connect.CodeInternal
}
