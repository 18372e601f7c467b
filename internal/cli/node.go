package cli

import (
	"context"
	"errors"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation"
)

// NodeConfig is what `evalbox node` passes to NodeFunc.
type NodeConfig struct {
	// NodeFlags configure the node itself, as serve's embedded one.
	NodeFlags
	// Listen is the gRPC address of the node contract; HealthListen the
	// HTTP address of /healthz and /readyz.
	Listen       string
	HealthListen string
	// NodeID names the node's Lease (unique in the cluster).
	NodeID string
	// Advertise is the address control planes dial ("": derived from
	// Listen).
	Advertise string
	// Token is the node token, read from --token-file and trimmed. Never
	// printed or logged.
	Token string `json:"-"`
	// TLSCert, TLSKey and TLSClientCA are PEM files: the server's
	// certificate and key, and the CA client certificates must chain to
	// (mutual TLS). Empty: plaintext.
	TLSCert, TLSKey, TLSClientCA string
	// Insecure serves plaintext to peers that are not on loopback.
	Insecure bool
	// Kubeconfig is a kubeconfig file ("": in-cluster); Namespace holds
	// the Leases; LeaseDuration is how long a renewal counts.
	Kubeconfig    string
	Namespace     string
	LeaseDuration time.Duration
	// ControlPlane is the API's URL templates are fetched from;
	// ControlPlaneCA verifies its certificate when it is https ("": the
	// system's CAs). Over https the node presents TLSCert as its client
	// certificate, for an API that asks for one (serve --node-listen
	// with --node-tls-ca).
	ControlPlane, ControlPlaneCA string
}

// NodeFunc runs a node agent until ctx is cancelled, then shuts it down and
// returns. cmd/evalbox sets it; while it is nil, `evalbox node` fails.
var NodeFunc func(ctx context.Context, cfg NodeConfig) error

// Defaults of `evalbox node`.
const (
	DefaultNodeDataDir      = "/var/lib/evalbox-node"
	DefaultNodeListen       = ":7070"
	DefaultNodeHealthListen = ":7071"
	DefaultNamespace        = "evalbox"
	DefaultLeaseDuration    = 15 * time.Second
)

