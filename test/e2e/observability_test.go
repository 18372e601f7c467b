package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// promParser parses Prometheus's text format with the real parser of the
// Prometheus project's Python client (prometheus_client, pinned in
// sdk/python's dev extras and constraints.txt) and prints the samples as
// JSON lines; a value as Python spells it (inf and nan included).
const promParser = `
import json, sys
from prometheus_client.parser import text_string_to_metric_families
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        print(json.dumps({"family": fam.name, "type": fam.type, "name": s.name, "labels": s.labels, "value": repr(s.value)}))
`

// sample is one parsed sample.
type sample struct {
	Family, Type, Name string
	Labels             map[string]string
	Value              float64
}

// samples are a scrape's samples.
type samples []sample

// parseMetrics parses text with prometheus_client's parser (a parse
// error fails the test).
func parseMetrics(t *testing.T, text []byte) samples {
	t.Helper()
	py, err := filepath.Abs(filepath.Join("..", "..", "sdk", "python", ".venv", "bin", "python"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(py); err != nil {
		t.Fatalf("%s missing: make the SDK's venv (python3 -m venv sdk/python/.venv && sdk/python/.venv/bin/pip install -e 'sdk/python[dev]' -c sdk/python/constraints.txt)", py)
	}
	cmd := exec.Command(py, "-c", promParser)
	cmd.Stdin = bytes.NewReader(text)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("prometheus_client could not parse the metrics: %v\n%s\n--- metrics:\n%s", err, stderr.String(), text)
	}
	var ss samples
	for line := range strings.Lines(string(out)) {
		var raw struct {
			Family, Type, Name string
			Labels             map[string]string
			Value              string
		}
		if err := json.Unmarshal([]byte(line), &raw); err != nil {
			t.Fatalf("parser output %q: %v", line, err)
		}
		v, err := strconv.ParseFloat(raw.Value, 64)
		if err != nil {
			t.Fatalf("value %q: %v", raw.Value, err)
		}
		ss = append(ss, sample{Family: raw.Family, Type: raw.Type, Name: raw.Name, Labels: raw.Labels, Value: v})
	}
	if len(ss) == 0 {
		t.Fatalf("no samples in:\n%s", text)
	}
	return ss
}

// get returns the value of the sample name with exactly labels, and
// whether there is one.
func (ss samples) get(name string, labels map[string]string) (float64, bool) {
	for _, s := range ss {
		if s.Name == name && maps.Equal(s.Labels, labels) {
			return s.Value, true
		}
	}
	return 0, false
}

// sum adds the samples of name whose labels include match.
func (ss samples) sum(name string, match map[string]string) (float64, int) {
	total, n := 0.0, 0
	for _, s := range ss {
		if s.Name != name {
			continue
		}
		ok := true
		for k, v := range match {
			ok = ok && s.Labels[k] == v
		}
		if ok {
			total, n = total+s.Value, n+1
		}
	}
	return total, n
}

func (ss samples) family(name string) (sample, bool) {
	for _, s := range ss {
		if s.Family == name {
			return s, true
		}
	}
	return sample{}, false
}

// scrape GETs url's /metrics with key ("" = none) and returns the status,
// the error code header and the body.
func scrape(t *testing.T, url, key string) (int, string, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxT(t, 30*time.Second), http.MethodGet, url+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get(client.HeaderError), body
}

// TestMetrics: GET /metrics on the API's listener needs an admin key, the
// --metrics-listen address serves it to anyone; its text parses with the
// Prometheus project's own parser and counts what the test did: a create,
// an exec, a refused create, the sandbox running and then gone. The audit
// log's retention sweeps old rows at start.
func TestMetrics(t *testing.T) {
	metricsAddr, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	s, err := startServer(serverOptions{args: []string{"--metrics-listen", metricsAddr}})
	if err != nil {
		t.Fatal(err)
	}
	dir := s.dataDir
	s.ownDir = false // restarted on below
	t.Cleanup(func() { os.RemoveAll(dir) })
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = s.stop()
		}
	})
	c, _, key := newTeam(t, s, client.Limits{MaxSandboxes: 5, MaxConcurrentExec: 5})
	ctx := ctxT(t, 5*time.Minute)

	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces})
	if err != nil {
		t.Fatal(err)
	}
	if res := mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "echo hi"}); res.ExitCode != 0 {
		t.Fatalf("exec: %+v", res)
	}
	if _, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "no-such-template", Runtime: client.RuntimeNamespaces}); !client.IsNotFound(err) {
		t.Fatalf("create of an unknown template: %v", err)
	}

	// Refused on the API's listener without an admin key.
	if status, code, _ := scrape(t, s.url, ""); status != http.StatusUnauthorized || code != client.CodeUnauthorized {
		t.Errorf("/metrics without a key: %d %q", status, code)
	}
	if status, code, _ := scrape(t, s.url, key); status != http.StatusForbidden || code != client.CodeForbidden {
		t.Errorf("/metrics with a team's key: %d %q", status, code)
	}
	if _, err := c.Metrics(ctx); client.ErrorCode(err) != client.CodeForbidden {
		t.Errorf("client.Metrics with a team's key: %v", err)
	}
	text, err := s.admin.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ss := parseMetrics(t, text)
	running := map[string]string{"state": client.StateRunning, "runtime": client.RuntimeNamespaces, "template": "base"}
	if v, ok := ss.get("evalbox_sandboxes", running); !ok || v != 1 {
		t.Errorf("evalbox_sandboxes%v = %v (%v), want 1", running, v, ok)
	}
	if f, ok := ss.family("evalbox_sandboxes"); !ok || f.Type != "gauge" {
		t.Errorf("evalbox_sandboxes: %+v", f)
	}
	if v, _ := ss.sum("evalbox_sandbox_create_duration_seconds_count", map[string]string{"runtime": client.RuntimeNamespaces, "outcome": "ok"}); v < 1 {
		t.Errorf("creates counted: %v", v)
	}
	if v, _ := ss.sum("evalbox_sandbox_create_duration_seconds_count", map[string]string{"outcome": client.CodeNotFound}); v != 1 {
		t.Errorf("refused creates counted: %v", v)
	}
	if v, _ := ss.sum("evalbox_exec_duration_seconds_count", map[string]string{"runtime": client.RuntimeNamespaces, "status": client.StatusExited}); v != 1 {
		t.Errorf("execs counted: %v", v)
	}
	if v, _ := ss.sum("evalbox_exec_duration_seconds_bucket", map[string]string{"runtime": client.RuntimeNamespaces, "status": client.StatusExited, "le": "+Inf"}); v != 1 {
		t.Errorf("exec +Inf bucket: %v", v)
	}
	if v, ok := ss.get("evalbox_http_requests_total", map[string]string{"route": "/v1/sandboxes", "method": "POST", "status": "201"}); !ok || v != 1 {
		t.Errorf("POST /v1/sandboxes 201: %v %v", v, ok)
	}
	if v, ok := ss.get("evalbox_http_errors_total", map[string]string{"code": client.CodeForbidden}); !ok || v < 2 {
		t.Errorf("forbidden errors: %v %v", v, ok)
	}
	if v, _ := ss.sum("evalbox_queue_wait_seconds_count", map[string]string{"queue": "exec_slot"}); v != 1 {
		t.Errorf("exec slot waits: %v", v)
	}
	if v, ok := ss.get("evalbox_host_capacity", map[string]string{"resource": "pids", "kind": "budget"}); !ok || v <= 0 {
		t.Errorf("pids budget: %v %v", v, ok)
	}
	if _, ok := ss.family("go_goroutines"); !ok {
		t.Error("no Go runtime metrics")
	}
	// No id or team in any label.
	for _, smp := range ss {
		for k, v := range smp.Labels {
			if strings.Contains(v, sb.ID) || strings.HasPrefix(v, "team_") {
				t.Errorf("%s has label %s=%q", smp.Name, k, v)
			}
		}
	}

	// After the delete the gauge drops to 0; the separate listener serves
	// the same without a key.
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	status, _, body := scrape(t, s.url, s.adminKey)
	if status != http.StatusOK {
		t.Fatalf("/metrics with the admin key: %d", status)
	}
	ss = parseMetrics(t, body)
	if v, ok := ss.get("evalbox_sandboxes", running); !ok || v != 0 {
		t.Errorf("after the delete, evalbox_sandboxes%v = %v (%v), want 0", running, v, ok)
	}
	if v, ok := ss.get("evalbox_sandboxes_ended_total", map[string]string{"state": client.StateDeleted}); !ok || v != 1 {
		t.Errorf("ended: %v %v", v, ok)
	}
	status, _, body = scrape(t, "http://"+metricsAddr, "")
	if status != http.StatusOK {
		t.Fatalf("--metrics-listen: %d %s", status, body)
	}
	ss = parseMetrics(t, body)
	if v, _ := ss.get("evalbox_sandboxes", running); v != 0 {
		t.Errorf("--metrics-listen: evalbox_sandboxes = %v", v)
	}
	if v, ok := ss.get("evalbox_http_requests_total", map[string]string{"route": "/v1/sandboxes", "method": "POST", "status": "201"}); !ok || v != 1 {
		t.Errorf("--metrics-listen: POST /v1/sandboxes 201: %v %v", v, ok)
	}
	// The metrics listener serves nothing else.
	resp, err := http.Get("http://" + metricsAddr + "/v1/teams")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("--metrics-listen /v1/teams: %d", resp.StatusCode)
	}

	// Retention: a restart with --audit-retention 1s sweeps the rows the
	// test made (older than a second by then) at start.
	before, err := s.admin.ListAudit(ctx, client.AuditQuery{})
	if err != nil || len(before.Events) < 3 {
		t.Fatalf("audit before the restart: %+v %v", before, err)
	}
	stopped = true
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	s2 := startServerT(t, serverOptions{dataDir: dir, args: []string{"--audit-retention", "1s"}})
	// The first sweep runs as the server starts serving.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		after, err := s2.admin.ListAudit(ctx, client.AuditQuery{})
		if err == nil && len(after.Events) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("audit after a restart with 1s retention: %+v %v", after, err)
		}
	}
}

