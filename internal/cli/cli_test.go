package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

type result struct {
	stdout, stderr string
	code           int
}

// run runs the CLI against f with args and stdin, as main would.
func (f *fakeAPI) run(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	return runCLI(t, stdin, append([]string{"--api-url", f.srv.URL, "--api-key", fakeKey}, args...)...)
}

func runCLI(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	root := NewRoot()
	var out, errb bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetIn(strings.NewReader(stdin))
	code := Main(t.Context(), root, args)
	return result{out.String(), errb.String(), code}
}

func (r result) ok(t *testing.T) result {
	t.Helper()
	if r.code != 0 {
		t.Fatalf("exit %d, stderr %q, stdout %q", r.code, r.stderr, r.stdout)
	}
	return r
}

func TestSandboxCreate(t *testing.T) {
	f := newFakeAPI(t)
	r := f.run(t, "", "sandbox", "create", "--template", "python", "--runtime", "namespaces", "--timeout", "10m",
		"--cpu", "0.5", "--memory-mb", "256", "--disk-mb", "100", "--env", "A=1", "-e", "B=x=y",
		"--metadata", "run=r1", "--network", "outbound", "--wait", "30").ok(t)
	if r.stdout != "sb-1\n" || r.stderr != "" {
		t.Errorf("stdout %q stderr %q", r.stdout, r.stderr)
	}
	var sent map[string]any
	if err := json.Unmarshal(f.lastBody, &sent); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"template": "python", "runtime": "namespaces", "timeout": 600.0, "cpu": 0.5, "memory_mb": 256.0, "disk_mb": 100.0,
		"env": map[string]any{"A": "1", "B": "x=y"}, "metadata": map[string]any{"run": "r1"}, "network": "outbound", "wait_seconds": 30.0,
	}
	if got, _ := json.Marshal(sent); string(got) != string(must(json.Marshal(want))) {
		t.Errorf("request %s\nwant    %s", got, must(json.Marshal(want)))
	}

	// Defaults send only the template; --json prints the whole sandbox.
	r = f.run(t, "", "sandbox", "create", "--json").ok(t)
	if string(f.lastBody) != `{"template":"base"}` {
		t.Errorf("default request %s", f.lastBody)
	}
	var sb client.Sandbox
	if err := json.Unmarshal([]byte(r.stdout), &sb); err != nil || sb.ID != "sb-2" || sb.Template != "base" {
		t.Errorf("--json: %v %q", err, r.stdout)
	}

	// Usage and API errors.
	r = f.run(t, "", "sandbox", "create", "--env", "NOEQUALS")
	if r.code != ExitUsage || r.stderr != "evalbox: --env \"NOEQUALS\": want KEY=VALUE (see 'evalbox sandbox create --help')\n" {
		t.Errorf("bad --env: %d %q", r.code, r.stderr)
	}
	r = f.run(t, "", "sandbox", "create", "--template", "nope")
	if r.code != ExitError || r.stderr != "evalbox: not_found: template nope not found\n" || r.stdout != "" {
		t.Errorf("unknown template: %d %q", r.code, r.stderr)
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

func TestSandboxListAndGet(t *testing.T) {
	f := newFakeAPI(t)
	f.run(t, "", "sandbox", "create", "-m", "run=r1", "-m", "task=7").ok(t)
	f.run(t, "", "sandbox", "create", "--template", "python", "--runtime", "namespaces").ok(t)
	f.run(t, "", "sandbox", "create", "-m", "run=r2").ok(t)
	f.run(t, "", "sandbox", "rm", "sb-3").ok(t)

	r := f.run(t, "", "sandbox", "ls").ok(t)
	want := `ID    TEMPLATE  RUNTIME     STATE    CREATED               EXPIRES               METADATA
sb-1  base      gvisor      running  2026-03-01T12:00:01Z  2026-03-01T12:05:01Z  run=r1,task=7
sb-2  python    namespaces  running  2026-03-01T12:00:02Z  2026-03-01T12:05:02Z  -
`
	if r.stdout != want {
		t.Errorf("ls:\n%s\nwant:\n%s", r.stdout, want)
	}
	r = f.run(t, "", "sandbox", "ls", "--all", "--metadata", "run=r2").ok(t)
	if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[1], "sb-3  base      gvisor   deleted") {
		t.Errorf("ls --all --metadata:\n%s", r.stdout)
	}
	if q := f.lastReq.URL.Query(); q.Get("state") != "all" || q.Get("metadata.run") != "r2" {
		t.Errorf("query %q", f.lastReq.URL.RawQuery)
	}
	r = f.run(t, "", "sandbox", "ls", "--json", "-m", "run=none").ok(t)
	if strings.TrimSpace(r.stdout) != "{\n  \"sandboxes\": []\n}" {
		t.Errorf("empty ls --json: %q", r.stdout)
	}

	r = f.run(t, "", "sandbox", "get", "sb-1").ok(t)
	for _, want := range []string{"ID         sb-1\n", "Template   base\n", "Metadata   run=r1,task=7\n", "From pool  false\n"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("get: missing %q in\n%s", want, r.stdout)
		}
	}
	r = f.run(t, "", "sandbox", "get", "--json", "sb-2").ok(t)
	var sb client.Sandbox
	if err := json.Unmarshal([]byte(r.stdout), &sb); err != nil || sb.Runtime != "namespaces" {
		t.Errorf("get --json: %v %q", err, r.stdout)
	}
}

