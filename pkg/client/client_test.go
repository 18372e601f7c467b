package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// newServer starts an httptest server with h and returns a Client for it
// (on the default shared transport) whose retry waits are recorded instead
// of slept (see sleepLog).
func newServer(t *testing.T, h http.HandlerFunc, opts ...Option) (*Client, *sleepLog) {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c := New(srv.URL, "key-1", opts...)
	sl := &sleepLog{}
	c.sleep = sl.sleep
	return c, sl
}

type sleepLog struct {
	mu sync.Mutex
	ds []time.Duration
}

func (s *sleepLog) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.ds = append(s.ds, d)
	s.mu.Unlock()
	return ctx.Err()
}

func (s *sleepLog) get() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.ds)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", ContentTypeJSON)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, ErrorBody{Error: ErrorDetail{Code: code, Message: msg}})
}

// TestClientCoversSpec calls every client method against a server that only
// knows the spec: each request must hit an operation of the spec with a
// body the spec's schema accepts, and every operation must be reached.
func TestClientCoversSpec(t *testing.T) {
	doc := loadSpec(t)
	routes := specRoutes(t, doc)
	var mu sync.Mutex
	hit := map[string]bool{}
	c, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		rt, ok := match(routes, r.Method, r.URL.EscapedPath())
		if !ok {
			t.Errorf("request %s %s is not an operation of the spec", r.Method, r.URL.EscapedPath())
			http.NotFound(w, r)
			return
		}
		mu.Lock()
		hit[rt.opID] = true
		mu.Unlock()
		if got := r.Header.Get("Authorization"); got != "Bearer key-1" {
			t.Errorf("%s: Authorization %q", rt.opID, got)
		}
		// The body must decode strictly into the schema's Go type.
		if ref, ok := dig(rt.op, "requestBody", "content", "application/json", "schema", "$ref").(string); ok {
			typ := wireTypes[strings.TrimPrefix(ref, "#/components/schemas/")]
			dec := json.NewDecoder(r.Body)
			dec.DisallowUnknownFields()
			if err := dec.Decode(reflect.New(typ).Interface()); err != nil {
				t.Errorf("%s: body does not decode as %s: %v", rt.opID, typ, err)
			}
			if ct := r.Header.Get("Content-Type"); ct != ContentTypeJSON {
				t.Errorf("%s: Content-Type %q", rt.opID, ct)
			}
		} else if dig(rt.op, "requestBody", "content", "application/octet-stream") != nil {
			if _, err := io.Copy(io.Discard, r.Body); err != nil {
				t.Errorf("%s: reading upload: %v", rt.opID, err)
			}
		}
		for code, resp := range asMap(rt.op["responses"]) {
			if !strings.HasPrefix(code, "2") {
				continue
			}
			var status int
			fmt.Sscan(code, &status)
			content := asMap(resolve(doc, resp)["content"])
			switch {
			case content[ContentTypeNDJSON] != nil && strings.Contains(r.Header.Get("Accept"), ContentTypeNDJSON):
				w.Header().Set("Content-Type", ContentTypeNDJSON)
				w.WriteHeader(status)
				io.WriteString(w, `{"type":"exit","result":{"status":"exited"}}`+"\n")
			case content[ContentTypeJSON] != nil:
				w.Header().Set("Content-Type", ContentTypeJSON)
				w.WriteHeader(status)
				io.WriteString(w, "{}")
			case content[ContentTypeOctetStream] != nil:
				w.Header().Set("Content-Type", ContentTypeOctetStream)
				w.WriteHeader(status)
				io.WriteString(w, "bytes")
			default:
				w.WriteHeader(status)
			}
			return
		}
		t.Errorf("%s: no 2xx response in the spec", rt.opID)
	})
	ctx := t.Context()
	md := map[string]string{"run": "r1"}
	calls := []func() error{
		func() error { _, err := c.Health(ctx); return err },
		func() error {
			_, err := c.CreateSandbox(ctx, CreateSandboxRequest{Template: "base", Env: map[string]string{"A": "1"}, Metadata: md})
			return err
		},
		func() error { _, err := c.GetSandbox(ctx, "sb-1"); return err },
		func() error { _, err := c.ListSandboxes(ctx, ListOptions{Metadata: md, All: true}); return err },
		func() error { return c.DeleteSandbox(ctx, "sb-1") },
		func() error { _, err := c.DeleteSandboxes(ctx, md); return err },
		func() error { _, err := c.SetTimeout(ctx, "sb-1", time.Minute); return err },
		func() error { _, err := c.Snapshot(ctx, "sb-1"); return err },
		func() error { _, err := c.ListSnapshots(ctx); return err },
		func() error { _, err := c.GetSnapshot(ctx, "snap-1"); return err },
		func() error { return c.DeleteSnapshot(ctx, "snap-1") },
		func() error { _, err := c.Fork(ctx, "sb-1", ForkRequest{Count: 2}); return err },
		func() error { _, err := c.Pause(ctx, "sb-1"); return err },
		func() error { _, err := c.Resume(ctx, "sb-1", ResumeRequest{WaitSeconds: 5}); return err },
		func() error { _, err := c.Exec(ctx, "sb-1", ExecRequest{Argv: []string{"true"}}); return err },
		func() error { _, err := c.ExecStream(ctx, "sb-1", ExecRequest{Cmd: "true"}, nil, nil); return err },
		func() error { _, err := c.StartProcess(ctx, "sb-1", ExecRequest{Cmd: "sleep 1", Tag: "t"}); return err },
		func() error { _, err := c.ListProcesses(ctx, "sb-1"); return err },
		func() error { _, err := c.GetProcess(ctx, "sb-1", "p-1"); return err },
		func() error { _, err := c.WaitProcess(ctx, "sb-1", "p-1", 1500*time.Millisecond); return err },
		func() error { _, err := c.StreamProcess(ctx, "sb-1", "p-1", nil, nil); return err },
		func() error { return c.SignalProcess(ctx, "sb-1", "p-1", "TERM") },
		func() error { return c.KillProcess(ctx, "sb-1", "p-1") },
		func() error { return c.WriteStdin(ctx, "sb-1", "p-1", []byte("x"), true) },
		func() error {
			_, err := c.SetNetwork(ctx, "sb-1", NetworkSpec{Mode: NetworkRules, Allow: []string{"pypi.org"}})
			return err
		},
		func() error { _, err := c.SetPorts(ctx, "sb-1", []PortSpec{{Port: 8000, Public: true}}); return err },
		func() error { _, err := c.RotateTrafficToken(ctx, "sb-1"); return err },
		func() error { _, err := c.WriteFile(ctx, "sb-1", "/a", strings.NewReader("x"), 1, 0o755); return err },
		func() error {
			rc, _, err := c.ReadFile(ctx, "sb-1", "/a")
			if err == nil {
				rc.Close()
			}
			return err
		},
		func() error { _, err := c.StatFile(ctx, "sb-1", "/a"); return err },
		func() error { _, err := c.ListFiles(ctx, "sb-1", "/"); return err },
		func() error { _, err := c.Mkdir(ctx, "sb-1", MkdirRequest{Path: "/d", Parents: true}); return err },
		func() error { _, err := c.RenameFile(ctx, "sb-1", "/a", "/b"); return err },
		func() error { return c.RemoveFile(ctx, "sb-1", "/d", true) },
		func() error {
			_, err := c.CreateTeam(ctx, CreateTeamRequest{Name: "t", Limits: &Limits{MaxSandboxes: 3}})
			return err
		},
		func() error { _, err := c.ListTeams(ctx); return err },
		func() error { _, err := c.GetTeam(ctx, "t-1"); return err },
		func() error {
			_, err := c.UpdateTeam(ctx, "t-1", UpdateTeamRequest{Limits: Limits{MaxSandboxes: 4}})
			return err
		},
		func() error { _, err := c.CreateKey(ctx, CreateKeyRequest{Name: "k", TeamID: "t-1"}); return err },
		func() error { _, err := c.ListKeys(ctx); return err },
		func() error { return c.RevokeKey(ctx, "k-1") },
		func() error { _, err := c.PutSecret(ctx, "API_KEY", "v"); return err },
		func() error { _, err := c.ListSecrets(ctx); return err },
		func() error { return c.DeleteSecret(ctx, "API_KEY") },
		func() error { _, err := c.ListTariffs(ctx); return err },
		func() error { _, err := c.GetTariff(ctx, "small"); return err },
		func() error { _, err := c.PutTariff(ctx, "small", PutTariffRequest{CPU: 1}); return err },
		func() error { return c.DeleteTariff(ctx, "small") },
		func() error { _, err := c.Usage(ctx, UsageOptions{GroupBy: "day"}); return err },
		func() error { _, err := c.Balance(ctx, ""); return err },
		func() error { _, err := c.Ledger(ctx, "team_1", 10); return err },
		func() error { _, err := c.TopUp(ctx, "team_1", TopUpRequest{Amount: "1"}); return err },
		func() error { _, err := c.ListTemplates(ctx); return err },
		func() error {
			_, err := c.BuildTemplate(ctx, BuildTemplateRequest{Name: "t", Spec: TemplateSpec{From: "base",
				Steps: []TemplateStep{{Run: "true"}, {Copy: &CopyStep{Src: "a", Dst: "/a"}}, {Env: map[string]string{"A": "1"}}}}}, nil)
			return err
		},
		func() error {
			_, err := c.ImportTemplate(ctx, ImportOptions{Name: "t", Ref: "r"}, strings.NewReader("tar"), 3)
			return err
		},
		func() error { _, err := c.GetTemplate(ctx, "t"); return err },
		func() error { return c.DeleteTemplate(ctx, "t") },
		func() error { _, err := c.TemplateTags(ctx, "t"); return err },
		func() error {
			err := c.WatchDir(ctx, "sb-1", "/work", true, func(WatchEvent) error { return nil })
			if errors.Is(err, errWatchNoEnd) {
				// The spec-only server answers one event line.
				return nil
			}
			return err
		},
		func() error { _, err := c.TagTemplate(ctx, "t", "v1", "stable"); return err },
		func() error { _, err := c.GetBuild(ctx, "t", "bld_1"); return err },
		func() error {
			_, err := c.FollowBuild(ctx, "t", "bld_1", nil)
			if errors.Is(err, errNoEnd) {
				// The spec-only server answers an empty stream.
				return nil
			}
			return err
		},
		func() error {
			resp, err := c.Port(ctx, http.MethodGet, "sb-1", 8000, "index.html", nil)
			if err == nil {
				resp.Body.Close()
			}
			return err
		},
		func() error { _, err := c.ListPools(ctx); return err },
		func() error { _, err := c.Capacity(ctx); return err },
		func() error {
			_, err := c.ListAudit(ctx, AuditQuery{TeamID: "t-1", Action: AuditActionSandboxCreate, Since: time.Now(), Limit: 5})
			return err
		},
		func() error { _, err := c.Metrics(ctx); return err },
		func() error {
			_, err := c.Execute(ctx, ExecuteRequest{Scripts: []string{"print(1)"}, Language: LanguagePython, Timeout: 3})
			return err
		},
		func() error {
			done := "    return 1"
			_, err := c.CreateEval(ctx, CreateEvalRequest{Problems: []EvalProblem{{TaskID: "t/0", EntryPoint: "f"}},
				Samples: []EvalSample{{TaskID: "t/0", Completion: &done}}, K: []int{1}})
			return err
		},
		func() error { _, err := c.GetEval(ctx, "ev_1"); return err },
		func() error { _, err := c.ListEvals(ctx); return err },
		func() error { _, err := c.CancelEval(ctx, "ev_1"); return err },
		func() error { return c.DeleteEval(ctx, "ev_1") },
		func() error {
			err := c.EvalResults(ctx, "ev_1", func(EvalResult) error { return nil })
			if ute := (*json.UnmarshalTypeError)(nil); errors.As(err, &ute) {
				// The spec-only server answers an exec event line.
				return nil
			}
			return err
		},
		func() error {
			err := c.EvalEvents(ctx, "ev_1", func(EvalEvent) error { return nil })
			if errors.Is(err, errEvalNoEnd) {
				// The spec-only server answers an exec event line.
				return nil
			}
			return err
		},
	}
	for i, call := range calls {
		if err := call(); err != nil {
			t.Errorf("call %d: %v", i, err)
		}
	}
	for _, rt := range routes {
		if !hit[rt.opID] {
			t.Errorf("operation %s (%s %s) has no client method (or it was not called here)", rt.opID, rt.method, rt.template)
		}
	}
}

