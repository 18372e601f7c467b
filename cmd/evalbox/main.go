// Command evalbox is the evalbox server (`evalbox serve`), the node agent
// (`evalbox node`), its command line client, and its benchmarks (`evalbox
// bench`).
package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"github.com/evalbox/evalbox/internal/api"
	"github.com/evalbox/evalbox/internal/bench"
	"github.com/evalbox/evalbox/internal/catalog"
	"github.com/evalbox/evalbox/internal/cli"
	"github.com/evalbox/evalbox/internal/meter"
	"github.com/evalbox/evalbox/internal/node"
	"github.com/evalbox/evalbox/internal/nodeagent"
	"github.com/evalbox/evalbox/internal/nodeapi/grpcnode"
	"github.com/evalbox/evalbox/internal/nodehost"
	"github.com/evalbox/evalbox/internal/runtime/namespaces"
	"github.com/evalbox/evalbox/internal/sandbox"
	"github.com/evalbox/evalbox/internal/server"
	"github.com/evalbox/evalbox/pkg/client"
	"strings"
	"time"
)

func main() {
	// A namespaces sandbox's init stage is this binary re-executed: it must
	// run before anything else (and never returns there).
	namespaces.Init()
	cli.ServeFunc = serve
	cli.NodeFunc = runNode
	cli.Execute(bench.Command())
}

// serve maps the CLI's serve flags onto the server.
func serve(ctx context.Context, c cli.ServeConfig) error {
	pools := make([]server.PoolSpec, 0, len(c.Pool))
	for _, p := range c.Pool {
		pools = append(pools, server.PoolSpec{Template: p.Template, Runtime: p.Runtime, Size: p.Size})
	}
	return server.Run(ctx, server.Config{
		DataDir: c.DataDir, Database: c.Database, SecretsKeys: c.SecretsKeys,
		Meter: meter.Config{Interval: c.MeterInterval, Rules: meter.Rules{Granularity: c.BillingGranularity, Minimum: cmp.Or(c.BillingMinimum, -1)},
			Billing: c.Billing, Grace: c.BillingGrace}, Listen: c.Listen, Runsc: c.RunscPath, Agent: c.AgentPath,
		TemplatesDir: c.TemplatesDir, Mirror: c.Mirror,
		Builtins: []string{"base", "python"}, Runtimes: c.Runtimes, Pools: pools,
		Limits: client.Limits{MaxSandboxes: c.MaxSandboxes, MaxConcurrentExec: c.MaxConcurrentExecs, MaxStorageMB: c.MaxStorageMB},
		RateLimits: api.RateLimits{RequestsPerMinute: c.RateLimitRequestsPerMinute, CreatesPerMinute: c.RateLimitCreatesPerMinute,
			KeyRequestsPerMinute: c.RateLimitKeyRequestsPerMinute},
		Service: sandbox.Config{DefaultTariff: c.DefaultTariff, DefaultTimeout: c.DefaultTimeout, MaxTimeout: c.MaxTimeout, MaxFileBytes: c.MaxFileBytes,
			ExecWait: execWait(c.ExecWait), Pids: c.Pids,
			CPUAbuse: sandbox.CPUAbuseConfig{Threshold: c.CPUAbuseThreshold, Window: c.CPUAbuseWindow, Interval: c.CPUAbuseInterval}},
		Capacity:  nodeCapacity(c.NodeFlags),
		EgressDNS: c.EgressDNS, AllowPrivate: c.AllowPrivate, SandboxDomain: c.SandboxDomain, PublicURL: c.PublicURL,
		SandboxFusionLoopbackTeam: c.SandboxFusionLoopbackTeam, Catalog: catalog.Config{MaxBuildsPerTeam: c.MaxBuilds, BuildTimeout: c.BuildTimeout, BuildNetwork: c.BuildNetwork},
		OutputMemory:  int64(c.OutputMemoryMB) << 20,
		HTTP:          server.HTTPConfig{ReadHeaderTimeout: c.ReadHeaderTimeout, IdleTimeout: c.IdleTimeout},
		RegistryAllow: c.RegistryAllow, RegistryHostCredentials: c.RegistryHostCredentials, NodeToken: c.NodeToken,
		ReplicaID: c.ReplicaID, EvalLease: c.EvalLease,
		Nodes: c.Nodes,
		Fleet: server.FleetConfig{Kubeconfig: c.Kubeconfig, Namespace: c.Namespace,
			NodeTLSCA: c.NodeTLSCA, NodeTLSCert: c.NodeTLSCert, NodeTLSKey: c.NodeTLSKey, NodeTLSServerName: c.NodeTLSServerName},
		NodeListen:    c.NodeListen,
		MetricsListen: c.MetricsListen, AuditRetention: c.AuditRetention,
		Logger: c.Logger,
	})
}

// nodeCapacity maps the node's capacity flags onto node.CapacityConfig.
func nodeCapacity(f cli.NodeFlags) node.CapacityConfig {
	return node.CapacityConfig{HostPids: f.HostPids, ReservePids: f.HostReservePids,
		ReserveMemoryMB: f.HostReserveMemoryMB, MemoryOvercommit: f.MemoryOvercommit}
}

// runNode maps the CLI's node flags onto a node agent.
func runNode(ctx context.Context, c cli.NodeConfig) error {
	var tlsConfig *tls.Config
	if c.TLSCert != "" {
		var err error
		if tlsConfig, err = grpcnode.ServerTLS(c.TLSCert, c.TLSKey, c.TLSClientCA); err != nil {
			return err
		}
	}
	// Over https, the node presents its certificate to the API as well.
	var cpTLS *tls.Config
	if strings.HasPrefix(c.ControlPlane, "https:") {
		var err error
		if cpTLS, err = grpcnode.ClientTLS(c.TLSCert, c.TLSKey, c.ControlPlaneCA); err != nil {
			return err
		}
	}
	return nodeagent.Run(ctx, nodeagent.Config{
		Host: nodehost.Config{DataDir: c.DataDir, Runsc: c.RunscPath, Agent: c.AgentPath, TemplatesDir: c.TemplatesDir,
			Runtimes: c.Runtimes, Capacity: nodeCapacity(c.NodeFlags), EgressDNS: c.EgressDNS, AllowPrivate: c.AllowPrivate},
		Listen: c.Listen, HealthListen: c.HealthListen, NodeID: c.NodeID, Advertise: c.Advertise,
		Token: c.Token, TLS: tlsConfig, Insecure: c.Insecure,
		Kubeconfig: c.Kubeconfig, Namespace: c.Namespace, LeaseDuration: c.LeaseDuration,
		ControlPlane: c.ControlPlane, ControlPlaneTLS: cpTLS, Logger: c.Logger,
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
