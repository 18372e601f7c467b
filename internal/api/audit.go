package api

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/pkg/client"
)

// AuditLog is where the audit log is kept (*store.Store).
type AuditLog interface {
	InsertAudit(ctx context.Context, e client.AuditEvent) (client.AuditEvent, error)
	ListAudit(ctx context.Context, f store.AuditFilter) ([]client.AuditEvent, string, error)
}

// auditActions names the requests the audit log records, by the mux
// pattern that routed them: every one that creates, deletes or changes a
// lasting thing (sandboxes, snapshots, eval runs, teams, keys, templates,
// stored secrets, a sandbox's network and ports), on evalbox's API and on
// E2B's. Reads,
// execs, file calls and one-off runs (POST /v1/execute, SandboxFusion's
// /run_code: their sandboxes live for one call) are not recorded. A new
// state-changing route adds its line here (TestAuditActions holds the
// table to the AuditAction* constants).
var auditActions = map[string]string{
	"POST /v1/sandboxes":                    client.AuditActionSandboxCreate,
	"DELETE /v1/sandboxes":                  client.AuditActionSandboxBulkDelete,
	"DELETE /v1/sandboxes/{id}":             client.AuditActionSandboxDelete,
	"PUT /v1/sandboxes/{id}/network":        client.AuditActionSandboxSetNetwork,
	"PUT /v1/sandboxes/{id}/ports":          client.AuditActionSandboxSetPorts,
	"POST /v1/sandboxes/{id}/traffic-token": client.AuditActionSandboxRotateToken,
	"POST /v1/sandboxes/{id}/fork":          client.AuditActionSandboxFork,
	"POST /v1/sandboxes/{id}/pause":         client.AuditActionSandboxPause,
	"POST /v1/sandboxes/{id}/resume":        client.AuditActionSandboxResume,
	"POST /v1/sandboxes/{id}/snapshots":     client.AuditActionSnapshotCreate,
	"DELETE /v1/snapshots/{id}":             client.AuditActionSnapshotDelete,
	"POST /v1/evals":                        client.AuditActionEvalCreate,
	"DELETE /v1/evals/{id}":                 client.AuditActionEvalDelete,
	"POST /v1/evals/{id}/cancel":            client.AuditActionEvalCancel,
	"POST /v1/teams":                        client.AuditActionTeamCreate,
	"PATCH /v1/teams/{id}":                  client.AuditActionTeamUpdate,
	"POST /v1/keys":                         client.AuditActionKeyCreate,
	"DELETE /v1/keys/{id}":                  client.AuditActionKeyRevoke,
	"POST /v1/templates":                    client.AuditActionTemplateBuild,
	"POST /v1/templates/import":             client.AuditActionTemplateImport,
	"DELETE /v1/templates/{name}":           client.AuditActionTemplateDelete,
	"POST /v1/templates/{name}/tags":        client.AuditActionTemplateTag,
	"PUT /v1/secrets/{name}":                client.AuditActionSecretPut,
	"DELETE /v1/secrets/{name}":             client.AuditActionSecretDelete,
	"PUT /v1/tariffs/{name}":                client.AuditActionTariffPut,
	"DELETE /v1/tariffs/{name}":             client.AuditActionTariffDelete,
	"POST /v1/teams/{id}/balance":           client.AuditActionBalanceTopUp,
	"POST /v2/sandboxes":                    client.AuditActionE2BSandboxCreate,
	"DELETE /sandboxes/{id}":                client.AuditActionE2BSandboxKill,
	"POST /sandboxes/{id}/pause":            client.AuditActionE2BSandboxPause,
	"POST /sandboxes/{id}/resume":           client.AuditActionE2BSandboxResume,
	"POST /sandboxes/{id}/fork":             client.AuditActionE2BSandboxFork,
	"POST /sandboxes/{id}/snapshots":        client.AuditActionE2BSnapshotCreate,
	"POST /v3/templates":                    client.AuditActionE2BTemplateCreate,
	"POST /v2/templates/{id}/builds/{bid}":  client.AuditActionE2BTemplateBuild,
	"DELETE /templates/{id}":                client.AuditActionE2BTemplateDelete,
	"POST /templates/tags":                  client.AuditActionE2BTemplateTag,
	"DELETE /templates/tags":                client.AuditActionE2BTemplateUntag,
}

