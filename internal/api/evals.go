package api

import (
	"encoding/json"
	"net/http"

	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/pkg/client"
)

// maxEvalBody bounds POST /v1/evals (problems and samples are uploaded in
// the body).
const maxEvalBody = 256 << 20

func (s *Server) createEval(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req client.CreateEvalRequest
	if err := decodeLimit(w, r, &req, maxEvalBody); err != nil {
		writeError(w, err)
		return
	}
	run, err := s.evals.Create(r.Context(), p.TeamID, req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, run)
}

func (s *Server) getEval(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	run, err := s.evals.Get(r.Context(), p.TeamID, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, run)
}

func (s *Server) listEvals(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	runs, err := s.evals.List(r.Context(), p.TeamID)
	if err != nil {
		writeError(w, err)
		return
	}
	if runs == nil {
		runs = []client.EvalRun{}
	}
	writeJSON(w, http.StatusOK, client.EvalRunList{Runs: runs})
}

func (s *Server) cancelEval(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	run, err := s.evals.Cancel(r.Context(), p.TeamID, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, run)
}

// evalResults streams a run's finished results as NDJSON, in samples order.
func (s *Server) evalResults(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	id := r.PathValue("id")
	if _, err := s.evals.Get(r.Context(), p.TeamID, id); err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", ndjson)
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	if err := s.evals.Results(r.Context(), p.TeamID, id, func(res client.EvalResult) error { return enc.Encode(res) }); err != nil {
		s.log.Warn("eval results", "run", id, "err", err)
	}
}
