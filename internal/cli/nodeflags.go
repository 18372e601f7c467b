package cli

import (
	"log/slog"
	"net/netip"

	"github.com/evalbox/evalbox/internal/runtime/network"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// NodeFlags are the flags of a host's node, which `evalbox serve` (its
// embedded node) and `evalbox node` (a node agent) share: each is defined
// here once, with one name, default and help text. To add one: a field
// here, its flag in register, its check in check, and its use in
// cmd/evalbox (both commands map it onto nodehost.Config).
type NodeFlags struct {
	// DataDir holds the node's state (sandboxes, the template store; for
	// serve also its database). Its absolute path names the instance
	// whose cgroup parents and network links the node makes and sweeps.
	DataDir string
	// RunscPath and AgentPath locate the runsc and guest agent binaries;
	// empty lets the node find them.
	RunscPath string
	AgentPath string
	// TemplatesDir holds the built-in templates; empty = under DataDir.
	TemplatesDir string
	// Runtimes lists the runtimes to enable (empty = all available).
	Runtimes []string
	// HostPids, HostReservePids, HostReserveMemoryMB and MemoryOvercommit
	// size the host budget every sandbox is admitted against (0: derived
	// from the host; see node.CapacityConfig).
	HostPids            int64
	HostReservePids     int64
	HostReserveMemoryMB int64
	MemoryOvercommit    float64
	// EgressDNS are the resolvers the egress resolver of rules sandboxes
	// asks (empty: the host's); AllowPrivate, ranges of the deny list
	// that sandboxes may reach all the same.
	EgressDNS    []netip.AddrPort
	AllowPrivate []netip.Prefix
	// LogLevel is the minimum level logged; Logger logs to stderr at it.
	LogLevel slog.Level
	Logger   *slog.Logger
}

// nodeFlagSet registers NodeFlags on a command and checks them.
type nodeFlagSet struct {
	cfg                     *NodeFlags
	logLevel                string
	egressDNS, allowPrivate []string
}

func (n *nodeFlagSet) register(f *pflag.FlagSet, defaultDataDir string) {
	c := n.cfg
	f.StringVar(&c.DataDir, "data-dir", defaultDataDir, "directory for the node's state (its absolute path names the node's cgroups and links on the host)")
	f.StringVar(&c.RunscPath, "runsc", "", "path of the runsc binary (default: next to evalbox)")
	f.StringVar(&c.AgentPath, "agent", "", "path of the guest agent binary (default: next to evalbox)")
	f.StringVar(&c.TemplatesDir, "templates-dir", "", "directory of the built-in templates (default: under --data-dir)")
	f.StringSliceVar(&c.Runtimes, "runtimes", nil, "runtimes to enable, e.g. gvisor,namespaces (default: all)")
	f.StringVar(&n.logLevel, "log-level", defaultLogLevelString, "debug, info, warn or error")
	// Host capacity: every sandbox (user, warm pool, build) reserves its
	// pids and memory limits from one host budget.
	f.Int64Var(&c.HostPids, "host-pids", 0, "host pids all sandboxes may reserve together (default: min(kernel.pid_max, kernel.threads-max) less --host-reserve-pids)")
	f.Int64Var(&c.HostReservePids, "host-reserve-pids", 0, "host pids kept out of the sandboxes' budget (default: max(4096, 1/8 of the host's))")
	f.Int64Var(&c.HostReserveMemoryMB, "host-reserve-memory-mb", 0,
		"host memory kept out of the sandboxes' budget, in MiB; no sandbox starts while MemAvailable is below it (default: max(2048, 10% of MemTotal))")
	f.Float64Var(&c.MemoryOvercommit, "memory-overcommit", DefaultMemoryOvercommit,
		"how many times the host's memory (less the reserve) the sandboxes' memory limits may add up to; raise it for many idle sandboxes")
	f.StringSliceVar(&n.egressDNS, "egress-dns", nil, "resolvers (IP or IP:port) that the DNS of network-rules sandboxes asks (default: the host's)")
	f.StringSliceVar(&n.allowPrivate, "allow-private", nil,
		"private or special CIDRs that sandboxes may reach all the same (outbound ones, and rules ones that allow them); never the host or other sandboxes")
}

// check validates the flags and makes the logger; a bad one is a usage
// error.
func (n *nodeFlagSet) check(cmd *cobra.Command) error {
	c := n.cfg
	if err := c.LogLevel.UnmarshalText([]byte(n.logLevel)); err != nil {
		return usagef(cmd, "--log-level %q: want debug, info, warn or error", n.logLevel)
	}
	if c.DataDir == "" {
		return usagef(cmd, "--data-dir must not be empty")
	}
	if c.HostPids < 0 || c.HostReservePids < 0 || c.HostReserveMemoryMB < 0 {
		return usagef(cmd, "--host-pids, --host-reserve-pids and --host-reserve-memory-mb must not be negative")
	}
	if c.HostPids > 0 && cmd.Flags().Changed("host-reserve-pids") {
		return usagef(cmd, "--host-pids sets the budget itself: give it or --host-reserve-pids, not both")
	}
	if c.MemoryOvercommit < 1 {
		return usagef(cmd, "--memory-overcommit must be at least 1")
	}
	for _, rt := range c.Runtimes {
		if rt != "gvisor" && rt != "namespaces" {
			return usagef(cmd, "--runtimes: unknown runtime %q (want gvisor, namespaces)", rt)
		}
	}
	c.EgressDNS, c.AllowPrivate = nil, nil
	for _, s := range n.egressDNS {
		ap, err := netip.ParseAddrPort(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return usagef(cmd, "--egress-dns %q: want an IP address or IP:port", s)
			}
			ap = netip.AddrPortFrom(a, 53)
		}
		c.EgressDNS = append(c.EgressDNS, ap)
	}
	for _, s := range n.allowPrivate {
		p, err := netip.ParsePrefix(s)
		if err != nil || p.Masked() != p {
			return usagef(cmd, "--allow-private %q: want a CIDR such as 10.1.0.0/16", s)
		}
		if err := network.CheckAllowPrivate(p); err != nil {
			return usagef(cmd, "--allow-private: %v", err)
		}
		c.AllowPrivate = append(c.AllowPrivate, p)
	}
	c.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: c.LogLevel}))
	return nil
}