func TestErrorsAndExitCodes(t *testing.T) {
	f := newFakeAPI(t)
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"not found", []string{"sandbox", "get", "sb-123"}, 1, "evalbox: not_found: sandbox sb-123 not found\n"},
		{"missing arg", []string{"sandbox", "get"}, 2, "evalbox: accepts 1 arg(s), received 0 (see 'evalbox sandbox get --help')\n"},
		{"unknown flag", []string{"sandbox", "ls", "--bogus"}, 2, "evalbox: unknown flag: --bogus (see 'evalbox sandbox ls --help')\n"},
		{"unknown command", []string{"sandbox", "frobnicate"}, 2, "evalbox: unknown command \"frobnicate\" for \"evalbox sandbox\" (see 'evalbox sandbox --help')\n"},
		{"unknown top command", []string{"frobnicate"}, 2, "evalbox: unknown command \"frobnicate\" for \"evalbox\" (see 'evalbox --help')\n"},
		{"rm needs ids or filter", []string{"sandbox", "rm"}, 2, "evalbox: give sandbox ids or --metadata, not both nor neither (see 'evalbox sandbox rm --help')\n"},
		{"bad timeout", []string{"sandbox", "timeout", "sb-1", "soon"}, 2, "evalbox: SECONDS \"soon\": want a positive number of seconds or a duration (see 'evalbox sandbox timeout --help')\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := f.run(t, "", tc.args...)
			if r.code != tc.code || r.stderr != tc.stderr || r.stdout != "" {
				t.Errorf("exit %d stderr %q stdout %q; want %d %q", r.code, r.stderr, r.stdout, tc.code, tc.stderr)
			}
		})
	}

	t.Run("bad key", func(t *testing.T) {
		r := runCLI(t, "", "--api-url", f.srv.URL, "--api-key", "wrong", "sandbox", "ls")
		if r.code != 1 || r.stderr != "evalbox: unauthorized: invalid API key\n" {
			t.Errorf("%d %q", r.code, r.stderr)
		}
	})
	t.Run("env fallback", func(t *testing.T) {
		t.Setenv(client.EnvAPIURL, f.srv.URL)
		t.Setenv(client.EnvAPIKey, fakeKey)
		runCLI(t, "", "sandbox", "ls").ok(t)
	})
	t.Run("unreachable", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		r := runCLI(t, "", "--api-url", "http://"+addr, "sandbox", "ls")
		if r.code != 1 || !strings.HasPrefix(r.stderr, "evalbox: cannot reach the evalbox API") || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("%d %q", r.code, r.stderr)
		}
	})
	t.Run("group alone prints help", func(t *testing.T) {
		r := f.run(t, "", "sandbox").ok(t)
		if !strings.Contains(r.stdout, "Available Commands:") {
			t.Errorf("%q", r.stdout)
		}
	})
	t.Run("health needs no key", func(t *testing.T) {
		r := runCLI(t, "", "--api-url", f.srv.URL, "health").ok(t)
		if r.stdout != "ok (version test, runtimes: gvisor, namespaces)\n" {
			t.Errorf("%q", r.stdout)
		}
	})
	t.Run("health with an admin key shows the host capacity", func(t *testing.T) {
		r := f.run(t, "", "health").ok(t)
		want := "ok (version test, runtimes: gvisor, namespaces)\n" +
			"host capacity: pids 1280 of 28672 reserved (27392 free); memory limits 1632 of 43392 MiB reserved (41760 MiB free); " +
			"memory available 23000 MiB (reserve 2410 MiB); 1 sandboxes, 0 waiting\n"
		if r.stdout != want {
			t.Errorf("%q\nwant %q", r.stdout, want)
		}
		r = f.run(t, "", "health", "--json").ok(t)
		if !strings.Contains(r.stdout, `"status": "ok"`) || !strings.Contains(r.stdout, `"budget": 28672`) {
			t.Errorf("%s", r.stdout)
		}
	})
}

