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
	"testing"

	"github.com/evalbox/evalbox/internal/node"
	"github.com/evalbox/evalbox/internal/runtime"
	"github.com/evalbox/evalbox/internal/runtime/namespaces"
	"github.com/evalbox/evalbox/internal/sandbox/sandboxtest"
	"github.com/evalbox/evalbox/internal/template"
	"github.com/evalbox/evalbox/pkg/client"
)

func TestMain(m *testing.M) {
	namespaces.Init()
	os.Exit(m.Run())
}

// row returns the stored row of id.

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
	svc := New(Config{DefaultRuntime: client.RuntimeNamespaces}, sandboxtest.NewMemStore(), node.NewLocal(n), regTemplates{reg}, log)
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
