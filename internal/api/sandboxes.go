package api

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/pkg/client"
)

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req client.CreateSandboxRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	sb, err := s.svc.Create(r.Context(), p.TeamID, req)
	if err != nil {
		writeError(w, err)
		return
	}
	setTarget(r.Context(), sb.ID)
	writeJSON(w, http.StatusCreated, s.out(sb))
}

// out is a sandbox as answered: with the server's sandbox domain.
func (s *Server) out(sb client.Sandbox) client.Sandbox {
	sb.Domain = s.domain
	return sb
}

// metadataFilter reads metadata.<key>=<value> query parameters.
func metadataFilter(q url.Values) (map[string]string, error) {
	md := map[string]string{}
	for k, vs := range q {
		key, ok := strings.CutPrefix(k, "metadata.")
		if !ok {
			continue
		}
		if key == "" || len(vs) != 1 {
			return nil, errorf(client.CodeBadRequest, "metadata filter %q must name a key and give one value", k)
		}
		md[key] = vs[0]
	}
	return md, nil
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	q := r.URL.Query()
	md, err := metadataFilter(q)
	if err != nil {
		writeError(w, err)
		return
	}
	all := false
	switch q.Get("state") {
	case "", client.StateRunning:
	case "all":
		all = true
	default:
		writeError(w, errorf(client.CodeBadRequest, "state must be running or all, got %q", q.Get("state")))
		return
	}
	list, err := s.svc.List(r.Context(), p.TeamID, md, all)
	if err != nil {
		writeError(w, err)
		return
	}
	if list == nil {
		list = []client.Sandbox{}
	}
	for i := range list {
		list[i] = s.out(list[i])
	}
	writeJSON(w, http.StatusOK, client.SandboxList{Sandboxes: list})
}

func (s *Server) bulkDeleteSandboxes(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	md, err := metadataFilter(r.URL.Query())
	if err != nil {
		writeError(w, err)
		return
	}
	deleted, err := s.svc.DeleteByMetadata(r.Context(), p.TeamID, md)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, client.DeleteResult{Deleted: deleted})
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	sb, err := s.svc.Get(r.Context(), p.TeamID, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.out(sb))
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if err := s.svc.Delete(r.Context(), p.TeamID, r.PathValue("id")); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req client.SetTimeoutRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	sb, err := s.svc.SetTimeout(r.Context(), p.TeamID, r.PathValue("id"), req.Timeout)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.out(sb))
}

func (s *Server) setNetwork(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req client.NetworkSpec
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	sb, err := s.svc.SetNetwork(r.Context(), p.TeamID, r.PathValue("id"), req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.out(sb))
}

func (s *Server) setPorts(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req client.SetPortsRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	sb, err := s.svc.SetPorts(r.Context(), p.TeamID, r.PathValue("id"), req.Ports)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.out(sb))
}

func (s *Server) rotateTrafficToken(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	tok, err := s.svc.RotateTrafficToken(r.Context(), p.TeamID, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, client.TrafficToken{TrafficToken: tok})
}
