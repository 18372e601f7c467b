package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/evalbox/evalbox/internal/limits"
	"github.com/evalbox/evalbox/internal/meter"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/internal/template/oci"
)

// ServeConfig is what `evalbox serve` passes to ServeFunc.
type ServeConfig struct {
	// NodeFlags configure the embedded node (its data dir also holds the
	// server's database, admin key and build logs).
	NodeFlags
	// Database names the state database (a path, sqlite:PATH or
	// postgres://…, see store.Open); empty = evalbox.db in DataDir.
	Database string
	// SecretsKeys is the keyring of the teams' stored secrets; empty =
	// secrets.keys in DataDir.
	SecretsKeys string
	// MeterInterval is the meter's tick; BillingGranularity and
	// BillingMinimum how a sandbox's time is billed (0 minimum: none);
	// DefaultTariff prices the sandboxes created without a tariff.
	MeterInterval      time.Duration
	BillingGranularity time.Duration
	BillingMinimum     time.Duration
	DefaultTariff      string
	// Billing holds teams to their prepaid balance (402 at create, their
	// sandboxes stopped BillingGrace after it reaches zero).
	Billing      bool
	BillingGrace time.Duration
	// Listen is the API's TCP address (host:port).
	Listen string
	// DefaultTimeout and MaxTimeout bound a sandbox's TTL.
	DefaultTimeout time.Duration
	MaxTimeout     time.Duration
	// MaxSandboxes and MaxConcurrentExecs are the default limits of a team.
	MaxSandboxes       int
	MaxConcurrentExecs int
	// MaxFileBytes is the largest file upload (413 past it).
	MaxFileBytes int64
	// RateLimit* are the request rate limits, per minute and per replica:
	// of a team whose own is 0 (requests, creates), and of one key within
	// its team's (0 = none).
	RateLimitRequestsPerMinute    int
	RateLimitCreatesPerMinute     int
	RateLimitKeyRequestsPerMinute int
	// MaxStorageMB is a team's default storage limit (templates, uploads
	// being processed, eval inputs; 0 = none).
	MaxStorageMB int
	// Pool lists the warm pools to keep filled.
	Pool []PoolSpec
	// Mirror is the Debian mirror built-in templates are bootstrapped from
	// (empty = the host's apt sources).
	Mirror string
	// MaxBuilds is how many template builds of a team run at once (more
	// queue); BuildTimeout bounds one build; BuildNetwork is the most
	// network build steps get (outbound or none).
	MaxBuilds    int
	BuildTimeout time.Duration
	// ExecWait is how long a command queues for a slot when its team is at
	// its concurrent-exec limit, before 429 rate_limited.
	ExecWait     time.Duration
	BuildNetwork string
	// Pids is the task limit (processes and threads) of every sandbox: the
	// default shape the control plane asks nodes for.
	Pids int
	// OutputMemoryMB bounds the command output the server holds in memory
	// for buffered answers and eval runs, in MiB (past it: 429
	// output_budget_exhausted).
	OutputMemoryMB int
	// ReadHeaderTimeout and IdleTimeout bound the HTTP connections: the
	// time to send a request's headers, and a keep-alive connection's idle
	// time (hidden flags; tests shorten them).
	ReadHeaderTimeout time.Duration
	IdleTimeout       time.Duration
	// RegistryAllow, when set, lists the only registries template imports
	// pull from (HOST or HOST:PORT, which may be private or loopback).
	RegistryAllow []string
	// RegistryHostCredentials: imports use the host's registry
	// credentials (shared by every team).
	RegistryHostCredentials bool
	// NodeToken is the node token (from --node-token-file, trimmed): node
	// agents that send it may fetch templates, and a replica with
	// --nodes kubernetes sends it to them. Never printed or logged.
	NodeToken string `json:"-"`
	// ReplicaID names this API replica among those sharing a PostgreSQL
	// database (the leases of its eval runs, its creates' team slots);
	// empty: the host name and process id.
	ReplicaID string
	// EvalLease is how long an eval run's lease outlives its replica's
	// last renewal, i.e. how soon another replica takes over the runs of
	// one that died (hidden flag; tests shorten it).
	EvalLease time.Duration
	// Nodes is where sandboxes run: "local" (one node in this process)
	// or "kubernetes" (the node agents whose Leases are in Namespace,
	// reached over gRPC with NodeToken and, when given, TLS: NodeTLSCA
	// verifies them, NodeTLSCert/Key is this replica's client
	// certificate). Kubeconfig "" is in-cluster.
	Nodes                              string
	Kubeconfig, Namespace              string
	NodeTLSCA, NodeTLSCert, NodeTLSKey string
	// NodeTLSServerName is the name the nodes' certificates are checked
	// against (empty: each node's address).
	NodeTLSServerName string
	// NodeListen, when set, serves the node agents' template fetches
	// there, over TLS with NodeTLSCert/Key (mutual with NodeTLSCA),
	// instead of on Listen.
	NodeListen string
	// SandboxDomain serves the host form of port URLs:
	// {port}-{id}.{SandboxDomain} (wildcard DNS pointing at the server).
	SandboxDomain string
	// PublicURL is the server's URL as its clients reach it (behind a
	// TLS-terminating proxy): the URLs it hands out are built on it. ""
	// = the request's scheme and Host.
	PublicURL string
	// SandboxFusionLoopbackTeam, when set, is the team that SandboxFusion
	// requests (POST /run_code, /run_jupyter) from programs on this host
	// without an API key run as.
	SandboxFusionLoopbackTeam string
	// MetricsListen, when set, serves GET /metrics there without
	// authentication (a private address); the API's listener serves it
	// to admin keys.
	MetricsListen string
	// AuditRetention is how long audit rows are kept (0 = forever).
	AuditRetention time.Duration
	// The CPU-abuse rule (docs/abuse.md): a sandbox above CPUAbuseThreshold
	// of its CPU quota for longer than CPUAbuseWindow (0: no rule) is
	// stopped, or throttled if long-running; sampled every
	// CPUAbuseInterval.
	CPUAbuseThreshold float64
	CPUAbuseWindow    time.Duration
	CPUAbuseInterval  time.Duration
}

