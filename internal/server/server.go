// Package server assembles the embedded single-machine evalbox: its state
// database (SQLite in the data dir, or the PostgreSQL database of
// Config.Database), the node in-process with its runtimes and warm pools,
// the control-plane services and the REST API. `evalbox serve` runs it.
package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/evalbox/evalbox/internal/api"
	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/internal/catalog"
	"github.com/evalbox/evalbox/internal/evalrun"
	"github.com/evalbox/evalbox/internal/limits"
	"github.com/evalbox/evalbox/internal/meter"
	"github.com/evalbox/evalbox/internal/node"
	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/internal/nodeapi/grpcnode"
	"github.com/evalbox/evalbox/internal/nodehost"
	"github.com/evalbox/evalbox/internal/outbuf"
	"github.com/evalbox/evalbox/internal/quota"
	"github.com/evalbox/evalbox/internal/sandbox"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/internal/template"
	"github.com/evalbox/evalbox/internal/template/oci"
	"github.com/evalbox/evalbox/pkg/client"
)

// Config configures the server.
type Config struct {
	// DataDir holds the server's files: the admin key, templates, build
	// logs, sandbox state, and the SQLite database unless Database names
	// another.
	DataDir string
	// Database names the state database, as store.Open takes it (a path,
	// sqlite:PATH or postgres://…); empty: <DataDir>/evalbox.db. It is only
	// ever logged through store.Redact.
	Database string
	// SecretsKeys is the keyring that seals the teams' stored secrets
	// (internal/secrets); empty: <DataDir>/secrets.keys, made at the first
	// start. API replicas that share a database need the same one.
	SecretsKeys string
	// Meter is the metering's and the billing's configuration
	// (internal/meter).
	Meter  meter.Config
	Listen string
	// Runsc and Agent are the paths of the runsc and evalbox-agent
	// binaries (default: next to the running executable).
	Runsc string
	Agent string
	// TemplatesDir holds templates (default <data-dir>/templates).
	TemplatesDir string
	// Mirror is the Debian mirror built-in templates are bootstrapped from
	// (default: the host's apt sources).
	Mirror string
	// Builtins are built (if missing or stale) at start.
	Builtins []string
	// Runtimes to enable (default both; gvisor is skipped with a warning
	// when runsc is missing).
	Runtimes []string
	// Pools lists the warm pools to keep filled, with the template's
	// default shape.
	Pools []PoolSpec
	// Team defaults (for the admin team and teams created without limits).
	// Limits.MaxStorageMB is also the limit of teams whose own is 0; 0
	// here: none.
	Limits client.Limits
	// RateLimits are the server's request rate limits (per replica), of
	// the teams whose own are 0.
	RateLimits api.RateLimits
	Service    sandbox.Config
	// Catalog configures template builds and imports.
	Catalog catalog.Config
	// Build is the shape of template build sandboxes.
	Build node.BuildConfig
	// Capacity sizes the host budget every sandbox is admitted against
	// (zero values: derived from the host).
	Capacity node.CapacityConfig
	// EgressDNS and AllowPrivate configure the embedded node's outbound
	// network (nodehost.Config); SandboxDomain, the host form of port URLs
	// (api.Config).
	EgressDNS     []netip.AddrPort
	AllowPrivate  []netip.Prefix
	SandboxDomain string
	// PublicURL is the server's URL as clients reach it (api.Config).
	PublicURL string
	// SandboxFusionLoopbackTeam names the team of keyless SandboxFusion
	// requests from loopback ("" = none: they need the API key).
	SandboxFusionLoopbackTeam string
	// OutputMemory bounds, in bytes, the command output the server holds
	// for buffered answers and eval runs at any one time (0: 1 GiB).
	OutputMemory int64
	// HTTP bounds the connections of the API's HTTP server.
	HTTP HTTPConfig
	// MetricsListen, when set, also serves GET /metrics there, to anyone
	// who reaches it (the API's listener serves it to admin keys only):
	// bind it to a private address.
	MetricsListen string
	// AuditRetention is how long audit rows are kept (0: forever; serve's
	// default is DefaultAuditRetention).
	AuditRetention time.Duration
	// RegistryAllow, when set, lists the only registries imports pull from
	// (HOST or HOST:PORT; they may be on private or loopback addresses).
	// Empty: registries on public addresses only.
	RegistryAllow []string
	// RegistryHostCredentials makes registry imports use the host's
	// registry credentials, for every team (default: anonymous pulls).
	RegistryHostCredentials bool
	// NodeToken, when set, serves templates to node agents that send it
	// (GET /v1/internal/templates/{digest}). Never logged.
	NodeToken string
	// NodeListen, when set, is where node agents fetch templates instead
	// (the API's listener then does not serve them): over TLS, with
	// Fleet.NodeTLSCert and NodeTLSKey as its certificate, and client
	// certificates that chain to Fleet.NodeTLSCA required when that is
	// set (mutual TLS). The node token still authenticates each fetch.
	NodeListen string
	// ReplicaID names this API replica among those sharing a PostgreSQL
	// database: the leases of the eval runs it runs and the team slots
	// its creates hold (empty: the host name and process id).
	ReplicaID string
	// EvalLease is an eval run's lease (0: evalrun.DefaultLeaseTTL).
	EvalLease time.Duration
	// Nodes is where sandboxes run: NodesLocal ("" too), one node in
	// process; NodesKubernetes, the node agents of Fleet (dialled with
	// NodeToken), and none here (runtimes, capacity, pools and build
	// settings are the nodes').
	Nodes  string
	Fleet  FleetConfig
	Logger *slog.Logger
	// Ready, if set, is called with the bound address once the server
	// accepts requests.
	Ready func(addr string)
}

