package e2b

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/internal/catalog"
	"github.com/evalbox/evalbox/internal/template"
	"github.com/evalbox/evalbox/pkg/client"
)

// Templates is what the layer needs of the template catalog.
type Templates interface {
	List(ctx context.Context, teamID string) (client.TemplateList, error)
	Get(ctx context.Context, teamID, name string) (client.Template, error)
	Delete(ctx context.Context, teamID, name string) error
	Build(ctx context.Context, teamID, name string, spec client.TemplateSpec, contextTar io.Reader, opts catalog.BuildOptions) (client.TemplateBuild, error)
	GetBuild(ctx context.Context, teamID, name, id string) (client.TemplateBuild, error)
	OpenLog(ctx context.Context, teamID, name, id string) (io.ReadCloser, error)
	MaxContextBytes() int64
	Tags(ctx context.Context, teamID, name string) ([]client.TemplateTag, error)
	Tag(ctx context.Context, teamID, name, target string, tags []string) (string, error)
	Untag(ctx context.Context, teamID, name string, tags []string) error
}

// The template build API (Template.build of the SDKs, Harbor's -e e2b):
//
//	POST /v3/templates {name, tags, cpuCount, memoryMB}    → a build, waiting
//	GET  /templates/{id}/files/{hash}                      → {present, url}
//	PUT  {url} (the COPY step's files, a tar, gzipped or not)
//	POST /v2/templates/{id}/builds/{bid} {fromImage | fromTemplate, steps, startCmd, readyCmd}
//	GET  /templates/{id}/builds/{bid}/status?logsOffset=   → polled
//
// The build is one of evalbox's (catalog.Build) from a spec this layer
// writes: the template ID is the evalbox template's name, the build ID
// the E2B form of the evalbox build's (buildids.go), the tags evalbox's
// (catalog/tags.go), the COPY steps' uploads make its build context (one
// directory per files hash), and each E2B step is one or more spec steps
// (stepMap keeps which, for the failed step the SDK points at in its
// traceback).
//
//	GET    /templates/{id}/tags                            → [{tag, buildID, createdAt}]
//	POST   /templates/tags {target: "name:tag", tags}      → {buildID, tags}
//	DELETE /templates/tags {name, tags}

// pendingTTL is how long a requested build waits for its start, and an
// uploaded file for a build that uses it.
const pendingTTL = time.Hour

// e2bBuild is a build the SDK asked for: waiting for its start, then the
// evalbox build it became.
type e2bBuild struct {
	team, name string
	id         string   // the evalbox build's, handed out at the request
	tags       []string // nil: the default
	cpu        float64
	memoryMB   int
	created    time.Time

	started bool
	// stepMap[i] is the E2B step (1-based; 0: evalbox's, before them)
	// of the spec's step i+1.
	stepMap  []int
	starting bool // a start is being checked
	// logLines and logOff: where the log's line logLines starts, so that
	// each poll reads only what is new.
	logLines int
	logOff   int64
}

// maxPendingBuilds bounds a team's builds requested and not started.
const maxPendingBuilds = 64

// builds holds the requested builds, by E2B build ID.
type builds struct {
	mu sync.Mutex
	m  map[string]*e2bBuild
}

func (b *builds) put(id string, e *e2bBuild) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[string]*e2bBuild{}
	}
	now := time.Now()
	pending := 0
	for k, v := range b.m {
		switch {
		case !v.started && now.Sub(v.created) > pendingTTL:
			delete(b.m, k) // never started
		case now.Sub(v.created) > 7*24*time.Hour:
			delete(b.m, k)
		case !v.started && v.team == e.team:
			pending++
		}
	}
	if pending >= maxPendingBuilds {
		return apierr.Errorf(client.CodeRateLimited, "the team has %d template builds requested and not started", pending)
	}
	b.m[id] = e
	return nil
}

func (b *builds) get(team, name, id string) (*e2bBuild, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.m[id]
	if !ok || e.team != team || e.name != name {
		return nil, false
	}
	return e, true
}