func newNodeCmd() *cobra.Command {
	cfg := NodeConfig{}
	var (
		tokenFile     string
		leaseDuration = seconds(DefaultLeaseDuration)
		nodeFlags     = nodeFlagSet{cfg: &cfg.NodeFlags}
	)
	hostname, _ := os.Hostname()
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Run a node agent: sandboxes on this host, for the control plane",
		Long: `Run a node agent: this host's sandboxes, served over gRPC on --listen to the
control plane (evalbox serve --nodes kubernetes), which finds the node through
the Lease it renews in --namespace with its address and capacity.

Every call must carry the node token (--token-file); the contract is served
over TLS with --tls-cert/--tls-key (mutual with --tls-client-ca), or in
plaintext to loopback peers only unless --insecure. Templates the node lacks
are fetched from --control-plane by digest. /healthz and /readyz are served
on --health-listen.

At start the node sweeps what a previous run of its --data-dir left. SIGINT
or SIGTERM: not ready, no new calls, every sandbox destroyed, the Lease
deleted, exit 0.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := nodeFlags.check(cmd); err != nil {
				return err
			}
			for _, l := range []struct{ flag, addr string }{{"--listen", cfg.Listen}, {"--health-listen", cfg.HealthListen}} {
				if _, _, err := net.SplitHostPort(l.addr); err != nil {
					return usagef(cmd, "%s %q: want HOST:PORT or :PORT", l.flag, l.addr)
				}
			}
			if cfg.Advertise != "" {
				if h, p, err := net.SplitHostPort(cfg.Advertise); err != nil || h == "" || p == "" {
					return usagef(cmd, "--advertise %q: want HOST:PORT", cfg.Advertise)
				}
			}
			cfg.NodeID = strings.ToLower(cfg.NodeID)
			if msgs := validation.IsDNS1123Subdomain(cfg.NodeID); len(msgs) > 0 {
				return usagef(cmd, "--node-id %q: want a DNS-1123 subdomain (lower case letters, digits, '-' and '.'), unique in the cluster", cfg.NodeID)
			}
			if tokenFile == "" {
				return usagef(cmd, "--token-file is required (the node token every call must carry)")
			}
			b, err := os.ReadFile(tokenFile)
			if err != nil {
				return usagef(cmd, "--token-file: %v", err)
			}
			if cfg.Token = strings.TrimSpace(string(b)); cfg.Token == "" {
				return usagef(cmd, "--token-file %s is empty", tokenFile)
			}
			if (cfg.TLSCert == "") != (cfg.TLSKey == "") {
				return usagef(cmd, "--tls-cert and --tls-key go together")
			}
			if cfg.TLSClientCA != "" && cfg.TLSCert == "" {
				return usagef(cmd, "--tls-client-ca needs --tls-cert and --tls-key")
			}
			if cfg.Insecure && cfg.TLSCert != "" {
				return usagef(cmd, "--insecure serves plaintext: give it or --tls-cert, not both")
			}
			cfg.LeaseDuration = time.Duration(leaseDuration)
			if cfg.LeaseDuration < time.Second || cfg.LeaseDuration%time.Second != 0 {
				return usagef(cmd, "--lease-duration %v: want a whole number of seconds, at least 1", cfg.LeaseDuration)
			}
			if cfg.Namespace == "" || len(validation.IsDNS1123Label(cfg.Namespace)) > 0 {
				return usagef(cmd, "--namespace %q: want a DNS-1123 label", cfg.Namespace)
			}
			if cfg.ControlPlane != "" {
				u, err := url.Parse(cfg.ControlPlane)
				if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
					return usagef(cmd, "--control-plane %q: want http(s)://HOST[:PORT]", cfg.ControlPlane)
				}
				// Template fetches send the node token, which also drives
				// every sandbox of the node: never in the clear over a
				// network, unless the operator says it is trusted.
				if u.Scheme == "http" && !cfg.Insecure && !loopbackHost(u.Hostname()) {
					return usagef(cmd, "--control-plane %q: plain http sends the node token in the clear; use https, or --insecure on a network you trust", cfg.ControlPlane)
				}
				if u.Scheme == "http" && cfg.ControlPlaneCA != "" {
					return usagef(cmd, "--control-plane-ca verifies an https --control-plane, not %q", cfg.ControlPlane)
				}
			} else if cfg.ControlPlaneCA != "" {
				return usagef(cmd, "--control-plane-ca needs --control-plane")
			}
			if NodeFunc == nil {
				return errors.New("this evalbox binary was built without a node agent (cli.NodeFunc is not set)")
			}
			err = NodeFunc(cmd.Context(), cfg)
			if errors.Is(err, context.Canceled) && cmd.Context().Err() != nil {
				return nil
			}
			return err
		},
	}
	f := cmd.Flags()
	nodeFlags.register(f, DefaultNodeDataDir)
	f.StringVar(&cfg.Listen, "listen", DefaultNodeListen, "gRPC address of the node contract (host:port)")
	f.StringVar(&cfg.HealthListen, "health-listen", DefaultNodeHealthListen, "HTTP address of /healthz and /readyz (host:port)")
	f.StringVar(&cfg.NodeID, "node-id", hostname, "the node's id, its Lease's name: unique in the cluster (default: the host name)")
	f.StringVar(&cfg.Advertise, "advertise", "", "address control planes dial (default: --listen, with $POD_IP or the host's address when it listens on every address)")
	f.StringVar(&tokenFile, "token-file", "", "file holding the node token (required; surrounding white space is trimmed)")
	f.StringVar(&cfg.TLSCert, "tls-cert", "", "PEM certificate of the node's TLS listener")
	f.StringVar(&cfg.TLSKey, "tls-key", "", "PEM key of --tls-cert")
	f.StringVar(&cfg.TLSClientCA, "tls-client-ca", "", "PEM CA that client certificates must chain to (mutual TLS)")
	f.BoolVar(&cfg.Insecure, "insecure", false, "serve plaintext to peers not on loopback too (a network you trust)")
	f.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig file of the cluster holding the Leases (default: in-cluster)")
	f.StringVar(&cfg.Namespace, "namespace", DefaultNamespace, "namespace of the node Leases")
	f.Var(&leaseDuration, "lease-duration", "how long a Lease renewal counts (whole seconds, or a duration)")
	f.StringVar(&cfg.ControlPlane, "control-plane", "", "the API's URL, which templates the node lacks are fetched from (default: none, never fetch)")
	f.StringVar(&cfg.ControlPlaneCA, "control-plane-ca", "", "PEM CA that verifies an https --control-plane (default: the system's); --tls-cert is the node's client certificate there")
	return cmd
}

// loopbackHost reports whether host (a name or an address) is this host's
// loopback.
func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
