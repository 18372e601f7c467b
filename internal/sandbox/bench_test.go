package sandbox

// Benchmarks of the service on a real node (namespaces, the real agent),
// through the node contract in process and over gRPC on loopback.
// BENCHMARKS.md has their numbers, and those of the direct path before the
// contract. They need root, $EVALBOX_TEST_ROOTFS and the agent binary
// ($EVALBOX_BIN_DIR, default <repo>/bin).

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/node"
	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/internal/nodeapi/grpcnode"
	"github.com/evalbox/evalbox/internal/runtime"
	"github.com/evalbox/evalbox/internal/runtime/namespaces"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/internal/template"
	"github.com/evalbox/evalbox/pkg/client"
)

func TestMain(m *testing.M) {
	namespaces.Init()
	os.Exit(m.Run())
}

// memStore is the state store in memory.
type memStore struct {
	mu   sync.Mutex
	rows map[string]client.Sandbox
	// listByState makes ListByState answer (else it lists nothing).
	listByState bool
}

func (m *memStore) InsertSandbox(ctx context.Context, sb client.Sandbox) (client.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rows[sb.ID] = sb
	return sb, nil
}
func (m *memStore) GetSandbox(ctx context.Context, teamID, id string) (client.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.rows[id]
	if !ok || r.TeamID != teamID {
		return client.Sandbox{}, store.ErrNotFound
	}
	return r, nil
}
func (m *memStore) ListSandboxes(ctx context.Context, teamID string, f store.SandboxFilter) ([]client.Sandbox, error) {
	return nil, nil
}
func (m *memStore) SetExpiry(ctx context.Context, teamID, id string, t time.Time) error { return nil }
func (m *memStore) MarkEnded(ctx context.Context, id, state, reason string, at time.Time) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.rows[id]
	if !ok || r.State != client.StateRunning {
		return false, nil
	}
	r.State, r.EndReason = state, reason
	m.rows[id] = r
	return true, nil
}
func (m *memStore) ListByState(ctx context.Context, state string) ([]client.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []client.Sandbox
	for _, r := range m.rows {
		if m.listByState && r.State == state {
			out = append(out, r)
		}
	}
	return out, nil
}
func (m *memStore) ListRunningOn(ctx context.Context, nodeID string) ([]client.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []client.Sandbox
	for _, r := range m.rows {
		if r.NodeID == nodeID && r.State == client.StateRunning {
			out = append(out, r)
		}
	}
	return out, nil
}
func (m *memStore) GetTeam(ctx context.Context, id string) (client.Team, error) {
	return client.Team{ID: id, Name: id, Limits: client.Limits{MaxSandboxes: 100, MaxConcurrentExec: 100}}, nil
}

// row returns the stored row of id.
func (m *memStore) row(id string) client.Sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rows[id]
}

type regTemplates struct{ reg *template.Registry }

func (r regTemplates) Acquire(ctx context.Context, teamID, name string) (*template.Template, func(), error) {
	t, err := r.reg.Get(name)
	return t, func() {}, err
}

// benchService returns a service on a real node, reached through the
// contract in process (remote false) or over gRPC on loopback.
func benchService(b *testing.B, remote bool) *Service {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	rootfs := os.Getenv("EVALBOX_TEST_ROOTFS")
	bin := os.Getenv("EVALBOX_BIN_DIR")
	if bin == "" {
		bin, _ = filepath.Abs("../../bin")
	}
	agent := filepath.Join(bin, "evalbox-agent")
	if _, err := os.Stat(agent); err != nil {
		b.Skip("no agent binary: run scripts/build.sh")
	}
	if _, err := os.Stat(filepath.Join(rootfs, "bin/sh")); err != nil {
		b.Skip("no template root filesystem: set EVALBOX_TEST_ROOTFS")
	}
	dir := b.TempDir()
	tdir := filepath.Join(dir, "templates", "base")
	os.MkdirAll(tdir, 0o755)
	os.WriteFile(filepath.Join(tdir, "template.json"), []byte(`{"name":"base","digest":"sha256:7777777777777777777777777777777777777777777777777777777777777777","defaults":{"cpu":1,"memory_mb":256,"disk_mb":64,"workdir":"/","user":"root","env":{"PATH":"/usr/bin:/bin"}}}`), 0o644)
	os.Symlink(rootfs, filepath.Join(tdir, "rootfs"))
	reg, err := template.Open(filepath.Join(dir, "templates"), nil)
	if err != nil {
		b.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	ns, err := namespaces.New(namespaces.Config{CgroupParent: fmt.Sprintf("evalbox-bench-%d", os.Getpid()), Logger: log})
	if err != nil {
		b.Fatal(err)
	}
	n, err := node.New(node.Config{Runtimes: []runtime.Runtime{ns}, Templates: reg, AgentPath: agent,
		StateDir: filepath.Join(dir, "state"), Logger: log})
	if err != nil {
		b.Fatal(err)
	}
	var contract nodeapi.Node = node.NewLocal(n)
	if remote {
		srv, err := grpcnode.NewServer(contract, grpcnode.ServerConfig{Token: "bench-token", Logger: log})
		if err != nil {
			b.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		go srv.Serve(ln)
		b.Cleanup(srv.Stop)
		cc, err := grpcnode.Dial(ln.Addr().String(), grpcnode.ClientConfig{Token: "bench-token"})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cc.Close() })
		contract = grpcnode.NewClient(cc)
	}
	svc := New(Config{DefaultRuntime: client.RuntimeNamespaces}, &memStore{rows: map[string]client.Sandbox{}}, contract, regTemplates{reg}, log)
	b.Cleanup(func() {
		svc.Close(context.Background())
		n.Close(context.Background())
		ns.Close()
	})
	return svc
}

// transports are the benchmarks' sub-benchmarks.
var transports = []struct {
	name   string
	remote bool
}{{"inprocess", false}, {"grpc", true}}

func BenchmarkServiceExecTrue(b *testing.B) {
	for _, tr := range transports {
		b.Run(tr.name, func(b *testing.B) { benchExecTrue(b, benchService(b, tr.remote)) })
	}
}

func benchExecTrue(b *testing.B, svc *Service) {
	ctx := context.Background()
	sb, err := svc.Create(ctx, "team", client.CreateSandboxRequest{Template: "base"})
	if err != nil {
		b.Fatal(err)
	}
	req := client.ExecRequest{Argv: []string{"true"}}
	for b.Loop() {
		res, err := svc.Exec(ctx, "team", sb.ID, req, nil, nil)
		if err != nil || res.ExitCode != 0 {
			b.Fatal(res, err)
		}
	}
}

func BenchmarkServiceCreateExecDestroy(b *testing.B) {
	for _, tr := range transports {
		b.Run(tr.name, func(b *testing.B) { benchCreateExecDestroy(b, benchService(b, tr.remote)) })
	}
}

func benchCreateExecDestroy(b *testing.B, svc *Service) {
	ctx := context.Background()
	req := client.ExecRequest{Argv: []string{"true"}}
	for b.Loop() {
		sb, err := svc.Create(ctx, "team", client.CreateSandboxRequest{Template: "base"})
		if err != nil {
			b.Fatal(err)
		}
		res, err := svc.Exec(ctx, "team", sb.ID, req, nil, nil)
		if err != nil || res.ExitCode != 0 {
			b.Fatal(res, err)
		}
		if err := svc.Delete(ctx, "team", sb.ID); err != nil {
			b.Fatal(err)
		}
	}
}
