package e2e

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// rawAnswer is one HTTP answer, read whole.
type rawAnswer struct {
	status     int
	retryAfter string
	errCode    string // the Evalbox-Error header
	body       string
}

// rlDo sends one request without any client-side retry (the Go client
// would wait out a Retry-After itself).
func rlDo(t *testing.T, method, url string, hdr map[string]string, body string) rawAnswer {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return rawAnswer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), errCode: resp.Header.Get(client.HeaderError), body: string(b)}
}

func rlBearer(key string) map[string]string {
	return map[string]string{"Authorization": "Bearer " + key}
}

// rateLimited checks that a is 429 rate_limited with a Retry-After of
// whole seconds in (0, max], and returns it.
func rateLimited(t *testing.T, what string, a rawAnswer, max int) time.Duration {
	t.Helper()
	secs, err := strconv.Atoi(a.retryAfter)
	if a.status != http.StatusTooManyRequests || err != nil || secs <= 0 || secs > max {
		t.Fatalf("%s: %d Retry-After %q %s, want 429 with Retry-After in 1..%d", what, a.status, a.retryAfter, a.body, max)
	}
	return time.Duration(secs) * time.Second
}

// TestRateLimits: a team over its request rate gets 429 rate_limited with
// Retry-After on every API (evalbox's, E2B's, SandboxFusion's), its other
// keys with it, and passes again after the Retry-After; another team is
// unaffected; creates have a bucket of their own; admin keys are exempt.
func TestRateLimits(t *testing.T) {
	// Server defaults: 600 requests a minute (a burst of 100), 12 creates
	// a minute (a burst of 2, then one every 5 s), and 120 requests a
	// minute of one key (a burst of 20).
	s := startServerT(t, serverOptions{args: []string{"--rate-limit-requests-per-minute", "600", "--rate-limit-creates-per-minute", "12",
		"--rate-limit-key-requests-per-minute", "120"}})
	ctx := ctxT(t, 5*time.Minute)
	lim := client.Limits{MaxSandboxes: 4, MaxConcurrentExec: 4}
	_, teamA, keyA := newTeam(t, s, lim)
	_, teamB, keyB := newTeam(t, s, lim)
	cC, _, keyC := newTeam(t, s, lim)
	keyA2, err := s.admin.CreateKey(ctx, client.CreateKeyRequest{Name: "second", TeamID: teamA.ID})
	if err != nil {
		t.Fatal(err)
	}

	// Team A's own limit, set through the CLI: 30 a minute, a burst of 5
	// and one token every 2 s.
	cli := func(args ...string) string {
		t.Helper()
		stdout, stderr, code := runCLI(t, ctx, s.adminKey, "", append([]string{"--api-url", s.url}, args...)...)
		if code != 0 {
			t.Fatalf("evalbox %v: %d %s %s", args, code, stdout, stderr)
		}
		return stdout
	}
	cli("teams", "update", teamA.ID, "--requests-per-minute", "30")
	var got client.Team
	if err := json.Unmarshal([]byte(cli("teams", "get", teamA.ID, "--json")), &got); err != nil ||
		got.Limits.RequestsPerMinute != 30 || got.Limits.CreatesPerMinute != 0 || got.Limits.MaxSandboxes != 4 {
		t.Fatalf("team A after update: %+v, %v", got.Limits, err)
	}

	list := func(key string) rawAnswer { return rlDo(t, "GET", s.url+"/v1/sandboxes", rlBearer(key), "") }
	// A's burst, then 429 with Retry-After (a token every 2 s).
	passed := 0
	var refusal rawAnswer
	for ; passed < 100; passed++ {
		if refusal = list(keyA); refusal.status != http.StatusOK {
			break
		}
	}
	if passed < 5 || passed > 7 {
		t.Fatalf("team A's burst: %d requests passed, want 5 (more with a refill)", passed)
	}
	wait := rateLimited(t, "team A over its rate", refusal, 2)
	if refusal.errCode != client.CodeRateLimited || !strings.Contains(refusal.body, `"code":"rate_limited"`) {
		t.Fatalf("refusal: %q %s", refusal.errCode, refusal.body)
	}
	// A's second key shares the team's bucket; E2B's API and
	// SandboxFusion's refuse it too, in their own forms.
	rateLimited(t, "team A's second key", list(keyA2.Key), 2)
	e2b := rlDo(t, "GET", s.url+"/v2/sandboxes", map[string]string{"X-API-KEY": keyA}, "")
	rateLimited(t, "team A on E2B's API", e2b, 2)
	var e2bBody struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal([]byte(e2b.body), &e2bBody); err != nil || e2bBody.Code != 429 || !strings.Contains(e2bBody.Message, "30 requests per minute") {
		t.Fatalf("E2B's refusal body: %s (%v)", e2b.body, err)
	}
	fusion := rlDo(t, "POST", s.url+"/run_code", rlBearer(keyA), `{"code":"print(1)","language":"python"}`)
	rateLimited(t, "team A on SandboxFusion's run_code", fusion, 2)
	if !strings.Contains(fusion.body, `"detail"`) {
		t.Fatalf("SandboxFusion's refusal body: %s", fusion.body)
	}

	// The Go client surfaces it: IsRateLimited, with the Retry-After.
	_, err = client.New(s.url, keyA, client.WithRetries(0)).ListSandboxes(ctx, client.ListOptions{})
	var apiErr *client.APIError
	if !client.IsRateLimited(err) || !errors.As(err, &apiErr) || apiErr.Status != http.StatusTooManyRequests ||
		apiErr.RetryAfter <= 0 || apiErr.RetryAfter > 2*time.Second {
		t.Fatalf("Go client over the rate: %v (%+v)", err, apiErr)
	}

	// Team B, on the server's default rate, is unaffected (team ↔ team);
	// so is the admin.
	for i := range 15 {
		if a := list(keyB); a.status != http.StatusOK {
			t.Fatalf("team B's request %d while A is limited: %d %s", i, a.status, a.body)
		}
		if a := list(s.adminKey); a.status != http.StatusOK {
			t.Fatalf("admin request %d: %d %s", i, a.status, a.body)
		}
	}
	// A key of team B is bounded by the per-key rate within its team's:
	// its burst of 20 (15 are spent), then 429; another key of B passes.
	passed = 0
	for ; passed < 100; passed++ {
		if refusal = list(keyB); refusal.status != http.StatusOK {
			break
		}
	}
	if passed < 5 || passed > 8 {
		t.Fatalf("team B's key: %d more requests passed, want 5 (20 less the 15 above, with a refill or two)", passed)
	}
	rateLimited(t, "team B's key over the per-key rate", refusal, 1)
	if !strings.Contains(refusal.body, "API key") {
		t.Fatalf("per-key refusal: %s", refusal.body)
	}
	keyB2, err := s.admin.CreateKey(ctx, client.CreateKeyRequest{Name: "second", TeamID: teamB.ID})
	if err != nil {
		t.Fatal(err)
	}
	if a := list(keyB2.Key); a.status != http.StatusOK {
		t.Fatalf("team B's second key: %d %s", a.status, a.body)
	}

	// After the Retry-After, A passes again.
	time.Sleep(wait)
	if a := list(keyA); a.status != http.StatusOK {
		t.Fatalf("team A after waiting %v: %d %s", wait, a.status, a.body)
	}

	// Creates: team C's bucket (the server's 12 a minute) is apart from
	// its requests'. Creates of a template that does not exist cost no
	// sandbox but count.
	bad := `{"template":"no-such-template","runtime":"namespaces"}`
	create := func() rawAnswer { return rlDo(t, "POST", s.url+"/v1/sandboxes", rlBearer(keyC), bad) }
	for i := range 2 {
		if a := create(); a.status != http.StatusNotFound {
			t.Fatalf("create %d within the burst: %d %s, want 404", i, a.status, a.body)
		}
	}
	wait = rateLimited(t, "team C's third create", create(), 5)
	// Other requests of C still pass: the create bucket is apart.
	for i := range 10 {
		if a := list(keyC); a.status != http.StatusOK {
			t.Fatalf("team C's request %d while its creates are limited: %d %s", i, a.status, a.body)
		}
	}
	// E2B's create takes from the same bucket.
	e2bCreate := rlDo(t, "POST", s.url+"/v2/sandboxes", map[string]string{"X-API-KEY": keyC}, `{"templateID":"base"}`)
	rateLimited(t, "team C's E2B create", e2bCreate, 5)
	// Another team's creates are its own.
	if a := rlDo(t, "POST", s.url+"/v1/sandboxes", rlBearer(keyB), bad); a.status != http.StatusNotFound {
		t.Fatalf("team B's create while C's are limited: %d %s", a.status, a.body)
	}
	// After the Retry-After, C creates a sandbox.
	time.Sleep(wait)
	sb := mustCreateOn(t, s, cC, client.CreateSandboxRequest{Runtime: client.RuntimeNamespaces})
	if sb.State != client.StateRunning {
		t.Fatalf("sandbox after waiting: %+v", sb)
	}
}