func TestRequestEncoding(t *testing.T) {
	var got *http.Request
	c, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		got = r.Clone(context.Background())
		if r.URL.EscapedPath() == "/v1/sandboxes/sb%2F1/processes/p%201/wait" {
			writeErr(w, http.StatusRequestTimeout, CodeTimeout, "still running")
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{})
	}, WithUserAgent("ua-test"))
	ctx := t.Context()

	if _, err := c.ListSandboxes(ctx, ListOptions{Metadata: map[string]string{"run": "r 1", "k": "v"}, All: true}); err != nil {
		t.Fatal(err)
	}
	if q := got.URL.Query(); q.Get("metadata.run") != "r 1" || q.Get("metadata.k") != "v" || q.Get("state") != "all" {
		t.Errorf("list query %q", got.URL.RawQuery)
	}
	if got.Header.Get("User-Agent") != "ua-test" || got.Header.Get("Accept") != ContentTypeJSON {
		t.Errorf("headers %v", got.Header)
	}
	if _, err := c.ListSandboxes(ctx, ListOptions{}); err != nil || got.URL.RawQuery != "" {
		t.Errorf("plain list: query %q, err %v", got.URL.RawQuery, err)
	}

	// Ids are escaped; the wait timeout is seconds; 408 is a wait timeout.
	_, err := c.WaitProcess(ctx, "sb/1", "p 1", 2500*time.Millisecond)
	if !IsWaitTimeout(err) {
		t.Fatalf("WaitProcess: %v", err)
	}
	if got.URL.EscapedPath() != "/v1/sandboxes/sb%2F1/processes/p%201/wait" || got.URL.Query().Get("timeout") != "2.5" {
		t.Errorf("wait request %s?%s", got.URL.EscapedPath(), got.URL.RawQuery)
	}

	if _, err := c.SetTimeout(ctx, "sb-1", 1500*time.Millisecond); err != nil {
		t.Fatal(err)
	}

	// Requests that cannot be right are refused before sending.
	got = nil
	if _, err := c.DeleteSandboxes(ctx, nil); err == nil {
		t.Error("DeleteSandboxes without a filter succeeded")
	}
	if _, err := c.GetSandbox(ctx, ""); err == nil {
		t.Error("GetSandbox with an empty id succeeded")
	}
	if got != nil {
		t.Errorf("a request was sent: %s", got.URL)
	}
}