func TestSandboxExec(t *testing.T) {
	f := newFakeAPI(t)
	f.run(t, "", "sandbox", "create").ok(t)
	for _, tc := range []struct {
		name                 string
		stdin                string
		args                 []string
		code                 int
		stdout, stderr, want string
	}{
		{name: "stdout", args: []string{"sb-1", "--", "echo", "hello", "world"}, stdout: "hello world\n"},
		{name: "exit code and stderr", args: []string{"sb-1", "--", "fail", "3", "boom"}, code: 3, stderr: "boom\n"},
		{name: "timed out", args: []string{"--timeout", "1.5", "sb-1", "sleep"}, code: 124, stdout: "partial\n", stderr: "evalbox: command timed out after 1.5s\n"},
		{name: "killed", args: []string{"sb-1", "killed", "15"}, code: 143, stderr: "evalbox: command killed by signal 15\n"},
		{name: "could not run", args: []string{"sb-1", "nosuchcmd"}, code: 1, stderr: "evalbox: exec failed: executable nosuchcmd not found\n"},
		{name: "stdin", stdin: "from stdin\n", args: []string{"-i", "sb-1", "--", "cat"}, stdout: "from stdin\n"},
		{name: "no stdin unless asked", stdin: "ignored", args: []string{"sb-1", "cat"}},
		{name: "env cwd user timeout", args: []string{"-e", "A=1", "--env", "B=2", "--cwd", "/w", "-u", "nobody", "--timeout", "2m", "sb-1", "--", "env"},
			stdout: "A=1\nB=2\ncwd=/w user=nobody timeout=120\n"},
		{name: "shell command", args: []string{"sb-1", "--cmd", "ls | wc -l"}, stdout: "sh -c ls | wc -l\n"},
		{name: "truncated", args: []string{"sb-1", "flood"}, stdout: "xxxx", stderr: "evalbox: warning: stdout was truncated at the server's output cap\n"},
		{name: "no command", args: []string{"sb-1"}, code: 2, stderr: "evalbox: give a command after the sandbox id (ID -- COMMAND…) or --cmd, not both (see 'evalbox sandbox exec --help')\n"},
		{name: "both", args: []string{"sb-1", "-c", "true", "--", "true"}, code: 2, stderr: "evalbox: give a command after the sandbox id (ID -- COMMAND…) or --cmd, not both (see 'evalbox sandbox exec --help')\n"},
		{name: "unknown sandbox", args: []string{"sb-9", "--", "true"}, code: 1, stderr: "evalbox: not_found: sandbox sb-9 not found\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := f.run(t, tc.stdin, append([]string{"sandbox", "exec"}, tc.args...)...)
			if r.code != tc.code || r.stdout != tc.stdout || r.stderr != tc.stderr {
				t.Errorf("exit %d stdout %q stderr %q\nwant %d %q %q", r.code, r.stdout, r.stderr, tc.code, tc.stdout, tc.stderr)
			}
			if tc.code != 2 && tc.name != "unknown sandbox" && f.lastReq.Header.Get("Accept") != client.ContentTypeNDJSON {
				t.Errorf("not streamed: Accept %q", f.lastReq.Header.Get("Accept"))
			}
		})
	}
	t.Run("json exits 0 with the result", func(t *testing.T) {
		r := f.run(t, "", "sandbox", "exec", "--json", "sb-1", "--", "fail", "7", "bad").ok(t)
		var res client.ExecResult
		if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res.ExitCode != 7 || res.Stderr != "bad\n" || res.Status != client.StatusExited {
			t.Errorf("%v %q", err, r.stdout)
		}
		if f.lastReq.Header.Get("Accept") != client.ContentTypeJSON {
			t.Errorf("--json streamed")
		}
	})
	t.Run("ended sandbox", func(t *testing.T) {
		f.run(t, "", "sandbox", "rm", "sb-1").ok(t)
		r := f.run(t, "", "sandbox", "exec", "sb-1", "true")
		if r.code != 1 || r.stderr != "evalbox: sandbox_not_running: sandbox sb-1 is deleted\n" {
			t.Errorf("%d %q", r.code, r.stderr)
		}
	})
}

