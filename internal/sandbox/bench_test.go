package sandbox

// Benchmarks of the service on a real node (namespaces, the real agent)
// through the node contract in process. BENCHMARKS.md has their numbers
// next to those of the direct path before the contract (the same
// benchmarks on that commit) and of the contract over gRPC (grpcnode's
// BenchmarkService*: that test binary links gRPC, whose package
// initialisation every namespaces sandbox start pays, since the init stage
// re-executes the test binary; this one must not, to compare with the
// direct path). They need root, $EVALBOX_TEST_ROOTFS and the agent binary
// ($EVALBOX_BIN_DIR, default <repo>/bin).

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/node"
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
	// full makes TakeSlot answer that the team is at its limit (other
	// replicas hold its slots); slots counts the slots held.
	full  atomic.Bool
	slots atomic.Int64
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
func (m *memStore) SetExpiry(ctx context.Context, teamID, id string, t time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r, ok := m.rows[id]; ok && r.TeamID == teamID && r.State == client.StateRunning {
		r.ExpiresAt = t
		m.rows[id] = r
	}
	return nil
}
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
func (m *memStore) ListExpired(ctx context.Context, now time.Time) ([]client.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []client.Sandbox
	for _, r := range m.rows {
		if r.State == client.StateRunning && !r.ExpiresAt.After(now) {
			out = append(out, r)
		}
	}
	return out, nil
}
func (m *memStore) MarkExpired(ctx context.Context, id string, now time.Time) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.rows[id]
	if !ok || r.State != client.StateRunning || r.ExpiresAt.After(now) {
		return false, nil
	}
	r.State, r.EndReason = client.StateExpired, "timeout"
	m.rows[id] = r
	return true, nil
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
// contract in process.
func benchService(b *testing.B) *Service {
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
	svc := New(Config{DefaultRuntime: client.RuntimeNamespaces}, &memStore{rows: map[string]client.Sandbox{}}, node.NewLocal(n), regTemplates{reg}, log)
	b.Cleanup(func() {
		svc.Close(context.Background())
		n.Close(context.Background())
		ns.Close()
	})
	return svc
}

func BenchmarkServiceExecTrue(b *testing.B) {
	svc := benchService(b)
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
	svc := benchService(b)
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

func (m *memStore) TakeSlot(ctx context.Context, teamID, replica string, ttl time.Duration) (string, error) {
	if m.full.Load() {
		return "", fmt.Errorf("store: %w", &store.LimitError{Running: 1, Limit: 1})
	}
	m.slots.Add(1)
	return store.NewID("slot"), nil
}
func (m *memStore) ReleaseSlot(ctx context.Context, id string) error { m.slots.Add(-1); return nil }
func (m *memStore) RenewSlots(ctx context.Context, replica string, ttl time.Duration) error {
	return nil
}
func (m *memStore) InsertSandboxInSlot(ctx context.Context, sb client.Sandbox, slotID string) (client.Sandbox, error) {
	if slotID != "" {
		m.slots.Add(-1)
	}
	return m.InsertSandbox(ctx, sb)
}
func (m *memStore) ListRunningOnNode(ctx context.Context, nodeID string) ([]client.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []client.Sandbox
	for _, r := range m.rows {
		if (r.NodeID == nodeID || r.NodeID == "") && r.State == client.StateRunning {
			out = append(out, r)
		}
	}
	return out, nil
}