// HTTPConfig bounds the API's connections. No read or write timeout is set
// on purpose: an exec, a stream or an upload may last as long as it needs.
type HTTPConfig struct {
	// ReadHeaderTimeout is how long a client has to send a request's
	// headers (0: 10 s): a slow sender (slowloris) is cut off after it.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes keep-alive connections idle that long (0: 2 min).
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers (0: 64 KiB); past it the
	// answer is 431.
	MaxHeaderBytes int
}

func (c *HTTPConfig) setDefaults() {
	if c.ReadHeaderTimeout == 0 {
		c.ReadHeaderTimeout = limits.HTTPReadHeader
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = limits.HTTPIdle
	}
	if c.MaxHeaderBytes == 0 {
		c.MaxHeaderBytes = limits.HTTPMaxHeaderBytes
	}
}

// DefaultOutputMemory is the default of Config.OutputMemory.
const DefaultOutputMemory = limits.OutputMemoryMB << 20

// PoolSpec is one warm pool: Size ready sandboxes of Template on Runtime
// ("" = the default runtime).
type PoolSpec struct {
	Template string
	Runtime  string
	Size     int
}

// Run runs the server until ctx ends, then shuts it down gracefully:
// in-flight requests finish (up to 30 s), every sandbox is destroyed and
// recorded as ended.
func Run(ctx context.Context, cfg Config) error {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.DataDir == "" {
		return errors.New("server: data dir is required")
	}
	fleetMode := cfg.Nodes == NodesKubernetes
	hostname, _ := os.Hostname()
	switch cfg.Nodes {
	case "", NodesLocal, NodesKubernetes:
	default:
		return fmt.Errorf("server: nodes %q: want %s or %s", cfg.Nodes, NodesLocal, NodesKubernetes)
	}
	var (
		n         *node.Node // the embedded node (local mode)
		templates *template.Registry
		svcConf   = cfg.Service
	)
	if fleetMode {
		var err error
		if templates, err = openTemplates(ctx, cfg, log); err != nil {
			return err
		}
	} else {
		// The node first: it makes the data dir (the owner's alone), which
		// also holds the SQLite database, the admin key and build logs.
		host, err := nodehost.Open(ctx, nodehost.Config{DataDir: cfg.DataDir, Runsc: cfg.Runsc, Agent: cfg.Agent,
			TemplatesDir: cfg.TemplatesDir, Mirror: cfg.Mirror, Builtins: cfg.Builtins, Runtimes: cfg.Runtimes,
			Build: cfg.Build, Capacity: cfg.Capacity, EgressDNS: cfg.EgressDNS, AllowPrivate: cfg.AllowPrivate, Logger: log})
		if err != nil {
			return fmt.Errorf("server: %w", err)
		}
		// After the node destroyed every sandbox (below), or at once on an
		// error before: closing twice does nothing more.
		defer host.Close(context.Background())
		n, templates = host.Node, host.Templates
		// The embedded node is named by the host and the data dir
		// (stable across restarts: its rows are recovered by the server
		// that restarts on that dir, never by another replica).
		svcConf.NodeID = sandbox.LocalNodeID(hostname, host.Instance)
	}
	if cfg.Limits.MaxSandboxes == 0 {
		cfg.Limits.MaxSandboxes = limits.MaxSandboxes
	}
	if cfg.Limits.MaxConcurrentExec == 0 {
		cfg.Limits.MaxConcurrentExec = limits.MaxConcurrentExecs
	}

	dsn := cfg.Database
	if dsn == "" {
		dsn = filepath.Join(cfg.DataDir, "evalbox.db")
	}
	st, err := store.Open(ctx, dsn)
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	defer st.Close()
	log.Info("state database", "backend", st.Backend(), "database", store.Redact(dsn))
	created, err := auth.EnsureAdmin(ctx, st, cfg.DataDir, cfg.Limits)
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	if created {
		log.Info("created admin key", "file", filepath.Join(cfg.DataDir, "admin.key"))
	}
	vault, err := openVault(ctx, cfg, st, log)
	if err != nil {
		return err
	}
	svcConf.Secrets = vault
	svcConf.Tariffs = st
	// The meter stops a team's sandboxes through the service, made below.
	var svc *sandbox.Service
	mtr := meter.New(st, teamStopper(func(ctx context.Context, teamID, reason string) (int, error) {
		return svc.EndTeam(ctx, teamID, reason)
	}), cfg.Meter, log)
	svcConf.Billing = mtr

	cat := cfg.Catalog
	if cat.Mirror == "" {
		cat.Mirror = cfg.Mirror
	}
	if cat.MaxCPU == 0 {
		cat.MaxCPU, cat.MaxMemoryMB, cat.MaxDiskMB = cfg.Service.MaxCPU, cfg.Service.MaxMemoryMB, cfg.Service.MaxDiskMB
	}
	// What a team stores (templates, uploads being processed, eval inputs)
	// is bounded by its max_storage_mb, or the server's default.
	storage := quota.NewStorage(func(ctx context.Context, teamID string) (int64, error) {
		t, err := st.GetTeam(ctx, teamID)
		if err != nil {
			return 0, err
		}
		mb := t.Limits.MaxStorageMB
		if mb == 0 {
			mb = cfg.Limits.MaxStorageMB
		}
		return int64(mb) << 20, nil
	})
	cat.Storage = storage
	allow, err := oci.ParseAllowList(cfg.RegistryAllow)
	if err != nil {
		return fmt.Errorf("server: --registry-allow: %w", err)
	}
	// The control plane drives nodes through the node contract only: the
	// embedded one in process, without serialisation, or the fleet's.
	var (
		nodes  nodeapi.Node
		runner template.Runner = n
		fp     *fleetPlane
	)
	if fleetMode {
		if fp, err = startFleet(ctx, cfg.Fleet, cfg.NodeToken, lookupNode(st), log); err != nil {
			return err
		}
		defer fp.stop()
		nodes, runner = fp.router, noBuilds{}
		svcConf.NodeLive = fp.router.Live
		svcConf.ContentDigest = templates.ContentDigest
	} else {
		nodes = node.NewLocal(n)
		cat.Snapshots = n
	}
	tmpls, err := catalog.New(cat, st, templates, runner, ociImporter{&oci.Importer{AllowRegistries: allow, HostCredentials: cfg.RegistryHostCredentials}}, log)
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	storage.AddSource(tmpls.StoredBytes)
	storage.AddSource(st.EvalInputBytes)
	storage.AddSource(st.SnapshotBytes)
	svcConf.Storage = storage
	// Stops builds (their sandboxes go with the node, closed before).
	defer tmpls.Close()
	// Several API replicas may share a PostgreSQL database; an SQLite one
	// is this server's alone.
	exclusive := st.Backend() != "postgres"
	replica := cfg.ReplicaID
	if replica == "" {
		replica = fmt.Sprintf("%s-%d", hostname, os.Getpid())
	}
	log.Info("replica", "replica", replica, "node", svcConf.NodeID, "nodes", cmp.Or(cfg.Nodes, NodesLocal), "exclusive", exclusive)
	svcConf.Exclusive, svcConf.ReplicaID = exclusive, replica
	svc = sandbox.New(svcConf, st, nodes, tmpls, log)
	if fp != nil {
		fp.OnNodeLost(func(id, reason string) {
			// Off the Lease watcher's goroutine: a large node's drain
			// (a write per sandbox) must not hold other nodes' events.
			go func() {
				if err := svc.NodeLost(context.Background(), id, reason); err != nil {
					log.Error("draining a lost node", "node", id, "err", err)
				}
			}()
		})
	}
	if err := svc.Recover(ctx); err != nil {
		return fmt.Errorf("server: %w", err)
	}
	if err := tmpls.Recover(ctx); err != nil {
		return fmt.Errorf("server: %w", err)
	}
	if cfg.OutputMemory == 0 {
		cfg.OutputMemory = DefaultOutputMemory
	}
	outputBudget := outbuf.NewBudget(cfg.OutputMemory)
	evals := evalrun.New(st, svc, outputBudget, storage, evalrun.Leases{Owner: replica, TTL: cfg.EvalLease, Exclusive: exclusive}, log)
	evals.MeterWith(cfg.Meter.Rules)
	defer evals.Close()
	// Before the runs resume: they count their trials.
	reg, trialMetrics, err := registerMetrics(svc, tmpls, evals, mtr)
	if err != nil {
		return fmt.Errorf("server: metrics: %w", err)
	}
	if err := evals.Recover(ctx); err != nil {
		return fmt.Errorf("server: %w", err)
	}
	if n != nil {
		logCapacity(ctx, log, n, svc)
	}
	for _, p := range cfg.Pools {
		key, err := svc.DefaultKey(ctx, p.Template, p.Runtime)
		if err != nil {
			return fmt.Errorf("server: pool %s:%s: %w", p.Template, p.Runtime, err)
		}
		if err := nodes.SetPool(ctx, nodeapi.PoolSpec{Spec: key, TemplateName: p.Template, Target: p.Size}); err != nil {
			return fmt.Errorf("server: pool %s:%s: %w", p.Template, p.Runtime, err)
		}
	}

	// The meter ticks once Recover has closed the usage of the sandboxes
	// that died with the last server (where its last tick left them).
	meterCtx, stopMeter := context.WithCancel(ctx)
	metered := make(chan struct{})
	go func() {
		defer close(metered)
		mtr.Run(meterCtx)
	}()
	// Stopped before the store closes (defers run last in, first out).
	defer func() { stopMeter(); <-metered }()

	apiCfg := api.Config{Service: svc, Store: st, Secrets: vault, Metering: st, Meter: mtr, DefaultTariff: svcConf.DefaultTariff, Auth: auth.NewAuthenticator(st),
		Templates: tmpls, Evals: evals, Storage: storage, Runtimes: runtimesOf(ctx, nodes), Pools: nodes, Capacity: nodes, DefaultLimits: cfg.Limits, RateLimits: cfg.RateLimits, OutputBudget: outputBudget, Logger: log,
		SandboxDomain: cfg.SandboxDomain, E2BFilesDir: filepath.Join(cfg.DataDir, "e2b-uploads"),
		PublicURL: cfg.PublicURL}
	if name := cfg.SandboxFusionLoopbackTeam; name != "" {
		if apiCfg.SandboxFusionKeyless, err = keylessTeam(ctx, st, name); err != nil {
			return err
		}
	}
	if fleetMode {
		apiCfg.RuntimesNow = func() []string { return runtimesOf(context.Background(), nodes) }
		apiCfg.NoTemplateBuilds = noBuildsOnFleet
	}
	apiCfg.Metrics, apiCfg.TrialMetrics, apiCfg.Audit = reg, trialMetrics, st
	var handler http.Handler = api.New(apiCfg)
	cfg.HTTP.setDefaults()
	var nodeSrv *http.Server
	switch {
	case cfg.NodeToken != "" && cfg.NodeListen != "":
		if nodeSrv, err = serveNodes(cfg, templates, log); err != nil {
			return err
		}
		defer nodeSrv.Close()
	case cfg.NodeToken != "":
		handler = internalTemplates(handler, templates, cfg.NodeToken, log)
	case cfg.NodeListen != "":
		return errors.New("server: --node-listen needs the node token (--node-token-file)")
	}
	stopObservability, err := startObservability(cfg, reg, st, log)
	if err != nil {
		return err
	}
	defer stopObservability()
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: cfg.HTTP.ReadHeaderTimeout,
		IdleTimeout: cfg.HTTP.IdleTimeout, MaxHeaderBytes: cfg.HTTP.MaxHeaderBytes,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	// Eval event streams end when shutdown starts instead of holding it
	// for the whole grace period.
	srv.RegisterOnShutdown(evals.Drain)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("evalbox serving", "addr", ln.Addr().String(), "data_dir", cfg.DataDir, "nodes", cmp.Or(cfg.Nodes, NodesLocal), "runtimes", runtimesOf(ctx, nodes))
	if cfg.Ready != nil {
		cfg.Ready(ln.Addr().String())
	}

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	log.Info("shutting down")
	// Stop accepting requests and let those in flight finish for a grace
	// period; then end every sandbox, which also ends the requests still
	// running in them (long execs, attached streams). A fleet replica
	// leaves its sandboxes running on their nodes instead, and cuts the
	// requests still running (their callers may go on through another
	// replica: a background process is reattached there).
	shutCtx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	shutdown := make(chan error, 1)
	go func() { shutdown <- srv.Shutdown(shutCtx) }()
	select {
	case err := <-shutdown:
		shutdown <- err
	case <-time.After(shutdownGrace):
		log.Warn("requests still running after the grace period; ending their sandboxes")
	}
	// Eval runs stop (they resume at the next start) before the
	// sandboxes they use end.
	evals.Close()
	tmpls.Close()
	_ = svc.Close(shutCtx)
	if fleetMode {
		_ = srv.Close()
	}
	if err := <-shutdown; err != nil {
		_ = srv.Close()
	}
	if n != nil {
		if err := n.Close(shutCtx); err != nil {
			log.Error("closing node", "err", err)
		}
	}
	if errors.Is(serveErr, http.ErrServerClosed) {
		serveErr = nil
	}
	return serveErr
}