func TestSetTimeoutRoundsUp(t *testing.T) {
	var body SetTimeoutRequest
	c, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewDecoder(r.Body).Decode(&body)
		writeJSON(w, http.StatusOK, Sandbox{ID: "sb-1"})
	})
	sb, err := c.SetTimeout(t.Context(), "sb-1", 1500*time.Millisecond)
	if err != nil || sb.ID != "sb-1" {
		t.Fatal(sb, err)
	}
	if body.Timeout != 2 {
		t.Errorf("timeout sent %d, want 2", body.Timeout)
	}
}

func TestNewAndFromEnv(t *testing.T) {
	for in, want := range map[string]string{
		"http://h:1":      "http://h:1",
		"http://h:1/":     "http://h:1",
		"http://h:1/v1/":  "http://h:1",
		"http://h/p/v1":   "http://h/p",
		"":                DefaultBaseURL,
		"https://x.y/api": "https://x.y/api",
	} {
		if got := New(in, "").BaseURL(); got != want {
			t.Errorf("New(%q).BaseURL() = %q, want %q", in, got, want)
		}
	}
	t.Setenv(EnvAPIURL, "http://env:9/v1")
	t.Setenv(EnvAPIKey, "secret")
	c := FromEnv()
	if c.BaseURL() != "http://env:9" || c.auth != "Bearer secret" {
		t.Errorf("FromEnv: %q %q", c.BaseURL(), c.auth)
	}
	if New("http://h", "k").hc != New("http://g", "k").hc {
		t.Error("clients do not share the default HTTP client")
	}
}

