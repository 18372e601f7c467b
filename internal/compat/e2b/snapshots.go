package e2b

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/pkg/client"
)

// E2B's pause, resume, fork and snapshots, onto sandbox.Service's
// (docs/design/snapshots.md). An E2B snapshot is used as a template id
// (Sandbox.create(snapshot_id)) and deleted as one (DELETE
// /templates/{id}): evalbox's snapshot ids ("snap-…") are told apart from
// template names by their prefix, which no template name of a team can
// take over (isSnapshotID).

// isSnapshotID reports whether an E2B template id names an evalbox
// snapshot.
func isSnapshotID(id string) bool { return strings.HasPrefix(id, "snap-") }

// snapshotInfo is E2B's SnapshotInfo.
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func e2bSnapshot(sn client.Snapshot) snapshotInfo {
	return snapshotInfo{SnapshotID: sn.ID, Names: []string{sn.ID}}
}

// memoryOnly refuses E2B's filesystem-only mode (memory false): an evalbox
// snapshot or pause always keeps memory.
func memoryOnly(memory *bool, what string) error {
	if memory != nil && !*memory {
		return errorf(client.CodeBadRequest, "%s without memory (mode filesystem) is not supported: evalbox keeps memory and processes", what)
	}
	return nil
}

func (h *Handler) pauseSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req struct {
		Memory              *bool `json:"memory"`
		RequireHealthyGuest *bool `json:"requireHealthyGuest"`
	}
	if r.ContentLength != 0 {
		if err := decode(w, r, &req); err != nil {
			h.writeError(w, err)
			return
		}
	}
	if err := memoryOnly(req.Memory, "a pause"); err != nil {
		h.writeError(w, err)
		return
	}
	id := r.PathValue("id")
	if _, err := h.running(r, p, id); err != nil {
		h.writeError(w, err)
		return
	}
	if _, err := h.cfg.Sandboxes.Pause(r.Context(), p.TeamID, id); err != nil {
		h.writeError(w, notRunningIsGone(err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// resumeSandbox serves the older POST /sandboxes/{id}/resume: a paused
// sandbox resumed, with its tokens.
func (h *Handler) resumeSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req struct {
		Timeout   *int  `json:"timeout"`
		AutoPause *bool `json:"autoPause"`
	}
	if r.ContentLength != 0 {
		if err := decode(w, r, &req); err != nil {
			h.writeError(w, err)
			return
		}
	}
	if req.AutoPause != nil && *req.AutoPause {
		h.writeError(w, errorf(client.CodeNotImplemented, "autoPause: evalbox does not pause sandboxes at their timeout"))
		return
	}
	id := r.PathValue("id")
	sb, err := h.running(r, p, id)
	if err != nil {
		h.writeError(w, err)
		return
	}
	if sb.PausedAt == nil {
		h.writeError(w, errorf(client.CodeConflict, "sandbox %s is not paused", id))
		return
	}
	if sb, err = h.resumeWithTimeout(r, p, id, req.Timeout); err != nil {
		h.writeError(w, err)
		return
	}
	body, err := h.sandboxBody(r, sb, sb.Template)
	if err != nil {
		h.writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, body)
}

// resumeWithTimeout resumes the team's paused sandbox and, with timeout,
// sets its expiry.
func (h *Handler) resumeWithTimeout(r *http.Request, p auth.Principal, id string, timeout *int) (client.Sandbox, error) {
	if timeout != nil && *timeout <= 0 {
		return client.Sandbox{}, errorf(client.CodeBadRequest, "timeout: want a positive number of seconds")
	}
	sb, err := h.cfg.Sandboxes.Resume(r.Context(), p.TeamID, id, 0)
	if err != nil {
		return client.Sandbox{}, notRunningIsGone(err)
	}
	if timeout != nil {
		if sb, err = h.cfg.Sandboxes.SetTimeout(r.Context(), p.TeamID, id, *timeout); err != nil {
			return client.Sandbox{}, notRunningIsGone(err)
		}
	}
	return sb, nil
}

// forkResult is E2B's SandboxForkResult: one of sandbox and error.
type forkResult struct {
	Sandbox *sandboxBody `json:"sandbox,omitempty"`
	Error   *errorBody   `json:"error,omitempty"`
}

func (h *Handler) forkSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req struct {
		Timeout *int `json:"timeout"`
		Count   *int `json:"count"`
	}
	if err := decode(w, r, &req); err != nil {
		h.writeError(w, err)
		return
	}
	freq := client.ForkRequest{Count: 1}
	if req.Count != nil {
		freq.Count = *req.Count
	}
	if req.Timeout != nil {
		if *req.Timeout <= 0 {
			h.writeError(w, errorf(client.CodeBadRequest, "timeout: want a positive number of seconds"))
			return
		}
		freq.Timeout = *req.Timeout
	}
	id := r.PathValue("id")
	if _, err := h.running(r, p, id); err != nil {
		h.writeError(w, err)
		return
	}
	res, err := h.cfg.Sandboxes.Fork(r.Context(), p.TeamID, id, freq)
	if err != nil {
		h.writeError(w, notRunningIsGone(err))
		return
	}
	out := make([]forkResult, 0, len(res.Sandboxes))
	for _, sb := range res.Sandboxes {
		body, err := h.sandboxBody(r, sb, sb.Template)
		if err != nil {
			h.writeError(w, err)
			return
		}
		out = append(out, forkResult{Sandbox: &body})
	}
	writeJSON(w, http.StatusCreated, out)
}

func (h *Handler) snapshotSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req struct {
		Name   *string `json:"name"`
		Memory *bool   `json:"memory"`
	}
	if r.ContentLength != 0 {
		if err := decode(w, r, &req); err != nil {
			h.writeError(w, err)
			return
		}
	}
	if err := memoryOnly(req.Memory, "a snapshot"); err != nil {
		h.writeError(w, err)
		return
	}
	if req.Name != nil && *req.Name != "" {
		h.writeError(w, errorf(client.CodeNotImplemented, "a named snapshot: evalbox snapshots are named by their id"))
		return
	}
	id := r.PathValue("id")
	if _, err := h.running(r, p, id); err != nil {
		h.writeError(w, err)
		return
	}
	sn, err := h.cfg.Sandboxes.Snapshot(r.Context(), p.TeamID, id)
	if err != nil {
		h.writeError(w, notRunningIsGone(err))
		return
	}
	writeJSON(w, http.StatusCreated, e2bSnapshot(sn))
}

// listSnapshots serves GET /snapshots: the team's snapshots, newest first,
// of one sandbox with sandboxID, a page at a time.
func (h *Handler) listSnapshots(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	q := r.URL.Query()
	limit, offset, err := page(q)
	if err != nil {
		h.writeError(w, err)
		return
	}
	all, err := h.cfg.Sandboxes.ListSnapshots(r.Context(), p.TeamID)
	if err != nil {
		h.writeError(w, err)
		return
	}
	out := []snapshotInfo{}
	for _, sn := range all {
		if src := q.Get("sandboxID"); src == "" || sn.SandboxID == src {
			out = append(out, e2bSnapshot(sn))
		}
	}
	if offset > len(out) {
		offset = len(out)
	}
	out = out[offset:]
	if len(out) > limit {
		w.Header().Set("x-next-token", strconv.Itoa(offset+limit))
		out = out[:limit]
	}
	writeJSON(w, http.StatusOK, out)
}