// runtimesOf lists the runtimes the nodes run (none when they cannot say).
func runtimesOf(ctx context.Context, n nodeapi.Node) []string {
	rts, _ := n.Runtimes(ctx)
	return rts
}

// logCapacity says how large the host budget is and how many sandboxes of
// the default shape fit in it, per runtime, and what to change when pids
// run out first.
func logCapacity(ctx context.Context, log *slog.Logger, n *node.Node, svc *sandbox.Service) {
	c := n.Capacity()
	b, h := c.Budget(), c.Host()
	log.Info("host capacity", "pids_budget", b.Pids, "kernel.pid_max", h.PidMax, "kernel.threads-max", h.ThreadsMax,
		"memory_budget_mb", b.MemoryBytes>>20, "mem_total_mb", h.MemTotal>>20, "memory_reserve_mb", c.Status().MemoryReserve>>20)
	hostPids := min(h.PidMax, h.ThreadsMax)
	if safe := hostPids - node.DefaultReservePids(hostPids); b.Pids > safe {
		log.Warn("the pids budget leaves the host less than its default reserve: fork bombs in every sandbox at once could starve it",
			"pids_budget", b.Pids, "default_budget", safe)
	}
	for _, rt := range n.Runtimes() {
		key, err := svc.DefaultKey(ctx, "base", rt)
		if err != nil {
			continue
		}
		cost, err := n.HostCost(key)
		if err != nil {
			continue
		}
		byPids, byMemory := b.Pids/cost.Pids, b.MemoryBytes/cost.MemoryBytes
		log.Info("default sandboxes that fit the host", "runtime", rt, "sandboxes", min(byPids, byMemory),
			"pids_each", cost.Pids, "memory_mb_each", cost.MemoryBytes>>20, "fit_by_pids", byPids, "fit_by_memory", byMemory)
		if byPids < byMemory && hostPids < 4194304 {
			log.Warn("host pids limit the sandboxes this server runs: raise kernel.pid_max (systemd hosts default to 4194304) or lower --pids for more",
				"runtime", rt, "kernel.pid_max", h.PidMax, "fit_by_pids", byPids, "fit_by_memory", byMemory)
		}
	}
}