// PoolSpec is one warm pool: Size ready sandboxes of Template on Runtime
// (empty Runtime = the server's default).
type PoolSpec struct {
	Template string
	Runtime  string
	Size     int
}

// ServeFunc runs the server until ctx is cancelled, then shuts it down
// gracefully and returns. cmd/evalbox sets it (to a call of the server
// package's Run); while it is nil, `evalbox serve` fails.
var ServeFunc func(ctx context.Context, cfg ServeConfig) error

// Defaults of `evalbox serve`.
const (
	DefaultDataDir = "/var/lib/evalbox"
	DefaultListen  = "127.0.0.1:8700"
	// The limits' defaults are internal/limits' (docs/limits.md).
	DefaultTimeout        = limits.DefaultTimeout
	DefaultMaxTimeout     = limits.MaxTimeout
	DefaultMaxSandboxes   = limits.MaxSandboxes
	DefaultMaxExecs       = limits.MaxConcurrentExecs
	DefaultMaxFileBytes   = limits.MaxFileBytes
	DefaultMaxStorageMB   = limits.MaxStorageMB
	DefaultMaxBuilds      = limits.MaxBuilds
	DefaultBuildTimeout   = limits.BuildTimeout
	DefaultExecWait       = limits.ExecWait
	DefaultOutputMemoryMB = limits.OutputMemoryMB
	// DefaultPids is a sandbox's task limit (on a host whose pid_max is
	// 32768 about 28 namespaces or 22 gVisor sandboxes fit at once), and
	// DefaultMemoryOvercommit the memory budget's overcommit: equal to
	// sandbox.DefaultPids and node.DefaultMemoryOvercommit (a test in
	// cmd/evalbox holds them equal).
	DefaultPids             = limits.Pids
	DefaultMemoryOvercommit = limits.MemoryOvercommit
	DefaultReadHeader       = limits.HTTPReadHeader
	DefaultEvalLease        = 15 * time.Second
	DefaultAuditRetention   = 90 * 24 * time.Hour
	DefaultIdleTimeout      = limits.HTTPIdle
	defaultLogLevelString   = "info"
)