func TestErrorDecoding(t *testing.T) {
	c, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/sandboxes/sb-404":
			writeErr(w, http.StatusNotFound, CodeNotFound, "sandbox sb-404 not found")
		case "/v1/sandboxes/sb-gone/exec":
			writeErr(w, http.StatusConflict, CodeSandboxNotRunning, "sandbox sb-gone is expired")
		case "/v1/templates":
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusBadGateway)
			io.WriteString(w, "<html>bad gateway</html>")
		default:
			w.WriteHeader(http.StatusInternalServerError)
		}
	}, WithRetries(0))
	ctx := t.Context()

	_, err := c.GetSandbox(ctx, "sb-404")
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != 404 || ae.Code != CodeNotFound || ae.Message != "sandbox sb-404 not found" {
		t.Fatalf("got %#v", err)
	}
	if !IsNotFound(err) || IsConflict(err) || err.Error() != "not_found: sandbox sb-404 not found" {
		t.Errorf("helpers/Error(): %q", err)
	}
	if IsNotFound(fmt.Errorf("wrapped: %w", err)) != true {
		t.Error("IsNotFound does not see through wrapping")
	}

	_, err = c.Exec(ctx, "sb-gone", ExecRequest{Cmd: "true"})
	if !IsSandboxNotRunning(err) {
		t.Errorf("exec on a gone sandbox: %v", err)
	}

	_, err = c.ListTemplates(ctx)
	if !errors.As(err, &ae) || ae.Status != 502 || ae.Code != CodeUnavailable || !strings.Contains(ae.Message, "bad gateway") {
		t.Errorf("non-JSON error: %#v", err)
	}
	_, err = c.ListKeys(ctx)
	if !errors.As(err, &ae) || ae.Code != CodeInternal || ae.Message != "HTTP 500: Internal Server Error" {
		t.Errorf("empty 500: %#v", err)
	}
	if ErrorCode(errors.New("x")) != "" || ErrorCode(nil) != "" {
		t.Error("ErrorCode of a non-API error")
	}
}

func TestParseRetryAfter(t *testing.T) {
	if d := parseRetryAfter("3"); d != 3*time.Second {
		t.Errorf("3 → %v", d)
	}
	for _, v := range []string{"", "0", "-1", "soon"} {
		if d := parseRetryAfter(v); d != 0 {
			t.Errorf("%q → %v", v, d)
		}
	}
	d := parseRetryAfter(time.Now().Add(10 * time.Second).UTC().Format(http.TimeFormat))
	if d < 8*time.Second || d > 10*time.Second {
		t.Errorf("HTTP date → %v", d)
	}
}