// TestAuditLog: the audit log records two teams' creates, deletes and key
// changes, a refused create with its code and a refused admin action,
// with who, from where and to what; an admin lists and filters it, a team
// cannot; no request body, env value or key secret is in it.
func TestAuditLog(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	start := time.Now().Add(-time.Second)
	cA, teamA, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 5, MaxConcurrentExec: 5})
	cB, teamB, keyB := newTeam(t, srv, client.Limits{MaxSandboxes: 5, MaxConcurrentExec: 5})

	const envValue = "audit-env-value-5f1c"
	sb, err := cA.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces,
		Env: map[string]string{"AUDIT_ENV": envValue}, Metadata: map[string]string{"m": envValue}})
	if err != nil {
		t.Fatal(err)
	}
	if err := cA.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	newKey, err := cA.CreateKey(ctx, client.CreateKeyRequest{Name: "second"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cB.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "no-such-template", Env: map[string]string{"AUDIT_ENV": envValue}}); !client.IsNotFound(err) {
		t.Fatalf("create of an unknown template: %v", err)
	}
	if _, err := cB.CreateTeam(ctx, client.CreateTeamRequest{Name: "not-allowed"}); client.ErrorCode(err) != client.CodeForbidden {
		t.Fatalf("team create by a team: %v", err)
	}
	// E2B's API, through the same audit: a create (its target the new
	// sandbox) and a kill.
	e2bDo := func(method, path, body string) (int, []byte) {
		req, err := http.NewRequestWithContext(ctx, method, srv.url+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-API-Key", keyB)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	status, body := e2bDo("POST", "/v2/sandboxes", `{"templateID":"base","envVars":{"AUDIT_ENV":"`+envValue+`"}}`)
	var e2bSandbox struct{ SandboxID string }
	if err := json.Unmarshal(body, &e2bSandbox); status != http.StatusCreated || err != nil || e2bSandbox.SandboxID == "" {
		t.Fatalf("E2B create: %d %s", status, body)
	}
	if status, body := e2bDo("DELETE", "/sandboxes/"+e2bSandbox.SandboxID, ""); status != http.StatusNoContent {
		t.Fatalf("E2B kill: %d %s", status, body)
	}
	// A team cannot read the log.
	if _, err := cA.ListAudit(ctx, client.AuditQuery{}); client.ErrorCode(err) != client.CodeForbidden {
		t.Errorf("a team's audit list: %v", err)
	}
	if _, err := srv.admin.ListAudit(ctx, client.AuditQuery{Since: time.Now(), Until: start}); client.ErrorCode(err) != client.CodeBadRequest {
		t.Errorf("since after until: %v", err)
	}

	type row struct{ team, action, target, code string }
	rowsOf := func(events []client.AuditEvent) []row {
		var out []row
		for _, e := range slices.Backward(events) { // oldest first
			out = append(out, row{e.TeamID, e.Action, e.Target, e.Code})
		}
		return out
	}
	a, err := srv.admin.ListAudit(ctx, client.AuditQuery{TeamID: teamA.ID, Since: start})
	if err != nil {
		t.Fatal(err)
	}
	wantA := []row{
		{teamA.ID, client.AuditActionSandboxCreate, sb.ID, ""},
		{teamA.ID, client.AuditActionSandboxDelete, sb.ID, ""},
		{teamA.ID, client.AuditActionKeyCreate, newKey.ID, ""},
	}
	if got := rowsOf(a.Events); !slices.Equal(got, wantA) {
		t.Errorf("team A's rows:\n%v\nwant\n%v", got, wantA)
	}
	for _, e := range a.Events {
		if e.KeyName != "test" || e.KeyID == "" || e.Admin || e.RemoteAddr != "127.0.0.1" || e.At.Before(start) || e.At.After(time.Now()) {
			t.Errorf("row %+v", e)
		}
	}
	if st := []int{a.Events[2].Status, a.Events[1].Status, a.Events[0].Status}; !slices.Equal(st, []int{201, 204, 201}) {
		t.Errorf("statuses %v", st)
	}
	b, err := srv.admin.ListAudit(ctx, client.AuditQuery{TeamID: teamB.ID, Since: start})
	if err != nil {
		t.Fatal(err)
	}
	wantB := []row{
		{teamB.ID, client.AuditActionSandboxCreate, "", client.CodeNotFound},
		{teamB.ID, client.AuditActionTeamCreate, "", client.CodeForbidden},
		{teamB.ID, client.AuditActionE2BSandboxCreate, e2bSandbox.SandboxID, ""},
		{teamB.ID, client.AuditActionE2BSandboxKill, e2bSandbox.SandboxID, ""},
	}
	if got := rowsOf(b.Events); !slices.Equal(got, wantB) {
		t.Errorf("team B's rows:\n%v\nwant\n%v", got, wantB)
	}
	if len(b.Events) == 4 && (b.Events[3].Status != 404 || b.Events[2].Status != 403 || b.Events[1].Status != 201 || b.Events[0].Status != 204) {
		t.Errorf("team B's statuses: %+v", b.Events)
	}

	// The admin's own rows: the two teams and their keys, by the admin key.
	// (Other tests may add rows meanwhile: the listings end at cut.)
	cut := time.Now()
	all, err := srv.admin.ListAudit(ctx, client.AuditQuery{Since: start, Until: cut, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	byTarget := map[string]client.AuditEvent{}
	for _, e := range all.Events {
		byTarget[e.Action+" "+e.Target] = e
	}
	for _, id := range []string{teamA.ID, teamB.ID} {
		e, ok := byTarget[client.AuditActionTeamCreate+" "+id]
		if !ok || !e.Admin || e.Status != 201 {
			t.Errorf("the admin's team.create of %s: %+v %v", id, e, ok)
		}
	}
	seen := map[string]bool{}
	for _, e := range all.Events {
		seen[e.TeamID] = true
	}
	if !seen[teamA.ID] || !seen[teamB.ID] {
		t.Errorf("the unfiltered list lacks a team: %v", seen)
	}
	// Filter by action, and pages of 2 that add up to the whole.
	creates, err := srv.admin.ListAudit(ctx, client.AuditQuery{Action: client.AuditActionSandboxCreate, Since: start, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range creates.Events {
		if e.Action != client.AuditActionSandboxCreate {
			t.Errorf("action filter: %+v", e)
		}
	}
	var paged []client.AuditEvent
	q := client.AuditQuery{Since: start, Until: cut, Limit: 2}
	for range 1000 {
		page, err := srv.admin.ListAudit(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		paged = append(paged, page.Events...)
		if page.NextCursor == "" {
			break
		}
		q.Cursor = page.NextCursor
	}
	pagedIDs, allIDs := []string{}, []string{}
	for _, e := range paged {
		pagedIDs = append(pagedIDs, e.ID)
	}
	for _, e := range all.Events {
		allIDs = append(allIDs, e.ID)
	}
	if len(pagedIDs) < len(wantA)+len(wantB) || !slices.Equal(pagedIDs, allIDs) {
		t.Errorf("pages %v, the whole %v", pagedIDs, allIDs)
	}

	// Nothing of the bodies: no env value, metadata or key secret.
	raw, err := json.Marshal(all)
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{envValue, "AUDIT_ENV", newKey.Key} {
		if strings.Contains(string(raw), secret) {
			t.Errorf("the audit log holds %q", secret)
		}
	}

	// The CLI.
	out, errOut, code := runCLI(t, ctx, srv.adminKey, "", "audit", "--team", teamA.ID, "--since", "10m", "--json")
	if code != 0 {
		t.Fatalf("evalbox audit --json: %d %s", code, errOut)
	}
	var l client.AuditList
	if err := json.Unmarshal([]byte(out), &l); err != nil || len(l.Events) != len(wantA) {
		t.Errorf("evalbox audit --json: %v %s", err, out)
	}
	out, errOut, code = runCLI(t, ctx, srv.adminKey, "", "audit", "--team", teamB.ID, "--action", client.AuditActionSandboxCreate)
	if code != 0 || !strings.Contains(out, client.CodeNotFound) || strings.Count(strings.TrimSpace(out), "\n") != 1 {
		t.Errorf("evalbox audit (table): %d %s %s", code, out, errOut)
	}
	if _, errOut, code := runCLI(t, ctx, srv.adminKey, "", "audit", "--since", "yesterday"); code != 2 {
		t.Errorf("evalbox audit --since yesterday: exit %d %s", code, errOut)
	}
	if _, _, code := runCLI(t, ctx, newKey.Key, "", "audit"); code == 0 {
		t.Error("evalbox audit with a team's key succeeded")
	}
}
