package api

import (
	"encoding/json"
	"net/http"
	"strconv"

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
	setTarget(r.Context(), run.ID)
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

func (s *Server) deleteEval(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if err := s.evals.Delete(r.Context(), p.TeamID, r.PathValue("id")); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
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

// evalEvents streams a run's events as NDJSON EvalEvents, one flushed line
// each, until the run ends or the client leaves (see evalrun.Follow).
func (s *Server) evalEvents(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	id := r.PathValue("id")
	results := true
	if v := r.URL.Query().Get("results"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			writeError(w, errorf(client.CodeBadRequest, "results must be true or false, got %q", v))
			return
		}
		results = b
	}
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	started := false
	err := s.evals.Follow(r.Context(), p.TeamID, id, results, func(ev client.EvalEvent) error {
		if !started {
			w.Header().Set("Content-Type", client.ContentTypeNDJSON)
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(http.StatusOK)
			started = true
		}
		if err := enc.Encode(ev); err != nil {
			return err
		}
		return rc.Flush()
	})
	switch {
	case err != nil && !started:
		writeError(w, err)
	case err != nil:
		// Headers are gone: a stream without its end event tells the
		// client it was cut.
		s.log.Debug("eval event stream ended", "run", id, "err", err)
	}
}