// flaky answers fail (status, code, Retry-After) for the first n requests,
// then 200 with body.
type flaky struct {
	n          int32
	status     int
	code       string
	retryAfter string
	body       any
	calls      atomic.Int32
}

func (f *flaky) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	if f.calls.Add(1) <= f.n {
		if f.retryAfter != "" {
			w.Header().Set("Retry-After", f.retryAfter)
		}
		writeErr(w, f.status, f.code, "busy")
		return
	}
	status := http.StatusOK
	if r.Method == http.MethodPost || r.Method == http.MethodPut {
		status = http.StatusCreated
	}
	writeJSON(w, status, f.body)
}

func TestRetries(t *testing.T) {
	ctx := t.Context()
	t.Run("idempotent call honours Retry-After", func(t *testing.T) {
		f := &flaky{n: 2, status: 429, code: CodeRateLimited, retryAfter: "2", body: Sandbox{ID: "sb-1"}}
		c, sl := newServer(t, f.ServeHTTP)
		sb, err := c.GetSandbox(ctx, "sb-1")
		if err != nil || sb.ID != "sb-1" {
			t.Fatal(sb, err)
		}
		if f.calls.Load() != 3 || !slices.Equal(sl.get(), []time.Duration{2 * time.Second, 2 * time.Second}) {
			t.Errorf("calls %d, waits %v", f.calls.Load(), sl.get())
		}
	})
	t.Run("503 without Retry-After backs off", func(t *testing.T) {
		f := &flaky{n: 3, status: 503, code: CodeUnavailable, body: SandboxList{}}
		c, sl := newServer(t, f.ServeHTTP)
		if _, err := c.ListSandboxes(ctx, ListOptions{}); err != nil {
			t.Fatal(err)
		}
		w := sl.get()
		if len(w) != 3 || w[0] < 80*time.Millisecond || w[0] > 120*time.Millisecond || w[2] < 320*time.Millisecond || w[2] > 480*time.Millisecond {
			t.Errorf("waits %v", w)
		}
	})
	t.Run("gives up after the retries", func(t *testing.T) {
		f := &flaky{n: 100, status: 503, code: CodeUnavailable, retryAfter: "1"}
		c, _ := newServer(t, f.ServeHTTP, WithRetries(2))
		err := c.DeleteSandbox(ctx, "sb-1")
		var ae *APIError
		if !errors.As(err, &ae) || ae.Code != CodeUnavailable || ae.RetryAfter != time.Second || f.calls.Load() != 3 {
			t.Errorf("err %#v after %d calls", err, f.calls.Load())
		}
	})
	t.Run("Retry-After beyond the max wait is not waited for", func(t *testing.T) {
		f := &flaky{n: 1, status: 429, code: CodeRateLimited, retryAfter: "120"}
		c, sl := newServer(t, f.ServeHTTP, WithMaxRetryWait(time.Minute))
		if _, err := c.ListTemplates(ctx); !IsRateLimited(err) || f.calls.Load() != 1 || len(sl.get()) != 0 {
			t.Errorf("err %v, calls %d, waits %v", err, f.calls.Load(), sl.get())
		}
	})
	t.Run("Retry-After beyond the context deadline is not waited for", func(t *testing.T) {
		f := &flaky{n: 1, status: 429, code: CodeRateLimited, retryAfter: "5"}
		c, sl := newServer(t, f.ServeHTTP)
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if _, err := c.ListTemplates(dctx); !IsRateLimited(err) || len(sl.get()) != 0 {
			t.Errorf("err %v, waits %v", err, sl.get())
		}
	})
	t.Run("exec is never retried", func(t *testing.T) {
		f := &flaky{n: 1, status: 429, code: CodeRateLimited, retryAfter: "1"}
		c, _ := newServer(t, f.ServeHTTP)
		if _, err := c.Exec(ctx, "sb-1", ExecRequest{Cmd: "true"}); !IsRateLimited(err) || f.calls.Load() != 1 {
			t.Errorf("err %v, calls %d", err, f.calls.Load())
		}
		if _, err := c.StartProcess(ctx, "sb-1", ExecRequest{Cmd: "true"}); err != nil || f.calls.Load() != 2 {
			t.Errorf("err %v, calls %d", err, f.calls.Load())
		}
	})
	t.Run("create is retried only when asked", func(t *testing.T) {
		f := &flaky{n: 1, status: 429, code: CodeTooManySandboxes, retryAfter: "1", body: Sandbox{ID: "sb-2"}}
		c, _ := newServer(t, f.ServeHTTP)
		if _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Template: "base"}); !IsTooManySandboxes(err) {
			t.Errorf("default client: %v", err)
		}
		f.calls.Store(0)
		c, sl := newServer(t, f.ServeHTTP, WithRetryCreate(true))
		sb, err := c.CreateSandbox(ctx, CreateSandboxRequest{Template: "base"})
		if err != nil || sb.ID != "sb-2" || len(sl.get()) != 1 {
			t.Errorf("WithRetryCreate: %v %v waits %v", sb, err, sl.get())
		}
	})
	t.Run("a seekable upload is resent whole", func(t *testing.T) {
		var mu sync.Mutex
		var bodies []string
		calls := 0
		c, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			defer mu.Unlock()
			bodies = append(bodies, string(b))
			calls++
			if calls == 1 {
				w.Header().Set("Retry-After", "1")
				writeErr(w, 503, CodeUnavailable, "busy")
				return
			}
			writeJSON(w, 201, FileInfo{Size: int64(len(b))})
		})
		r := strings.NewReader("0123456789")
		r.Seek(2, io.SeekStart)
		fi, err := c.WriteFile(ctx, "sb-1", "/f", r, 8, 0)
		if err != nil || fi.Size != 8 || !slices.Equal(bodies, []string{"23456789", "23456789"}) {
			t.Errorf("fi %v err %v bodies %q", fi, err, bodies)
		}
		// A plain reader cannot be resent: no retry.
		calls, bodies = 0, nil
		if _, err := c.WriteFile(ctx, "sb-1", "/f", io.MultiReader(strings.NewReader("abc")), 3, 0); ErrorCode(err) != CodeUnavailable || calls != 1 {
			t.Errorf("err %v calls %d", err, calls)
		}
	})
	t.Run("cancel while waiting", func(t *testing.T) {
		f := &flaky{n: 5, status: 429, code: CodeRateLimited, retryAfter: "1"}
		srv := httptest.NewServer(f)
		defer srv.Close()
		c := New(srv.URL, "k")
		cctx, cancel := context.WithCancel(ctx)
		time.AfterFunc(50*time.Millisecond, cancel)
		start := time.Now()
		_, err := c.ListKeys(cctx)
		if !errors.Is(err, context.Canceled) || !IsRateLimited(err) || time.Since(start) > 900*time.Millisecond {
			t.Errorf("err %v after %v", err, time.Since(start))
		}
	})
}

