package api

import (
	"net/http"

	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/pkg/client"
)

// Snapshots, forks, pause and resume (docs/design/snapshots.md).

func (s *Server) snapshotSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	sn, err := s.svc.Snapshot(r.Context(), p.TeamID, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	setTarget(r.Context(), sn.ID)
	writeJSON(w, http.StatusCreated, sn)
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	l, err := s.svc.ListSnapshots(r.Context(), p.TeamID)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, client.SnapshotList{Snapshots: l})
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	sn, err := s.svc.GetSnapshot(r.Context(), p.TeamID, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, sn)
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if err := s.svc.DeleteSnapshot(r.Context(), p.TeamID, r.PathValue("id")); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) forkSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req client.ForkRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	res, err := s.svc.Fork(r.Context(), p.TeamID, r.PathValue("id"), req)
	if err != nil {
		writeError(w, err)
		return
	}
	for i, sb := range res.Sandboxes {
		res.Sandboxes[i] = s.out(sb)
	}
	writeJSON(w, http.StatusCreated, res)
}

func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	sb, err := s.svc.Pause(r.Context(), p.TeamID, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.out(sb))
}

func (s *Server) resumeSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req client.ResumeRequest
	if r.ContentLength != 0 {
		if err := decode(w, r, &req); err != nil {
			writeError(w, err)
			return
		}
	}
	sb, err := s.svc.Resume(r.Context(), p.TeamID, r.PathValue("id"), req.WaitSeconds)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.out(sb))
}
