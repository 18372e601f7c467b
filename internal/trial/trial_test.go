package trial

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/sandbox"
	"github.com/evalbox/evalbox/pkg/client"
)

// flaky is a sandbox service whose steps fail as scripted, recording what
// was created and deleted. The Runner's retry and cleanup rules are under
// test here; the real service is exercised by the e2e suite.
type flaky struct {
	mu               sync.Mutex
	createErrs       []error // returned by successive creates, then success
	execErrs         []error
	created, deleted []string
	wrote            string
}

func pop(errs *[]error) error {
	if len(*errs) == 0 {
		return nil
	}
	err := (*errs)[0]
	*errs = (*errs)[1:]
	return err
}

func (f *flaky) Create(ctx context.Context, teamID string, req client.CreateSandboxRequest) (client.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := pop(&f.createErrs); err != nil {
		return client.Sandbox{}, err
	}
	id := "sb-" + string(rune('a'+len(f.created)))
	f.created = append(f.created, id)
	return client.Sandbox{ID: id}, nil
}

func (f *flaky) WriteFile(ctx context.Context, teamID, id, path, mode string, r io.Reader) (client.FileInfo, error) {
	b, err := io.ReadAll(r)
	f.mu.Lock()
	f.wrote = path + ":" + string(b)
	f.mu.Unlock()
	return client.FileInfo{}, err
}

func (f *flaky) Exec(ctx context.Context, teamID, id string, req client.ExecRequest, stdout, stderr io.Writer) (client.ExecResult, error) {
	f.mu.Lock()
	err := pop(&f.execErrs)
	f.mu.Unlock()
	if err != nil {
		return client.ExecResult{}, err
	}
	io.WriteString(stdout, strings.Join(req.Argv, " "))
	return client.ExecResult{Status: client.StatusExited, ExitCode: 0}, ctx.Err()
}

func (f *flaky) Delete(ctx context.Context, teamID, id string) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	f.mu.Lock()
	f.deleted = append(f.deleted, id)
	f.mu.Unlock()
	return nil
}

var spec = Spec{Template: "python", Script: "print(1)", Path: "/tmp/main.py", Argv: []string{"python3", "/tmp/main.py"}, Timeout: 3}

func newRunner(f *flaky) *Runner {
	r := New(f, nil)
	r.Backoff = time.Millisecond
	return r
}

func TestRetriesInfraFailures(t *testing.T) {
	died := &sandbox.Error{Code: client.CodeSandboxNotRunning, Message: "died"}
	f := &flaky{
		createErrs: []error{&sandbox.Error{Code: client.CodeInternal, Message: "boom"}},
		execErrs:   []error{died},
	}
	out, err := newRunner(f).Run(t.Context(), "t1", spec)
	if err != nil {
		t.Fatal(err)
	}
	if out.Attempts != 3 || out.Result.Status != client.StatusExited || out.Result.Stdout != "python3 /tmp/main.py" || out.Sandbox.ID != "sb-b" {
		t.Fatalf("outcome %+v", out)
	}
	if f.wrote != "/tmp/main.py:print(1)" {
		t.Fatalf("wrote %q", f.wrote)
	}
	if strings.Join(f.created, ",") != "sb-a,sb-b" || strings.Join(f.deleted, ",") != "sb-a,sb-b" {
		t.Fatalf("created %v, deleted %v: every sandbox must be deleted", f.created, f.deleted)
	}
}

func TestGivesUpAsError(t *testing.T) {
	died := &sandbox.Error{Code: client.CodeSandboxNotRunning, Message: "died"}
	f := &flaky{execErrs: []error{died, died, died}}
	out, err := newRunner(f).Run(t.Context(), "t1", spec)
	if err != nil {
		t.Fatal(err)
	}
	if out.Result.Status != client.StatusError || !strings.Contains(out.Result.Error, "after 3 attempts") || !strings.Contains(out.Result.Error, "died") {
		t.Fatalf("outcome %+v", out)
	}
	if len(f.deleted) != 3 {
		t.Fatalf("deleted %v, want the 3 sandboxes", f.deleted)
	}
}

func TestNoRetryOnBadInput(t *testing.T) {
	for _, code := range []string{client.CodeBadRequest, client.CodeNotFound, client.CodeTooManySandboxes} {
		f := &flaky{createErrs: []error{&sandbox.Error{Code: code, Message: "no"}}}
		_, err := newRunner(f).Run(t.Context(), "t1", spec)
		var se *sandbox.Error
		if !errors.As(err, &se) || se.Code != code || len(f.created) != 0 || len(f.createErrs) != 0 {
			t.Errorf("%s: err %v, created %v", code, err, f.created)
		}
	}
}

func TestDeletesAfterCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	f := &flaky{}
	if _, err := newRunner(f).Run(ctx, "t1", spec); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	if strings.Join(f.deleted, ",") != "sb-a" {
		t.Fatalf("deleted %v after cancel", f.deleted)
	}
}
