package e2e

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// rawDo sends a raw HTTP request and returns status, error code and body.
func rawDo(t *testing.T, method, url, key, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	c, _, key := newTeam(t, srv, client.Limits{MaxSandboxes: 5, MaxConcurrentExec: 5})
	sandboxes := func() int {
		list, err := c.ListSandboxes(context.Background(), client.ListOptions{All: true})
		if err != nil {
			t.Fatal(err)
		}
		return len(list)
	}
	cases := []struct {
		name, method, path, key, body string
		status                        int
		code                          string
	}{
		{"no key", "GET", "/v1/sandboxes", "", "", 401, client.CodeUnauthorized},
		{"wrong key", "GET", "/v1/sandboxes", "eb_wrong", "", 401, client.CodeUnauthorized},
		{"malformed json", "POST", "/v1/sandboxes", key, `{"template":`, 400, client.CodeBadRequest},
		{"trailing data", "POST", "/v1/sandboxes", key, `{"template":"base"} {}`, 400, client.CodeBadRequest},
		{"unknown field", "POST", "/v1/sandboxes", key, `{"template":"base","bogus":1}`, 400, client.CodeBadRequest},
		{"missing template", "POST", "/v1/sandboxes", key, `{}`, 400, client.CodeBadRequest},
		{"unknown template", "POST", "/v1/sandboxes", key, `{"template":"nope"}`, 404, client.CodeNotFound},
		{"bad template name", "POST", "/v1/sandboxes", key, `{"template":"../../etc"}`, 404, client.CodeNotFound},
		{"unknown runtime", "POST", "/v1/sandboxes", key, `{"template":"base","runtime":"docker"}`, 400, client.CodeBadRequest},
		{"negative timeout", "POST", "/v1/sandboxes", key, `{"template":"base","timeout":-1}`, 400, client.CodeBadRequest},
		{"huge timeout", "POST", "/v1/sandboxes", key, `{"template":"base","timeout":999999999}`, 400, client.CodeBadRequest},
		{"oversize memory", "POST", "/v1/sandboxes", key, `{"template":"base","memory_mb":10000000}`, 400, client.CodeBadRequest},
		{"oversize cpu", "POST", "/v1/sandboxes", key, `{"template":"base","cpu":1000}`, 400, client.CodeBadRequest},
		{"negative disk", "POST", "/v1/sandboxes", key, `{"template":"base","disk_mb":-5}`, 400, client.CodeBadRequest},
		{"bad network", "POST", "/v1/sandboxes", key, `{"template":"base","network":"host"}`, 400, client.CodeBadRequest},
		{"bad env name", "POST", "/v1/sandboxes", key, `{"template":"base","env":{"A=B":"x"}}`, 400, client.CodeBadRequest},
		{"wrong type", "POST", "/v1/sandboxes", key, `{"template":"base","timeout":"10"}`, 400, client.CodeBadRequest},
		{"unknown sandbox", "GET", "/v1/sandboxes/sb-nope", key, "", 404, client.CodeNotFound},
		{"exec unknown sandbox", "POST", "/v1/sandboxes/sb-nope/exec", key, `{"cmd":"true"}`, 404, client.CodeNotFound},
		{"bulk delete without filter", "DELETE", "/v1/sandboxes", key, "", 400, client.CodeBadRequest},
		{"teams need admin", "GET", "/v1/teams", key, "", 403, client.CodeForbidden},
		{"unknown route", "GET", "/v1/nope", key, "", 404, client.CodeNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, body := rawDo(t, tc.method, srv.url+tc.path, tc.key, tc.body)
			if status != tc.status || !strings.Contains(body, `"code":"`+tc.code+`"`) {
				t.Fatalf("%s %s %s → %d %s; want %d %s", tc.method, tc.path, tc.body, status, body, tc.status, tc.code)
			}
		})
	}
	if n := sandboxes(); n != 0 {
		t.Fatalf("bad requests left %d sandboxes", n)
	}

	// Bad exec and file input against a real sandbox.
	sb := mustCreate(t, c, client.CreateSandboxRequest{Runtime: client.RuntimeNamespaces})
	base := "/v1/sandboxes/" + sb.ID
	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"exec no cmd", "POST", base + "/exec", `{}`, 400, client.CodeBadRequest},
		{"exec cmd and argv", "POST", base + "/exec", `{"cmd":"true","argv":["true"]}`, 400, client.CodeBadRequest},
		{"exec negative timeout", "POST", base + "/exec", `{"cmd":"true","timeout":-1}`, 400, client.CodeBadRequest},
		{"exec negative memory limit", "POST", base + "/exec", `{"cmd":"true","memory_limit_mb":-1}`, 400, client.CodeBadRequest},
		{"exec huge memory limit", "POST", base + "/exec", `{"cmd":"true","memory_limit_mb":2000000000}`, 400, client.CodeBadRequest},
		{"exec relative cwd", "POST", base + "/exec", `{"cmd":"true","cwd":"tmp"}`, 400, client.CodeBadRequest},
		{"exec unknown user", "POST", base + "/exec", `{"cmd":"true","user":"nosuchuser"}`, 200, ""},
		{"file no path", "GET", base + "/files", "", 400, client.CodeBadRequest},
		{"file relative", "GET", base + "/files?path=etc/passwd", "", 400, client.CodeBadRequest},
		{"file missing", "GET", base + "/files?path=/nope", "", 404, client.CodeNotFound},
		{"read a dir", "GET", base + "/files?path=/etc", "", 400, client.CodeBadRequest},
		{"bad mode", "PUT", base + "/files?path=/work/x&mode=999", "x", 400, client.CodeBadRequest},
		{"bad signal", "POST", base + "/processes/p1/signal", `{"signal":"SIGNOPE"}`, 400, client.CodeBadRequest},
		{"remove root", "DELETE", base + "/files?path=/&recursive=true", "", 400, client.CodeBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := rawDo(t, tc.method, srv.url+tc.path, key, tc.body)
			if status != tc.status || (tc.code != "" && !strings.Contains(body, `"code":"`+tc.code+`"`)) {
				t.Fatalf("%s %s → %d %s; want %d %s", tc.method, tc.path, status, body, tc.status, tc.code)
			}
		})
	}
	// A bad mode or path leaves no file behind.
	r := mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "ls /work"})
	if r.Stdout != "" {
		t.Fatalf("failed uploads left files: %q", r.Stdout)
	}

	// Another team's sandbox is a 404 for everything.
	other, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 1, MaxConcurrentExec: 1})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := other.GetSandbox(ctx, sb.ID); !client.IsNotFound(err) {
		t.Errorf("other team get: %v", err)
	}
	if _, err := other.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "true"}); !client.IsNotFound(err) {
		t.Errorf("other team exec: %v", err)
	}
	if err := other.DeleteSandbox(ctx, sb.ID); !client.IsNotFound(err) {
		t.Errorf("other team delete: %v", err)
	}
	if _, _, err := other.ReadFile(ctx, sb.ID, "/etc/hostname"); !client.IsNotFound(err) {
		t.Errorf("other team read: %v", err)
	}
	if list, err := other.ListSandboxes(ctx, client.ListOptions{All: true}); err != nil || len(list) != 0 {
		t.Errorf("other team list: %v %v", list, err)
	}
	if _, err := c.GetSandbox(ctx, sb.ID); err != nil {
		t.Errorf("own sandbox after other team's attempts: %v", err)
	}
}

// TestRevokeOwnKey: a key cannot revoke itself (409 conflict, found by
// schemathesis: the admin key revoked itself and locked every admin
// operation out until a restart); another key of the team still can.
func TestRevokeOwnKey(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t, time.Minute)
	for name, c := range map[string]*client.Client{"admin": srv.admin, "team": func() *client.Client { c, _, _ := newTeam(t, srv, client.Limits{}); return c }()} {
		keys, err := c.ListKeys(ctx)
		if err != nil {
			t.Fatal(err)
		}
		own := ""
		for _, k := range keys {
			if name == "admin" && k.Name == "bootstrap admin" || name == "team" && k.Name == "test" {
				own = k.ID
			}
		}
		if own == "" {
			t.Fatalf("%s: own key not listed: %+v", name, keys)
		}
		if err := c.RevokeKey(ctx, own); client.ErrorCode(err) != client.CodeConflict {
			t.Errorf("%s: revoking the key of the request: %v, want conflict", name, err)
		}
		if _, err := c.ListKeys(ctx); err != nil {
			t.Errorf("%s: the key no longer works: %v", name, err)
		}
	}
}