// TestRetryAfterRealWait checks, with the real clock, that a retry waits
// for the Retry-After the server asked for.
func TestRetryAfterRealWait(t *testing.T) {
	f := &flaky{n: 1, status: 503, code: CodeUnavailable, retryAfter: "1", body: Health{Status: "ok"}}
	srv := httptest.NewServer(f)
	defer srv.Close()
	c := New(srv.URL, "")
	start := time.Now()
	h, err := c.Health(t.Context())
	if err != nil || h.Status != "ok" {
		t.Fatal(h, err)
	}
	if el := time.Since(start); el < time.Second || el > 3*time.Second {
		t.Errorf("retried after %v, want ~1s", el)
	}
}

// notifyWriter is a writer that reports each write on a channel.
type notifyWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
	ch  chan string
}

func (w *notifyWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.buf.Write(p)
	w.mu.Unlock()
	w.ch <- string(p)
	return len(p), nil
}

func TestExecStream(t *testing.T) {
	release := make(chan struct{})
	c, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Accept") != ContentTypeNDJSON {
			t.Errorf("Accept %q", r.Header.Get("Accept"))
		}
		var req ExecRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Cmd != "run" || *req.Stdin != "in" {
			t.Errorf("request %+v %v", req, err)
		}
		w.Header().Set("Content-Type", ContentTypeNDJSON)
		enc := json.NewEncoder(w)
		fl := w.(http.Flusher)
		enc.Encode(ExecEvent{Type: EventStdout, Data: "line 1\n"})
		fl.Flush()
		// The client must see the first chunk while the command still runs.
		select {
		case <-release:
		case <-time.After(5 * time.Second):
			t.Error("first chunk not delivered before the end of the stream")
		}
		enc.Encode(ExecEvent{Type: EventStderr, Data: "oops\n"})
		enc.Encode(ExecEvent{Type: "progress"}) // unknown types are skipped
		enc.Encode(ExecEvent{Type: EventStdout, Data: strings.Repeat("x", 200<<10)})
		enc.Encode(ExecEvent{Type: EventExit, Result: &ExecResult{ExitCode: 3, Status: StatusExited, DurationMs: 7}})
	})
	stdout := &notifyWriter{ch: make(chan string, 10)}
	go func() {
		if got := <-stdout.ch; got == "line 1\n" {
			close(release)
		}
	}()
	var stderr bytes.Buffer
	in := "in"
	res, err := c.ExecStream(t.Context(), "sb-1", ExecRequest{Cmd: "run", Stdin: &in}, stdout, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 3 || res.Status != StatusExited || res.DurationMs != 7 {
		t.Errorf("result %+v", res)
	}
	if want := "line 1\n" + strings.Repeat("x", 200<<10); stdout.buf.String() != want || stderr.String() != "oops\n" {
		t.Errorf("stdout %d bytes, stderr %q", stdout.buf.Len(), stderr.String())
	}
}

