package e2e

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// schemathesisChecks: no 5xx, and every answer as the spec says (its status
// documented, its content type and its body matching the schema).
const schemathesisChecks = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"

// TestSchemathesis fuzzes every operation of api/openapi.yaml with
// schemathesis (EVALBOX_SCHEMATHESIS: its `st` binary, which
// scripts/test.sh installs, pinned) against a real server: once with the
// admin key, with real ids of a sandbox, processes, an eval run, a team and
// a key so that the fuzzing reaches past 404, and once with a team's key.
// Any 5xx or answer that breaks the spec fails it; at the end every sandbox
// the run made is gone from the host.
func TestSchemathesis(t *testing.T) {
	st := os.Getenv("EVALBOX_SCHEMATHESIS")
	if st == "" {
		t.Skip("EVALBOX_SCHEMATHESIS is not set (scripts/test.sh installs schemathesis and sets it)")
	}
	spec, err := filepath.Abs("../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// The fuzzer may hold up to --max-sandboxes sandboxes of the largest
	// shape (8 GiB of memory, 10 GiB of disk) per team at once, in the
	// teams it makes too (about 100 hold a reservation at the end of a run). What it tests is the
	// API, not the host's room (TestHostCapacity* do): the host capacity
	// is sized above what they reserve, so that no create meets 503
	// insufficient_capacity. Their pids limits (--pids 128 and the
	// Sentry's 256 each) are a budget, not what idle sandboxes use; their
	// memory limits, up to 18 GiB each, are overcommitted 64 times.
	s, err := startServer(serverOptions{args: []string{"--max-sandboxes", "64", "--exec-wait", "0", "--default-timeout", "120",
		"--pids", "128", "--host-pids", "200000", "--memory-overcommit", "64"}})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = s.stop()
		}
	})
	ctx := ctxT(t, 15*time.Minute)
	c := s.admin

	// Fixtures: what the fuzzed operations' ids point to.
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeGVisor, Timeout: 900})
	if err != nil {
		t.Fatal(err)
	}
	victim, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces, Timeout: 900})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteFile(ctx, sb.ID, "/tmp/st.txt", strings.NewReader("schemathesis\n"), -1, 0o644); err != nil {
		t.Fatal(err)
	}
	running, err := c.StartProcess(ctx, sb.ID, client.ExecRequest{Cmd: "sleep 900", Tag: "running"})
	if err != nil {
		t.Fatal(err)
	}
	ended, err := c.StartProcess(ctx, sb.ID, client.ExecRequest{Cmd: "echo ended", Tag: "ended"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitProcess(ctx, sb.ID, ended.ID, time.Minute); err != nil {
		t.Fatal(err)
	}
	// A server on port 8000 of sb, behind the port URL operation: a
	// request of any method and path gets 200 "ok" (perl-base is in every
	// Debian root).
	portSrv := `perl -MIO::Socket::INET -e '$SIG{PIPE}="IGNORE"; $s=IO::Socket::INET->new(LocalAddr=>"127.0.0.1",LocalPort=>8000,Listen=>64,ReuseAddr=>1) or die "listen: $!"; while($c=$s->accept){ while(defined($l=<$c>)){ last if $l=~/^\r?\n$/ } print $c "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"; close $c }'`
	if _, err := c.StartProcess(ctx, sb.ID, client.ExecRequest{Cmd: portSrv, Tag: "port-8000"}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; {
		resp, err := c.Port(ctx, http.MethodGet, sb.ID, 8000, "/", nil)
		if err == nil {
			resp.Body.Close()
			break
		}
		if client.ErrorCode(err) != client.CodePortClosed || time.Now().After(deadline) {
			t.Fatalf("the port server: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	completion := "    return a + b\n"
	run, err := c.CreateEval(ctx, client.CreateEvalRequest{
		Problems: []client.EvalProblem{{TaskID: "t/0", Prompt: "def add(a, b):\n", EntryPoint: "add",
			Test: "def check(candidate):\n    assert candidate(1, 2) == 3\n"}},
		Samples: []client.EvalSample{{TaskID: "t/0", Completion: &completion}},
	})
	if err != nil {
		t.Fatal(err)
	}
	teamC, team, teamKey := newTeam(t, s, client.Limits{MaxSandboxes: 4, MaxConcurrentExec: 4})
	spare, err := c.CreateKey(ctx, client.CreateKeyRequest{Name: "spare", TeamID: team.ID})
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	q := func(s string) string { return fmt.Sprintf("%q", s) }
	sbOps := `^/v1/sandboxes/\\{id\\}`
	config := strings.Join([]string{
		`[[operations]]`,
		`include-name = "DELETE /v1/sandboxes/{id}"`,
		`parameters = { id = ` + q(victim.ID) + ` }`,
		`[[operations]]`,
		`include-name = "DELETE /v1/sandboxes/{id}/files"`,
		`parameters = { id = ` + q(sb.ID) + ` }`,
		`[[operations]]`,
		`include-name = "GET /v1/sandboxes/{id}/files"`,
		`parameters = { id = ` + q(sb.ID) + `, path = "/tmp/st.txt" }`,
		`[[operations]]`,
		`include-name = ["GET /v1/sandboxes/{id}/processes/{pid}", "POST /v1/sandboxes/{id}/processes/{pid}/signal", "DELETE /v1/sandboxes/{id}/processes/{pid}"]`,
		`parameters = { id = ` + q(sb.ID) + `, pid = ` + q(running.ID) + ` }`,
		`[[operations]]`,
		`include-name = "POST /v1/sandboxes/{id}/processes/{pid}/wait"`,
		`parameters = { id = ` + q(sb.ID) + `, pid = ` + q(running.ID) + `, timeout = 0.5 }`,
		`[[operations]]`,
		`include-name = "GET /v1/sandboxes/{id}/ports/{port}/{path}"`,
		`parameters = { id = ` + q(sb.ID) + `, port = 8000 }`,
		`[[operations]]`,
		`include-name = "GET /v1/sandboxes/{id}/processes/{pid}/stream"`,
		`parameters = { id = ` + q(sb.ID) + `, pid = ` + q(ended.ID) + ` }`,
		// The sandbox's other operations (after the ones above: the first
		// entry that matches an operation is its).
		`[[operations]]`,
		`include-path-regex = "` + sbOps + `(/files.*|/timeout|/exec|/processes)?$"`,
		`exclude-method = "DELETE"`,
		`parameters = { id = ` + q(sb.ID) + ` }`,
		`[[operations]]`,
		`include-path-regex = "^/v1/evals/\\{id\\}"`,
		`parameters = { id = ` + q(run.ID) + ` }`,
		`[[operations]]`,
		`include-path-regex = "^/v1/teams/\\{id\\}"`,
		`parameters = { id = ` + q(team.ID) + ` }`,
		`[[operations]]`,
		`include-path-regex = "^/v1/keys/\\{id\\}"`,
		`parameters = { id = ` + q(spare.ID) + ` }`,
		`[[operations]]`,
		`include-path-regex = "^/v1/templates/\\{name\\}"`,
		`parameters = { name = "base" }`,
	}, "\n") + "\n"
	cfgPath := filepath.Join(dir, "schemathesis.toml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}

	// One worker: schemathesis 4.32.5 on several threads shares
	// Hypothesis's lambda-source cache between them, which once failed a
	// run with a KeyError inside the tool (not an answer of ours).
	runST := func(name, key string, examples int, extra ...string) {
		t.Helper()
		args := append([]string{"--config-file", cfgPath, "run", spec, "--url", s.url,
			"--header", "Authorization: Bearer " + key, "--checks", schemathesisChecks,
			"--max-examples", fmt.Sprint(examples), "--phases", "examples,coverage,fuzzing",
			"--seed", "1", "--generation-database", "none", "--workers", "1", "--request-timeout", "60",
			"--no-color", "--output-sanitize", "false"}, extra...)
		cmd := exec.CommandContext(ctx, st, args...)
		cmd.Dir = dir
		start := time.Now()
		out, err := cmd.CombinedOutput()
		os.WriteFile(filepath.Join(dir, name+".log"), out, 0o644)
		t.Logf("schemathesis (%s): %v, %s\n%s", name, time.Since(start).Round(time.Second), lastLine(out, "generated"), section(out, "WARNINGS", "SUMMARY"))
		if err != nil {
			t.Errorf("schemathesis (%s) failed: %v\n%s", name, err, failures(out))
			// What the server said of its failures (a 5xx's cause is
			// logged, not answered).
			if log, err := os.ReadFile(s.logPath); err == nil {
				for l := range strings.SplitSeq(string(log), "\n") {
					if strings.Contains(l, "level=ERROR") || strings.Contains(l, "level=WARN") || strings.Contains(l, "port proxy") {
						t.Logf("server: %s", l)
					}
				}
			}
		}
		if cp, err := c.Capacity(ctx); err == nil {
			t.Logf("after schemathesis (%s): %d sandboxes hold %d of %d host pids, %d of %d MiB", name, cp.Sandboxes,
				cp.Pids.Reserved, cp.Pids.Budget, cp.MemoryMB.Reserved, cp.MemoryMB.Budget)
		}
	}
	runST("admin", s.adminKey, 40)
	runST("team", teamKey, 5)

	// Leave nothing: every sandbox the fuzzing made is deleted, then the
	// server stopped, and none of them has anything left on the host.
	for _, cl := range []*client.Client{c, teamC} {
		sbs, err := cl.ListSandboxes(ctx, client.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range sbs {
			if err := cl.DeleteSandbox(ctx, sb.ID); err != nil && !client.IsNotFound(err) {
				t.Errorf("delete %s: %v", sb.ID, err)
			}
		}
	}
	log, _ := os.ReadFile(s.logPath)
	ids := regexp.MustCompile(`sandbox created" sandbox=(sb-[a-z0-9]+)`).FindAllSubmatch(log, -1)
	stopped = true
	if err := s.stop(); err != nil {
		t.Error(err)
	}
	t.Logf("%d sandboxes were made", len(ids))
	for _, m := range ids {
		if left := hostLeftovers(s, string(m[1])); len(left) > 0 {
			t.Errorf("sandbox %s left behind:\n  %s", m[1], strings.Join(left, "\n  "))
		}
	}
}

// failures returns schemathesis's report from its FAILURES section (or the
// whole output's end).
func failures(out []byte) string {
	s := string(out)
	if i := strings.Index(s, "FAILURES"); i >= 0 {
		s = s[i:]
	}
	if len(s) > 20000 {
		s = s[:20000] + "\n…"
	}
	return s
}

// section returns the lines of out between the headings from and to.
func section(out []byte, from, to string) string {
	s := string(out)
	i, j := strings.Index(s, from), strings.Index(s, to)
	if i < 0 || j < i {
		return ""
	}
	return s[i:j]
}

func lastLine(out []byte, containing string) string {
	last := ""
	for line := range strings.Lines(string(out)) {
		if strings.Contains(line, containing) {
			last = strings.TrimSpace(line)
		}
	}
	return last
}