// templateRef maps an E2B template reference ("name", "name:tag" or
// "name:<build ID>") to evalbox's name and tag (a build ID as its evalbox
// id; DefaultTag for none).
func templateRef(ref string) (name, tag string, err error) {
	name, tag = template.SplitRef(ref)
	if t, ok := templateAliases[name]; ok {
		name = t
	}
	if id, ok := evalboxBuildID(tag); ok {
		tag = id
	}
	if !template.ValidName(name) {
		return "", "", errorf(client.CodeBadRequest, "template name %q: want 1–63 of a-z 0-9 . _ -, starting with a letter or digit (an evalbox template name)", ref)
	}
	if !template.ValidTag(tag) {
		return "", "", errorf(client.CodeBadRequest, "tag of %q: want 1–128 of A-Z a-z 0-9 . _ -, starting with a letter or digit", ref)
	}
	return name, tag, nil
}

// templateName is the evalbox name of an E2B reference that may only
// name the default tag.
func templateName(ref string) (string, error) {
	name, tag, err := templateRef(ref)
	if err == nil && tag != template.DefaultTag {
		err = errorf(client.CodeNotImplemented, "template %q: only a template's default tag can be named here", ref)
	}
	return name, err
}

// evalboxRef is the evalbox form of an E2B template reference.
func evalboxRef(name, tag string) string {
	if tag == template.DefaultTag {
		return name
	}
	return name + ":" + tag
}

// e2bRef is the E2B form of an evalbox template reference: a build id
// as its UUID.
func e2bRef(ref string) string {
	name, tag, ok := strings.Cut(ref, ":")
	if !ok {
		return ref
	}
	if u := e2bBuildID(tag); u != "" {
		tag = u
	}
	return name + ":" + tag
}

// registerTemplates adds the template routes.
func (h *Handler) registerTemplates(mux *http.ServeMux) {
	a := h.authed
	mux.HandleFunc("POST /v3/templates", a(h.requestBuild))
	mux.HandleFunc("GET /templates/{id}/files/{hash}", a(h.fileUploadLink))
	mux.HandleFunc("PUT "+uploadPath+"{team}/{hash}", h.uploadFile)
	mux.HandleFunc("POST /v2/templates/{id}/builds/{bid}", a(h.startBuild))
	mux.HandleFunc("GET /templates/{id}/builds/{bid}/status", a(h.buildStatus))
	// GET /templates/aliases/{alias} and GET /templates/{id}/tags: one
	// pattern, since "aliases" could be a template's ID.
	mux.HandleFunc("GET /templates/{id}/{sub}", a(h.templateAliasOrTags))
	mux.HandleFunc("GET /templates", a(h.listTemplates))
	mux.HandleFunc("DELETE /templates/{id}", a(h.deleteTemplate))
	mux.HandleFunc("POST /templates/tags", a(h.assignTags))
	mux.HandleFunc("DELETE /templates/tags", a(h.removeTags))
}

// templatesOff answers when the server has no template builds.
func (h *Handler) templatesOff(w http.ResponseWriter) bool {
	if h.cfg.NoBuilds != "" {
		h.writeError(w, errorf(client.CodeNotImplemented, "%s", h.cfg.NoBuilds))
		return true
	}
	if h.cfg.Templates == nil {
		h.writeError(w, errorf(client.CodeNotImplemented, "this server has no template catalog"))
		return true
	}
	return false
}

type buildRequest struct {
	Name     string   `json:"name"`
	Alias    string   `json:"alias"`
	Tags     []string `json:"tags"`
	CPUCount *float64 `json:"cpuCount"`
	MemoryMB *int     `json:"memoryMB"`
}

type buildRequested struct {
	TemplateID string   `json:"templateID"`
	BuildID    string   `json:"buildID"`
	Public     bool     `json:"public"`
	Names      []string `json:"names"`
	Tags       []string `json:"tags"`
	Aliases    []string `json:"aliases"`
}