func TestSandboxCp(t *testing.T) {
	f := newFakeAPI(t)
	f.run(t, "", "sandbox", "create").ok(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "solution.py")
	if err := os.WriteFile(src, []byte("print(42)\n"), 0o750); err != nil {
		t.Fatal(err)
	}

	f.run(t, "", "sandbox", "cp", src, "sb-1:/work/solution.py").ok(t)
	if ff, _ := f.file(f.sandboxes["sb-1"], "/work/solution.py"); string(ff.data) != "print(42)\n" || ff.mode != "0750" {
		t.Errorf("uploaded %q mode %s", ff.data, ff.mode)
	}
	if cl := f.lastReq.ContentLength; cl != 10 {
		t.Errorf("upload Content-Length %d", cl)
	}
	// Into a directory: keeps the name.
	f.run(t, "", "sandbox", "cp", src, "sb-1:/tmp/").ok(t)
	if _, ok := f.file(f.sandboxes["sb-1"], "/tmp/solution.py"); !ok {
		t.Error("cp into sb-1:/tmp/ did not keep the name")
	}
	f.mu.Lock()
	f.files["sb-1:/data"] = fakeFile{dir: true, mode: "0755"}
	f.mu.Unlock()
	f.run(t, "", "sandbox", "cp", src, "sb-1:/data").ok(t)
	if _, ok := f.file(f.sandboxes["sb-1"], "/data/solution.py"); !ok {
		t.Error("cp onto the existing directory sb-1:/data did not keep the name")
	}
	// From stdin, chunked.
	f.run(t, "stdin data", "sandbox", "cp", "-", "sb-1:/in.txt").ok(t)
	if ff, _ := f.file(f.sandboxes["sb-1"], "/in.txt"); string(ff.data) != "stdin data" || ff.mode != "0644" {
		t.Errorf("stdin upload %q %s", ff.data, ff.mode)
	}

	// Download to a file, into a directory, to stdout.
	dst := filepath.Join(dir, "back.py")
	f.run(t, "", "sandbox", "cp", "sb-1:/work/solution.py", dst).ok(t)
	if b, err := os.ReadFile(dst); err != nil || string(b) != "print(42)\n" {
		t.Errorf("download %q %v", b, err)
	}
	sub := t.TempDir()
	f.run(t, "", "sandbox", "cp", "sb-1:/in.txt", sub).ok(t)
	if b, err := os.ReadFile(filepath.Join(sub, "in.txt")); err != nil || string(b) != "stdin data" {
		t.Errorf("download into dir %q %v", b, err)
	}
	r := f.run(t, "", "sandbox", "cp", "sb-1:/in.txt", "-").ok(t)
	if r.stdout != "stdin data" {
		t.Errorf("download to stdout %q", r.stdout)
	}

	// Errors.
	r = f.run(t, "", "sandbox", "cp", "sb-1:/missing", filepath.Join(dir, "x"))
	if r.code != 1 || r.stderr != "evalbox: not_found: no file /missing\n" {
		t.Errorf("missing: %d %q", r.code, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "x")); !errors.Is(err, os.ErrNotExist) {
		t.Error("a failed download left a file")
	}
	r = f.run(t, "", "sandbox", "cp", dir, "sb-1:/d")
	if r.code != 1 || !strings.Contains(r.stderr, "copying directories is not supported") {
		t.Errorf("dir: %d %q", r.code, r.stderr)
	}
	for _, a := range [][]string{{"a", "b"}, {"sb-1:/a", "sb-1:/b"}, {"./x:/y", "z"}} {
		if r := f.run(t, "", append([]string{"sandbox", "cp"}, a...)...); r.code != 2 {
			t.Errorf("cp %v: exit %d %q", a, r.code, r.stderr)
		}
	}
}