func newServeCmd() *cobra.Command {
	cfg := ServeConfig{}
	var (
		defTimeout    = seconds(DefaultTimeout)
		maxTimeout    = seconds(DefaultMaxTimeout)
		maxFileBytes  = byteSize(DefaultMaxFileBytes)
		buildTimeout  = seconds(DefaultBuildTimeout)
		execWait      = seconds(DefaultExecWait)
		readHeader    = seconds(DefaultReadHeader)
		idleTimeout   = seconds(DefaultIdleTimeout)
		evalLease     = seconds(DefaultEvalLease)
		auditKeep     = seconds(DefaultAuditRetention)
		meterInterval = seconds(meter.DefaultInterval)
		billingGran   = seconds(meter.DefaultGranularity)
		billingMin    = seconds(meter.DefaultMinimum)
		billingGrace  = seconds(meter.DefaultGrace)
		billing       string
		abuseWindow   = seconds(limits.CPUAbuseWindow)
		abuseInterval = seconds(limits.CPUAbuseInterval)
		pool          string
		nodeTokenFile string
		nodeFlags     = nodeFlagSet{cfg: &cfg.NodeFlags}
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the evalbox server (API, sandboxes, warm pools)",
		Long: `Run the evalbox server: the REST API on --listen, with its state in --data-dir.

--database keeps the state database elsewhere: a PostgreSQL database
(postgres://USER@HOST/DB?sslmode=…; give the password through PGPASSWORD or
~/.pgpass rather than in the URL, which other users of the host can read in
the process list), or an SQLite file (a path or sqlite:PATH). Default: the
SQLite file evalbox.db in --data-dir.

SIGINT or SIGTERM shuts it down gracefully; a second signal kills it.

--pool keeps warm sandboxes ready, as TEMPLATE[:RUNTIME]=SIZE pairs separated
by commas, e.g. "base:gvisor=4,python:namespaces=2".`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if cfg.Pool, err = parsePool(pool); err != nil {
				return usagef(cmd, "--pool: %v", err)
			}
			if err := nodeFlags.check(cmd); err != nil {
				return err
			}
			cfg.DefaultTimeout = time.Duration(defTimeout)
			cfg.MaxTimeout = time.Duration(maxTimeout)
			cfg.MaxFileBytes = int64(maxFileBytes)
			cfg.BuildTimeout = time.Duration(buildTimeout)
			cfg.ExecWait = time.Duration(execWait)
			cfg.ReadHeaderTimeout = time.Duration(readHeader)
			cfg.IdleTimeout = time.Duration(idleTimeout)
			cfg.EvalLease = time.Duration(evalLease)
			cfg.AuditRetention = time.Duration(auditKeep)
			cfg.CPUAbuseWindow, cfg.CPUAbuseInterval = time.Duration(abuseWindow), time.Duration(abuseInterval)
			if !(cfg.CPUAbuseThreshold > 0 && cfg.CPUAbuseThreshold <= 1) || cfg.CPUAbuseWindow < 0 || cfg.CPUAbuseInterval < 10*time.Millisecond {
				return usagef(cmd, "--cpu-abuse-threshold must be in (0, 1], --cpu-abuse-window at least 0 (0 = no CPU-abuse rule), --cpu-abuse-interval at least 10ms")
			}
			cfg.MeterInterval, cfg.BillingGranularity, cfg.BillingMinimum = time.Duration(meterInterval), time.Duration(billingGran), time.Duration(billingMin)
			cfg.BillingGrace = time.Duration(billingGrace)
			switch billing {
			case "on":
				cfg.Billing = true
			case "off", "":
			default:
				return usagef(cmd, "--billing must be on or off, got %q", billing)
			}
			if cfg.MeterInterval < 100*time.Millisecond || cfg.BillingGranularity < time.Millisecond || cfg.BillingMinimum < 0 {
				return usagef(cmd, "--meter-interval must be at least 100ms, --billing-granularity at least 1ms, --billing-minimum at least 0")
			}
			if cfg.MetricsListen != "" {
				if _, _, err := net.SplitHostPort(cfg.MetricsListen); err != nil {
					return usagef(cmd, "--metrics-listen %q: want HOST:PORT", cfg.MetricsListen)
				}
			}
			if cfg.EvalLease < time.Second {
				return usagef(cmd, "--eval-lease must be at least 1s")
			}
			if cfg.ReadHeaderTimeout <= 0 || cfg.IdleTimeout <= 0 {
				return usagef(cmd, "--http-read-header-timeout and --http-idle-timeout must be positive")
			}
			if cfg.OutputMemoryMB < 16 {
				return usagef(cmd, "--output-memory-mb must be at least 16")
			}
			if cfg.Pids < 64 {
				return usagef(cmd, "--pids must be at least 64")
			}
			if cfg.ExecWait < 0 {
				return usagef(cmd, "--exec-wait must not be negative")
			}
			if cfg.MaxBuilds <= 0 || cfg.BuildTimeout <= 0 {
				return usagef(cmd, "--max-builds and --build-timeout must be positive")
			}
			if _, err := oci.ParseAllowList(cfg.RegistryAllow); err != nil {
				return usagef(cmd, "--registry-allow: %v", strings.TrimPrefix(err.Error(), "oci: "))
			}
			if d := cfg.SandboxDomain; d != "" && len(validation.IsDNS1123Subdomain(strings.TrimSuffix(d, "."))) > 0 {
				return usagef(cmd, "--sandbox-domain %q: want a DNS name such as sandboxes.example.com", d)
			}
			if u := cfg.PublicURL; u != "" {
				pu, err := url.Parse(u)
				if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" || (pu.Path != "" && pu.Path != "/") || pu.RawQuery != "" {
					return usagef(cmd, "--public-url %q: want http(s)://HOST[:PORT], without a path", u)
				}
			}
			if cfg.BuildNetwork != "outbound" && cfg.BuildNetwork != "none" {
				return usagef(cmd, "--build-network %q: want outbound or none", cfg.BuildNetwork)
			}
			if cfg.DefaultTimeout <= 0 || cfg.MaxTimeout < cfg.DefaultTimeout {
				return usagef(cmd, "want 0 < --default-timeout (%v) <= --max-timeout (%v)", cfg.DefaultTimeout, cfg.MaxTimeout)
			}
			if cfg.MaxSandboxes <= 0 || cfg.MaxConcurrentExecs <= 0 || cfg.MaxFileBytes <= 0 {
				return usagef(cmd, "--max-sandboxes, --max-execs and --max-file-bytes must be positive")
			}
			if cfg.Database != "" {
				if err := store.CheckDSN(cfg.Database); err != nil {
					return usagef(cmd, "--database: %v", strings.TrimPrefix(err.Error(), "store: "))
				}
			}
			switch cfg.Nodes {
			case "local":
				local := []string{"kubeconfig", "namespace", "node-tls-server-name"}
				if cfg.NodeListen == "" { // else they are the node listener's
					local = append(local, "node-tls-ca", "node-tls-cert", "node-tls-key")
				}
				for _, name := range local {
					if cmd.Flags().Changed(name) {
						return usagef(cmd, "--%s is for --nodes kubernetes", name)
					}
				}
			case "kubernetes":
				if nodeTokenFile == "" {
					return usagef(cmd, "--nodes kubernetes needs --node-token-file (the node agents' shared token)")
				}
				if cfg.NodeTLSServerName != "" && cfg.NodeTLSCA == "" {
					return usagef(cmd, "--node-tls-server-name checks the nodes' certificates: it needs --node-tls-ca")
				}
			default:
				return usagef(cmd, "--nodes %q: want local or kubernetes", cfg.Nodes)
			}
			if (cfg.NodeTLSCert == "") != (cfg.NodeTLSKey == "") {
				return usagef(cmd, "--node-tls-cert and --node-tls-key go together")
			}
			if cfg.NodeListen != "" {
				if nodeTokenFile == "" {
					return usagef(cmd, "--node-listen serves the node agents: it needs --node-token-file")
				}
				if cfg.NodeTLSCert == "" {
					return usagef(cmd, "--node-listen serves TLS only: it needs --node-tls-cert and --node-tls-key")
				}
				if _, _, err := net.SplitHostPort(cfg.NodeListen); err != nil {
					return usagef(cmd, "--node-listen %q: want HOST:PORT", cfg.NodeListen)
				}
			}
			for name, v := range map[string]int{"rate-limit-requests-per-minute": cfg.RateLimitRequestsPerMinute,
				"rate-limit-creates-per-minute": cfg.RateLimitCreatesPerMinute, "rate-limit-key-requests-per-minute": cfg.RateLimitKeyRequestsPerMinute} {
				if v < 0 {
					return usagef(cmd, "--%s must not be negative (0 = no limit)", name)
				}
			}
			if cfg.MaxStorageMB < 0 || cfg.MaxStorageMB > 1<<30 {
				return usagef(cmd, "--max-storage-mb must be between 0 (no limit) and %d", 1<<30)
			}
			if nodeTokenFile != "" {
				b, err := os.ReadFile(nodeTokenFile)
				if err != nil {
					return usagef(cmd, "--node-token-file: %v", err)
				}
				if cfg.NodeToken = strings.TrimSpace(string(b)); cfg.NodeToken == "" {
					return usagef(cmd, "--node-token-file %s is empty", nodeTokenFile)
				}
			}
			if ServeFunc == nil {
				return errors.New("this evalbox binary was built without a server (cli.ServeFunc is not set)")
			}
			err = ServeFunc(cmd.Context(), cfg)
			if errors.Is(err, context.Canceled) && cmd.Context().Err() != nil {
				// Shut down by a signal, as asked.
				return nil
			}
			return err
		},
	}
	f := cmd.Flags()
	nodeFlags.register(f, DefaultDataDir)
	f.StringVar(&cfg.SecretsKeys, "secrets-keys", "", "keyring file that seals the teams' stored secrets, mode 0600, made at the first start; API replicas sharing a database need the same one (default: secrets.keys in --data-dir)")
	f.StringVar(&cfg.Database, "database", "", "state database: postgres://USER@HOST/DB (password from PGPASSWORD or ~/.pgpass), or an SQLite file (PATH or sqlite:PATH) (default: evalbox.db in --data-dir)")
	f.StringVar(&cfg.Listen, "listen", DefaultListen, "address of the API (host:port)")
	f.StringVar(&nodeTokenFile, "node-token-file", "", "file holding the node token (trimmed): node agents that send it fetch templates from GET /v1/internal/templates/{digest}, and --nodes kubernetes dials them with it (default: none, not served)")
	f.StringVar(&cfg.Nodes, "nodes", "local", "where sandboxes run: local (a node in this process) or kubernetes (the node agents of --namespace, over gRPC; no template builds)")
	f.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig of the cluster whose node Leases to watch (--nodes kubernetes; default: in-cluster)")
	f.StringVar(&cfg.Namespace, "namespace", "evalbox", "namespace of the node Leases (--nodes kubernetes)")
	f.StringVar(&cfg.NodeTLSCA, "node-tls-ca", "", "CA that verifies the node agents' certificates (--nodes kubernetes, and their client certificates at --node-listen; default: plaintext, loopback nodes only)")
	f.StringVar(&cfg.NodeTLSCert, "node-tls-cert", "", "this replica's certificate toward the node agents: its client certificate for their mutual TLS, and --node-listen's (with --node-tls-key)")
	f.StringVar(&cfg.NodeTLSKey, "node-tls-key", "", "the key of --node-tls-cert")
	f.StringVar(&cfg.NodeTLSServerName, "node-tls-server-name", "", "the name every node's certificate is checked against (default: each node's address; with --node-tls-ca)")
	f.StringVar(&cfg.SandboxFusionLoopbackTeam, "sandbox-fusion-loopback-team", "", "run SandboxFusion requests (POST /run_code, /run_jupyter) that programs on this host send as JSON without an API key as this team (verl posts to a bare URL; off by default: never behind a proxy on this host)")
	f.StringVar(&cfg.PublicURL, "public-url", "", "the server's URL as clients reach it, e.g. https://evalbox.example.com behind a TLS proxy (the URLs it hands out are built on it; default: each request's scheme and Host)")
	f.StringVar(&cfg.SandboxDomain, "sandbox-domain", "", "serve port URLs of the host form {port}-{id}.DOMAIN too (point wildcard DNS *.DOMAIN at this server)")
	f.StringVar(&cfg.NodeListen, "node-listen", "", "serve the node agents' template fetches on this address, over TLS with --node-tls-cert/--node-tls-key (mutual with --node-tls-ca), instead of on --listen")
	f.StringVar(&cfg.MetricsListen, "metrics-listen", "", "also serve GET /metrics on this address, without authentication: bind it to a private interface (default: only on --listen, to admin keys)")
	f.Var(&meterInterval, "meter-interval", "how often metered usage is saved: at most this much of it is lost if every server crashes (seconds or a duration)")
	f.Var(&billingGran, "billing-granularity", "a sandbox's metered time is rounded up to this (seconds or a duration)")
	f.Var(&billingMin, "billing-minimum", "a sandbox's running time is billed at least this (seconds or a duration; 0 = none)")
	f.StringVar(&billing, "billing", "off", "on: teams pay from a prepaid balance (402 insufficient_balance at create; their sandboxes stop with balance_exhausted at zero); off: usage and balances are only shown")
	f.Var(&billingGrace, "billing-grace", "how long a team's sandboxes run on, warned, after its balance reached zero (seconds or a duration)")
	f.StringVar(&cfg.DefaultTariff, "default-tariff", meter.DefaultTariff, "tariff that prices the sandboxes created without one (their shape stays the template's)")
	f.Var(&auditKeep, "audit-retention", "how long audit log rows are kept (seconds or a duration, e.g. 720h; 0 = forever)")
	f.Var(&defTimeout, "default-timeout", "sandbox TTL when a create request gives none (seconds or a duration)")
	f.Var(&maxTimeout, "max-timeout", "longest sandbox TTL (seconds or a duration)")
	f.IntVar(&cfg.MaxSandboxes, "max-sandboxes", DefaultMaxSandboxes, "a team's default limit of running sandboxes")
	f.IntVar(&cfg.MaxConcurrentExecs, "max-execs", DefaultMaxExecs, "a team's default limit of concurrent commands")
	f.Var(&maxFileBytes, "max-file-bytes", "largest file upload (bytes, or 512MiB, 2G)")
	f.IntVar(&cfg.RateLimitRequestsPerMinute, "rate-limit-requests-per-minute", limits.RequestsPerMinute,
		"a team's default request rate, per API replica: past it (and a burst of 10 s' worth) 429 rate_limited with Retry-After; admin keys are exempt (0 = no limit)")
	f.IntVar(&cfg.RateLimitCreatesPerMinute, "rate-limit-creates-per-minute", limits.CreatesPerMinute,
		"a team's default rate of creates (sandboxes, forks, resumes, eval runs), per API replica, apart from --max-sandboxes (0 = no limit)")
	f.IntVar(&cfg.RateLimitKeyRequestsPerMinute, "rate-limit-key-requests-per-minute", limits.KeyRequestsPerMinute,
		"one API key's request rate within its team's, per API replica (0 = only the team's)")
	f.IntVar(&cfg.MaxStorageMB, "max-storage-mb", DefaultMaxStorageMB, "a team's default storage limit in MiB: its templates, uploads being processed and eval inputs (0 = none)")
	f.StringVar(&pool, "pool", "", `warm pools, e.g. "base:gvisor=4,python:namespaces=2"`)
	f.StringVar(&cfg.Mirror, "mirror", os.Getenv("EVALBOX_DEBIAN_MIRROR"), "Debian mirror for the built-in templates (default: the host's apt sources; env EVALBOX_DEBIAN_MIRROR)")
	f.IntVar(&cfg.MaxBuilds, "max-builds", DefaultMaxBuilds, "template builds of a team that run at once (more queue)")
	f.Var(&buildTimeout, "build-timeout", "longest template build (seconds or a duration)")
	f.Var(&execWait, "exec-wait", "how long a command queues for a team's exec slot before 429 rate_limited (0 = answer at once)")
	f.StringVar(&cfg.BuildNetwork, "build-network", "outbound", "network of template build steps: outbound (specs may opt out) or none")
	f.BoolVar(&cfg.RegistryHostCredentials, "registry-host-credentials", false, "registry imports authenticate with the host's registry credentials (~/.docker/config.json), for every team alike (default: anonymous pulls)")
	f.StringSliceVar(&cfg.RegistryAllow, "registry-allow", nil, "the only registries image imports pull from, HOST[:PORT],... (they may be private or loopback; default: any registry on a public address)")
	f.IntVar(&cfg.OutputMemoryMB, "output-memory-mb", DefaultOutputMemoryMB,
		"memory for command output held for buffered (JSON) answers and eval runs, server-wide, in MiB; past it a request gets 429 output_budget_exhausted (streamed answers need none)")
	f.IntVar(&cfg.Pids, "pids", DefaultPids, "task limit (processes and threads) of every sandbox; each reserves it from the host's pids (gVisor: plus 256 for the Sentry)")
	f.StringVar(&cfg.ReplicaID, "replica-id", "", "name of this API replica among those sharing one PostgreSQL database (default: host name and process id)")
	f.Float64Var(&cfg.CPUAbuseThreshold, "cpu-abuse-threshold", limits.CPUAbuseThreshold,
		"the CPU-abuse rule's threshold: the share of its CPU quota a sandbox must use to count toward --cpu-abuse-window (docs/abuse.md)")
	f.Var(&abuseWindow, "cpu-abuse-window", "a sandbox above --cpu-abuse-threshold for longer than this is stopped (end reason cpu_abuse), or throttled to half its CPU if long_running; warned at 80 % of it (seconds or a duration; 0 = no CPU-abuse rule)")
	f.Var(&abuseInterval, "cpu-abuse-interval", "how often the CPU-abuse rule samples every sandbox's CPU use (seconds or a duration)")
	f.Var(&evalLease, "eval-lease", "how long an eval run's lease outlives its replica's last renewal (another replica then takes the run over)")
	_ = f.MarkHidden("eval-lease")
	// Hidden: the HTTP connection bounds, for tests.
	f.Var(&readHeader, "http-read-header-timeout", "time a client has to send a request's headers")
	f.Var(&idleTimeout, "http-idle-timeout", "time a keep-alive connection may stay idle")
	_ = f.MarkHidden("http-read-header-timeout")
	_ = f.MarkHidden("http-idle-timeout")
	return cmd
}

// parsePool parses "tmpl[:runtime]=size,…".
func parsePool(s string) ([]PoolSpec, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []PoolSpec
	seen := map[[2]string]bool{}
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		lhs, size, ok := strings.Cut(item, "=")
		if !ok {
			return nil, fmt.Errorf("%q: want TEMPLATE[:RUNTIME]=SIZE", item)
		}
		tmpl, rt, _ := strings.Cut(lhs, ":")
		n, err := strconv.Atoi(size)
		if tmpl == "" || err != nil || n < 0 {
			return nil, fmt.Errorf("%q: want TEMPLATE[:RUNTIME]=SIZE with SIZE >= 0", item)
		}
		key := [2]string{tmpl, rt}
		if seen[key] {
			return nil, fmt.Errorf("%q: pool given twice", lhs)
		}
		seen[key] = true
		out = append(out, PoolSpec{Template: tmpl, Runtime: rt, Size: n})
	}
	return out, nil
}