// requestBuild is POST /v3/templates: a build of the template, to be
// started once its files are uploaded.
func (h *Handler) requestBuild(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if h.templatesOff(w) {
		return
	}
	var req buildRequest
	if err := decode(w, r, &req); err != nil {
		h.writeError(w, err)
		return
	}
	ref := firstNonEmpty(req.Name, req.Alias)
	if ref == "" {
		h.writeError(w, errorf(client.CodeBadRequest, "name is required"))
		return
	}
	name, tag, err := templateRef(ref)
	if err != nil {
		h.writeError(w, err)
		return
	}
	tags := req.Tags
	if strings.Contains(ref, ":") {
		tags = append([]string{tag}, tags...)
	}
	for _, t := range tags {
		if !template.ValidTag(t) {
			h.writeError(w, errorf(client.CodeBadRequest, "tag %q: want 1–128 of A-Z a-z 0-9 . _ -, starting with a letter or digit", t))
			return
		}
		if _, ok := evalboxBuildID(t); ok || strings.HasPrefix(t, "bld_") {
			h.writeError(w, errorf(client.CodeBadRequest, "tag %q: a build ID cannot be a tag", t))
			return
		}
	}
	// Refused now, before the SDK uploads its files.
	if !template.ValidName(name) {
		h.writeError(w, errorf(client.CodeBadRequest, "template name %q: want 1–63 of a-z 0-9 . _ -, starting with a letter or digit", ref))
		return
	}
	if template.ReservedName(name) {
		h.writeError(w, errorf(client.CodeBadRequest, "%s is a built-in template or a reserved name; choose another name", ref))
		return
	}
	id, uuid := newBuild()
	e := &e2bBuild{team: p.TeamID, name: name, id: id, tags: tags, created: time.Now()}
	if req.CPUCount != nil {
		if *req.CPUCount <= 0 {
			h.writeError(w, errorf(client.CodeBadRequest, "cpuCount %g: want a positive number", *req.CPUCount))
			return
		}
		e.cpu = *req.CPUCount
	}
	if req.MemoryMB != nil {
		if *req.MemoryMB <= 0 {
			h.writeError(w, errorf(client.CodeBadRequest, "memoryMB %d: want a positive number", *req.MemoryMB))
			return
		}
		e.memoryMB = *req.MemoryMB
	}
	if err := h.builds.put(uuid, e); err != nil {
		h.writeError(w, err)
		return
	}
	shown := tags
	if len(shown) == 0 {
		shown = []string{template.DefaultTag}
	}
	writeJSON(w, http.StatusAccepted, buildRequested{TemplateID: name, BuildID: uuid, Names: []string{name},
		Tags: shown, Aliases: []string{name}})
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// buildStart is the body of POST /v2/templates/{id}/builds/{bid}.
type buildStart struct {
	FromImage         string      `json:"fromImage"`
	FromTemplate      string      `json:"fromTemplate"`
	FromImageRegistry any         `json:"fromImageRegistry"`
	Force             bool        `json:"force"`
	Steps             []buildStep `json:"steps"`
	StartCmd          string      `json:"startCmd"`
	ReadyCmd          string      `json:"readyCmd"`
}

type buildStep struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash"`
	Force     bool     `json:"force"`
}

// startBuild is POST /v2/templates/{id}/builds/{bid}: the build runs.
func (h *Handler) startBuild(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if h.templatesOff(w) {
		return
	}
	e, ok := h.builds.get(p.TeamID, r.PathValue("id"), r.PathValue("bid"))
	if !ok {
		h.writeError(w, errorf(client.CodeNotFound, "build %s of template %s not found", r.PathValue("bid"), r.PathValue("id")))
		return
	}
	var req buildStart
	if err := decode(w, r, &req); err != nil {
		h.writeError(w, err)
		return
	}
	h.builds.mu.Lock()
	busy := e.started || e.starting
	e.starting = !busy
	h.builds.mu.Unlock()
	if busy {
		h.writeError(w, errorf(client.CodeConflict, "build %s has started already", r.PathValue("bid")))
		return
	}
	defer func() {
		h.builds.mu.Lock()
		e.starting = false
		h.builds.mu.Unlock()
	}()
	spec, stepMap, hashes, err := h.translateBuild(r.Context(), p.TeamID, e, req)
	if err != nil {
		h.writeError(w, err)
		return
	}
	var ctxTar io.Reader
	if len(hashes) > 0 {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(h.files.writeContext(pw, p.TeamID, hashes)) }()
		defer pr.Close()
		ctxTar = pr
	}
	if _, err := h.cfg.Templates.Build(r.Context(), p.TeamID, e.name, spec, ctxTar, catalog.BuildOptions{ID: e.id, Tags: e.tags}); err != nil {
		h.writeError(w, err)
		return
	}
	h.builds.mu.Lock()
	e.started, e.stepMap = true, stepMap
	h.builds.mu.Unlock()
	w.WriteHeader(http.StatusAccepted)
}

