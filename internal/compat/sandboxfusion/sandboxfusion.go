// Package sandboxfusion serves SandboxFusion's code-running API on
// evalbox (docs/integrations/sandbox-fusion.md): POST /run_code, which verl's
// and ROLL's code rewards and the sandbox-fusion client call, and POST
// /run_jupyter (jupyter.go). Every call runs in a fresh sandbox (internal/trial: create, write, run, delete, infra
// failures retried on a new sandbox), and answers as the real service does:
// HTTP 200 with status Success, Failed (the code's own failure: a non-zero
// exit, a timeout) or SandboxError (evalbox could not run it); a request
// the service would refuse is a 422 in FastAPI's form.
//
// Authentication is the team's API key, as a bearer token, an X-API-Key
// header, or the password of HTTP basic authentication (so that a bare
// endpoint URL such as http://:KEY@host:8700 carries it). With
// Config.Keyless, JSON requests from a program on this host (a loopback
// address and Host, no browser's headers) that carry no credentials header
// run as that team: verl posts to a bare URL.
package sandboxfusion

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/internal/lang"
	"github.com/evalbox/evalbox/internal/outbuf"
	"github.com/evalbox/evalbox/internal/trial"
	"github.com/evalbox/evalbox/pkg/client"
)

// Trials runs one program in a fresh sandbox (trial.Runner).
type Trials interface {
	Run(ctx context.Context, teamID string, spec trial.Spec) (trial.Outcome, error)
}

// Authenticator resolves an Authorization header to a team.
type Authenticator interface {
	Authenticate(ctx context.Context, authorization string) (auth.Principal, error)
}

// Config configures the handler.
type Config struct {
	Trials Trials
	Auth   Authenticator
	// Keyless, when set, is the team of requests without credentials from
	// a program on this host (keylessRefusal); nil: every request needs the
	// API key.
	Keyless func(ctx context.Context) (auth.Principal, error)
	// Sandboxes and Dial serve run_jupyter: its sandbox, and connections
	// to its interpreter's port (as port URLs make them); nil: it answers
	// SandboxError.
	Sandboxes Sandboxes
	Dial      func(ctx context.Context, teamID, id string, port int) (net.Conn, error)
	// Output is the server's budget for output held until an answer is
	// written (nil: unlimited).
	Output *outbuf.Budget
	// Runtime runs the sandboxes ("" = the server's default).
	Runtime string
	Logger  *slog.Logger
}

// Handler serves the routes.
type Handler struct {
	cfg Config
	log *slog.Logger
}

// New returns the handler.
func New(cfg Config) *Handler {
	h := &Handler{cfg: cfg, log: cfg.Logger}
	if h.log == nil {
		h.log = slog.Default()
	}
	return h
}

// Register adds the routes to mux.
func (h *Handler) Register(mux *http.ServeMux) {
	mux.HandleFunc("POST /run_code", h.authed(h.runCode))
	mux.HandleFunc("POST /run_jupyter", h.authed(h.runJupyter))
}

// Bounds of a request.
const (
	maxBody        = 32 << 20
	maxTimeout     = 600.0
	defaultTimeout = 10.0
	// defaultCompileTimeout is the service's compile_timeout default.
	defaultCompileTimeout = 10.0
	maxOutputBytes        = 8 << 20
	maxFiles              = 256
	// workdir is where the code and the request's relative files go, and
	// the run's working directory.
	workdir = "/workspace"
)

// languages are the SandboxFusion languages this server runs, in the
// order its messages name them: each is the internal/lang language of that
// name (its template, source file, compile and run commands), SandboxFusion's
// names being the table's. c is evalbox's own (SandboxFusion has none).
// SandboxFusion knows more (knownLanguages); they are refused with a
// message naming these.
var languages = []string{"python", "cpp", "c", "java", "go", "rust", "nodejs", "typescript", "bash"}

// languageOf is the language a request names, if this server runs it.
func languageOf(name string) (lang.Language, bool) {
	if !slices.Contains(languages, name) {
		return lang.Language{}, false
	}
	return lang.LookupExact(name)
}

