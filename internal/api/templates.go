package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"slices"
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
	Name       string            `json:"name"`
	Spec       json.RawMessage   `json:"spec"`
	Dockerfile string            `json:"dockerfile"`
	BuildArgs  map[string]string `json:"build_args"`
	Tags       []string          `json:"tags"`
}

// parsedBuild is a checked build request: its spec, or its Dockerfile
// (whose FROM is resolved when the build starts).
type parsedBuild struct {
	req        buildRequest
	spec       client.TemplateSpec
	dockerfile *template.Dockerfile
}

// parseBuildRequest decodes a build request (JSON).
func parseBuildRequest(body io.Reader) (parsedBuild, error) {
	var b parsedBuild
	dec := json.NewDecoder(io.LimitReader(body, maxJSONBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b.req); err != nil {
		if errors.Is(err, io.EOF) {
			return b, errorf(client.CodeBadRequest, "request body is empty; expected {\"name\", \"spec\"} or {\"name\", \"dockerfile\"}")
		}
		return b, errorf(client.CodeBadRequest, "invalid JSON body: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	hasSpec := len(b.req.Spec) > 0 && string(b.req.Spec) != "null"
	switch {
	case hasSpec && b.req.Dockerfile != "":
		return b, errorf(client.CodeBadRequest, "give spec or dockerfile, not both")
	case b.req.Dockerfile != "":
		df, err := template.ParseDockerfile([]byte(b.req.Dockerfile), b.req.BuildArgs)
		if err != nil {
			return b, errorf(client.CodeBadRequest, "%v", err)
		}
		b.dockerfile = df
		return b, nil
	case len(b.req.BuildArgs) > 0:
		return b, errorf(client.CodeBadRequest, "build_args are for a dockerfile")
	case !hasSpec:
		return b, errorf(client.CodeBadRequest, "spec (or dockerfile) is required")
	}
	spec, err := template.ParseSpec(b.req.Spec)
	if err != nil {
		return b, errorf(client.CodeBadRequest, "spec: %v", err)
	}
	b.spec = spec
	return b, nil
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
		b, err := parseBuildRequest(http.MaxBytesReader(w, r.Body, maxJSONBody))
		if err != nil {
			writeError(w, err)
			return
		}
		s.startBuild(w, r, p, b, nil)
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
		b, err := parseBuildRequest(part)
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
		s.startBuild(w, r, p, b, ctxTar)
	default:
		writeError(w, errorf(client.CodeBadRequest, "Content-Type must be application/json or multipart/form-data, got %q", mt))
	}
}

func (s *Server) startBuild(w http.ResponseWriter, r *http.Request, p auth.Principal, b parsedBuild, ctxTar io.Reader) {
	spec, opts := b.spec, catalog.BuildOptions{Tags: b.req.Tags}
	if df := b.dockerfile; df != nil {
		var err error
		var base client.Template
		if spec, base, err = s.dockerfileSpec(r.Context(), p.TeamID, df); err != nil {
			writeError(w, err)
			return
		}
		// As an image's: the Dockerfile's ENTRYPOINT and CMD, else its base's.
		opts.Cmd = append(slices.Clone(df.Entrypoint), df.Cmd...)
		if len(opts.Cmd) == 0 {
			opts.Cmd = base.Cmd
		}
	}
	setTarget(r.Context(), b.req.Name)
	build, err := s.templates.Build(r.Context(), p.TeamID, b.req.Name, spec, ctxTar, opts)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusAccepted, build)
}

// dockerfileSpec translates a Dockerfile onto the template its FROM names:
// one of the team's templates, or an image it imported.
func (s *Server) dockerfileSpec(ctx context.Context, teamID string, df *template.Dockerfile) (client.TemplateSpec, client.Template, error) {
	base, ok, err := template.ResolveImage(ctx, df.From, func(ctx context.Context, name string) (client.Template, error) {
		return s.templates.Get(ctx, teamID, name)
	}, func(ctx context.Context) ([]client.Template, error) {
		list, err := s.templates.List(ctx, teamID)
		return list.Templates, err
	})
	if err != nil {
		return client.TemplateSpec{}, client.Template{}, err
	}
	if !ok {
		return client.TemplateSpec{}, client.Template{}, errorf(client.CodeBadRequest,
			"Dockerfile line %d: FROM %s: no template of this name, and no image imported under this reference (evalbox pulls no images at build time): import it (evalbox template import --ref %s IMAGE.tar), or start FROM a template (base, python, node or one of yours)",
			df.FromLine, df.From, df.From)
	}
	spec, err := df.Spec(base)
	if err != nil {
		return client.TemplateSpec{}, client.Template{}, errorf(client.CodeBadRequest, "%v", err)
	}
	return spec, base, nil
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
	setTarget(r.Context(), q.Get("name"))
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
