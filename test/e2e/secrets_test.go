package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// recorder keeps every answer a client got (a secret must be in none but
// the one exec that prints it).
type recorder struct {
	mu      sync.Mutex
	answers []string
	skip    bool // the next answer is the secret's own exec output
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	r.mu.Lock()
	if r.skip {
		r.skip = false
	} else {
		r.answers = append(r.answers, req.Method+" "+req.URL.Path+" "+resp.Status+"\n"+string(b))
	}
	r.mu.Unlock()
	return resp, nil
}

func canaryValue(t *testing.T, what string) string {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "evbx-" + what + "-" + hex.EncodeToString(b)
}

// TestSecretsNeverLeak: secrets given at create, stored by the team (from
// the CLI's stdin) and given from the CLI's environment reach the
// sandbox's commands as environment variables, on both runtimes, and
// nowhere else: not another uid's view of the process list in the
// sandbox, not another team, not an answer of the API (but the command's
// own output), nor an error of a failing exec or create, nor the server's
// log, nor any file of its data dir (the SQLite database and its WAL).
func TestSecretsNeverLeak(t *testing.T) {
	// A data dir of the test's, to look into after the server stopped.
	s, err := startServer(serverOptions{dataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = s.stop()
		}
	})
	given, stored, fromEnv := canaryValue(t, "given"), canaryValue(t, "stored"), canaryValue(t, "cli")
	canaries := []string{given, stored, fromEnv}
	rec := &recorder{}
	_, _, keyA := newTeam(t, s, client.Limits{MaxSandboxes: 10, MaxConcurrentExec: 10})
	a := client.New(s.url, keyA, client.WithHTTPClient(&http.Client{Transport: rec}))
	b, _, _ := newTeam(t, s, client.Limits{MaxSandboxes: 10, MaxConcurrentExec: 10})
	ctx := ctxT(t, 5*time.Minute)

	cli := func(key, stdin string, env []string, args ...string) (string, string, int) {
		t.Helper()
		return runCLIEnv(t, s, ctx, key, stdin, env, args...)
	}
	var cliOutput []string
	mustCLI := func(key, stdin string, env []string, args ...string) string {
		t.Helper()
		out, errOut, code := cli(key, stdin, env, args...)
		cliOutput = append(cliOutput, out, errOut)
		if code != 0 {
			t.Fatalf("evalbox %v: exit %d: %s", args, code, errOut)
		}
		return out
	}

	// The team's stored secret, from stdin; listed by name only.
	mustCLI(keyA, stored+"\n", nil, "secrets", "set", "STORED_KEY")
	if out := mustCLI(keyA, "", nil, "secrets", "ls"); !strings.Contains(out, "STORED_KEY") {
		t.Fatalf("secrets ls: %q", out)
	}
	list, err := a.ListSecrets(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "STORED_KEY" {
		t.Fatalf("ListSecrets = %+v, %v", list, err)
	}
	if l, err := b.ListSecrets(ctx); err != nil || len(l) != 0 {
		t.Fatalf("another team lists %+v, %v", l, err)
	}
	// Bad input is refused and names no value.
	if _, errOut, code := cli(keyA, "", nil, "secrets", "set", "EMPTY"); code == 0 || !strings.Contains(errOut, "no value") {
		t.Fatalf("secrets set with no value: exit %d, %q", code, errOut)
	}
	if _, err := a.PutSecret(ctx, "BAD-NAME", given); client.ErrorCode(err) != client.CodeBadRequest {
		t.Fatalf("bad name: %v", err)
	}
	if _, err := a.PutSecret(ctx, "NUL", given+"\x00"); client.ErrorCode(err) != client.CodeBadRequest {
		t.Fatalf("NUL value: %v", err)
	}

	// Failing creates: the error names no value, and nothing is left.
	for name, req := range map[string]client.CreateSandboxRequest{
		"unknown template": {Template: "no-such-template", Secrets: map[string]string{"GIVEN_KEY": given}},
		"bad name":         {Template: "base", Secrets: map[string]string{"GIVEN-KEY": given}},
		"in env too":       {Template: "base", Secrets: map[string]string{"GIVEN_KEY": given}, Env: map[string]string{"GIVEN_KEY": "x"}},
		"unknown ref":      {Template: "base", Secrets: map[string]string{"GIVEN_KEY": given}, SecretRefs: []string{"NO_SUCH"}},
		"bad cpu":          {Template: "base", Secrets: map[string]string{"GIVEN_KEY": given}, CPU: 1000},
	} {
		if _, err := a.CreateSandbox(ctx, req); err == nil {
			t.Fatalf("%s: created", name)
		} else if strings.Contains(err.Error(), given) {
			t.Fatalf("%s: the error holds the value: %v", name, err)
		}
	}
	if _, err := a.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", SecretRefs: []string{"NO_SUCH"}}); !client.IsNotFound(err) {
		t.Fatalf("unknown ref: %v, want not_found", err)
	}
	// Another team cannot use the team's stored secret by its name.
	if _, err := b.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", SecretRefs: []string{"STORED_KEY"}}); !client.IsNotFound(err) {
		t.Fatalf("another team's ref: %v, want not_found", err)
	}
	if sbs, err := a.ListSandboxes(ctx, client.ListOptions{}); err != nil || len(sbs) != 0 {
		t.Fatalf("after failed creates: %+v, %v", sbs, err)
	}

	for _, rt := range []string{"gvisor", "namespaces"} {
		t.Run(rt, func(t *testing.T) {
			sb := mustCreateOn(t, s, a, client.CreateSandboxRequest{Runtime: rt, Env: map[string]string{"PLAIN": "p"},
				Secrets: map[string]string{"GIVEN_KEY": given}, SecretRefs: []string{"STORED_KEY"}})
			if !slices.Equal(sb.SecretNames, []string{"GIVEN_KEY", "STORED_KEY"}) || !slices.Equal(sb.EnvKeys, []string{"PLAIN"}) {
				t.Fatalf("secret_names %v, env_keys %v", sb.SecretNames, sb.EnvKeys)
			}
			// The command sees them (this answer is the one that may hold them).
			rec.mu.Lock()
			rec.skip = true
			rec.mu.Unlock()
			r := mustExec(t, a, sb.ID, client.ExecRequest{Cmd: `printf '%s|%s|%s' "$GIVEN_KEY" "$STORED_KEY" "$PLAIN"`})
			if r.Stdout != given+"|"+stored+"|p" {
				t.Fatalf("the command's env: %+v", r)
			}
			// An exec's own env is over the secrets.
			if r := mustExec(t, a, sb.ID, client.ExecRequest{Cmd: `printf %s "$GIVEN_KEY"`, Env: map[string]string{"GIVEN_KEY": "mine"}}); r.Stdout != "mine" {
				t.Fatalf("exec env over a secret: %+v", r)
			}
			// Failing execs: their answers and errors hold no value.
			if r := mustExec(t, a, sb.ID, client.ExecRequest{Cmd: `test -n "$GIVEN_KEY" && exit 3`}); r.ExitCode != 3 {
				t.Fatalf("failing exec: %+v", r)
			}
			if _, err := a.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/no/such/program"}}); err != nil && strings.Contains(err.Error(), given) {
				t.Fatalf("exec error holds the value: %v", err)
			}
			if r := mustExec(t, a, sb.ID, client.ExecRequest{Cmd: `sleep 5`, Timeout: 1}); r.Status == "exited" && r.ExitCode == 0 {
				t.Fatalf("timed-out exec: %+v", r)
			}
			// A process of the sandbox's root holds them; another uid sees
			// neither its environment nor anything in the process list.
			if _, err := a.StartProcess(ctx, sb.ID, client.ExecRequest{Cmd: `exec sleep 120`}); err != nil {
				t.Fatal(err)
			}
			// (The spy's own env has the secrets' names emptied: every
			// exec of the sandbox gets them, and it may read its own.)
			spy := mustExec(t, a, sb.ID, client.ExecRequest{User: "nobody", Env: map[string]string{"GIVEN_KEY": "", "STORED_KEY": ""}, Cmd: `sleep 0.5; for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do cat "$f" 2>/dev/null | tr '\0' '\n'; done; ps -eo args,euser 2>/dev/null; true`})
			for _, c := range canaries {
				if strings.Contains(spy.Stdout+spy.Stderr, c) {
					t.Fatalf("another uid in the sandbox sees a secret:\n%s", spy.Stdout)
				}
			}
			// The sandbox as the API and the CLI show it: names only.
			out := mustCLI(keyA, "", nil, "sandbox", "get", sb.ID)
			if !strings.Contains(out, "GIVEN_KEY,STORED_KEY") {
				t.Fatalf("sandbox get: %s", out)
			}
			// Another team sees nothing of it.
			if _, err := b.GetSandbox(ctx, sb.ID); !client.IsNotFound(err) {
				t.Fatalf("another team's get: %v", err)
			}
		})
	}

	// From the CLI: --secret takes the value from the CLI's environment;
	// NAME=VALUE on the command line is refused.
	if _, errOut, code := cli(keyA, "", nil, "sandbox", "create", "--secret", "X="+given); code == 0 || strings.Contains(errOut, given) {
		t.Fatalf("--secret NAME=VALUE: exit %d, %q", code, errOut)
	}
	id := strings.TrimSpace(mustCLI(keyA, "", []string{"CLI_KEY=" + fromEnv}, "sandbox", "create", "--secret", "CLI_KEY", "--secret-ref", "STORED_KEY", "--timeout", "2m"))
	t.Cleanup(func() { _ = a.DeleteSandbox(context.Background(), id) })
	rec.mu.Lock()
	rec.skip = true
	rec.mu.Unlock()
	if r := mustExec(t, a, id, client.ExecRequest{Cmd: `printf '%s|%s' "$CLI_KEY" "$STORED_KEY"`}); r.Stdout != fromEnv+"|"+stored {
		t.Fatalf("CLI sandbox env: %+v", r)
	}
	if err := a.DeleteSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := a.DeleteSecret(ctx, "STORED_KEY"); err != nil {
		t.Fatal(err)
	}
	if err := a.DeleteSecret(ctx, "STORED_KEY"); !client.IsNotFound(err) {
		t.Fatalf("second delete: %v", err)
	}

	check := func(where, text string) {
		t.Helper()
		for _, c := range canaries {
			if strings.Contains(text, c) {
				t.Errorf("%s holds a secret's value", where)
			}
		}
	}
	rec.mu.Lock()
	for _, ans := range rec.answers {
		check("the answer "+ans, ans)
	}
	rec.mu.Unlock()
	for _, o := range cliOutput {
		check("the CLI's output", o)
	}
	grepDataDir := func() {
		t.Helper()
		err := filepath.WalkDir(s.dataDir, func(path string, d os.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return nil // a sandbox's state going away meanwhile
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return nil
			}
			check(path, string(b))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// While the server runs (the WAL holds the latest writes), then once it
	// has stopped (checkpointed into the database file).
	if _, err := os.Stat(filepath.Join(s.dataDir, "evalbox.db-wal")); err != nil {
		t.Fatalf("no WAL to look in: %v", err)
	}
	grepDataDir()
	stopped = true
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	grepDataDir()
}