// knownLanguages are the languages of SandboxFusion's API (its client's
// Language type).
var knownLanguages = map[string]bool{
	"python": true, "python2": true, "cpp": true, "nodejs": true, "go": true, "go_test": true, "java": true, "php": true,
	"csharp": true, "bash": true, "typescript": true, "sql": true, "rust": true, "cuda": true, "lua": true, "R": true,
	"perl": true, "D_ut": true, "ruby": true, "scala": true, "julia": true, "pytest": true, "junit": true,
	"kotlin_script": true, "jest": true, "verilog": true, "python_gpu": true, "lean": true, "swift": true,
	"racket": true, "gtest": true, "react": true,
}

// runCodeRequest is SandboxFusion's RunCodeRequest. Fields it does not
// know are ignored, as the service ignores them.
type runCodeRequest struct {
	Code           *string            `json:"code"`
	Language       string             `json:"language"`
	CompileTimeout *float64           `json:"compile_timeout"`
	RunTimeout     *float64           `json:"run_timeout"`
	MemoryLimitMB  *float64           `json:"memory_limit_MB"`
	Stdin          *string            `json:"stdin"`
	Files          map[string]*string `json:"files"`
	FetchFiles     []string           `json:"fetch_files"`
}

// Run statuses (RunStatus) and command statuses (CommandRunStatus).
const (
	statusSuccess      = "Success"
	statusFailed       = "Failed"
	statusSandboxError = "SandboxError"

	cmdFinished          = "Finished"
	cmdError             = "Error"
	cmdTimeLimitExceeded = "TimeLimitExceeded"
)

// commandRunResult is SandboxFusion's CommandRunResult.
type commandRunResult struct {
	Status        string   `json:"status"`
	ExecutionTime *float64 `json:"execution_time"`
	CPUTime       *float64 `json:"cpu_time"`
	ReturnCode    *int     `json:"return_code"`
	Stdout        *string  `json:"stdout"`
	Stderr        *string  `json:"stderr"`
}

// runCodeResponse is SandboxFusion's RunCodeResponse.
type runCodeResponse struct {
	Status          string            `json:"status"`
	Message         string            `json:"message"`
	CompileResult   *commandRunResult `json:"compile_result"`
	RunResult       *commandRunResult `json:"run_result"`
	ExecutorPodName *string           `json:"executor_pod_name"`
	Files           map[string]string `json:"files"`
}