// notAudited are the state-changing routes the audit log leaves out, on
// purpose: a sandbox's TTL (renewed by keep-alives), what runs in it and
// its files, one-off runs, E2B's connect (a resume when paused, which its
// SDK sends on every reconnect). TestEveryChangeIsClassified fails on a
// POST, PUT, PATCH or DELETE route in neither table.
var notAudited = map[string]bool{
	"POST /v1/sandboxes/{id}/timeout":                true,
	"POST /v1/sandboxes/{id}/exec":                   true,
	"POST /v1/sandboxes/{id}/processes":              true,
	"POST /v1/sandboxes/{id}/processes/{pid}/wait":   true,
	"POST /v1/sandboxes/{id}/processes/{pid}/signal": true,
	"POST /v1/sandboxes/{id}/processes/{pid}/stdin":  true,
	"DELETE /v1/sandboxes/{id}/processes/{pid}":      true,
	"PUT /v1/sandboxes/{id}/files":                   true,
	"DELETE /v1/sandboxes/{id}/files":                true,
	"POST /v1/sandboxes/{id}/files/mkdir":            true,
	"POST /v1/sandboxes/{id}/files/rename":           true,
	"POST /v1/execute":                               true,
	"POST /run_code":                                 true,
	"POST /run_jupyter":                              true,
	"POST /sandboxes/{id}/timeout":                   true,
	"POST /v2/sandboxes/{id}/connect":                true,
	"POST /sandboxes/{id}/connect":                   true,
}

// auditInsertTimeout bounds an audit row's write: the answer has been
// written already, but the handler's goroutine (and its connection) waits.
const auditInsertTimeout = 5 * time.Second

// audit records a request that changed something, or tried to, in the
// audit log: only requests of an authenticated caller (an unauthenticated
// one is attributable to no one, and recording it would let anyone on the
// network fill the table). The row is written synchronously once the
// handler returns, before net/http ends the answer (an answer that fits
// its 4 KiB buffer, as every audited one does, is not sent before): a
// client that has its answer finds the row. A failed write is logged and
// never fails the request.
func (s *Server) audit(r *http.Request, ri *requestInfo, status int, code string) {
	if s.auditLog == nil || !ri.authed || code == client.CodeRateLimited {
		// A request refused by the rate limits writes nothing: a key past
		// its limit must not be able to make the database write for it.
		return
	}
	action, ok := auditActions[r.Pattern]
	if !ok {
		return
	}
	e := auditEvent(r, ri.principal, action, ri.target, status, code)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), auditInsertTimeout)
	defer cancel()
	if _, err := s.auditLog.InsertAudit(ctx, e); err != nil {
		s.log.Error("audit: recording a request", "action", action, "team", e.TeamID, "status", status, "err", err)
	}
}

// auditEvent is the row of a request: its target is what the handler set
// (setTarget: what it created), else the id or name in its path.
func auditEvent(r *http.Request, p auth.Principal, action, target string, status int, code string) client.AuditEvent {
	if target == "" {
		target = r.PathValue("id")
	}
	if target == "" {
		target = r.PathValue("name")
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return client.AuditEvent{TeamID: p.TeamID, KeyID: p.KeyID, KeyName: p.KeyName, Admin: p.Admin,
		RemoteAddr: host, Action: action, Target: target, Status: status, Code: code}
}

// listAudit is GET /v1/audit (admin key only).
func (s *Server) listAudit(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if err := requireAdmin(p); err != nil {
		writeError(w, err)
		return
	}
	if s.auditLog == nil {
		writeError(w, errorf(client.CodeNotFound, "this server keeps no audit log"))
		return
	}
	f, err := auditFilter(r)
	if err != nil {
		writeError(w, err)
		return
	}
	events, next, err := s.auditLog.ListAudit(r.Context(), f)
	if errors.Is(err, store.ErrBadCursor) {
		err = errorf(client.CodeBadRequest, "cursor is not one a listing handed out")
	}
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, client.AuditList{Events: events, NextCursor: next})
}

// auditFilter reads GET /v1/audit's parameters.
func auditFilter(r *http.Request) (store.AuditFilter, error) {
	q := r.URL.Query()
	for k, vs := range q {
		switch k {
		case "team", "action", "since", "until", "limit", "cursor":
			if len(vs) != 1 {
				return store.AuditFilter{}, errorf(client.CodeBadRequest, "parameter %s given %d times", k, len(vs))
			}
		default:
			return store.AuditFilter{}, errorf(client.CodeBadRequest, "unknown parameter %q (want team, action, since, until, limit, cursor)", k)
		}
	}
	f := store.AuditFilter{TeamID: q.Get("team"), Action: q.Get("action"), Cursor: q.Get("cursor")}
	for _, t := range []struct {
		name string
		dst  *time.Time
	}{{"since", &f.Since}, {"until", &f.Until}} {
		v := q.Get(t.name)
		if v == "" {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return store.AuditFilter{}, errorf(client.CodeBadRequest, "%s must be an RFC 3339 time (2006-01-02T15:04:05Z), got %q", t.name, v)
		}
		*t.dst = at
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return store.AuditFilter{}, errorf(client.CodeBadRequest, "since must be before until")
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > store.MaxAuditLimit {
			return store.AuditFilter{}, errorf(client.CodeBadRequest, "limit must be an integer between 1 and %d, got %q", store.MaxAuditLimit, v)
		}
		f.Limit = n
	}
	return f, nil
}
