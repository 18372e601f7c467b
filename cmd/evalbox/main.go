// Command evalbox is the evalbox server (`evalbox serve`), its command line
// client, and its benchmarks (`evalbox bench`).
package main

import (
	"context"
	"github.com/evalbox/evalbox/internal/bench"
	"github.com/evalbox/evalbox/internal/catalog"
	"github.com/evalbox/evalbox/internal/cli"
	"github.com/evalbox/evalbox/internal/node"
	"github.com/evalbox/evalbox/internal/runtime/namespaces"
	"github.com/evalbox/evalbox/internal/sandbox"
	"github.com/evalbox/evalbox/internal/server"
	"github.com/evalbox/evalbox/pkg/client"
	"time"
)

func main() {
	// A namespaces sandbox's init stage is this binary re-executed: it must
	// run before anything else (and never returns there).
	namespaces.Init()
	cli.ServeFunc = serve
	cli.Execute(bench.Command())
}

// serve maps the CLI's serve flags onto the server.
func serve(ctx context.Context, c cli.ServeConfig) error {
	pools := make([]server.PoolSpec, 0, len(c.Pool))
	for _, p := range c.Pool {
		pools = append(pools, server.PoolSpec{Template: p.Template, Runtime: p.Runtime, Size: p.Size})
	}
	return server.Run(ctx, server.Config{
		DataDir: c.DataDir, Database: c.Database, Listen: c.Listen, Runsc: c.RunscPath, Agent: c.AgentPath,
		TemplatesDir: c.TemplatesDir, Mirror: c.Mirror,
		Builtins: []string{"base", "python"}, Runtimes: c.Runtimes, Pools: pools,
		Limits: client.Limits{MaxSandboxes: c.MaxSandboxes, MaxConcurrentExec: c.MaxConcurrentExecs, MaxStorageMB: c.MaxStorageMB},
		Service: sandbox.Config{DefaultTimeout: c.DefaultTimeout, MaxTimeout: c.MaxTimeout, MaxFileBytes: c.MaxFileBytes,
			ExecWait: execWait(c.ExecWait), Pids: c.Pids},
		Capacity: node.CapacityConfig{HostPids: c.HostPids, ReservePids: c.HostReservePids,
			ReserveMemoryMB: c.HostReserveMemoryMB, MemoryOvercommit: c.MemoryOvercommit},
		Catalog:       catalog.Config{MaxBuildsPerTeam: c.MaxBuilds, BuildTimeout: c.BuildTimeout, BuildNetwork: c.BuildNetwork},
		OutputMemory:  int64(c.OutputMemoryMB) << 20,
		HTTP:          server.HTTPConfig{ReadHeaderTimeout: c.ReadHeaderTimeout, IdleTimeout: c.IdleTimeout},
		RegistryAllow: c.RegistryAllow, RegistryHostCredentials: c.RegistryHostCredentials,
		Nodes: c.Nodes,
		Fleet: server.FleetConfig{Kubeconfig: c.Kubeconfig, Namespace: c.Namespace, NodeTokenFile: c.NodeTokenFile,
			NodeTLSCA: c.NodeTLSCA, NodeTLSCert: c.NodeTLSCert, NodeTLSKey: c.NodeTLSKey},
		Logger: c.Logger,
	})
}

// execWait maps --exec-wait onto sandbox.Config.ExecWait, where 0 means the
// default and a negative value means no queueing.
func execWait(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