// shutdownGrace is how long in-flight requests may run on after a
// shutdown begins, before their sandboxes are ended under them.
const shutdownGrace = 10 * time.Second

// ociImporter imports images with internal/template/oci.
type ociImporter struct{ im *oci.Importer }

func (o ociImporter) Import(ctx context.Context, src, ref, dst string, charge func(int64) error) (template.ImageConfig, string, error) {
	c, d, err := o.im.Import(ctx, src, ref, dst, charge)
	return template.ImageConfig(c), d, err
}

func (o ociImporter) ImportRemote(ctx context.Context, ref, dst string, charge func(int64) error) (template.ImageConfig, string, error) {
	c, d, err := o.im.ImportRemote(ctx, ref, dst, charge)
	return template.ImageConfig(c), d, err
}

func (o ociImporter) CheckRemote(ref string) error { return o.im.CheckRemote(ref) }

// serveNodes serves the node agents' template fetches on cfg.NodeListen,
// over TLS (mutual when Fleet.NodeTLSCA is set), until closed.
func serveNodes(cfg Config, templates *template.Registry, log *slog.Logger) (*http.Server, error) {
	f := cfg.Fleet
	if f.NodeTLSCert == "" || f.NodeTLSKey == "" {
		return nil, errors.New("server: --node-listen serves TLS only: it needs --node-tls-cert and --node-tls-key")
	}
	tlsCfg, err := grpcnode.ServerTLS(f.NodeTLSCert, f.NodeTLSKey, f.NodeTLSCA)
	if err != nil {
		return nil, fmt.Errorf("server: --node-listen: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.NodeListen)
	if err != nil {
		return nil, fmt.Errorf("server: --node-listen: %w", err)
	}
	srv := &http.Server{Handler: internalTemplates(http.NotFoundHandler(), templates, cfg.NodeToken, log),
		TLSConfig: tlsCfg, ReadHeaderTimeout: cfg.HTTP.ReadHeaderTimeout, IdleTimeout: cfg.HTTP.IdleTimeout,
		MaxHeaderBytes: cfg.HTTP.MaxHeaderBytes, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	go func() {
		if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("node listener", "err", err)
		}
	}()
	log.Info("serving templates to node agents", "addr", ln.Addr().String(), "mutual_tls", f.NodeTLSCA != "")
	return srv, nil
}

// keylessTeam is the principal of keyless SandboxFusion requests: the team
// name, which must exist now, read again at each request (its limits may
// change; once it is deleted, such requests are refused).
func keylessTeam(ctx context.Context, st *store.Store, name string) (func(context.Context) (auth.Principal, error), error) {
	t, err := st.GetTeamByName(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("server: --sandbox-fusion-loopback-team: no team named %q", name)
	}
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	id := t.ID
	return func(ctx context.Context) (auth.Principal, error) {
		t, err := st.GetTeam(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			return auth.Principal{}, fmt.Errorf("%w: the keyless team %s is gone", auth.ErrUnauthorized, name)
		}
		if err != nil {
			return auth.Principal{}, err
		}
		return auth.Principal{TeamID: t.ID, TeamName: t.Name, Limits: t.Limits}, nil
	}, nil
}