// translateBuild writes the evalbox spec of an E2B build, the E2B step of
// each of its steps, and the files hashes its context needs.
func (h *Handler) translateBuild(ctx context.Context, team string, e *e2bBuild, req buildStart) (client.TemplateSpec, []int, []string, error) {
	var spec client.TemplateSpec
	if req.FromImageRegistry != nil {
		return spec, nil, nil, errorf(client.CodeNotImplemented, "fromImageRegistry: evalbox pulls no images from registries here; import the image (evalbox template import) and name it in fromImage")
	}
	from, err := h.resolveFrom(ctx, team, req.FromImage, req.FromTemplate)
	if err != nil {
		return spec, nil, nil, err
	}
	spec = client.TemplateSpec{From: from.Name, CPU: e.cpu, MemoryMB: e.memoryMB, StartCmd: req.StartCmd}
	if req.ReadyCmd != "" {
		spec.ReadyCmd = readyLoop(req.ReadyCmd)
	}
	user, workdir := firstNonEmpty(from.User, "root"), firstNonEmpty(from.Workdir, "/")
	var stepMap []int
	var hashes []string
	add := func(i int, st client.TemplateStep) {
		spec.Steps = append(spec.Steps, st)
		stepMap = append(stepMap, i)
	}
	for n, st := range req.Steps {
		i := n + 1
		bad := func(format string, a ...any) error {
			return errorf(client.CodeBadRequest, "step %d (%s): %s", i, st.Type, fmt.Sprintf(format, a...))
		}
		switch strings.ToUpper(st.Type) {
		case "RUN":
			if len(st.Args) < 1 || strings.TrimSpace(st.Args[0]) == "" {
				return spec, nil, nil, bad("want a command")
			}
			if len(st.Args) > 1 && st.Args[1] != "" && st.Args[1] != user {
				add(i, client.TemplateStep{User: st.Args[1]})
				add(i, client.TemplateStep{Run: st.Args[0]})
				add(i, client.TemplateStep{User: user})
			} else {
				add(i, client.TemplateStep{Run: st.Args[0]})
			}
		case "ENV":
			if len(st.Args) == 0 || len(st.Args)%2 != 0 {
				return spec, nil, nil, bad("want name, value pairs")
			}
			env := map[string]string{}
			for j := 0; j < len(st.Args); j += 2 {
				env[st.Args[j]] = st.Args[j+1]
			}
			add(i, client.TemplateStep{Env: env})
		case "WORKDIR":
			if len(st.Args) != 1 || st.Args[0] == "" {
				return spec, nil, nil, bad("want a directory")
			}
			d := st.Args[0]
			if !path.IsAbs(d) {
				d = path.Join(workdir, d) // as E2B: relative to the current one
			}
			workdir = path.Clean(d)
			add(i, client.TemplateStep{Workdir: workdir})
		case "USER":
			if len(st.Args) != 1 || st.Args[0] == "" {
				return spec, nil, nil, bad("want a user")
			}
			user = st.Args[0]
			add(i, client.TemplateStep{User: user})
		case "COPY":
			if len(st.Args) < 2 {
				return spec, nil, nil, bad("want a source and a destination")
			}
			if !validHash(st.FilesHash) {
				return spec, nil, nil, bad("filesHash %q: want the SDK's hex hash of the files", st.FilesHash)
			}
			if !h.files.present(team, st.FilesHash) {
				return spec, nil, nil, bad("its files (hash %s) were not uploaded, or were dropped (uploads are kept %s)", st.FilesHash, pendingTTL)
			}
			if !slices.Contains(hashes, st.FilesHash) {
				hashes = append(hashes, st.FilesHash)
			}
			c := &client.CopyStep{Src: path.Join(st.FilesHash, globBase(st.Args[0])), Dst: st.Args[1]}
			// E2B's files are the current user's unless an owner is given.
			if len(st.Args) > 2 && st.Args[2] != "" {
				c.Owner = st.Args[2]
			} else if user != "root" && user != "0" {
				c.Owner = user
			}
			if len(st.Args) > 3 {
				c.Mode = st.Args[3]
			}
			add(i, client.TemplateStep{Copy: c})
		default:
			return spec, nil, nil, bad("evalbox does not know this step type (want RUN, COPY, ENV, WORKDIR or USER)")
		}
	}
	// Every E2B template has the user "user" (the SDKs' Dockerfile
	// builds end with USER user): a build that names it gets it.
	if usesE2BUser(spec.Steps) {
		first := []client.TemplateStep{{Run: addE2BUser}}
		if u := firstNonEmpty(from.User, "root"); u != "root" && u != "0" {
			first = []client.TemplateStep{{User: "root"}, {Run: addE2BUser}, {User: u}}
		}
		spec.Steps = append(first, spec.Steps...)
		stepMap = append(make([]int, len(first)), stepMap...) // E2B's step 0: its base
	}
	return spec, stepMap, hashes, nil
}

