package judge

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/eval"
	"github.com/evalbox/evalbox/internal/lang"
	"github.com/evalbox/evalbox/pkg/client"
)

// fakeSandboxes is the sandbox service's seam: execs answer from run,
// which sees the sandbox, the request and the files written to it.
type fakeSandboxes struct {
	mu      sync.Mutex
	next    int
	live    map[string]map[string]string // sandbox → path → content
	created []client.CreateSandboxRequest
	execs   []string // "sandbox user argv0"
	// createErr fails the first creates.
	createErr []error
	run       func(box string, files map[string]string, req client.ExecRequest, stdout io.Writer) (client.ExecResult, error)
}

func (f *fakeSandboxes) Create(_ context.Context, _ string, req client.CreateSandboxRequest) (client.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.createErr) > 0 {
		err := f.createErr[0]
		f.createErr = f.createErr[1:]
		return client.Sandbox{}, err
	}
	f.next++
	id := fmt.Sprintf("sb%d", f.next)
	if f.live == nil {
		f.live = map[string]map[string]string{}
	}
	f.live[id] = map[string]string{}
	f.created = append(f.created, req)
	return client.Sandbox{ID: id}, nil
}

func (f *fakeSandboxes) WriteFile(_ context.Context, _, id, path, _ string, r io.Reader) (client.FileInfo, error) {
	b, _ := io.ReadAll(r)
	f.mu.Lock()
	defer f.mu.Unlock()
	files, ok := f.live[id]
	if !ok {
		return client.FileInfo{}, &apierr.Error{Code: client.CodeNotFound, Message: "gone"}
	}
	files[path] = string(b)
	return client.FileInfo{Path: path}, nil
}

func (f *fakeSandboxes) Exec(_ context.Context, _, id string, req client.ExecRequest, stdout, _ io.Writer) (client.ExecResult, error) {
	f.mu.Lock()
	files, ok := f.live[id]
	f.execs = append(f.execs, id+" "+req.User+" "+req.Argv[0])
	f.mu.Unlock()
	if !ok {
		return client.ExecResult{}, &apierr.Error{Code: client.CodeNotFound, Message: "gone"}
	}
	if req.User == "root" {
		return client.ExecResult{Status: client.StatusExited}, nil
	}
	// A sandbox stopped by its memory stays until it is deleted, as the
	// service keeps its row.
	return f.run(id, files, req, stdout)
}

func (f *fakeSandboxes) Delete(_ context.Context, _, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.live[id]; !ok {
		return &apierr.Error{Code: client.CodeNotFound, Message: "gone"}
	}
	delete(f.live, id)
	return nil
}

