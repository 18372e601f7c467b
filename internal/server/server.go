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
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/evalbox/evalbox/internal/api"
	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/internal/catalog"
	"github.com/evalbox/evalbox/internal/evalrun"
	"github.com/evalbox/evalbox/internal/instance"
	"github.com/evalbox/evalbox/internal/node"
	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/internal/outbuf"
	"github.com/evalbox/evalbox/internal/quota"
	"github.com/evalbox/evalbox/internal/runtime"
	"github.com/evalbox/evalbox/internal/runtime/gvisor"
	"github.com/evalbox/evalbox/internal/runtime/namespaces"
	"github.com/evalbox/evalbox/internal/runtime/network"
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
	Listen   string
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
	Limits  client.Limits
	Service sandbox.Config
	// Catalog configures template builds and imports.
	Catalog catalog.Config
	// Build is the shape of template build sandboxes.
	Build node.BuildConfig
	// Capacity sizes the host budget every sandbox is admitted against
	// (zero values: derived from the host).
	Capacity node.CapacityConfig
	// OutputMemory bounds, in bytes, the command output the server holds
	// for buffered answers and eval runs at any one time (0: 1 GiB).
	OutputMemory int64
	// HTTP bounds the connections of the API's HTTP server.
	HTTP HTTPConfig
	// RegistryAllow, when set, lists the only registries imports pull from
	// (HOST or HOST:PORT; they may be on private or loopback addresses).
	// Empty: registries on public addresses only.
	RegistryAllow []string
	// RegistryHostCredentials makes registry imports use the host's
	// registry credentials, for every team (default: anonymous pulls).
	RegistryHostCredentials bool
	// Nodes is where sandboxes run: NodesLocal ("" too), one node in
	// process; NodesKubernetes, the node agents of Fleet, and none here
	// (runtimes, capacity, pools and build settings are the nodes').
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
		c.ReadHeaderTimeout = 10 * time.Second
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = 2 * time.Minute
	}
	if c.MaxHeaderBytes == 0 {
		c.MaxHeaderBytes = 64 << 10
	}
}