// addE2BUser makes E2B's default user where the template lacks it.
const addE2BUser = "id -u user >/dev/null 2>&1 || useradd -m -s /bin/bash user 2>/dev/null || useradd -m user 2>/dev/null || adduser -D user"

func usesE2BUser(steps []client.TemplateStep) bool {
	for _, st := range steps {
		if st.User == "user" || (st.Copy != nil && (st.Copy.Owner == "user" || strings.HasPrefix(st.Copy.Owner, "user:"))) {
			return true
		}
	}
	return false
}

// readyLoop runs an E2B ready command until it succeeds, as E2B does (its
// helpers, such as wait_for_port, check once), for at most 120 s.
func readyLoop(cmd string) string {
	return "i=0; until ( " + cmd + "\n) >/dev/null 2>&1; do i=$((i+1)); if [ $i -ge 1200 ]; then echo 'the ready command did not succeed within 120 s' >&2; exit 1; fi; sleep 0.1; done"
}

// globBase is the part of a COPY source before its first glob (the SDK
// sends the files a glob matched, under their paths).
func globBase(src string) string {
	var kept []string
	for _, c := range strings.Split(path.Clean(src), "/") {
		if strings.ContainsAny(c, "*?[{") {
			break
		}
		kept = append(kept, c)
	}
	if len(kept) == 0 {
		return "."
	}
	return path.Join(kept...)
}

// resolveFrom finds the template a build starts from: fromTemplate names
// one; fromImage names a template, or an image the team imported.
func (h *Handler) resolveFrom(ctx context.Context, team, image, tmpl string) (client.Template, error) {
	switch {
	case tmpl != "" && image != "":
		return client.Template{}, errorf(client.CodeBadRequest, "fromImage and fromTemplate: give one")
	case tmpl != "":
		name, tag, err := templateRef(tmpl)
		if err != nil {
			return client.Template{}, err
		}
		t, err := h.cfg.Templates.Get(ctx, team, evalboxRef(name, tag))
		if err != nil {
			return client.Template{}, errorf(client.CodeBadRequest, "fromTemplate %q: no such template", tmpl)
		}
		return t, nil
	case image == "":
		return client.Template{}, errorf(client.CodeBadRequest, "fromImage or fromTemplate is required")
	}
	if name, err := templateName(image); err == nil {
		if t, err := h.cfg.Templates.Get(ctx, team, name); err == nil {
			return t, nil
		}
	}
	t, ok, err := template.ResolveImage(ctx, image, func(ctx context.Context, name string) (client.Template, error) {
		return h.cfg.Templates.Get(ctx, team, name)
	}, func(ctx context.Context) ([]client.Template, error) {
		list, err := h.cfg.Templates.List(ctx, team)
		return list.Templates, err
	})
	if err != nil {
		return client.Template{}, err
	}
	if ok {
		return t, nil
	}
	return client.Template{}, errorf(client.CodeBadRequest,
		"fromImage %q: this server pulls no images; import it first (evalbox template import --name NAME --ref %s IMAGE.tar), or start from a template (fromTemplate: base, python, node, code-interpreter or one of yours)", image, image)
}

// Build states as E2B names them.
const (
	statusWaiting  = "waiting"
	statusBuilding = "building"
	statusReady    = "ready"
	statusError    = "error"
)

type logEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
}

type statusReason struct {
	Message    string     `json:"message"`
	Step       string     `json:"step,omitempty"`
	LogEntries []logEntry `json:"logEntries,omitempty"`
}