func TestStreamEndings(t *testing.T) {
	c, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/sandboxes/sb-1/processes/p-err/stream":
			w.Header().Set("Content-Type", ContentTypeNDJSON)
			io.WriteString(w, `{"type":"stdout","data":"a"}`+"\n"+`{"type":"error","error":{"code":"sandbox_not_running","message":"sandbox sb-1 is lost"}}`+"\n")
		case "/v1/sandboxes/sb-1/processes/p-cut/stream":
			w.Header().Set("Content-Type", ContentTypeNDJSON)
			io.WriteString(w, `{"type":"stdout","data":"a"}`+"\n")
		case "/v1/sandboxes/sb-1/exec":
			// A server that answers the buffered result to a stream request.
			writeJSON(w, 200, ExecResult{Stdout: "out", Stderr: "err", Status: StatusExited})
		}
	})
	ctx := t.Context()
	var out bytes.Buffer
	_, err := c.StreamProcess(ctx, "sb-1", "p-err", &out, nil)
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != 0 || !IsSandboxNotRunning(err) || out.String() != "a" {
		t.Errorf("error event: %#v, out %q", err, out.String())
	}
	if _, err := c.StreamProcess(ctx, "sb-1", "p-cut", nil, nil); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("cut stream: %v", err)
	}
	var o, e bytes.Buffer
	res, err := c.ExecStream(ctx, "sb-1", ExecRequest{Cmd: "x"}, &o, &e)
	if err != nil || o.String() != "out" || e.String() != "err" || res.Stdout != "" {
		t.Errorf("JSON fallback: %+v %v %q %q", res, err, o.String(), e.String())
	}
}

// patternReader yields n bytes of a repeating pattern without holding them.
type patternReader struct{ n, off int64 }

// pattern is a 251-byte cycle, long enough to fill any read with one copy
// from any phase.
var pattern = func() []byte {
	b := make([]byte, 251+256<<10)
	for i := range b {
		b[i] = byte(i % 251)
	}
	return b
}()

func (p *patternReader) Read(b []byte) (int, error) {
	if p.off >= p.n {
		return 0, io.EOF
	}
	b = b[:min(int64(len(b)), p.n-p.off, 256<<10)]
	n := copy(b, pattern[p.off%251:])
	p.off += int64(n)
	return n, nil
}

func TestWriteFileStreams(t *testing.T) {
	const size = 100 << 20
	want := crc32.NewIEEE()
	io.Copy(want, &patternReader{n: size})
	wantSum := want.Sum(nil)

	type seen struct {
		contentLength int64
		chunked       bool
		n             int64
		sum           []byte
		query         string
	}
	var got seen
	c, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		h := crc32.NewIEEE()
		n, err := io.CopyBuffer(h, r.Body, make([]byte, 64<<10))
		if err != nil {
			t.Errorf("server read: %v", err)
		}
		got = seen{r.ContentLength, slices.Contains(r.TransferEncoding, "chunked"), n, h.Sum(nil), r.URL.RawQuery}
		writeJSON(w, http.StatusCreated, FileInfo{Path: r.URL.Query().Get("path"), Size: n, Mode: r.URL.Query().Get("mode")})
	})

	for _, tc := range []struct {
		name    string
		size    int64
		chunked bool
	}{{"unknown size", -1, true}, {"known size", size, false}} {
		t.Run(tc.name, func(t *testing.T) {
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			fi, err := c.WriteFile(t.Context(), "sb-1", "/data/big.bin", &patternReader{n: size}, tc.size, 0o600)
			runtime.ReadMemStats(&after)
			if err != nil {
				t.Fatal(err)
			}
			if got.n != size || !bytes.Equal(got.sum, wantSum) || fi.Size != size {
				t.Errorf("server got %d bytes (sum match %v), fi %+v", got.n, bytes.Equal(got.sum, wantSum), fi)
			}
			if got.chunked != tc.chunked || (!tc.chunked && got.contentLength != size) {
				t.Errorf("chunked %v, Content-Length %d", got.chunked, got.contentLength)
			}
			if got.query != "mode=0600&path=%2Fdata%2Fbig.bin" {
				t.Errorf("query %q", got.query)
			}
			// Client and server together allocate far less than the file.
			alloc := after.TotalAlloc - before.TotalAlloc
			t.Logf("allocated %d KiB", alloc>>10)
			if alloc > 16<<20 {
				t.Errorf("allocated %d MiB for a 100 MiB upload: the body is buffered", alloc>>20)
			}
		})
	}
}

