package api

import (
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/internal/catalog"
	"github.com/evalbox/evalbox/internal/template"
	"github.com/evalbox/evalbox/pkg/client"
)

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	list, err := s.templates.List(r.Context(), p.TeamID)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	t, err := s.templates.Get(r.Context(), p.TeamID, r.PathValue("name"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, t)
}

func (s *Server) templateTags(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	tags, err := s.templates.Tags(r.Context(), p.TeamID, r.PathValue("name"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, client.TemplateTagList{Tags: tags})
}

func (s *Server) tagTemplate(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req client.TagTemplateRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Target == "" || len(req.Tags) == 0 {
		writeError(w, errorf(client.CodeBadRequest, "target and tags are required"))
		return
	}
	name := r.PathValue("name")
	if _, err := s.templates.Tag(r.Context(), p.TeamID, name, req.Target, req.Tags); err != nil {
		writeError(w, err)
		return
	}
	s.templateTags(w, r, p)
}

func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if err := s.templates.Delete(r.Context(), p.TeamID, r.PathValue("name")); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// buildRequest is BuildTemplateRequest with the spec kept raw, so that the
// spec's own parser reports what is wrong with it (step and field).
type buildRequest struct {
	Name string          `json:"name"`
	Spec json.RawMessage `json:"spec"`
	Tags []string        `json:"tags"`
}

// parseBuildRequest decodes a build request (JSON).
func parseBuildRequest(body io.Reader) (buildRequest, client.TemplateSpec, error) {
	var req buildRequest
	dec := json.NewDecoder(io.LimitReader(body, maxJSONBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		if errors.Is(err, io.EOF) {
			return req, client.TemplateSpec{}, errorf(client.CodeBadRequest, "request body is empty; expected {\"name\", \"spec\"}")
		}
		return req, client.TemplateSpec{}, errorf(client.CodeBadRequest, "invalid JSON body: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	if len(req.Spec) == 0 || string(req.Spec) == "null" {
		return req, client.TemplateSpec{}, errorf(client.CodeBadRequest, "spec is required")
	}
	spec, err := template.ParseSpec(req.Spec)
	if err != nil {
		return req, client.TemplateSpec{}, errorf(client.CodeBadRequest, "spec: %v", err)
	}
	return req, spec, nil
}

// buildTemplate starts a build: a JSON BuildTemplateRequest, or a
// multipart/form-data body whose "request" part is that JSON and whose
// optional "context" part is the build context (a tar archive), in this
// order. The context is read while the request is checked; the answer
// (202) comes once the build is queued.
func (s *Server) buildTemplate(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if s.noBuilds != "" {
		writeError(w, apierr.Errorf(client.CodeNotImplemented, "%s", s.noBuilds))
		return
	}
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch mt {
	case "", client.ContentTypeJSON:
		req, spec, err := parseBuildRequest(http.MaxBytesReader(w, r.Body, maxJSONBody))
		if err != nil {
			writeError(w, err)
			return
		}
		s.startBuild(w, r, p, req, spec, nil)
	case "multipart/form-data":
		mr, err := r.MultipartReader()
		if err != nil {
			writeError(w, errorf(client.CodeBadRequest, "multipart body: %v", err))
			return
		}
		part, err := mr.NextPart()
		if err != nil || part.FormName() != "request" {
			writeError(w, errorf(client.CodeBadRequest, "the first part of the multipart body must be \"request\" (the JSON build request)"))
			return
		}
		req, spec, err := parseBuildRequest(part)
		if err != nil {
			writeError(w, err)
			return
		}
		var ctxTar io.Reader
		part, err = mr.NextPart()
		switch {
		case errors.Is(err, io.EOF):
		case err != nil:
			writeError(w, errorf(client.CodeBadRequest, "multipart body: %v", err))
			return
		case part.FormName() != "context":
			writeError(w, errorf(client.CodeBadRequest, "unexpected part %q: the second part is \"context\" (a tar archive)", part.FormName()))
			return
		default:
			ctxTar = part
		}
		s.startBuild(w, r, p, req, spec, ctxTar)
	default:
		writeError(w, errorf(client.CodeBadRequest, "Content-Type must be application/json or multipart/form-data, got %q", mt))
	}
}

func (s *Server) startBuild(w http.ResponseWriter, r *http.Request, p auth.Principal, req buildRequest, spec client.TemplateSpec, ctxTar io.Reader) {
	b, err := s.templates.Build(r.Context(), p.TeamID, req.Name, spec, ctxTar, catalog.BuildOptions{Tags: req.Tags})
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusAccepted, b)
}

// importTemplate starts an import: the body is the image archive, or
// empty with ?image= naming a registry reference.
func (s *Server) importTemplate(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if s.noBuilds != "" {
		writeError(w, apierr.Errorf(client.CodeNotImplemented, "%s", s.noBuilds))
		return
	}
	q := r.URL.Query()
	var archive io.Reader
	if q.Get("image") == "" {
		archive = r.Body
	} else if r.ContentLength > 0 {
		writeError(w, errorf(client.CodeBadRequest, "give either an image archive (the body) or image=, not both"))
		return
	}
	b, err := s.templates.Import(r.Context(), p.TeamID, q.Get("name"), q.Get("ref"), q.Get("image"), archive, r.ContentLength)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusAccepted, b)
}

func (s *Server) getBuild(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	b, err := s.templates.GetBuild(r.Context(), p.TeamID, r.PathValue("name"), r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, b)
}

// buildLogs streams a build's log as NDJSON BuildEvents: the log so far,
// what follows while the build runs, then an "end" event with the build.
func (s *Server) buildLogs(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	name, id := r.PathValue("name"), r.PathValue("id")
	if _, err := s.templates.GetBuild(r.Context(), p.TeamID, name, id); err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", client.ContentTypeNDJSON)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	send := func(ev client.BuildEvent) error {
		if err := enc.Encode(ev); err != nil {
			return err
		}
		return rc.Flush()
	}
	_ = rc.Flush()
	var pending []byte
	b, err := s.templates.FollowLog(r.Context(), p.TeamID, name, id, func(chunk []byte) error {
		buf := append(pending, chunk...)
		cut := completeUTF8(buf)
		pending = append(pending[:0:0], buf[cut:]...)
		if cut == 0 {
			return nil
		}
		return send(client.BuildEvent{Type: client.BuildEventLog, Data: string(buf[:cut])})
	})
	if len(pending) > 0 {
		_ = send(client.BuildEvent{Type: client.BuildEventLog, Data: string(pending)})
	}
	if err != nil {
		// Headers are gone: a stream without its end event tells the
		// client it was cut.
		s.log.Debug("build log stream ended", "build", id, "err", err)
		return
	}
	_ = send(client.BuildEvent{Type: client.BuildEventEnd, Build: &b})
}