func TestSandboxRmTimeoutPsKill(t *testing.T) {
	f := newFakeAPI(t)
	for range 3 {
		f.run(t, "", "sandbox", "create", "-m", "run=r1").ok(t)
	}
	f.run(t, "", "sandbox", "create", "-m", "run=r2").ok(t)

	r := f.run(t, "", "sandbox", "rm", "sb-1", "sb-404", "sb-2")
	if r.code != 1 || r.stdout != "sb-1\nsb-2\n" || r.stderr != "evalbox: not_found: sandbox sb-404 not found\n" {
		t.Errorf("rm ids: %d %q %q", r.code, r.stdout, r.stderr)
	}
	r = f.run(t, "", "sandbox", "rm", "--json", "--metadata", "run=r1").ok(t)
	if strings.Join(strings.Fields(r.stdout), "") != `{"deleted":["sb-3"]}` {
		t.Errorf("rm --metadata: %q", r.stdout)
	}
	if r := f.run(t, "", "sandbox", "rm", "sb-4", "-m", "run=r2"); r.code != 2 {
		t.Errorf("rm with ids and filter: %d", r.code)
	}

	r = f.run(t, "", "sandbox", "timeout", "sb-4", "15m").ok(t)
	if r.stdout != "sb-4 expires at 2026-03-01T12:15:00Z\n" {
		t.Errorf("timeout: %q", r.stdout)
	}
	if !strings.Contains(string(must(json.Marshal(f.lastReq.URL.Path))), "/timeout") {
		t.Errorf("timeout path %s", f.lastReq.URL.Path)
	}

	r = f.run(t, "", "sandbox", "ps", "sb-4").ok(t)
	want := `ID   PID  STATUS   EXIT  STARTED               TAG  COMMAND
p-1  42   running  -     2026-03-01T12:00:00Z  web  python3 server.py
p-2  43   exited   1     2026-03-01T12:00:00Z  -    false
`
	if r.stdout != want {
		t.Errorf("ps:\n%s\nwant:\n%s", r.stdout, want)
	}
	f.run(t, "", "sandbox", "kill", "sb-4", "p-1").ok(t)
	f.run(t, "", "sandbox", "kill", "--signal", "TERM", "sb-4", "p-2").ok(t)
	if !slices.Equal(f.killed, []string{"p-1"}) || !slices.Equal(f.signals, []string{"p-2:TERM"}) {
		t.Errorf("killed %v signals %v", f.killed, f.signals)
	}
}

func TestKeysTeamsTemplates(t *testing.T) {
	f := newFakeAPI(t)
	r := f.run(t, "", "keys", "create", "--name", "ci").ok(t)
	if r.stdout != "ebx_abcdSECRET\n" {
		t.Errorf("keys create: %q", r.stdout)
	}
	r = f.run(t, "", "keys", "create", "--name", "ci", "--team", "team-7", "--json").ok(t)
	var k client.APIKey
	if err := json.Unmarshal([]byte(r.stdout), &k); err != nil || k.TeamID != "team-7" || k.Key == "" {
		t.Errorf("keys create --json: %v %q", err, r.stdout)
	}
	if r := f.run(t, "", "keys", "create"); r.code != 2 {
		t.Errorf("keys create without --name: %d", r.code)
	}
	r = f.run(t, "", "keys", "ls").ok(t)
	want := `ID     NAME    TEAM    PREFIX    ADMIN  CREATED               REVOKED
key-1  admin   team-1  ebx_0000  true   2026-03-01T12:00:00Z  -
key-2  old ci  team-1  ebx_1111  false  2026-03-01T12:00:00Z  2026-03-01T13:00:00Z
`
	if r.stdout != want {
		t.Errorf("keys ls:\n%s\nwant:\n%s", r.stdout, want)
	}
	f.run(t, "", "keys", "revoke", "key-2").ok(t)
	if r := f.run(t, "", "keys", "revoke", "key-3"); r.code != 1 || r.stderr != "evalbox: not_found: key key-3 not found\n" {
		t.Errorf("revoke unknown: %d %q", r.code, r.stderr)
	}

	r = f.run(t, "", "teams", "create", "evals", "--max-sandboxes", "8", "--max-execs", "16").ok(t)
	if r.stdout != "team-2\n" {
		t.Errorf("teams create: %q", r.stdout)
	}
	f.run(t, "", "teams", "create", "rl").ok(t)
	f.run(t, "", "teams", "update", "team-2", "--max-execs", "32").ok(t)
	if f.teams["team-2"].Limits != (client.Limits{MaxSandboxes: 8, MaxConcurrentExec: 32}) {
		t.Errorf("update kept other limit? %+v", f.teams["team-2"].Limits)
	}
	f.run(t, "", "teams", "update", "team-2", "--max-storage-mb", "2048").ok(t)
	if f.teams["team-2"].Limits != (client.Limits{MaxSandboxes: 8, MaxConcurrentExec: 32, MaxStorageMB: 2048}) {
		t.Errorf("update of the storage limit: %+v", f.teams["team-2"].Limits)
	}
	f.run(t, "", "teams", "update", "team-2", "--requests-per-minute", "600", "--creates-per-minute", "60").ok(t)
	if f.teams["team-2"].Limits != (client.Limits{MaxSandboxes: 8, MaxConcurrentExec: 32, MaxStorageMB: 2048, RequestsPerMinute: 600, CreatesPerMinute: 60}) {
		t.Errorf("update of the rate limits: %+v", f.teams["team-2"].Limits)
	}
	r = f.run(t, "", "teams", "ls").ok(t)
	want = `ID      NAME   MAX_SANDBOXES  MAX_EXECS  MAX_STORAGE_MB  REQUESTS/MIN  CREATES/MIN  CREATED
team-2  evals  8              32         2048            600           60           2026-03-01T12:00:00Z
team-3  rl     100            64         default         default       default      2026-03-01T12:00:00Z
`
	if r.stdout != want {
		t.Errorf("teams ls:\n%s\nwant:\n%s", r.stdout, want)
	}

	r = f.run(t, "", "template", "ls").ok(t)
	want = `NAME    SOURCE   DIGEST               SIZE     CPU  MEMORY_MB  DISK_MB  BUILT
base    builtin  sha256:0123456789ab  50.0MiB  1    512        1024     2026-03-01T12:00:00Z
python  build    sha256:fedcba987654  3.0GiB   0.5  1024       2048     2026-03-01T12:00:00Z

template store: 5.0GiB on disk
`
	if r.stdout != want {
		t.Errorf("template ls:\n%s\nwant:\n%s", r.stdout, want)
	}
}