type buildInfo struct {
	TemplateID string        `json:"templateID"`
	BuildID    string        `json:"buildID"`
	Status     string        `json:"status"`
	Logs       []string      `json:"logs"`
	LogEntries []logEntry    `json:"logEntries"`
	Reason     *statusReason `json:"reason,omitempty"`
}

// maxLogEntries is the most log entries one status answer carries (the
// SDK asks for more until it gets none).
const maxLogEntries = 100

// buildStatus is GET /templates/{id}/builds/{bid}/status: the state, and
// the log's lines from logsOffset on.
func (h *Handler) buildStatus(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if h.templatesOff(w) {
		return
	}
	name, bid := r.PathValue("id"), r.PathValue("bid")
	e, ok := h.builds.get(p.TeamID, name, bid)
	if !ok {
		// Not requested through this server since it started: a build of
		// the catalog's, if the ID is one's.
		id, isOurs := evalboxBuildID(bid)
		if !isOurs {
			h.writeError(w, errorf(client.CodeNotFound, "build %s of template %s not found", bid, name))
			return
		}
		e = &e2bBuild{team: p.TeamID, name: name, id: id, started: true}
	}
	offset, limit := 0, maxLogEntries
	for k, dst := range map[string]*int{"logsOffset": &offset, "limit": &limit} {
		if v := r.URL.Query().Get(k); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				h.writeError(w, errorf(client.CodeBadRequest, "%s %q: want a number ≥ 0", k, v))
				return
			}
			*dst = n
		}
	}
	limit = min(limit, maxLogEntries)
	h.builds.mu.Lock()
	id, started, stepMap := e.id, e.started, e.stepMap
	h.builds.mu.Unlock()
	out := buildInfo{TemplateID: name, BuildID: bid, Status: statusWaiting, Logs: []string{}, LogEntries: []logEntry{}}
	if !started {
		writeJSON(w, http.StatusOK, out)
		return
	}
	b, err := h.cfg.Templates.GetBuild(r.Context(), p.TeamID, name, id)
	if apierr.Code(err) == client.CodeNotFound {
		err = errorf(client.CodeNotFound, "build %s of template %s not found", bid, name)
	}
	if err != nil {
		h.writeError(w, err)
		return
	}
	done := false
	switch b.State {
	case client.BuildStateQueued:
		out.Status = statusWaiting
	case client.BuildStateRunning:
		out.Status = statusBuilding
	case client.BuildStateSucceeded:
		out.Status, done = statusReady, true
	default:
		out.Status, done = statusError, true
	}
	lines, err := h.readLog(r.Context(), e, p.TeamID, name, id, offset, limit, done)
	if err != nil {
		h.writeError(w, err)
		return
	}
	now := time.Now().UTC()
	for _, l := range lines {
		out.LogEntries = append(out.LogEntries, logEntry{Timestamp: now, Level: "info", Message: l})
	}
	if out.Status == statusError {
		reason := &statusReason{Message: firstNonEmpty(b.Error, "the build failed")}
		if b.FailedStep > 0 && b.FailedStep <= len(stepMap) {
			reason.Step = "base" // evalbox's own first steps
			if n := stepMap[b.FailedStep-1]; n > 0 {
				reason.Step = strconv.Itoa(n)
			}
		} else if strings.Contains(b.Error, "ready_cmd") {
			reason.Step = "finalize"
		}
		out.Reason = reason
	}
	writeJSON(w, http.StatusOK, out)
}

// maxLogLine is the longest log line an entry carries (the rest is cut).
const maxLogLine = 16 << 10

