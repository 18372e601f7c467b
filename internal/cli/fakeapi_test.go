package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// fakeAPI is an in-memory stand-in for the evalbox server, enough to drive
// the CLI: it follows api/openapi.yaml for the routes the CLI uses. Its
// "sandboxes" run a tiny command language (see exec).
type fakeAPI struct {
	t   *testing.T
	srv *httptest.Server

	mu        sync.Mutex
	next      int
	sandboxes map[string]*client.Sandbox
	files     map[string]fakeFile // "id:path"
	lastReq   *http.Request
	lastBody  []byte
	signals   []string
	killed    []string
	teams     map[string]*client.Team
}

type fakeFile struct {
	data []byte
	mode string
	dir  bool
}

var fakeNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

const fakeKey = "k-test"

func newFakeAPI(t *testing.T) *fakeAPI {
	f := &fakeAPI{
		t:         t,
		sandboxes: map[string]*client.Sandbox{},
		files:     map[string]fakeFile{},
		teams:     map[string]*client.Team{},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, r *http.Request) {
		reply(w, 200, client.Health{Status: "ok", Version: "test", Runtimes: []string{"gvisor", "namespaces"}})
	})
	mux.HandleFunc("GET /v1/capacity", func(w http.ResponseWriter, r *http.Request) {
		reply(w, 200, client.Capacity{Pids: client.CapacityAmount{Budget: 28672, Reserved: 1280, Free: 27392},
			MemoryMB:          client.CapacityAmount{Budget: 43392, Reserved: 1632, Free: 41760},
			MemoryAvailableMB: 23000, MemoryReserveMB: 2410, Sandboxes: 1})
	})
	mux.HandleFunc("POST /v1/sandboxes", f.create)
	mux.HandleFunc("GET /v1/sandboxes", f.list)
	mux.HandleFunc("DELETE /v1/sandboxes", f.bulkDelete)
	mux.HandleFunc("GET /v1/sandboxes/{id}", f.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *client.Sandbox) {
		reply(w, 200, sb)
	}))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", f.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *client.Sandbox) {
		f.mu.Lock()
		sb.State = client.StateDeleted
		f.mu.Unlock()
		w.WriteHeader(204)
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/timeout", f.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *client.Sandbox) {
		var req client.SetTimeoutRequest
		if !decode(w, r, &req) {
			return
		}
		f.mu.Lock()
		sb.ExpiresAt = fakeNow.Add(time.Duration(req.Timeout) * time.Second)
		cp := *sb
		f.mu.Unlock()
		reply(w, 200, cp)
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", f.withSandbox(f.exec))
	mux.HandleFunc("GET /v1/sandboxes/{id}/processes", f.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *client.Sandbox) {
		reply(w, 200, client.ProcessList{Processes: []client.Process{
			{ID: "p-1", Pid: 42, Argv: []string{"python3", "server.py"}, Tag: "web", StartedAt: fakeNow, Running: true},
			{ID: "p-2", Pid: 43, Argv: []string{"false"}, StartedAt: fakeNow, Result: &client.ExecResult{Status: client.StatusExited, ExitCode: 1}},
		}})
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/processes/{pid}/signal", f.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *client.Sandbox) {
		var req client.SignalRequest
		if !decode(w, r, &req) {
			return
		}
		f.mu.Lock()
		f.signals = append(f.signals, r.PathValue("pid")+":"+req.Signal)
		f.mu.Unlock()
		w.WriteHeader(204)
	}))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}/processes/{pid}", f.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *client.Sandbox) {
		f.mu.Lock()
		f.killed = append(f.killed, r.PathValue("pid"))
		f.mu.Unlock()
		w.WriteHeader(204)
	}))
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files", f.withSandbox(f.writeFile))
	mux.HandleFunc("GET /v1/sandboxes/{id}/files", f.withSandbox(f.readFile))
	mux.HandleFunc("GET /v1/sandboxes/{id}/files/stat", f.withSandbox(f.statFile))
	mux.HandleFunc("POST /v1/keys", func(w http.ResponseWriter, r *http.Request) {
		var req client.CreateKeyRequest
		if !decode(w, r, &req) {
			return
		}
		team := req.TeamID
		if team == "" {
			team = "team-1"
		}
		reply(w, 201, client.APIKey{ID: "key-9", TeamID: team, Name: req.Name, Prefix: "ebx_abcd", CreatedAt: fakeNow, Key: "ebx_abcdSECRET"})
	})
	mux.HandleFunc("GET /v1/keys", func(w http.ResponseWriter, r *http.Request) {
		revoked := fakeNow.Add(time.Hour)
		reply(w, 200, client.KeyList{Keys: []client.APIKey{
			{ID: "key-1", TeamID: "team-1", Name: "admin", Prefix: "ebx_0000", Admin: true, CreatedAt: fakeNow},
			{ID: "key-2", TeamID: "team-1", Name: "old ci", Prefix: "ebx_1111", CreatedAt: fakeNow, RevokedAt: &revoked},
		}})
	})
	mux.HandleFunc("DELETE /v1/keys/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != "key-2" {
			replyErr(w, 404, client.CodeNotFound, "key "+r.PathValue("id")+" not found")
			return
		}
		w.WriteHeader(204)
	})
	mux.HandleFunc("POST /v1/teams", func(w http.ResponseWriter, r *http.Request) {
		var req client.CreateTeamRequest
		if !decode(w, r, &req) {
			return
		}
		lim := client.Limits{MaxSandboxes: 100, MaxConcurrentExec: 64}
		if req.Limits != nil {
			lim = *req.Limits
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		t := &client.Team{ID: "team-" + strconv.Itoa(len(f.teams)+2), Name: req.Name, CreatedAt: fakeNow, Limits: lim}
		f.teams[t.ID] = t
		reply(w, 201, t)
	})
	mux.HandleFunc("GET /v1/teams", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		l := client.TeamList{Teams: []client.Team{}}
		for _, id := range slices.Sorted(maps.Keys(f.teams)) {
			l.Teams = append(l.Teams, *f.teams[id])
		}
		reply(w, 200, l)
	})
	mux.HandleFunc("GET /v1/teams/{id}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		t, ok := f.teams[r.PathValue("id")]
		if !ok {
			replyErr(w, 404, client.CodeNotFound, "team not found")
			return
		}
		reply(w, 200, t)
	})
	mux.HandleFunc("PATCH /v1/teams/{id}", func(w http.ResponseWriter, r *http.Request) {
		var req client.UpdateTeamRequest
		if !decode(w, r, &req) {
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		t, ok := f.teams[r.PathValue("id")]
		if !ok {
			replyErr(w, 404, client.CodeNotFound, "team not found")
			return
		}
		t.Limits = req.Limits
		reply(w, 200, t)
	})
	mux.HandleFunc("GET /v1/templates", func(w http.ResponseWriter, r *http.Request) {
		reply(w, 200, client.TemplateList{Templates: []client.Template{
			{Name: "base", Digest: "sha256:0123456789abcdef0123", SizeBytes: 50 << 20, BuiltAt: fakeNow, CPU: 1, MemoryMB: 512, DiskMB: 1024, Workdir: "/work", User: "user", Source: client.TemplateSourceBuiltin},
			{Name: "python", Digest: "sha256:fedcba9876543210fedc", SizeBytes: 3 << 30, BuiltAt: fakeNow, CPU: 0.5, MemoryMB: 1024, DiskMB: 2048, Workdir: "/work", User: "user", Source: client.TemplateSourceBuild},
		}, DiskUsageBytes: 5 << 30})
	})
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/health" && r.Header.Get("Authorization") != "Bearer "+fakeKey {
			replyErr(w, 401, client.CodeUnauthorized, "invalid API key")
			return
		}
		f.mu.Lock()
		f.lastReq = r.Clone(r.Context())
		f.mu.Unlock()
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", client.ContentTypeJSON)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func replyErr(w http.ResponseWriter, status int, code, msg string) {
	reply(w, status, client.ErrorBody{Error: client.ErrorDetail{Code: code, Message: msg}})
}