func (h *Handler) runCode(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req runCodeRequest
	if !decode(w, r, &req) {
		return
	}
	spec, verr := h.specOf(req)
	if verr != nil {
		writeValidation(w, verr)
		return
	}
	spec.Metadata = map[string]string{"via": "sandbox-fusion"}
	// The run's output and fetched files are held until the answer is
	// written: all of it is reserved from the server's output budget, as
	// /v1/execute's output is. A run whose output or files the budget
	// could not hold is answered 503, to be asked again.
	tally := outbuf.NewTally(h.cfg.Output)
	defer tally.ReleaseAll()
	stdout, err := outbuf.New(tally, outbuf.Truncate)
	if err != nil {
		writeBusy(w)
		return
	}
	defer stdout.Release()
	stderr, err := outbuf.New(tally, outbuf.Truncate)
	if err != nil {
		writeBusy(w)
		return
	}
	defer stderr.Release()
	spec.Output = pair(stdout, stderr)
	// A compiled language's compile output is compile_result's, apart.
	var compile [2]*outbuf.Buffer
	if spec.Prepare != nil {
		for i := range compile {
			if compile[i], err = outbuf.New(tally, outbuf.Truncate); err != nil {
				writeBusy(w)
				return
			}
			defer compile[i].Release()
		}
		spec.PrepareOutput = pair(compile[0], compile[1])
	}
	spec.FetchBudget = tally
	out, err := h.cfg.Trials.Run(r.Context(), p.TeamID, spec)
	if err != nil {
		if r.Context().Err() != nil {
			return // the caller is gone
		}
		var ae *apierr.Error
		if errors.As(err, &ae) && ae.Code == client.CodeBadRequest {
			// Beyond what the server allows (memory_limit_MB, say).
			writeValidation(w, &fieldError{Loc: []string{"body"}, Msg: ae.Message, Type: "value_error"})
			return
		}
		// The request could not run at all (no such template on this
		// server, the team's limits): evalbox's failure, not the code's.
		writeJSON(w, http.StatusOK, runCodeResponse{Status: statusSandboxError, Message: userMessage(err), Files: map[string]string{}})
		return
	}
	if stdout.Dropped() || stderr.Dropped() || out.FetchOverBudget || (compile[0] != nil && (compile[0].Dropped() || compile[1].Dropped())) {
		// An answer cut short for want of memory would score the code by
		// the server's load: refuse it, to be asked again.
		writeBusy(w)
		return
	}
	resp := responseOf(out)
	var notes []string
	if len(out.FetchSkipped) > 0 {
		notes = append(notes, fmt.Sprintf("fetch_files left out (larger than %d bytes, or past %d in all): %s", trial.MaxFetchBytes, trial.MaxFetchTotalBytes, strings.Join(out.FetchSkipped, ", ")))
	}
	if out.FetchErr != nil {
		notes = append(notes, "fetch_files could not be read back")
	}
	if len(notes) > 0 {
		resp.Message = strings.Join(append([]string{resp.Message}, notes...), "; ")
		resp.Message = strings.TrimPrefix(resp.Message, "; ")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	if err := writeResponse(w, resp, out, [2]*outbuf.Buffer{stdout, stderr}, compile); err != nil && r.Context().Err() == nil {
		h.log.Warn("sandbox-fusion: write answer", "err", err)
	}
}

// pair is a trial's Output of stdout and stderr: reset for each attempt.
func pair(stdout, stderr *outbuf.Buffer) func() (io.Writer, io.Writer) {
	return func() (io.Writer, io.Writer) {
		stdout.Reset()
		stderr.Reset()
		return stdout, stderr
	}
}

// writeBusy answers a request whose output the server's budget cannot
// hold now: 503 with Retry-After, which SandboxFusion's clients retry.
func writeBusy(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	writeJSON(w, http.StatusServiceUnavailable, map[string]string{"detail": "the server's memory for command output is in use by other requests; retry later"})
}

// writeResponse writes resp, whose run's output is in run (stdout,
// stderr), its compile's in compile, and whose files are out.Files,
// without building it in memory: resp is marshalled with placeholders that
// the buffers (escaped as encoding/json escapes) and the files (in base64)
// are streamed in place of. A placeholder holds a NUL byte and a random
// nonce, so nothing else the document says (all of it evalbox's, or paths
// without NUL) can look like one.
func writeResponse(w io.Writer, resp runCodeResponse, out trial.Outcome, run, compile [2]*outbuf.Buffer) error {
	var b [8]byte
	_, _ = rand.Read(b[:])
	nonce := hex.EncodeToString(b[:])
	var parts []func(io.Writer) error
	placeholder := func(part func(io.Writer) error) string {
		parts = append(parts, part)
		return "\x00" + nonce + strconv.Itoa(len(parts)-1)
	}
	for _, c := range []struct {
		res *commandRunResult
		buf [2]*outbuf.Buffer
	}{{resp.CompileResult, compile}, {resp.RunResult, run}} {
		if c.res != nil && c.buf[0] != nil {
			so, se := placeholder(c.buf[0].WriteJSONString), placeholder(c.buf[1].WriteJSONString)
			c.res.Stdout, c.res.Stderr = &so, &se
		}
	}
	for name, b := range out.Files {
		resp.Files[name] = placeholder(func(w io.Writer) error { return writeBase64(w, b) })
	}
	doc, err := json.Marshal(resp)
	if err != nil {
		return err
	}
	// encoding/json writes the placeholders' NUL as \u0000.
	open := []byte(`"\u0000` + nonce)
	for {
		i := bytes.Index(doc, open)
		if i < 0 {
			break
		}
		end := bytes.IndexByte(doc[i+len(open):], '"')
		n, err := strconv.Atoi(string(doc[i+len(open) : i+len(open)+end]))
		if err != nil || n < 0 || n >= len(parts) {
			return fmt.Errorf("sandbox-fusion: a broken placeholder in the answer")
		}
		if _, err := w.Write(doc[:i]); err != nil {
			return err
		}
		if err := parts[n](w); err != nil {
			return err
		}
		doc = doc[i+len(open)+end+1:]
	}
	if _, err := w.Write(doc); err != nil {
		return err
	}
	_, err = io.WriteString(w, "\n")
	return err
}

// writeBase64 writes b as a JSON string of its standard base64.
func writeBase64(w io.Writer, b []byte) error {
	if _, err := io.WriteString(w, `"`); err != nil {
		return err
	}
	enc := base64.NewEncoder(base64.StdEncoding, w)
	if _, err := enc.Write(b); err != nil {
		return err
	}
	if err := enc.Close(); err != nil {
		return err
	}
	_, err := io.WriteString(w, `"`)
	return err
}

// fieldError is one entry of FastAPI's 422 detail.
type fieldError struct {
	Loc  []string `json:"loc"`
	Msg  string   `json:"msg"`
	Type string   `json:"type"`
}

func invalid(field, format string, a ...any) *fieldError {
	return &fieldError{Loc: []string{"body", field}, Msg: fmt.Sprintf(format, a...), Type: "value_error"}
}

// specOf checks a request and turns it into a trial.
func (h *Handler) specOf(req runCodeRequest) (trial.Spec, *fieldError) {
	if req.Code == nil {
		return trial.Spec{}, invalid("code", "field required")
	}
	if req.Language == "" {
		return trial.Spec{}, invalid("language", "field required")
	}
	l, ok := languageOf(req.Language)
	if !ok {
		supported := strings.Join(languages[:len(languages)-1], ", ") + " and " + languages[len(languages)-1]
		if knownLanguages[req.Language] {
			return trial.Spec{}, invalid("language", "language %q is not run by this evalbox server (it runs %s)", req.Language, supported)
		}
		return trial.Spec{}, invalid("language", "unknown language %q (this evalbox server runs %s)", req.Language, supported)
	}
	timeout := defaultTimeout
	if req.RunTimeout != nil {
		timeout = *req.RunTimeout
	}
	if math.IsNaN(timeout) || timeout <= 0 || timeout > maxTimeout {
		return trial.Spec{}, invalid("run_timeout", "must be in (0, %g] seconds", maxTimeout)
	}
	compileTimeout := defaultCompileTimeout
	if c := req.CompileTimeout; c != nil {
		if math.IsNaN(*c) || *c < 0 || *c > maxTimeout {
			return trial.Spec{}, invalid("compile_timeout", "must be in [0, %g] seconds", maxTimeout)
		}
		if *c > 0 {
			compileTimeout = *c
		}
	}
	file, class := l.SourceFile(*req.Code)
	spec := trial.Spec{Template: l.Template, Runtime: h.cfg.Runtime, Script: *req.Code, Path: file, Argv: l.RunArgv(file, class),
		Env: l.Env, Cwd: workdir, Stdin: req.Stdin, Timeout: timeout, MaxOutputBytes: maxOutputBytes}
	if l.Compiled() {
		// Compiled, then run, in the same sandbox: compile_result, then
		// run_result (none when the compile failed), as the service does.
		spec.Prepare, spec.PrepareTimeout = l.CompileArgv(file, nil), compileTimeout
	}
	if m := req.MemoryLimitMB; m != nil && *m > 0 {
		// -1 (its default) or 0: the template's.
		if *m > math.MaxInt32 {
			return trial.Spec{}, invalid("memory_limit_MB", "too large")
		}
		spec.MemoryMB = int(math.Ceil(*m))
	}
	var verr *fieldError
	if spec.Files, verr = decodeFiles(req.Files); verr != nil {
		return trial.Spec{}, verr
	}
	if verr := checkFetch(req.FetchFiles); verr != nil {
		return trial.Spec{}, verr
	}
	spec.Fetch = req.FetchFiles
	return spec, nil
}

// decodeFiles checks and decodes a request's files (path → base64; null:
// an empty file).
func decodeFiles(in map[string]*string) (map[string][]byte, *fieldError) {
	if len(in) > maxFiles {
		return nil, invalid("files", "%d files; at most %d", len(in), maxFiles)
	}
	var files map[string][]byte
	for name, b64 := range in {
		if err := checkPath(name); err != nil {
			return nil, invalid("files", "%q: %v", name, err)
		}
		var b []byte
		if b64 != nil {
			var err error
			if b, err = base64.StdEncoding.DecodeString(*b64); err != nil {
				return nil, invalid("files", "%q: the content is not base64: %v", name, err)
			}
		}
		if files == nil {
			files = map[string][]byte{}
		}
		files[name] = b
	}
	return files, nil
}

// checkFetch checks a request's fetch_files.
func checkFetch(names []string) *fieldError {
	if len(names) > maxFiles {
		return invalid("fetch_files", "%d files; at most %d", len(names), maxFiles)
	}
	for _, name := range names {
		if err := checkPath(name); err != nil {
			return invalid("fetch_files", "%q: %v", name, err)
		}
	}
	return nil
}

// checkPath checks a file name of a request: a path, absolute or relative
// to the working directory, without NUL bytes.
func checkPath(name string) error {
	switch {
	case name == "" || path.Clean(name) == "/" || path.Clean(name) == ".":
		return errors.New("not a file path")
	case strings.ContainsRune(name, 0):
		return errors.New("a NUL byte in the path")
	case len(name) > 4096:
		return errors.New("the path is too long")
	}
	return nil
}

// responseOf is SandboxFusion's answer for a trial's outcome: Success when
// every command it ran (the compile, the run) finished with 0; a failed
// compile has no run_result.
func responseOf(out trial.Outcome) runCodeResponse {
	res := out.Result
	// The files are streamed in by writeResponse, never encoded here.
	resp := runCodeResponse{Files: map[string]string{}}
	if res.Status == client.StatusError {
		// No attempt ran the code to an end: evalbox's failure.
		resp.Status, resp.Message = statusSandboxError, res.Error
		return resp
	}
	if out.Prepare != nil {
		resp.CompileResult = commandOf(*out.Prepare)
	}
	if !out.PrepareFailed {
		resp.RunResult = commandOf(res)
	}
	resp.Status = statusSuccess
	for _, c := range []*commandRunResult{resp.CompileResult, resp.RunResult} {
		if c != nil && (c.Status != cmdFinished || c.ReturnCode == nil || *c.ReturnCode != 0) {
			resp.Status = statusFailed
		}
	}
	return resp
}

// commandOf is SandboxFusion's CommandRunResult of one command's result.
func commandOf(res client.ExecResult) *commandRunResult {
	secs := float64(res.DurationMs) / 1000
	stdout, stderr := res.Stdout, res.Stderr
	rr := &commandRunResult{Status: cmdFinished, ExecutionTime: &secs, Stdout: &stdout, Stderr: &stderr}
	code := res.ExitCode
	switch res.Status {
	case client.StatusTimedOut:
		rr.Status = cmdTimeLimitExceeded
	case client.StatusKilled:
		// As a subprocess's return code: minus the signal.
		sig := res.Signal
		if sig == 0 {
			sig = 9
		}
		code = -sig
		rr.ReturnCode = &code
	default:
		rr.ReturnCode = &code
	}
	return rr
}

// userMessage is an error's message for the caller.
func userMessage(err error) string {
	var ae *apierr.Error
	if errors.As(err, &ae) && ae.Message != "" {
		return ae.Message
	}
	return "evalbox could not run the code"
}

// authed resolves the request's credentials to a team, or (Keyless) lets a
// loopback request without any run as its team.
func (h *Handler) authed(fn func(http.ResponseWriter, *http.Request, auth.Principal)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		authz := r.Header.Get("Authorization")
		if key := r.Header.Get("X-API-Key"); key != "" {
			authz = "Bearer " + key
		} else if _, pass, ok := r.BasicAuth(); ok {
			authz = "Bearer " + pass
		}
		var (
			p   auth.Principal
			err error
		)
		keyless := h.cfg.Keyless != nil && !hasCredentials(r) && fromLoopback(r)
		if keyless {
			if why := keylessRefusal(r); why != "" {
				writeJSON(w, http.StatusUnauthorized, map[string]string{"detail": "a request without an evalbox API key runs only as a JSON POST from this host's own programs: " + why})
				return
			}
			p, err = h.cfg.Keyless(r.Context())
		} else {
			p, err = h.cfg.Auth.Authenticate(r.Context(), authz)
		}
		if errors.Is(err, auth.ErrUnauthorized) {
			writeJSON(w, http.StatusUnauthorized, map[string]string{"detail": "missing or invalid evalbox API key (Authorization: Bearer KEY, X-API-Key, or the password of http://:KEY@host)"})
			return
		}
		if ae := (*apierr.Error)(nil); errors.As(err, &ae) && ae.Code == client.CodeRateLimited {
			// Over the team's request rate (internal/api's rate limits).
			w.Header().Set("Retry-After", strconv.Itoa(ae.RetryAfter))
			writeJSON(w, http.StatusTooManyRequests, map[string]string{"detail": ae.Message})
			return
		}
		if err != nil {
			h.log.Error("sandbox-fusion: authenticate", "err", err)
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"detail": "evalbox could not check the credentials; try again"})
			return
		}
		fn(w, r, p)
	}
}

