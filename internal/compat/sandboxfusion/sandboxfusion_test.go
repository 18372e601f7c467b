package sandboxfusion

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/internal/outbuf"
	"github.com/evalbox/evalbox/internal/trial"
	"github.com/evalbox/evalbox/pkg/client"
)

// fakeTrials answers every trial with out (or err) and keeps the spec.
type fakeTrials struct {
	spec trial.Spec
	team string
	out  trial.Outcome
	err  error
}

func (f *fakeTrials) Run(_ context.Context, teamID string, spec trial.Spec) (trial.Outcome, error) {
	f.spec, f.team = spec, teamID
	out := f.out
	if spec.PrepareOutput != nil && out.Prepare != nil && f.err == nil {
		p := *out.Prepare
		stdout, stderr := spec.PrepareOutput()
		_, _ = io.WriteString(stdout, p.Stdout)
		_, _ = io.WriteString(stderr, p.Stderr)
		p.Stdout, p.Stderr = "", ""
		out.Prepare = &p
		if out.PrepareFailed {
			out.Result = p
			return out, nil
		}
	}
	if spec.Output != nil && f.err == nil {
		// As trial.Runner: the output goes to the writers, not the Result.
		stdout, stderr := spec.Output()
		_, _ = io.WriteString(stdout, out.Result.Stdout)
		_, _ = io.WriteString(stderr, out.Result.Stderr)
		out.Result.Stdout, out.Result.Stderr = "", ""
	}
	return out, f.err
}

// keys accepts the bearer key "good" as team-a.
type keys struct{}

func (keys) Authenticate(_ context.Context, authz string) (auth.Principal, error) {
	if authz == "Bearer good" {
		return auth.Principal{TeamID: "team-a"}, nil
	}
	return auth.Principal{}, fmt.Errorf("%w: no", auth.ErrUnauthorized)
}

func serve(t *testing.T, f *fakeTrials, keyless bool, remote, body string, hdr map[string]string) (*httptest.ResponseRecorder, map[string]any) {
	t.Helper()
	return serveWith(t, Config{Trials: f, Auth: keys{}}, keyless, remote, body, hdr)
}

func serveWith(t *testing.T, cfg Config, keyless bool, remote, body string, hdr map[string]string) (*httptest.ResponseRecorder, map[string]any) {
	t.Helper()
	if keyless {
		cfg.Keyless = func(context.Context) (auth.Principal, error) { return auth.Principal{TeamID: "team-keyless"}, nil }
	}
	mux := http.NewServeMux()
	New(cfg).Register(mux)
	req := httptest.NewRequest(http.MethodPost, "/run_code", strings.NewReader(body))
	req.RemoteAddr = remote
	req.Host = "127.0.0.1:8700"
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		switch {
		case k == "Host":
			req.Host = v
		case v == "-":
			req.Header.Del(k)
		default:
			req.Header[http.CanonicalHeaderKey(k)] = []string{v}
		}
	}
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	var m map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &m); err != nil {
		t.Fatalf("body %q: %v", rec.Body.String(), err)
	}
	return rec, m
}

var bearer = map[string]string{"Authorization": "Bearer good"}