// DefaultOutputMemory is the default of Config.OutputMemory.
const DefaultOutputMemory = 1 << 30

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
	// The data dir holds the database, the admin key and every team's
	// templates and logs: the owner's alone, also when it existed before.
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("server: %w", err)
	}
	if err := os.Chmod(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("server: %w", err)
	}
	exeDir := ""
	if exe, err := os.Executable(); err == nil {
		exeDir = filepath.Dir(exe)
	}
	if cfg.Agent == "" {
		cfg.Agent = filepath.Join(exeDir, "evalbox-agent")
	}
	if cfg.Runsc == "" {
		cfg.Runsc = filepath.Join(exeDir, "runsc")
	}
	fleetMode := cfg.Nodes == NodesKubernetes
	switch cfg.Nodes {
	case "", NodesLocal, NodesKubernetes:
	default:
		return fmt.Errorf("server: --nodes %q: want %s or %s", cfg.Nodes, NodesLocal, NodesKubernetes)
	}
	if _, err := os.Stat(cfg.Agent); err != nil && !fleetMode {
		return fmt.Errorf("server: agent binary: %w (build cmd/evalbox-agent, or pass --agent)", err)
	}
	if cfg.TemplatesDir == "" {
		cfg.TemplatesDir = filepath.Join(cfg.DataDir, "templates")
	}
	if cfg.Limits.MaxSandboxes == 0 {
		cfg.Limits.MaxSandboxes = 20
	}
	if cfg.Limits.MaxConcurrentExec == 0 {
		cfg.Limits.MaxConcurrentExec = 64
	}
	if len(cfg.Runtimes) == 0 {
		cfg.Runtimes = []string{client.RuntimeGVisor, client.RuntimeNamespaces}
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

	templates, err := template.Open(cfg.TemplatesDir, log)
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	for _, name := range cfg.Builtins {
		if _, err := templates.EnsureBuiltin(ctx, name, cfg.Mirror, io.Discard); err != nil {
			return fmt.Errorf("server: %w", err)
		}
	}
	// Built and imported templates and the layer cache are this server's
	// state, next to its database (the built-ins' directory is a cache that
	// servers may share).
	if err := templates.UseStore(filepath.Join(cfg.DataDir, "images")); err != nil {
		return fmt.Errorf("server: %w", err)
	}

	// Host-wide names (cgroup parents, link aliases) carry the instance,
	// so that two servers on one host never sweep each other's sandboxes.
	inst := instance.ID(cfg.DataDir)
	var (
		n       *localNode
		nodes   nodeapi.Node    // what the services drive: the local node or the fleet
		runner  template.Runner // template build steps
		fp      *fleetPlane
		svcConf = cfg.Service
	)
	if fleetMode {
		if fp, err = startFleet(ctx, cfg.Fleet, lookupNode(st), log); err != nil {
			return err
		}
		defer fp.stop()
		nodes, runner = fp.router, noBuilds{}
		svcConf.NodeLive = fp.router.Live
	} else {
		if n, err = startLocalNode(ctx, cfg, inst, templates, log); err != nil {
			return err
		}
		defer func() {
			// Closing runtimes after the node destroyed every sandbox.
			for _, c := range n.Closers {
				if err := c.Close(); err != nil {
					log.Warn("closing runtime", "err", err)
				}
			}
		}()
		nodes, runner = node.NewLocal(n.Node), n.Node
		svcConf.NodeID = "embedded-" + inst
	}
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
	tmpls, err := catalog.New(cat, st, templates, runner, ociImporter{&oci.Importer{AllowRegistries: allow, HostCredentials: cfg.RegistryHostCredentials}}, log)
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	storage.AddSource(tmpls.StoredBytes)
	storage.AddSource(st.EvalInputBytes)
	// Stops builds (their sandboxes go with the node, closed before).
	defer tmpls.Close()
	// The control plane drives the node through the node contract only;
	// in process, without serialisation.
	svc := sandbox.New(svcConf, st, nodes, tmpls, log)
	if fp != nil {
		fp.OnNodeLost(func(id, reason string) {
			if err := svc.NodeLost(context.Background(), id, reason); err != nil {
				log.Error("draining a lost node", "node", id, "err", err)
			}
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
	evals := evalrun.New(st, svc, outputBudget, storage, log)
	defer evals.Close()
	if err := evals.Recover(ctx); err != nil {
		return fmt.Errorf("server: %w", err)
	}
	if n != nil {
		logCapacity(ctx, log, n.Node, svc)
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

	apiCfg := api.Config{Service: svc, Store: st, Auth: auth.NewAuthenticator(st),
		Templates: tmpls, Evals: evals, Storage: storage, Runtimes: runtimesOf(ctx, nodes), Pools: nodes, Capacity: nodes, DefaultLimits: cfg.Limits, OutputBudget: outputBudget, Logger: log}
	if fleetMode {
		apiCfg.RuntimesNow = func() []string { return runtimesOf(context.Background(), nodes) }
		apiCfg.NoTemplateBuilds = noBuildsOnFleet
	}
	handler := api.New(apiCfg)
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	cfg.HTTP.setDefaults()
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
	// running in them (long execs, attached streams).
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

// localNode is the embedded node and the runtimes to close after it.
type localNode struct {
	*node.Node
	Closers []interface{ Close() error }
}

// startLocalNode starts the embedded node: its runtimes, its network, and
// a sweep of what a previous process left.
func startLocalNode(ctx context.Context, cfg Config, inst string, templates *template.Registry, log *slog.Logger) (*localNode, error) {
	// One outbound network for all drivers: one address pool.
	netm, err := network.New(network.Config{Scope: inst, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	var runtimes []runtime.Runtime
	var closers []interface{ Close() error }
	fail := func(err error) (*localNode, error) {
		for _, c := range closers {
			_ = c.Close()
		}
		return nil, err
	}
	for _, name := range cfg.Runtimes {
		switch name {
		case client.RuntimeGVisor:
			gv, err := gvisor.New(gvisor.Config{Runsc: cfg.Runsc, RootDir: filepath.Join(cfg.DataDir, "runsc"),
				CgroupParent: instance.GVisorCgroupParent(inst), Network: netm, Logger: log})
			if err != nil {
				return fail(fmt.Errorf("server: %w", err))
			}
			runtimes = append(runtimes, gv)
			closers = append(closers, gv)
		case client.RuntimeNamespaces:
			ns, err := namespaces.New(namespaces.Config{CgroupParent: instance.NamespacesCgroupParent(inst), Network: netm, Logger: log})
			if err != nil {
				return fail(fmt.Errorf("server: %w", err))
			}
			runtimes = append(runtimes, ns)
			closers = append(closers, ns)
		default:
			return fail(fmt.Errorf("server: unknown runtime %q", name))
		}
	}

	capacity, err := node.NewCapacity(cfg.Capacity)
	if err != nil {
		return fail(fmt.Errorf("server: %w", err))
	}
	n, err := node.New(node.Config{Runtimes: runtimes, Templates: templates, AgentPath: cfg.Agent,
		StateDir: filepath.Join(cfg.DataDir, "sandboxes"), Build: cfg.Build, Capacity: capacity, Logger: log})
	if err != nil {
		return fail(fmt.Errorf("server: %w", err))
	}
	if removed, err := n.Sweep(ctx); err != nil {
		log.Warn("sweeping leftovers", "err", err)
	} else if len(removed) > 0 {
		log.Info("removed leftover sandboxes", "count", len(removed))
	}
	n.SweepEvery(time.Minute)
	return &localNode{Node: n, Closers: closers}, nil
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
