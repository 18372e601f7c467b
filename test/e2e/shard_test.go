package e2e

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// TestShard: `evalbox shard` splits a real pytest suite (testdata/shard:
// passing, failing, erroring, skipped and slow tests, nested directories)
// across 4 sandboxes; the merged JUnit report has the same test cases with
// the same outcomes as an unsharded run, the exit status says a test
// failed, the durations are recorded and used, and no sandbox is left.
func TestShard(t *testing.T) {
	t.Parallel()
	c, _, key := newTeam(t, srv, client.Limits{MaxSandboxes: 6, MaxConcurrentExec: 8})
	ctx := ctxT(t, 10*time.Minute)
	const tpl = "shard-pytest"
	deleteTemplateAtEnd(t, c, tpl)
	spec := mustParse(t, "from: python\nsteps:\n  - run: apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pytest >/dev/null\n")
	b, err := c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: tpl, Spec: spec}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	if end, err := c.FollowBuild(ctx, tpl, b.ID, &log); err != nil || end.State != client.BuildStateSucceeded {
		t.Fatalf("build: %+v %v\n%s", end, err, log.String())
	}

	// A copy of the project, with things the upload leaves out.
	proj := t.TempDir()
	if err := os.CopyFS(proj, os.DirFS("testdata/shard")); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{".git", "__pycache__"} {
		if err := os.MkdirAll(filepath.Join(proj, d), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proj, d, "test_not_a_test.py"), []byte("def test_x(): assert False\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := t.TempDir()
	durations := filepath.Join(out, "durations.json")
	run := func(shards, report string, extra ...string) (string, int) {
		args := append([]string{"shard", "--template", tpl, "--runtime", client.RuntimeNamespaces, "--shards", shards, "--dir", proj,
			"--junit-out", report, "--durations", durations}, extra...)
		args = append(args, "--", "python3", "-m", "pytest", "-q", "-p", "no:cacheprovider")
		_, stderr, code := runCLI(t, ctx, key, "", args...)
		return stderr, code
	}
	single := filepath.Join(out, "single.xml")
	stderr, code := run("1", single)
	if code != 1 || !strings.Contains(stderr, "2 of 9 tests failed or errored") {
		t.Fatalf("unsharded: exit %d\n%s", code, stderr)
	}
	sharded := filepath.Join(out, "sharded.xml")
	stderr, code = run("4", sharded)
	if code != 1 || !strings.Contains(stderr, "across 4 sandboxes") || !strings.Contains(stderr, "[shard 4] ") {
		t.Fatalf("sharded: exit %d\n%s", code, stderr)
	}
	want, got := outcomes(t, single), outcomes(t, sharded)
	if !slices.Equal(want, got) || len(want) != 9 {
		t.Errorf("sharded report\n%v\nunsharded\n%v", got, want)
	}
	for _, tc := range []string{"test_fail.test_bad failure", "test_skip.test_error_in_fixture error", "test_skip.test_skipped skipped", "test_slow.test_slow passed"} {
		if !slices.Contains(got, tc) {
			t.Errorf("no %q in %v", tc, got)
		}
	}
	var d map[string]float64
	if b, err := os.ReadFile(durations); err != nil || json.Unmarshal(b, &d) != nil || len(d) != 5 || d["test_slow.py"] < 1 {
		t.Errorf("durations %s: %v %v", b, d, err)
	}
	// Split by those durations now; a passing subset exits 0.
	if stderr, code = run("2", filepath.Join(out, "again.xml"), "--pattern", "test_pass.py", "--pattern", "test_slow.py"); code != 0 {
		t.Errorf("passing subset: exit %d\n%s", code, stderr)
	}
	// A shard whose command fails after a report without failures fails
	// the run: a crash in teardown, pytest's internal error.
	args := []string{"shard", "--template", tpl, "--runtime", client.RuntimeNamespaces, "--shards", "1", "--dir", proj,
		"--junit-out", filepath.Join(out, "crash.xml"), "--durations", durations, "--pattern", "test_pass.py",
		"--", "sh", "-c", `python3 -m pytest -q -p no:cacheprovider "$@"; exit 3`, "sh"}
	if _, stderr, code := runCLI(t, ctx, key, "", args...); code != 1 || !strings.Contains(stderr, "exit code 3) though its report has no failure") {
		t.Errorf("a failing command with a clean report: exit %d\n%s", code, stderr)
	}
	if sbs, err := c.ListSandboxes(context.Background(), client.ListOptions{}); err != nil || len(sbs) != 0 {
		t.Errorf("sandboxes left: %+v %v", sbs, err)
	}

	// Bad input: one line, exit 2, nothing made.
	for _, args := range [][]string{
		{"shard", "python3"},
		{"shard", "--shards", "0", "--", "pytest"},
		{"shard", "--junit-arg", "--junitxml", "--", "pytest"},
		{"shard", "--dir", t.TempDir(), "--", "pytest"},
	} {
		stdout, stderr, code := runCLI(t, ctx, key, "", args...)
		if code == 0 || stdout != "" || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("%v: exit %d %q %q", args, code, stdout, stderr)
		}
	}
}

// outcomes lists a JUnit report's test cases as "class.name outcome",
// sorted.
func outcomes(t *testing.T, p string) []string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Suites []struct {
			Cases []struct {
				Classname string    `xml:"classname,attr"`
				Name      string    `xml:"name,attr"`
				Failure   *struct{} `xml:"failure"`
				Error     *struct{} `xml:"error"`
				Skipped   *struct{} `xml:"skipped"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(b, &r); err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	var out []string
	for _, s := range r.Suites {
		for _, c := range s.Cases {
			o := "passed"
			switch {
			case c.Failure != nil:
				o = "failure"
			case c.Error != nil:
				o = "error"
			case c.Skipped != nil:
				o = "skipped"
			}
			out = append(out, c.Classname+"."+c.Name+" "+o)
		}
	}
	slices.Sort(out)
	return out
}