// decode reads a JSON body strictly, like the real server.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		replyErr(w, 400, client.CodeBadRequest, "bad body: "+err.Error())
		return false
	}
	return true
}

func (f *fakeAPI) withSandbox(h func(http.ResponseWriter, *http.Request, *client.Sandbox)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		sb, ok := f.sandboxes[r.PathValue("id")]
		f.mu.Unlock()
		if !ok {
			replyErr(w, 404, client.CodeNotFound, "sandbox "+r.PathValue("id")+" not found")
			return
		}
		if sb.State != client.StateRunning && r.Method != http.MethodGet {
			replyErr(w, 409, client.CodeSandboxNotRunning, "sandbox "+sb.ID+" is "+sb.State)
			return
		}
		h(w, r, sb)
	}
}

func (f *fakeAPI) create(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req client.CreateSandboxRequest
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		replyErr(w, 400, client.CodeBadRequest, err.Error())
		return
	}
	if req.Template != "base" && req.Template != "python" {
		replyErr(w, 404, client.CodeNotFound, "template "+req.Template+" not found")
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastBody = body
	f.next++
	sb := &client.Sandbox{
		ID: fmt.Sprintf("sb-%d", f.next), TeamID: "team-1", Template: req.Template, Runtime: cmpOr(req.Runtime, client.RuntimeGVisor),
		State: client.StateRunning, CPU: 1, MemoryMB: 512, DiskMB: 1024, Network: cmpOr(req.Network.Mode, client.NetworkNone),
		Metadata: cmpOrMap(req.Metadata), CreatedAt: fakeNow.Add(time.Duration(f.next) * time.Second),
		ExpiresAt: fakeNow.Add(time.Duration(f.next)*time.Second + 300*time.Second),
	}
	for k := range req.Env {
		sb.EnvKeys = append(sb.EnvKeys, k)
	}
	f.sandboxes[sb.ID] = sb
	reply(w, 201, sb)
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func cmpOrMap(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

func matches(sb *client.Sandbox, r *http.Request) bool {
	for k, v := range r.URL.Query() {
		if key, ok := strings.CutPrefix(k, "metadata."); ok && sb.Metadata[key] != v[0] {
			return false
		}
	}
	return true
}

func (f *fakeAPI) list(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	all := r.URL.Query().Get("state") == "all"
	l := client.SandboxList{Sandboxes: []client.Sandbox{}}
	for _, id := range slices.Sorted(maps.Keys(f.sandboxes)) {
		sb := f.sandboxes[id]
		if (all || sb.State == client.StateRunning) && matches(sb, r) {
			l.Sandboxes = append(l.Sandboxes, *sb)
		}
	}
	reply(w, 200, l)
}

func (f *fakeAPI) bulkDelete(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	hasFilter := false
	for k := range r.URL.Query() {
		hasFilter = hasFilter || strings.HasPrefix(k, "metadata.")
	}
	if !hasFilter {
		replyErr(w, 400, client.CodeBadRequest, "a metadata filter is required")
		return
	}
	res := client.DeleteResult{Deleted: []string{}}
	for _, id := range slices.Sorted(maps.Keys(f.sandboxes)) {
		sb := f.sandboxes[id]
		if sb.State == client.StateRunning && matches(sb, r) {
			sb.State = client.StateDeleted
			res.Deleted = append(res.Deleted, id)
		}
	}
	reply(w, 200, res)
}

// exec runs the fake command language:
//
//	echo ARGS…     prints ARGS to stdout
//	fail CODE MSG  prints MSG to stderr, exits CODE
//	sleep          prints "partial" then times out
//	killed SIG     is killed by signal SIG
//	cat            copies stdin to stdout
//	env            prints its env, sorted, and cwd/user
//	flood          stdout truncated
func (f *fakeAPI) exec(w http.ResponseWriter, r *http.Request, sb *client.Sandbox) {
	var req client.ExecRequest
	if !decode(w, r, &req) {
		return
	}
	argv := req.Argv
	if req.Cmd != "" {
		argv = []string{"echo", "sh -c " + req.Cmd}
	}
	res := client.ExecResult{Status: client.StatusExited, DurationMs: 5}
	switch argv[0] {
	case "echo":
		res.Stdout = strings.Join(argv[1:], " ") + "\n"
	case "fail":
		res.ExitCode, _ = strconv.Atoi(argv[1])
		res.Stderr = argv[2] + "\n"
	case "sleep":
		res.Stdout, res.Status, res.ExitCode = "partial\n", client.StatusTimedOut, -1
	case "killed":
		res.Signal, _ = strconv.Atoi(argv[1])
		res.Status, res.ExitCode = client.StatusKilled, -1
	case "cat":
		if req.Stdin != nil {
			res.Stdout = *req.Stdin
		}
	case "env":
		for _, k := range slices.Sorted(maps.Keys(req.Env)) {
			res.Stdout += k + "=" + req.Env[k] + "\n"
		}
		res.Stdout += fmt.Sprintf("cwd=%s user=%s timeout=%g\n", req.Cwd, req.User, req.Timeout)
	case "flood":
		res.Stdout, res.StdoutTruncated = "xxxx", true
	default:
		res.Status, res.Error, res.ExitCode = client.StatusError, "executable "+argv[0]+" not found", -1
	}
	if r.Header.Get("Accept") != client.ContentTypeNDJSON {
		reply(w, 200, res)
		return
	}
	w.Header().Set("Content-Type", client.ContentTypeNDJSON)
	enc := json.NewEncoder(w)
	// Send the output in two chunks per stream to exercise reassembly.
	for _, s := range []struct{ typ, data string }{{client.EventStdout, res.Stdout}, {client.EventStderr, res.Stderr}} {
		if s.data == "" {
			continue
		}
		half := len(s.data) / 2
		_ = enc.Encode(client.ExecEvent{Type: s.typ, Data: s.data[:half]})
		w.(http.Flusher).Flush()
		_ = enc.Encode(client.ExecEvent{Type: s.typ, Data: s.data[half:]})
	}
	res.Stdout, res.Stderr = "", ""
	_ = enc.Encode(client.ExecEvent{Type: client.EventExit, Result: &res})
}

func (f *fakeAPI) writeFile(w http.ResponseWriter, r *http.Request, sb *client.Sandbox) {
	p := r.URL.Query().Get("path")
	if !strings.HasPrefix(p, "/") {
		replyErr(w, 400, client.CodeBadRequest, "path must be absolute")
		return
	}
	data, err := io.ReadAll(r.Body)
	if err != nil {
		replyErr(w, 400, client.CodeBadRequest, err.Error())
		return
	}
	mode := cmpOr(r.URL.Query().Get("mode"), "0644")
	f.mu.Lock()
	f.files[sb.ID+":"+p] = fakeFile{data: data, mode: mode}
	f.mu.Unlock()
	reply(w, 201, client.FileInfo{Name: p[strings.LastIndex(p, "/")+1:], Path: p, Type: client.FileTypeFile, Size: int64(len(data)), Mode: mode, ModTime: fakeNow})
}

func (f *fakeAPI) file(sb *client.Sandbox, p string) (fakeFile, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ff, ok := f.files[sb.ID+":"+p]
	return ff, ok
}

func (f *fakeAPI) readFile(w http.ResponseWriter, r *http.Request, sb *client.Sandbox) {
	p := r.URL.Query().Get("path")
	ff, ok := f.file(sb, p)
	if !ok || ff.dir {
		replyErr(w, 404, client.CodeNotFound, "no file "+p)
		return
	}
	w.Header().Set("Content-Type", client.ContentTypeOctetStream)
	w.Header().Set("Content-Length", strconv.Itoa(len(ff.data)))
	_, _ = w.Write(ff.data)
}

func (f *fakeAPI) statFile(w http.ResponseWriter, r *http.Request, sb *client.Sandbox) {
	p := r.URL.Query().Get("path")
	ff, ok := f.file(sb, p)
	if !ok {
		replyErr(w, 404, client.CodeNotFound, "no file "+p)
		return
	}
	typ := client.FileTypeFile
	if ff.dir {
		typ = client.FileTypeDir
	}
	reply(w, 200, client.FileInfo{Path: p, Type: typ, Size: int64(len(ff.data)), Mode: ff.mode, ModTime: fakeNow})
}