// readLog returns up to limit whole lines of a build's log after the
// first offset (a running build's last line only once it ends). Where the
// last answer ended is kept: a poll reads what is new, not the whole log.
func (h *Handler) readLog(ctx context.Context, e *e2bBuild, team, name, id string, offset, limit int, done bool) ([]string, error) {
	f, err := h.cfg.Templates.OpenLog(ctx, team, name, id)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	line0, off := 0, int64(0)
	h.builds.mu.Lock()
	if s, ok := f.(io.Seeker); ok && e.logLines > 0 && e.logLines <= offset {
		if _, err := s.Seek(e.logOff, io.SeekStart); err == nil {
			line0, off = e.logLines, e.logOff
		}
	}
	h.builds.mu.Unlock()
	br := bufio.NewReaderSize(f, maxLogLine)
	var out []string
	n := line0
	for len(out) < limit {
		line, long, err := readLine(br)
		if err == io.EOF && (line == "" || !done) {
			break
		}
		if err != nil && err != io.EOF {
			return nil, err
		}
		off += long
		if n >= offset {
			out = append(out, line)
		}
		n++
		if err == io.EOF {
			break
		}
	}
	h.builds.mu.Lock()
	if n > e.logLines {
		e.logLines, e.logOff = n, off
	}
	h.builds.mu.Unlock()
	return out, nil
}

