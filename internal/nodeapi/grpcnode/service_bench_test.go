package grpcnode

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/node"
	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/internal/sandbox"
	"github.com/evalbox/evalbox/internal/sandbox/sandboxtest"
	"github.com/evalbox/evalbox/internal/template"
	"github.com/evalbox/evalbox/pkg/client"
)

// The control plane's service on a real node, through the contract in
// process and over gRPC on loopback, side by side in one test binary (both
// pay this binary's start-up in every namespaces sandbox start, whose init
// stage re-executes it: compare them with each other, and
// internal/sandbox's benchmarks with the direct path before the contract).

func BenchmarkServiceExecTrue(b *testing.B) {
	for name, svc := range benchServices(b) {
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			sb, err := svc.Create(ctx, "team", client.CreateSandboxRequest{Template: "base", Runtime: "namespaces"})
			if err != nil {
				b.Fatal(err)
			}
			req := client.ExecRequest{Argv: []string{"true"}}
			for b.Loop() {
				if res, err := svc.Exec(ctx, "team", sb.ID, req, nil, nil); err != nil || res.ExitCode != 0 {
					b.Fatal(res, err)
				}
			}
			svc.Delete(ctx, "team", sb.ID)
		})
	}
}

func BenchmarkServiceCreateExecDestroy(b *testing.B) {
	for name, svc := range benchServices(b) {
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			req := client.ExecRequest{Argv: []string{"true"}}
			for b.Loop() {
				sb, err := svc.Create(ctx, "team", client.CreateSandboxRequest{Template: "base", Runtime: "namespaces"})
				if err != nil {
					b.Fatal(err)
				}
				if res, err := svc.Exec(ctx, "team", sb.ID, req, nil, nil); err != nil || res.ExitCode != 0 {
					b.Fatal(res, err)
				}
				if err := svc.Delete(ctx, "team", sb.ID); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchServices returns a service per implementation of the contract, on
// one real node.
func benchServices(b *testing.B) map[string]*sandbox.Service {
	n := newRealNode(b, node.CapacityConfig{}, false)
	local := node.NewLocal(n)
	out := map[string]*sandbox.Service{}
	for name, impl := range map[string]nodeapi.Node{"inprocess": local, "grpc": dial(b, serve(b, local, ServerConfig{}), ClientConfig{})} {
		svc := sandbox.New(sandbox.Config{DefaultRuntime: "namespaces", ReapInterval: time.Hour}, sandboxtest.NewMemStore(),
			impl, benchTemplates{n}, slog.New(slog.DiscardHandler))
		b.Cleanup(func() { svc.Close(context.Background()) })
		out[name] = svc
	}
	return out
}

// benchTemplates resolves "base" to the test template (newRealNode).
type benchTemplates struct{ n *node.Node }

func (benchTemplates) Acquire(ctx context.Context, teamID, name string) (*template.Template, func(), error) {
	return &template.Template{Name: "base", Digest: testDigest, Source: template.SourceBuiltin,
		Defaults: template.Defaults{CPU: 1, MemoryMB: 512, DiskMB: 256}}, func() {}, nil
}

// The team's slots: this benchmark's team is never full.