func cpp(t *testing.T) lang.Language {
	l, err := lang.Resolve("c++")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func tests(n int) []eval.Test {
	var ts []eval.Test
	for i := range n {
		ts = append(ts, eval.Test{Input: fmt.Sprint(i), Output: fmt.Sprint(2 * i)})
	}
	return ts
}

// twice answers a compile with success and a run with 2n, except on the
// inputs in oom (the sandbox runs out of memory).
func twice(oom map[string]bool) func(string, map[string]string, client.ExecRequest, io.Writer) (client.ExecResult, error) {
	return func(_ string, _ map[string]string, req client.ExecRequest, stdout io.Writer) (client.ExecResult, error) {
		if req.Argv[0] == "g++" {
			return client.ExecResult{Status: client.StatusExited, DurationMs: 5}, nil
		}
		if oom[*req.Stdin] {
			return client.ExecResult{}, fmt.Errorf("exec: %w", apierr.ErrOutOfMemory)
		}
		var n int
		fmt.Sscan(*req.Stdin, &n)
		fmt.Fprintln(stdout, 2*n)
		return client.ExecResult{Status: client.StatusExited, DurationMs: 1}, nil
	}
}

// TestCompileOnceRunEach: the program is compiled once, as the sample's
// user, with the request's flags and limits, and every test runs the
// compiled program; the sandbox's memory covers the largest limit; the
// sandbox is deleted.
func TestCompileOnceRunEach(t *testing.T) {
	f := &fakeSandboxes{run: twice(nil)}
	j := New(f, nil)
	out, err := j.Run(context.Background(), "team", Spec{Lang: cpp(t), Source: "int main(){}", Tests: tests(3),
		Limits: Limits{CompileFlags: []string{"-O0"}, MemoryMB: 2000}})
	if err != nil {
		t.Fatal(err)
	}
	if out.Status != client.TestPassed || out.TestsPassed != 3 || out.Compile == nil || !out.Compile.OK || out.Attempts != 1 || out.RunMs != 3 {
		t.Fatalf("outcome %+v", out)
	}
	want := []string{"sb1 root /bin/sh", "sb1 65534 g++", "sb1 root /bin/sh", "sb1 65534 /bin/sh", "sb1 65534 /bin/sh", "sb1 65534 /bin/sh"}
	if strings.Join(f.execs, ",") != strings.Join(want, ",") {
		t.Errorf("execs %q, want %q", f.execs, want)
	}
	if len(f.created) != 1 || f.created[0].MemoryMB != 2000+sandboxSlackMB || f.created[0].Template != lang.TemplatePolyglot || len(f.live) != 0 {
		t.Errorf("created %+v, left %v", f.created, f.live)
	}
}

// TestOutOfMemoryGoesOn: a test whose program takes the sandbox down is
// memory_limit, and the tests after it run in a fresh sandbox, compiled
// again; the compile reported is the first.
func TestOutOfMemoryGoesOn(t *testing.T) {
	f := &fakeSandboxes{run: twice(map[string]bool{"1": true})}
	out, err := New(f, nil).Run(context.Background(), "team", Spec{Lang: cpp(t), Source: "x", Tests: tests(3)})
	if err != nil {
		t.Fatal(err)
	}
	if out.Status != client.TestMemoryLimit || out.TestsPassed != 2 || out.Tests[1].Status != client.TestMemoryLimit || out.Attempts != 1 || len(f.created) != 2 {
		t.Fatalf("outcome %+v, created %d", out, len(f.created))
	}
	if len(f.live) != 0 {
		t.Errorf("left %v", f.live)
	}
	if !strings.HasPrefix(out.Detail, "test 2 of 3: memory limit: passed the memory limit of 512 MiB") {
		t.Errorf("detail %q", out.Detail)
	}
}

// TestInfraRetried: infra failures (a create refused with a retriable
// error, an exec that fails) retry the whole sample on a fresh sandbox;
// bad input is not retried; failures that persist are infra_error.
func TestInfraRetried(t *testing.T) {
	f := &fakeSandboxes{run: twice(nil), createErr: []error{&apierr.Error{Code: client.CodeInternal, Message: "node lost"}}}
	j := New(f, nil)
	j.Backoff = 0
	out, err := j.Run(context.Background(), "team", Spec{Lang: cpp(t), Source: "x", Tests: tests(2)})
	if err != nil || out.Status != client.TestPassed || out.Attempts != 2 {
		t.Fatalf("outcome %+v, %v", out, err)
	}
	f = &fakeSandboxes{createErr: []error{&apierr.Error{Code: client.CodeNotFound, Message: "no template"}}}
	if _, err := New(f, nil).Run(context.Background(), "team", Spec{Lang: cpp(t), Source: "x", Tests: tests(1)}); err == nil {
		t.Fatal("an unknown template is an error, not a verdict")
	}
	f = &fakeSandboxes{run: func(string, map[string]string, client.ExecRequest, io.Writer) (client.ExecResult, error) {
		return client.ExecResult{Status: client.StatusError, Error: "agent lost"}, nil
	}}
	j = New(f, nil)
	j.Backoff = 0
	out, err = j.Run(context.Background(), "team", Spec{Lang: cpp(t), Source: "x", Tests: tests(1)})
	if err != nil || out.Status != client.TestInfraError || out.Attempts != 3 || !strings.Contains(out.Detail, "agent lost") || len(f.live) != 0 {
		t.Fatalf("outcome %+v, %v, left %v", out, err, f.live)
	}
}

// TestCompileVerdicts: a compiler that fails, runs out of time or of its
// memory limit is compile_error with its output, and no test runs.
func TestCompileVerdicts(t *testing.T) {
	for _, tc := range []struct {
		res  client.ExecResult
		want string
	}{
		{client.ExecResult{Status: client.StatusExited, ExitCode: 1}, "main.cpp:1:1: error: expected"},
		{client.ExecResult{Status: client.StatusTimedOut}, "past its timeout of 30 s"},
		{client.ExecResult{Status: client.StatusKilled, MemoryLimitExceeded: true}, "compile memory limit of 1024 MiB"},
	} {
		f := &fakeSandboxes{run: func(_ string, _ map[string]string, req client.ExecRequest, stdout io.Writer) (client.ExecResult, error) {
			if req.Argv[0] != "g++" {
				t.Errorf("ran %v after a failed compile", req.Argv)
			}
			fmt.Fprint(stdout, "main.cpp:1:1: error: expected ';'\n")
			return tc.res, nil
		}}
		out, err := New(f, nil).Run(context.Background(), "team", Spec{Lang: cpp(t), Source: "x", Tests: tests(2)})
		if err != nil || out.Status != client.CompileError || out.Compile == nil || out.Compile.OK || !strings.Contains(out.Compile.Output, tc.want) || out.Tests != nil {
			t.Errorf("%+v: outcome %+v, %v", tc.res, out, err)
		}
		if !strings.HasPrefix(out.Detail, "compile error: main.cpp:1:1: error") {
			t.Errorf("detail %q", out.Detail)
		}
	}
}

func TestLimitsValidate(t *testing.T) {
	for _, l := range []Limits{{Timeout: -1}, {MemoryMB: MaxMemoryMB + 1}, {OutputBytes: -1}, {CompileTimeout: 601}, {CompileFlags: []string{"-o", "x"}}} {
		if l.Validate() == nil {
			t.Errorf("%+v validated", l)
		}
	}
	if err := (Limits{}).Validate(); err != nil {
		t.Error(err)
	}
	if d := (Limits{}).WithDefaults(); d.Timeout != DefaultTimeout || d.MemoryMB != DefaultMemoryMB || d.OutputBytes != DefaultOutputBytes || d.CompileTimeout != DefaultCompileTimeout {
		t.Errorf("defaults %+v", d)
	}
}

// TestLeftoversKilled: each run of the program starts by killing what its
// user left running (a daemon of one test does not outlive it), and exec
// keeps the program's own argv.
func TestLeftoversKilled(t *testing.T) {
	var argv []string
	f := &fakeSandboxes{run: func(_ string, _ map[string]string, req client.ExecRequest, stdout io.Writer) (client.ExecResult, error) {
		if req.Argv[0] != "g++" {
			argv = req.Argv
		}
		return twice(nil)("", nil, client.ExecRequest{Argv: req.Argv[len(req.Argv)-1:], Stdin: req.Stdin}, stdout)
	}}
	if _, err := New(f, nil).Run(context.Background(), "team", Spec{Lang: cpp(t), Source: "x", Tests: tests(1)}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"/bin/sh", "-c", `kill -9 -1 2>/dev/null; exec "$@"`, "judge", "./main"}; strings.Join(argv, "|") != strings.Join(want, "|") {
		t.Errorf("run argv %q, want %q", argv, want)
	}
}

// TestSandboxDownOnceRun: a program after whose start every fresh sandbox
// fails, while a control command runs to its end in another, is judged
// (runtime_error), not an infra_error that pass@k would leave out; when
// the control fails too, it is infra_error.
func TestSandboxDownOnceRun(t *testing.T) {
	for _, controlOK := range []bool{true, false} {
		f := &fakeSandboxes{run: func(_ string, _ map[string]string, req client.ExecRequest, stdout io.Writer) (client.ExecResult, error) {
			switch {
			case req.Argv[0] == "g++":
				return client.ExecResult{Status: client.StatusExited}, nil
			case req.Argv[len(req.Argv)-1] == "exit 0" && controlOK:
				return client.ExecResult{Status: client.StatusExited}, nil
			}
			return client.ExecResult{}, &apierr.Error{Code: client.CodeSandboxNotRunning, Message: "the sandbox stopped"}
		}}
		j := New(f, nil)
		j.Backoff = 0
		out, err := j.Run(context.Background(), "team", Spec{Lang: cpp(t), Source: "x", Tests: tests(2), Metadata: map[string]string{"eval_run": "r"}})
		want := client.TestInfraError
		if controlOK {
			want = client.TestRuntimeError
		}
		if err != nil || out.Status != want || out.Attempts != 3 || !strings.Contains(out.Detail, "the sandbox stopped") || len(f.live) != 0 {
			t.Errorf("control ok %v: outcome %+v, %v, left %v", controlOK, out, err, f.live)
		}
		if last := f.created[len(f.created)-1]; last.Metadata["trial_control"] != "1" || last.Metadata["eval_run"] != "r" || len(f.created) != 4 {
			t.Errorf("control ok %v: creates %+v", controlOK, f.created)
		}
	}
}

// TestMemoryReplacementsBounded: a program whose memory takes down every
// sandbox gets 3, and the tests after are not run.
func TestMemoryReplacementsBounded(t *testing.T) {
	f := &fakeSandboxes{run: twice(map[string]bool{"0": true, "1": true, "2": true, "3": true, "4": true})}
	out, err := New(f, nil).Run(context.Background(), "team", Spec{Lang: cpp(t), Source: "x", Tests: tests(5)})
	if err != nil {
		t.Fatal(err)
	}
	if len(f.created) != maxReplaced || out.Status != client.TestMemoryLimit || out.Tests[2].Status != client.TestMemoryLimit ||
		out.Tests[3].Status != client.TestNotRun || out.Tests[4].Status != client.TestNotRun || len(f.live) != 0 {
		t.Errorf("created %d, outcome %+v", len(f.created), out)
	}
}