// readLine reads one line (without its end), at most maxLogLine bytes of
// it kept, and how many bytes it took; io.EOF with a line that has no end.
func readLine(br *bufio.Reader) (string, int64, error) {
	var kept []byte
	var took int64
	for {
		chunk, err := br.ReadSlice('\n')
		took += int64(len(chunk))
		if room := maxLogLine - len(kept); room > 0 {
			kept = append(kept, chunk[:min(len(chunk), room)]...)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		return strings.TrimRight(string(kept), "\r\n"), took, err
	}
}

type aliasInfo struct {
	TemplateID string `json:"templateID"`
	Public     bool   `json:"public"`
}

// templateAliasOrTags routes GET /templates/aliases/{alias} and GET
// /templates/{id}/tags.
func (h *Handler) templateAliasOrTags(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	switch id, sub := r.PathValue("id"), r.PathValue("sub"); {
	case id == "aliases":
		h.templateAlias(w, r, p, sub)
	case sub == "tags":
		h.templateTags(w, r, p, id)
	default:
		h.writeError(w, errorf(client.CodeNotFound, "no route %s %s", r.Method, r.URL.Path))
	}
}

// templateAlias is GET /templates/aliases/{alias}: whether the team has
// the template (Template.exists).
func (h *Handler) templateAlias(w http.ResponseWriter, r *http.Request, p auth.Principal, alias string) {
	if h.cfg.Templates == nil {
		h.templatesOff(w)
		return
	}
	name, err := templateName(alias)
	if err != nil {
		h.writeError(w, err)
		return
	}
	if template.IsBuiltin(name) {
		if _, err := h.cfg.Templates.Get(r.Context(), p.TeamID, name); err != nil {
			h.writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, aliasInfo{TemplateID: name, Public: true})
		return
	}
	// A name that has tags and no default exists too.
	if _, err := h.cfg.Templates.Tags(r.Context(), p.TeamID, name); err != nil {
		h.writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, aliasInfo{TemplateID: name})
}

type tagInfo struct {
	Tag       string    `json:"tag"`
	BuildID   string    `json:"buildID"`
	CreatedAt time.Time `json:"createdAt"`
}

// templateTags is GET /templates/{id}/tags (Template.get_tags).
func (h *Handler) templateTags(w http.ResponseWriter, r *http.Request, p auth.Principal, id string) {
	if h.cfg.Templates == nil {
		h.templatesOff(w)
		return
	}
	name, err := templateName(id)
	if err != nil {
		h.writeError(w, err)
		return
	}
	tags, err := h.cfg.Templates.Tags(r.Context(), p.TeamID, name)
	if err != nil {
		h.writeError(w, err)
		return
	}
	out := make([]tagInfo, 0, len(tags))
	for _, t := range tags {
		out = append(out, tagInfo{Tag: t.Tag, BuildID: e2bBuildID(t.BuildID), CreatedAt: t.CreatedAt})
	}
	writeJSON(w, http.StatusOK, out)
}

type assignTagsRequest struct {
	Target string   `json:"target"`
	Tags   []string `json:"tags"`
}

type assignedTags struct {
	BuildID string   `json:"buildID"`
	Tags    []string `json:"tags"`
}

// assignTags is POST /templates/tags (Template.assign_tags): the tags take
// the build target ("name:tag") names.
func (h *Handler) assignTags(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if h.templatesOff(w) {
		return
	}
	var req assignTagsRequest
	if err := decode(w, r, &req); err != nil {
		h.writeError(w, err)
		return
	}
	if req.Target == "" || len(req.Tags) == 0 {
		h.writeError(w, errorf(client.CodeBadRequest, "target and tags are required"))
		return
	}
	name, tag, err := templateRef(req.Target)
	if err != nil {
		h.writeError(w, err)
		return
	}
	id, err := h.cfg.Templates.Tag(r.Context(), p.TeamID, name, evalboxRef(name, tag), req.Tags)
	if err != nil {
		h.writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, assignedTags{BuildID: e2bBuildID(id), Tags: req.Tags})
}

type removeTagsRequest struct {
	Name string   `json:"name"`
	Tags []string `json:"tags"`
}

// removeTags is DELETE /templates/tags (Template.remove_tags).
func (h *Handler) removeTags(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if h.templatesOff(w) {
		return
	}
	var req removeTagsRequest
	if err := decode(w, r, &req); err != nil {
		h.writeError(w, err)
		return
	}
	if req.Name == "" || len(req.Tags) == 0 {
		h.writeError(w, errorf(client.CodeBadRequest, "name and tags are required"))
		return
	}
	name, err := templateName(req.Name)
	if err != nil {
		h.writeError(w, err)
		return
	}
	if err := h.cfg.Templates.Untag(r.Context(), p.TeamID, name, req.Tags); err != nil {
		h.writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

type listedTemplate struct {
	TemplateID  string    `json:"templateID"`
	BuildID     string    `json:"buildID"`
	CPUCount    float64   `json:"cpuCount"`
	MemoryMB    int       `json:"memoryMB"`
	DiskSizeMB  int       `json:"diskSizeMB"`
	Public      bool      `json:"public"`
	Aliases     []string  `json:"aliases"`
	Names       []string  `json:"names"`
	CreatedAt   time.Time `json:"createdAt"`
	UpdatedAt   time.Time `json:"updatedAt"`
	CreatedBy   any       `json:"createdBy"`
	LastSpawned any       `json:"lastSpawnedAt"`
	SpawnCount  int       `json:"spawnCount"`
	BuildCount  int       `json:"buildCount"`
	EnvdVersion string    `json:"envdVersion"`
	BuildStatus string    `json:"buildStatus"`
}

// listTemplates is GET /templates: the built-ins and the team's.
func (h *Handler) listTemplates(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if h.cfg.Templates == nil {
		h.templatesOff(w)
		return
	}
	list, err := h.cfg.Templates.List(r.Context(), p.TeamID)
	if err != nil {
		h.writeError(w, err)
		return
	}
	out := make([]listedTemplate, 0, len(list.Templates))
	seen := map[string]bool{}
	for _, t := range list.Templates {
		// One entry per template: its default tag's, else its first tag's
		// (the list is by name, "name" before "name:tag").
		t.Name, _ = template.SplitRef(t.Name)
		if seen[t.Name] {
			continue
		}
		seen[t.Name] = true
		names := []string{t.Name}
		for alias, name := range templateAliases {
			if name == t.Name {
				names = append(names, alias)
			}
		}
		out = append(out, listedTemplate{TemplateID: t.Name, BuildID: firstNonEmpty(e2bBuildID(t.BuildID), t.Digest), CPUCount: t.CPU, MemoryMB: t.MemoryMB,
			DiskSizeMB: t.DiskMB, Public: t.Source == "builtin", Aliases: names, Names: names, CreatedAt: t.BuiltAt, UpdatedAt: t.BuiltAt,
			BuildCount: 1, EnvdVersion: EnvdVersion, BuildStatus: statusReady})
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteTemplate is DELETE /templates/{id}.
func (h *Handler) deleteTemplate(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if id := r.PathValue("id"); isSnapshotID(id) {
		// Sandbox.delete_snapshot: a snapshot is deleted as a template.
		if err := h.cfg.Sandboxes.DeleteSnapshot(r.Context(), p.TeamID, id); err != nil {
			h.writeError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if h.cfg.Templates == nil {
		h.templatesOff(w)
		return
	}
	name, tag, err := templateRef(r.PathValue("id"))
	if err != nil {
		h.writeError(w, err)
		return
	}
	if err := h.cfg.Templates.Delete(r.Context(), p.TeamID, evalboxRef(name, tag)); err != nil {
		h.writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