// TestRunCodeRequest: a request becomes the trial SandboxFusion's service
// would run: the language's template and command, in the working
// directory, with its files (base64), stdin, timeout, memory and fetches.
func TestRunCodeRequest(t *testing.T) {
	f := &fakeTrials{out: trial.Outcome{Result: client.ExecResult{Status: client.StatusExited}}}
	body := `{"code": "print(input())", "language": "python", "run_timeout": 2.5, "compile_timeout": 1, "memory_limit_MB": 300,
		"stdin": "hi", "files": {"data/in.txt": "` + base64.StdEncoding.EncodeToString([]byte("x")) + `", "/empty": null},
		"fetch_files": ["out.txt"], "unknown_field": 1}`
	rec, _ := serve(t, f, false, "10.0.0.1:1234", body, bearer)
	if rec.Code != http.StatusOK {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	s := f.spec
	_, empty := s.Files["/empty"]
	if f.team != "team-a" || s.Template != "python" || s.Path != "main.py" || strings.Join(s.Argv, " ") != "python3 main.py" || s.Prepare != nil ||
		s.Cwd != workdir || s.Script != "print(input())" || *s.Stdin != "hi" || s.Timeout != 2.5 || s.MemoryMB != 300 ||
		string(s.Files["data/in.txt"]) != "x" || !empty || len(s.Files) != 2 || strings.Join(s.Fetch, ",") != "out.txt" {
		t.Errorf("spec %+v (team %s)", s, f.team)
	}
	for lang, tpl := range map[string]string{"bash": "base", "nodejs": "node"} {
		serve(t, f, false, "10.0.0.1:1234", `{"code": "x", "language": "`+lang+`"}`, bearer)
		if f.spec.Template != tpl || f.spec.Timeout != defaultTimeout || f.spec.MemoryMB != 0 || f.spec.Prepare != nil {
			t.Errorf("%s: %+v", lang, f.spec)
		}
	}
	// A compiled language is compiled then run, by internal/lang's
	// commands, within compile_timeout (0 or absent: the service's 10 s).
	for _, c := range []struct {
		body, template, path, prepare, argv string
		compile                             float64
	}{
		{`{"code": "int main(){}", "language": "cpp"}`, "polyglot", "main.cpp", "g++ -O2 -std=c++17 -o main main.cpp", "./main", defaultCompileTimeout},
		{`{"code": "int main(){}", "language": "c", "compile_timeout": 0}`, "polyglot", "main.c", "gcc -O2 -std=gnu17 -o main main.c -lm", "./main", defaultCompileTimeout},
		{`{"code": "public class Hi {}", "language": "java", "compile_timeout": 30}`, "polyglot", "Hi.java", "javac -encoding UTF-8 -d . Hi.java",
			"java -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xss64m -cp . Hi", 30},
		{`{"code": "fn main(){}", "language": "rust"}`, "polyglot", "main.rs", "rustc -O --edition 2021 -o main main.rs", "./main", defaultCompileTimeout},
		{`{"code": "package main", "language": "go"}`, "polyglot", "main.go", "go build -o main main.go", "./main", defaultCompileTimeout},
		{`{"code": "let x = 1", "language": "typescript"}`, "polyglot", "main.ts", "tsc --target es2020 --module commonjs --typeRoots /usr/local/lib/node_modules/@types --types node --skipLibCheck --noEmitOnError main.ts",
			"node main.js", defaultCompileTimeout},
	} {
		serve(t, f, false, "10.0.0.1:1234", c.body, bearer)
		s := f.spec
		if s.Template != c.template || s.Path != c.path || strings.Join(s.Prepare, " ") != c.prepare || strings.Join(s.Argv, " ") != c.argv ||
			s.PrepareTimeout != c.compile || s.Cwd != workdir {
			t.Errorf("%s: %+v", c.body, s)
		}
	}
	if f.spec.Env != nil {
		t.Errorf("typescript: env %v", f.spec.Env)
	}
	serve(t, f, false, "10.0.0.1:1234", `{"code": "package main", "language": "go"}`, bearer)
	if f.spec.Env["GOCACHE"] == "" {
		t.Errorf("go: env %v", f.spec.Env)
	}
}

// TestRunCodeCompiled: a compiled language's answer has compile_result
// (its own output) and run_result; a compile that failed has no
// run_result and fails the request.
func TestRunCodeCompiled(t *testing.T) {
	ok := client.ExecResult{Status: client.StatusExited, Stderr: "warning: x", DurationMs: 300}
	for name, c := range map[string]struct {
		out             trial.Outcome
		status, compile string
		compileCode     any
		run             bool
	}{
		"compiled and ran": {trial.Outcome{Prepare: &ok, Result: client.ExecResult{Status: client.StatusExited, Stdout: "123\n", DurationMs: 20}},
			"Success", "Finished", 0.0, true},
		"ran and failed": {trial.Outcome{Prepare: &ok, Result: client.ExecResult{Status: client.StatusExited, ExitCode: 2}}, "Failed", "Finished", 0.0, true},
		"compile error": {trial.Outcome{Prepare: &client.ExecResult{Status: client.StatusExited, ExitCode: 1, Stderr: "main.cpp:1: error: expected ';'"},
			PrepareFailed: true}, "Failed", "Finished", 1.0, false},
		"compile timeout": {trial.Outcome{Prepare: &client.ExecResult{Status: client.StatusTimedOut, ExitCode: -1}, PrepareFailed: true},
			"Failed", "TimeLimitExceeded", nil, false},
	} {
		f := &fakeTrials{out: c.out}
		rec, m := serve(t, f, false, "10.0.0.1:1", `{"code": "x", "language": "cpp"}`, bearer)
		cr, _ := m["compile_result"].(map[string]any)
		rr, _ := m["run_result"].(map[string]any)
		if rec.Code != http.StatusOK || m["status"] != c.status || cr == nil || cr["status"] != c.compile || cr["return_code"] != c.compileCode ||
			cr["stderr"] != c.out.Prepare.Stderr || cr["stdout"] != "" || (rr != nil) != c.run {
			t.Errorf("%s: %d %v", name, rec.Code, m)
			continue
		}
		if c.run && (rr["stdout"] != c.out.Result.Stdout || rr["return_code"] != float64(c.out.Result.ExitCode)) {
			t.Errorf("%s: run_result %v", name, rr)
		}
	}
}

// TestRunCodeResponse: the outcome in SandboxFusion's terms.
func TestRunCodeResponse(t *testing.T) {
	for name, c := range map[string]struct {
		res            client.ExecResult
		status, cmd    string
		code           any
		files, message bool
	}{
		"success": {client.ExecResult{Status: client.StatusExited, Stdout: "out", Stderr: "err", DurationMs: 1500}, "Success", "Finished", 0.0, true, false},
		// Output that looks like the answer's placeholders or like JSON
		// comes back as it was.
		"tricky output": {client.ExecResult{Status: client.StatusExited, Stdout: "\x00\"\\u0000\"}\n\u2028<", Stderr: "\"\\u00000\""}, "Success", "Finished", 0.0, true, false},
		"exit 3":        {client.ExecResult{Status: client.StatusExited, ExitCode: 3}, "Failed", "Finished", 3.0, true, false},
		"timeout":       {client.ExecResult{Status: client.StatusTimedOut, ExitCode: -1}, "Failed", "TimeLimitExceeded", nil, true, false},
		"signal":        {client.ExecResult{Status: client.StatusKilled, Signal: 11, ExitCode: -1}, "Failed", "Finished", -11.0, true, false},
		"no start":      {client.ExecResult{Status: client.StatusError, Error: "infrastructure failure after 3 attempts"}, "SandboxError", "", nil, false, true},
	} {
		f := &fakeTrials{out: trial.Outcome{Result: c.res, Files: map[string][]byte{"out.txt": []byte("o")}}}
		rec, m := serve(t, f, false, "10.0.0.1:1", `{"code": "", "language": "python"}`, bearer)
		if rec.Code != http.StatusOK || m["status"] != c.status || m["compile_result"] != nil {
			t.Errorf("%s: %d %v", name, rec.Code, m)
			continue
		}
		if c.message != (m["message"] != "") {
			t.Errorf("%s: message %q", name, m["message"])
		}
		files, _ := m["files"].(map[string]any)
		if c.files && files["out.txt"] != base64.StdEncoding.EncodeToString([]byte("o")) {
			t.Errorf("%s: files %v", name, m["files"])
		}
		rr, _ := m["run_result"].(map[string]any)
		if c.cmd == "" {
			if rr != nil {
				t.Errorf("%s: run_result %v", name, rr)
			}
			continue
		}
		if rr["status"] != c.cmd || rr["return_code"] != c.code || rr["stdout"] != c.res.Stdout || rr["stderr"] != c.res.Stderr ||
			rr["execution_time"] != float64(c.res.DurationMs)/1000 {
			t.Errorf("%s: run_result %v", name, rr)
		}
	}
	// A trial that cannot run at all: SandboxError, or 422 for what the
	// server does not allow.
	f := &fakeTrials{err: &apierr.Error{Code: client.CodeTooManySandboxes, Message: "the team may not run sandboxes"}}
	if rec, m := serve(t, f, false, "10.0.0.1:1", `{"code": "", "language": "python"}`, bearer); rec.Code != 200 || m["status"] != "SandboxError" || m["message"] != "the team may not run sandboxes" {
		t.Errorf("no run: %d %v", rec.Code, m)
	}
	f = &fakeTrials{err: &apierr.Error{Code: client.CodeBadRequest, Message: "memory_mb may be at most 4096"}}
	if rec, _ := serve(t, f, false, "10.0.0.1:1", `{"code": "", "language": "python", "memory_limit_MB": 100000}`, bearer); rec.Code != http.StatusUnprocessableEntity {
		t.Errorf("beyond the server's limits: %d %s", rec.Code, rec.Body)
	}
}

// TestRunCodeBadInput: what SandboxFusion's service refuses is a 422 with
// FastAPI's detail, and nothing runs.
func TestRunCodeBadInput(t *testing.T) {
	for body, field := range map[string]string{
		`{"language": "python"}`:                                          "code",
		`{"code": "x"}`:                                                   "language",
		`{"code": "x", "language": "cobol"}`:                              "language",
		`{"code": "x", "language": "php"}`:                                "language",
		`{"code": "x", "language": "js"}`:                                 "language",
		`{"code": "x", "language": "python", "run_timeout": 0}`:           "run_timeout",
		`{"code": "x", "language": "python", "run_timeout": 1e9}`:         "run_timeout",
		`{"code": "x", "language": "python", "compile_timeout": -1}`:      "compile_timeout",
		`{"code": "x", "language": "python", "files": {"a": "%%%"}}`:      "files",
		`{"code": "x", "language": "python", "files": {"": "eA=="}}`:      "files",
		`{"code": "x", "language": "python", "fetch_files": ["/"]}`:       "fetch_files",
		`{"code": "x", "language": "python", "fetch_files": ["a\u0000"]}`: "fetch_files",
		`not json`: "",
	} {
		f := &fakeTrials{}
		rec, m := serve(t, f, false, "10.0.0.1:1", body, bearer)
		detail, _ := m["detail"].([]any)
		if rec.Code != http.StatusUnprocessableEntity || len(detail) != 1 || f.team != "" {
			t.Errorf("%s: %d %v (ran: %v)", body, rec.Code, m, f.team != "")
			continue
		}
		loc, _ := detail[0].(map[string]any)["loc"].([]any)
		if field != "" && (len(loc) != 2 || loc[1] != field) {
			t.Errorf("%s: loc %v, want %s", body, loc, field)
		}
	}
}

// TestRunCodeAuth: the API key as a bearer token, X-API-Key or basic
// auth's password; without one, only a loopback request with Keyless on
// runs, as its team.
func TestRunCodeAuth(t *testing.T) {
	ok := `{"code": "", "language": "bash"}`
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte(":good"))
	for name, c := range map[string]struct {
		keyless bool
		remote  string
		hdr     map[string]string
		team    string
	}{
		"bearer":                    {false, "10.0.0.1:1", bearer, "team-a"},
		"x-api-key":                 {false, "10.0.0.1:1", map[string]string{"X-API-Key": "good"}, "team-a"},
		"basic password":            {false, "10.0.0.1:1", map[string]string{"Authorization": basic}, "team-a"},
		"a key wins over keyless":   {true, "127.0.0.1:1", bearer, "team-a"},
		"keyless from loopback":     {true, "127.0.0.1:1", nil, "team-keyless"},
		"keyless from ::1":          {true, "[::1]:1", nil, "team-keyless"},
		"no key, keyless off":       {false, "127.0.0.1:1", nil, ""},
		"no key, not loopback":      {true, "10.0.0.1:1", nil, ""},
		"bad key from loopback":     {true, "127.0.0.1:1", map[string]string{"Authorization": "Bearer bad"}, ""},
		"keyless mapped v4 remote":  {true, "[::ffff:10.0.0.1]:1", nil, ""},
		"keyless mapped v4 loopack": {true, "[::ffff:127.0.0.1]:1", nil, "team-keyless"},
		// Any credentials header, even an empty one, is judged as a key.
		"empty authorization":  {true, "127.0.0.1:1", map[string]string{"Authorization": ""}, ""},
		"empty x-api-key":      {true, "127.0.0.1:1", map[string]string{"X-API-Key": ""}, ""},
		"empty basic password": {true, "127.0.0.1:1", map[string]string{"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte(":"))}, ""},
		// What a web page's fetch or form from the host's browser looks
		// like is refused keyless.
		"keyless text/plain":             {true, "127.0.0.1:1", map[string]string{"Content-Type": "text/plain"}, ""},
		"keyless form":                   {true, "127.0.0.1:1", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, ""},
		"keyless no content type":        {true, "127.0.0.1:1", map[string]string{"Content-Type": "-"}, ""},
		"keyless json with charset":      {true, "127.0.0.1:1", map[string]string{"Content-Type": "application/json; charset=utf-8"}, "team-keyless"},
		"keyless with Origin":            {true, "127.0.0.1:1", map[string]string{"Origin": "https://evil.example"}, ""},
		"keyless with Origin null":       {true, "127.0.0.1:1", map[string]string{"Origin": "null"}, ""},
		"keyless cross-site fetch":       {true, "127.0.0.1:1", map[string]string{"Sec-Fetch-Site": "cross-site"}, ""},
		"keyless same-origin fetch":      {true, "127.0.0.1:1", map[string]string{"Sec-Fetch-Site": "same-origin"}, ""},
		"keyless rebinding host":         {true, "127.0.0.1:1", map[string]string{"Host": "evil.example:8700"}, ""},
		"keyless localhost host":         {true, "127.0.0.1:1", map[string]string{"Host": "localhost:8700"}, "team-keyless"},
		"keyless ::1 host":               {true, "[::1]:1", map[string]string{"Host": "[::1]:8700"}, "team-keyless"},
		"keyless 0.0.0.0 host":           {true, "127.0.0.1:1", map[string]string{"Host": "0.0.0.0:8700"}, "team-keyless"},
		"keyless localhost.evil host":    {true, "127.0.0.1:1", map[string]string{"Host": "localhost.evil.example"}, ""},
		"a key with Origin, not keyless": {true, "127.0.0.1:1", map[string]string{"Authorization": "Bearer good", "Origin": "https://evil.example"}, "team-a"},
	} {
		f := &fakeTrials{out: trial.Outcome{Result: client.ExecResult{Status: client.StatusExited}}}
		rec, _ := serve(t, f, c.keyless, c.remote, ok, c.hdr)
		switch {
		case c.team == "" && (rec.Code != http.StatusUnauthorized || f.team != ""):
			t.Errorf("%s: %d, ran as %q", name, rec.Code, f.team)
		case c.team != "" && (rec.Code != http.StatusOK || f.team != c.team):
			t.Errorf("%s: %d, ran as %q, want %s", name, rec.Code, f.team, c.team)
		}
	}
}

// TestRunCodeOutputBudget: a run's output and fetched files are reserved
// from the server's output budget until the answer is written, then given
// back; a run whose output or files the budget could not hold is a 503 to
// retry (never an answer cut short by the server's load); so is a request
// that not even the first chunks fit, and then nothing runs. Files left
// out for their size alone are named in the message.
func TestRunCodeOutputBudget(t *testing.T) {
	big := strings.Repeat("x", 3<<20)
	budget := outbuf.NewBudget(1 << 20)
	run := func(f *fakeTrials, body string) (*httptest.ResponseRecorder, map[string]any) {
		return serveWith(t, Config{Trials: f, Auth: keys{}, Output: budget}, false, "10.0.0.1:1", body, bearer)
	}
	for name, out := range map[string]trial.Outcome{
		"output past the budget": {Result: client.ExecResult{Status: client.StatusExited, Stdout: big}},
		"a file past the budget": {Result: client.ExecResult{Status: client.StatusExited}, FetchSkipped: []string{"out.bin"}, FetchOverBudget: true},
	} {
		f := &fakeTrials{out: out}
		rec, m := run(f, `{"code": "", "language": "python", "fetch_files": ["out.bin"]}`)
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
			t.Errorf("%s: %d %v", name, rec.Code, m)
		}
		if f.spec.FetchBudget == nil {
			t.Errorf("%s: the fetched files were not bounded by the budget", name)
		}
		if budget.Used() != 0 {
			t.Errorf("%s: %d bytes still reserved after the answer", name, budget.Used())
		}
	}
	f := &fakeTrials{out: trial.Outcome{Result: client.ExecResult{Status: client.StatusExited, Stdout: "ok"}, FetchSkipped: []string{"huge.bin"},
		Files: map[string][]byte{"small.txt": []byte("s")}}}
	rec, m := run(f, `{"code": "", "language": "python", "fetch_files": ["huge.bin", "small.txt"]}`)
	files, _ := m["files"].(map[string]any)
	if msg, _ := m["message"].(string); rec.Code != 200 || !strings.Contains(msg, "huge.bin") || files["small.txt"] != "cw==" {
		t.Errorf("a file left out for its size: %d %v", rec.Code, m)
	}

	if !budget.TryReserve(budget.Total()) {
		t.Fatal("reserve")
	}
	f = &fakeTrials{out: trial.Outcome{Result: client.ExecResult{Status: client.StatusExited}}}
	rec, m = run(f, `{"code": "", "language": "python"}`)
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" || f.team != "" {
		t.Errorf("with the budget spent: %d %v, ran as %q", rec.Code, m, f.team)
	}
}