func TestWriteFileDoesNotCloseCallerFile(t *testing.T) {
	c, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		writeJSON(w, http.StatusCreated, FileInfo{Size: n})
	})
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := c.WriteFile(t.Context(), "sb-1", "/f", f, 5, 0)
	if err != nil || fi.Size != 5 {
		t.Fatal(fi, err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		t.Errorf("caller's file was closed: %v", err)
	}
}

// countingReader counts what was read from r.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func TestWriteFileTooLarge(t *testing.T) {
	const limit = 1 << 20
	tooLarge := func(w http.ResponseWriter) {
		writeErr(w, http.StatusRequestEntityTooLarge, CodePayloadTooLarge, "file larger than 1048576 bytes")
	}
	for _, tc := range []struct {
		name        string
		size        int64
		checkLength bool // the server refuses from Content-Length, unread
	}{
		{"chunked", -1, false},
		{"declared size refused from the headers", 64 << 20, true},
		{"declared size refused while reading", 64 << 20, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				if tc.checkLength && r.ContentLength > limit {
					tooLarge(w)
					return
				}
				n, err := io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, limit))
				if err != nil {
					tooLarge(w)
					return
				}
				writeJSON(w, http.StatusCreated, FileInfo{Size: n})
			})
			body := &countingReader{r: &patternReader{n: 64 << 20}}
			_, err := c.WriteFile(t.Context(), "sb-1", "/f", body, tc.size, 0)
			if ErrorCode(err) != CodePayloadTooLarge {
				t.Errorf("got %v, want payload_too_large", err)
			}
			// Refused from the headers: the body is not sent (100-continue).
			if tc.checkLength && body.n.Load() != 0 {
				t.Errorf("%d bytes of the body sent before the refusal", body.n.Load())
			}
			// A small upload skips 100-continue and still works.
			fi, err := c.WriteFile(t.Context(), "sb-1", "/f", strings.NewReader("small"), 5, 0)
			if err != nil || fi.Size != 5 {
				t.Errorf("small upload: %v %v", fi, err)
			}
		})
	}
}

func TestReadFile(t *testing.T) {
	const size = 8 << 20
	c, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("path") == "/missing" {
			writeErr(w, 404, CodeNotFound, "no such file /missing")
			return
		}
		w.Header().Set("Content-Type", ContentTypeOctetStream)
		w.Header().Set("Content-Length", fmt.Sprint(size))
		io.Copy(w, &patternReader{n: size})
	})
	rc, n, err := c.ReadFile(t.Context(), "sb-1", "/big")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	h1, h2 := crc32.NewIEEE(), crc32.NewIEEE()
	got, err := io.Copy(h1, rc)
	io.Copy(h2, &patternReader{n: size})
	if err != nil || n != size || got != size || !bytes.Equal(h1.Sum(nil), h2.Sum(nil)) {
		t.Errorf("size %d, read %d, err %v", n, got, err)
	}
	if _, _, err := c.ReadFile(t.Context(), "sb-1", "/missing"); !IsNotFound(err) {
		t.Errorf("missing file: %v", err)
	}
}

// TestConnectionReuse checks that the hot path (create, exec, delete,
// errors included) keeps using one connection.
func TestConnectionReuse(t *testing.T) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/v1/sandboxes":
			writeJSON(w, 201, Sandbox{ID: "sb-1"})
		case strings.HasSuffix(r.URL.Path, "/exec"):
			writeJSON(w, 200, ExecResult{Stdout: strings.Repeat("o", 10000), Status: StatusExited})
		case r.Method == http.MethodDelete:
			w.WriteHeader(204)
		default:
			writeErr(w, 404, CodeNotFound, "nope")
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	c := New(srv.URL, "k")
	ctx := t.Context()
	for range 50 {
		sb, err := c.CreateSandbox(ctx, CreateSandboxRequest{Template: "base"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, sb.ID, ExecRequest{Cmd: "true"}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.GetProcess(ctx, sb.ID, "p"); !IsNotFound(err) {
			t.Fatal(err)
		}
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections for 200 sequential requests, want 1", n)
	}
}

// BenchmarkExec measures the client's share of an exec round trip (the
// server answers at once) and its allocations.
func BenchmarkExec(b *testing.B) {
	body := must(json.Marshal(ExecResult{Stdout: "ok\n", Status: StatusExited, DurationMs: 1}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", ContentTypeJSON)
		w.Write(body)
	}))
	defer srv.Close()
	c := New(srv.URL, "k")
	ctx := context.Background()
	req := ExecRequest{Argv: []string{"python3", "/work/solution.py"}, Timeout: 5}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.Exec(ctx, "sb-0123456789", req); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}
