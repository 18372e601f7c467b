package node

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/evalbox/evalbox/internal/agentproto"
	"github.com/evalbox/evalbox/internal/nodeapi"
)

// BenchmarkExecTrue measures what the contract adds in process: the same
// sandbox (the fake runtime's in-process agent, so that no sandbox start or
// kernel noise hides it), `true` through its agent client directly, as the
// service called it before the contract, and through Local.
func BenchmarkExecTrue(b *testing.B) {
	n, _ := newTestNode(b, 32768)
	ctx := context.Background()
	sb, err := n.Create(ctx, testKey, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer n.Destroy(ctx, sb.ID)
	local := NewLocal(n)
	b.Run("direct", func(b *testing.B) {
		req := agentproto.ExecRequest{Argv: []string{"true"}}
		for b.Loop() {
			if x, err := sb.Agent.Exec(ctx, req, nil, nil, nil); err != nil || x.ExitCode != 0 {
				b.Fatal(x, err)
			}
			_ = sb.OOMKills() // the service read it after every exec
		}
	})
	b.Run("local", func(b *testing.B) {
		req := nodeapi.ExecRequest{Argv: []string{"true"}}
		for b.Loop() {
			if x, err := local.Exec(ctx, sb.ID, req, nil, nil, nil); err != nil || x.ExitCode != 0 {
				b.Fatal(x, err)
			}
		}
	})
}

// TestLocalErrors: Local maps the node's and the agent's errors to the
// contract's.
func TestLocalErrors(t *testing.T) {
	n, _ := newTestNode(t, 32768)
	ctx := t.Context()
	local := NewLocal(n)
	info, err := local.Create(ctx, nodeapi.CreateRequest{Spec: testKey})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := local.Stat(ctx, info.ID, "/nonexistent/x"); err == nil {
		t.Fatal("stat of nothing")
	} else if ae := (*nodeapi.AgentError)(nil); !errors.As(err, &ae) || ae.Code != nodeapi.CodeNotFound {
		t.Errorf("stat of nothing: %T %v", err, err)
	}
	if _, err := local.Stat(ctx, "sb-nope", "/"); !errors.Is(err, nodeapi.ErrSandboxNotFound) {
		t.Errorf("unknown sandbox: %v", err)
	}
	bad := testKey
	bad.Template = "sha256:" + strings.Repeat("1", 64)
	if _, err := local.Create(ctx, nodeapi.CreateRequest{Spec: bad}); !errors.Is(err, nodeapi.ErrTemplateMissing) {
		t.Errorf("unknown template: %v", err)
	}
	// The agent going away is a StoppedError, and Wait returns.
	n.mu.Lock()
	sb := n.live[info.ID]
	n.mu.Unlock()
	sb.rt.(*fakeSandbox).cancel()
	if end, err := local.Wait(ctx, info.ID); err != nil || end.Reason == "destroyed" {
		t.Errorf("wait: %+v %v", end, err)
	}
	if _, err := local.Stat(ctx, info.ID, "/"); !errors.Is(err, nodeapi.ErrSandboxStopped) {
		t.Errorf("stat in a stopped sandbox: %v", err)
	}
}

// TestLocalKeepsTheCreateEnv: the env a create gives is every exec's and
// process's, under the request's own; the caller's map is not shared.
func TestLocalKeepsTheCreateEnv(t *testing.T) {
	n, _ := newTestNode(t, 32768)
	ctx := t.Context()
	local := NewLocal(n)
	env := map[string]string{"A": "create", "B": "create"}
	info, err := local.Create(ctx, nodeapi.CreateRequest{Spec: testKey, Env: env})
	if err != nil {
		t.Fatal(err)
	}
	defer local.Destroy(ctx, info.ID)
	env["A"] = "changed after the create"
	var out strings.Builder
	x, err := local.Exec(ctx, info.ID, nodeapi.ExecRequest{Shell: `echo "$A $B"`, Env: map[string]string{"B": "exec"}, TimeoutMs: 10000}, nil, &out, nil)
	if err != nil || x.ExitCode != 0 || out.String() != "create exec\n" {
		t.Fatalf("exec: %q %+v %v; want %q", out.String(), x, err, "create exec\n")
	}
	p, err := local.StartProcess(ctx, info.ID, nodeapi.ExecRequest{Shell: `test "$A" = create`, TimeoutMs: 10000})
	if err != nil {
		t.Fatal(err)
	}
	if x, err := local.WaitProcess(ctx, info.ID, p.ID); err != nil || x.ExitCode != 0 {
		t.Fatalf("process without the create's env: %+v %v", x, err)
	}
}
