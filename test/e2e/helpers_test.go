package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/leaks"
	"github.com/evalbox/evalbox/pkg/client"
)

var runtimes = []string{client.RuntimeGVisor, client.RuntimeNamespaces}

var teamSeq atomic.Int64

// newTeam makes a team with its own key and returns a client for it.
func newTeam(t *testing.T, s *server, limits client.Limits) (*client.Client, *client.Team, string) {
	t.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("t%d-%d", time.Now().UnixNano()%1e6, teamSeq.Add(1))
	team, err := s.admin.CreateTeam(ctx, client.CreateTeamRequest{Name: name, Limits: &limits})
	if err != nil {
		t.Fatalf("create team: %v", err)
	}
	key, err := s.admin.CreateKey(ctx, client.CreateKeyRequest{Name: "test", TeamID: team.ID})
	if err != nil {
		t.Fatalf("create key: %v", err)
	}
	return client.New(s.url, key.Key), team, key.Key
}

// defaultTeam is a team with generous limits for tests that do not test
// limits themselves.
func defaultTeam(t *testing.T) *client.Client {
	c, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 50, MaxConcurrentExec: 50})
	return c
}

// mustCreate creates a sandbox and registers its deletion, and the check
// that nothing of it is left on the host, at cleanup.
func mustCreate(t *testing.T, c *client.Client, req client.CreateSandboxRequest) *client.Sandbox {
	t.Helper()
	return mustCreateOn(t, srv, c, req)
}

// mustCreateOn is mustCreate on server s.
func mustCreateOn(t *testing.T, s *server, c *client.Client, req client.CreateSandboxRequest) *client.Sandbox {
	t.Helper()
	if req.Template == "" && req.Snapshot == "" {
		req.Template = "base"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := c.CreateSandbox(ctx, req)
	if err != nil {
		t.Fatalf("create sandbox %+v: %v", req, err)
	}
	t.Cleanup(func() {
		if err := c.DeleteSandbox(context.Background(), sb.ID); err != nil && !client.IsNotFound(err) {
			t.Errorf("delete %s: %v", sb.ID, err)
		}
		assertGone(t, s, sb.ID)
	})
	return sb
}

// assertGone fails the test if the host still holds anything of sandbox id:
// processes (by cgroup or argv), mounts, cgroups, network namespaces, or
// files in the data dir.
func assertGone(t *testing.T, s *server, id string) {
	t.Helper()
	var left []string
	deadline := time.Now().Add(10 * time.Second)
	for {
		left = hostLeftovers(s, id)
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(left) > 0 {
		t.Errorf("sandbox %s left behind:\n  %s", id, strings.Join(left, "\n  "))
	}
}

// hostLeftovers lists what the host still holds of sandbox id of server s
// (internal/leaks: processes, mounts, cgroups, links, netns and state
// files).
func hostLeftovers(s *server, id string) []string { return leaks.ByID(s.dataDir, id) }

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func mustExec(t *testing.T, c *client.Client, id string, req client.ExecRequest) *client.ExecResult {
	t.Helper()
	res, err := c.Exec(ctxT(t, 2*time.Minute), id, req)
	if err != nil {
		t.Fatalf("exec %+v: %v", req, err)
	}
	return res
}

func jsonOf(v any) (string, error) {
	b, err := json.Marshal(v)
	return string(b), err
}

// runCLI runs the evalbox binary against srv as the team of key, with
// stdin, and returns its stdout, stderr and exit code.
func runCLI(t *testing.T, ctx context.Context, key, stdin string, args ...string) (string, string, int) {
	t.Helper()
	return runCLIOn(t, srv, ctx, key, stdin, args...)
}

// runCLIOn is runCLI against server s.
func runCLIOn(t *testing.T, s *server, ctx context.Context, key, stdin string, args ...string) (string, string, int) {
	t.Helper()
	return runCLIEnv(t, s, ctx, key, stdin, nil, args...)
}

// runCLIEnv is runCLIOn with env (KEY=VALUE) added to the CLI's environment.
func runCLIEnv(t *testing.T, s *server, ctx context.Context, key, stdin string, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "evalbox"), args...)
	cmd.Env = append(append(os.Environ(), "EVALBOX_API_URL="+s.url, "EVALBOX_API_KEY="+key), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}