// hasCredentials reports whether r carries any credentials header at all,
// even an empty one: such a request is judged by its key, never keyless.
func hasCredentials(r *http.Request) bool {
	_, authz := r.Header["Authorization"]
	_, key := r.Header["X-Api-Key"]
	return authz || key
}

// keylessRefusal says why a credential-less loopback request may not run
// keyless, or "" when it may. A web page the host's user opens can make its
// browser post to a loopback port; a program (verl, the sandbox-fusion
// client) does not look like one. So the request must be JSON, which a page
// can send across origins only after a CORS preflight this server never
// grants; carry no Origin and no cross-site Sec-Fetch-Site, which browsers
// add; and name a loopback host, which a DNS-rebinding page cannot.
func keylessRefusal(r *http.Request) string {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return "Content-Type is not application/json"
	}
	if _, ok := r.Header["Origin"]; ok {
		return "it carries an Origin header (a browser's request)"
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "none" {
		return "it carries Sec-Fetch-Site: " + site + " (a browser's request)"
	}
	if !loopbackHost(r.Host) {
		return fmt.Sprintf("its Host %q is not localhost or a loopback address", r.Host)
	}
	return ""
}

// loopbackHost reports whether a Host header names this host: localhost or
// an IP literal of loopback or of any address (0.0.0.0 and :: reach
// loopback when dialled), with or without a port.
func loopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	a = a.Unmap()
	return a.IsLoopback() || a.IsUnspecified()
}

// fromLoopback reports whether r came from a loopback address.
func fromLoopback(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}

// decode reads a JSON body, answering 422 (FastAPI's form) when it is not
// one.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	if err := json.NewDecoder(r.Body).Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeJSON(w, http.StatusRequestEntityTooLarge, map[string]string{"detail": fmt.Sprintf("the request body is larger than %d bytes", maxBody)})
			return false
		}
		writeValidation(w, &fieldError{Loc: []string{"body"}, Msg: "the body is not a JSON object of the request: " + err.Error(), Type: "value_error.jsondecode"})
		return false
	}
	return true
}

func writeValidation(w http.ResponseWriter, e *fieldError) {
	writeJSON(w, http.StatusUnprocessableEntity, map[string][]*fieldError{"detail": {e}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