func TestServe(t *testing.T) {
	var got ServeConfig
	t.Cleanup(func() { ServeFunc = nil })
	ServeFunc = func(ctx context.Context, cfg ServeConfig) error {
		got = cfg
		// A signal cancels ctx: serve returns cleanly.
		if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Second):
			return errors.New("SIGINT did not cancel the context")
		}
	}
	runCLI(t, "", "serve", "--data-dir", "/tmp/ebx", "--database", "postgres://evalbox@db.internal/evalbox?sslmode=require", "--listen", "127.0.0.1:0", "--runsc", "/bin/runsc", "--agent", "/bin/agent",
		"--templates-dir", "/tmp/tmpl", "--default-timeout", "600", "--max-timeout", "2h", "--max-sandboxes", "10", "--max-execs", "20",
		"--max-file-bytes", "512MiB", "--pool", "base:gvisor=4, python:namespaces=2,node=1", "--log-level", "debug",
		"--max-builds", "3", "--build-timeout", "10m", "--build-network", "none", "--exec-wait", "30",
		"--output-memory-mb", "256", "--http-read-header-timeout", "3", "--http-idle-timeout", "1m", "--max-storage-mb", "512",
		"--registry-allow", "registry.internal:5000,ghcr.io", "--replica-id", "api-1", "--eval-lease", "5s",
		"--pids", "512", "--host-pids", "16996", "--host-reserve-memory-mb", "4096", "--memory-overcommit", "3.5",
		"--public-url", "https://evalbox.example.com", "--rate-limit-requests-per-minute", "120", "--rate-limit-creates-per-minute", "6",
		"--rate-limit-key-requests-per-minute", "60", "--metrics-listen", "10.0.0.5:9100", "--audit-retention", "720h",
		"--cpu-abuse-threshold", "0.8", "--cpu-abuse-window", "5m", "--cpu-abuse-interval", "2s",
		"--secrets-keys", "/etc/evalbox/secrets.keys", "--meter-interval", "2s", "--billing-granularity", "10s", "--billing-minimum", "0",
		"--default-tariff", "small", "--billing", "on", "--billing-grace", "1m").ok(t)
	want := ServeConfig{
		NodeFlags: NodeFlags{DataDir: "/tmp/ebx", RunscPath: "/bin/runsc", AgentPath: "/bin/agent", TemplatesDir: "/tmp/tmpl",
			HostPids: 16996, HostReserveMemoryMB: 4096, MemoryOvercommit: 3.5, LogLevel: -4, Logger: got.Logger},
		Database: "postgres://evalbox@db.internal/evalbox?sslmode=require", Listen: "127.0.0.1:0",
		DefaultTimeout: 10 * time.Minute, MaxTimeout: 2 * time.Hour, MaxSandboxes: 10, MaxConcurrentExecs: 20, MaxFileBytes: 512 << 20,
		RateLimitRequestsPerMinute: 120, RateLimitCreatesPerMinute: 6, RateLimitKeyRequestsPerMinute: 60,
		Pool:      []PoolSpec{{"base", "gvisor", 4}, {"python", "namespaces", 2}, {"node", "", 1}},
		MaxBuilds: 3, BuildTimeout: 10 * time.Minute, BuildNetwork: "none", ExecWait: 30 * time.Second,
		OutputMemoryMB: 256, ReadHeaderTimeout: 3 * time.Second, IdleTimeout: time.Minute, MaxStorageMB: 512,
		RegistryAllow: []string{"registry.internal:5000", "ghcr.io"},
		Pids:          512,
		ReplicaID:     "api-1", EvalLease: 5 * time.Second,
		Nodes: "local", Namespace: "evalbox", PublicURL: "https://evalbox.example.com",
		MetricsListen: "10.0.0.5:9100", AuditRetention: 30 * 24 * time.Hour,
		CPUAbuseThreshold: 0.8, CPUAbuseWindow: 5 * time.Minute, CPUAbuseInterval: 2 * time.Second,
		SecretsKeys: "/etc/evalbox/secrets.keys", MeterInterval: 2 * time.Second, BillingGranularity: 10 * time.Second,
		DefaultTariff: "small", Billing: true, BillingGrace: time.Minute,
	}
	if got.Logger == nil || !got.Logger.Enabled(context.Background(), -4) {
		t.Error("no debug logger")
	}
	if gj, wj := must(json.Marshal(got)), must(json.Marshal(want)); string(gj) != string(wj) {
		t.Errorf("config\n%s\nwant\n%s", gj, wj)
	}

	// A fleet replica.
	ServeFunc = func(ctx context.Context, cfg ServeConfig) error { got = cfg; return nil }
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	runCLI(t, "", "serve", "--nodes", "kubernetes", "--kubeconfig", "/k", "--namespace", "ns", "--node-token-file", tokenFile,
		"--node-tls-ca", "/ca", "--node-tls-cert", "/c", "--node-tls-key", "/k2", "--node-tls-server-name", "evalbox-node",
		"--node-listen", ":8443").ok(t)
	if got.Nodes != "kubernetes" || got.Kubeconfig != "/k" || got.Namespace != "ns" || got.NodeToken != "s3cret" ||
		got.NodeTLSCA != "/ca" || got.NodeTLSCert != "/c" || got.NodeTLSKey != "/k2" || got.NodeTLSServerName != "evalbox-node" ||
		got.NodeListen != ":8443" {
		t.Errorf("fleet flags %+v", got)
	}
	// An embedded server may serve its templates to nodes on a TLS port.
	runCLI(t, "", "serve", "--node-token-file", tokenFile, "--node-listen", "127.0.0.1:8443", "--node-tls-cert", "/c", "--node-tls-key", "/k2").ok(t)
	if got.NodeListen != "127.0.0.1:8443" || got.NodeTLSCert != "/c" {
		t.Errorf("embedded --node-listen: %+v", got)
	}
	for _, args := range [][]string{
		{"--nodes", "k8s"},
		{"--nodes", "kubernetes"},
		{"--nodes", "kubernetes", "--node-token-file", tokenFile, "--node-tls-cert", "/c"},
		{"--nodes", "kubernetes", "--node-token-file", tokenFile, "--node-tls-server-name", "evalbox-node"}, // checks nothing without a CA
		{"--kubeconfig", "/k"},
		{"--node-tls-ca", "/ca"}, // a local node needs none, unless --node-listen
		{"--node-tls-server-name", "x"},
		{"--node-listen", ":8443", "--node-tls-cert", "/c", "--node-tls-key", "/k2"},                                // no token
		{"--node-listen", ":8443", "--node-token-file", tokenFile},                                                  // TLS only
		{"--node-listen", "8443", "--node-token-file", tokenFile, "--node-tls-cert", "/c", "--node-tls-key", "/k2"}, // no host:port
		{"--metrics-listen", "9100"}, // no host:port
		{"--audit-retention", "-1"},
		{"--cpu-abuse-threshold", "0"},
		{"--cpu-abuse-threshold", "1.5"},
		{"--cpu-abuse-window", "-1"},
		{"--cpu-abuse-interval", "1ms"},
		{"--billing", "yes"},
		{"--meter-interval", "1ms"},
		{"--billing-minimum", "-1s"},
	} {
		if r := runCLI(t, "", append([]string{"serve"}, args...)...); r.code != 2 {
			t.Errorf("serve %v: exit %d %q, want a usage error", args, r.code, r.stderr)
		}
	}

	// Defaults.
	runCLI(t, "", "serve").ok(t)
	if got.DataDir != DefaultDataDir || got.Database != "" || got.Listen != DefaultListen || got.DefaultTimeout != DefaultTimeout ||
		got.MaxTimeout != DefaultMaxTimeout || got.MaxFileBytes != DefaultMaxFileBytes || got.Pool != nil || got.LogLevel != 0 ||
		got.OutputMemoryMB != DefaultOutputMemoryMB || got.ReadHeaderTimeout != DefaultReadHeader || got.IdleTimeout != DefaultIdleTimeout ||
		got.MaxStorageMB != DefaultMaxStorageMB || got.RegistryAllow != nil ||
		got.Pids != DefaultPids || got.MemoryOvercommit != DefaultMemoryOvercommit || got.HostPids != 0 || got.HostReservePids != 0 || got.HostReserveMemoryMB != 0 ||
		got.ReplicaID != "" || got.EvalLease != DefaultEvalLease || got.MetricsListen != "" || got.AuditRetention != DefaultAuditRetention {
		t.Errorf("defaults %+v", got)
	}

	// Failures.
	ServeFunc = func(ctx context.Context, cfg ServeConfig) error { return errors.New("listen tcp: address in use") }
	if r := runCLI(t, "", "serve"); r.code != 1 || r.stderr != "evalbox: listen tcp: address in use\n" {
		t.Errorf("server error: %d %q", r.code, r.stderr)
	}
	for _, a := range [][]string{
		{"--pool", "base:gvisor"}, {"--pool", "=3"}, {"--pool", "base=-1"}, {"--pool", "base=1,base=2"},
		{"--log-level", "loud"}, {"--default-timeout", "soon"}, {"--max-file-bytes", "lots"},
		{"--output-memory-mb", "8"}, {"--http-idle-timeout", "0"},
		{"--default-timeout", "2h", "--max-timeout", "1h"}, {"--max-sandboxes", "0"}, {"extra-arg"},
		{"--registry-allow", "https://ghcr.io"}, {"--registry-allow", "ghcr.io/x"}, {"--max-storage-mb", "-1"}, {"--rate-limit-requests-per-minute", "-1"}, {"--rate-limit-creates-per-minute", "-5"},
		{"--database", "mysql://u@h/db"}, {"--database", "sqlite:"}, {"--database", "host=db password=pw"},
		{"--pids", "10"}, {"--host-pids", "-1"}, {"--host-reserve-memory-mb", "-5"}, {"--memory-overcommit", "0.5"},
		{"--host-pids", "20000", "--host-reserve-pids", "100"},
		{"--public-url", "evalbox.example.com"}, {"--public-url", "https://h/x"}, {"--public-url", "ftp://h"},
	} {
		if r := runCLI(t, "", append([]string{"serve"}, a...)...); r.code != 2 {
			t.Errorf("serve %v: exit %d %q", a, r.code, r.stderr)
		}
	}
	for _, db := range []string{"mysql://u:secretpw@h/db", "host=db password=secretpw"} {
		if r := runCLI(t, "", "serve", "--database", db); r.code != 2 || strings.Contains(r.stderr, "secretpw") {
			t.Errorf("serve --database %s: exit %d %q; want a usage error without the password", db, r.code, r.stderr)
		}
	}
	ServeFunc = nil
	if r := runCLI(t, "", "serve"); r.code != 1 || !strings.Contains(r.stderr, "without a server") {
		t.Errorf("no ServeFunc: %d %q", r.code, r.stderr)
	}
}

func TestFlagParsers(t *testing.T) {
	for in, want := range map[string]time.Duration{"30": 30 * time.Second, "1.5": 1500 * time.Millisecond, "5m": 5 * time.Minute, "0": 0} {
		if got, err := parseSeconds(in); err != nil || got != want {
			t.Errorf("parseSeconds(%q) = %v, %v", in, got, err)
		}
	}
	for _, in := range []string{"-1", "x", "-5s", "NaN", "1e300"} {
		if _, err := parseSeconds(in); err == nil {
			t.Errorf("parseSeconds(%q) accepted", in)
		}
	}
	for in, want := range map[string]int64{"1048576": 1 << 20, "512MiB": 512 << 20, "1G": 1 << 30, "2GB": 2e9, "10 KiB": 10 << 10, "7B": 7} {
		if got, err := parseByteSize(in); err != nil || got != want {
			t.Errorf("parseByteSize(%q) = %v, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "MiB", "-1", "1X"} {
		if _, err := parseByteSize(in); err == nil {
			t.Errorf("parseByteSize(%q) accepted", in)
		}
	}
}
