// Package nodeagent assembles `evalbox node`, a node agent: one host's node
// (internal/nodehost: opened and swept of what a previous run left) served
// over gRPC (grpcnode, token and TLS), a Lease renewed with the node's
// capacity and address (membership.Heartbeat), templates fetched by digest
// from the control plane into the node's store (fetch.go), and an HTTP
// health endpoint for the kubelet. docs/design/fleet.md is the design.
package nodeagent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"reflect"
	goruntime "runtime"
	"strconv"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/evalbox/evalbox/internal/fleet/membership"
	"github.com/evalbox/evalbox/internal/node"
	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/internal/nodeapi/grpcnode"
	"github.com/evalbox/evalbox/internal/nodehost"
)

// Config configures a node agent.
type Config struct {
	// Host is the node itself (data dir, templates, runtimes, capacity).
	Host nodehost.Config
	// Listen is the gRPC address of the node contract (host:port);
	// HealthListen the HTTP address of /healthz and /readyz.
	Listen       string
	HealthListen string
	// NodeID names the node's Lease: unique in the cluster, a DNS-1123
	// subdomain (CheckNodeID).
	NodeID string
	// Advertise is the address control planes dial (host:port). Empty:
	// the listen address, its host replaced by $POD_IP or the host's
	// first non-loopback address when it listens on every address.
	Advertise string
	// Token is the shared node token: every gRPC call must carry it, and
	// template fetches from the control plane send it. Never logged.
	Token string
	// TLS, when set, serves the contract over TLS (mutual with ClientCAs).
	TLS *tls.Config
	// Insecure serves plaintext to peers not on loopback too.
	Insecure bool
	// Kubeconfig is a kubeconfig file; empty: the in-cluster config.
	Kubeconfig string
	// Namespace holds the node Leases.
	Namespace string
	// LeaseDuration is how long a renewal counts (0: 15 s).
	LeaseDuration time.Duration
	// ControlPlane is the API's base URL, which templates the node lacks
	// are fetched from (GET /v1/internal/templates/{digest}). Empty: the
	// node never fetches (a create of a template it lacks fails with
	// template_missing).
	ControlPlane string
	// ControlPlaneTLS is the TLS configuration of fetches from an https
	// ControlPlane (nil: the system's CAs, no client certificate).
	ControlPlaneTLS *tls.Config
	// MaxTemplateBytes bounds a fetched template's stream (0:
	// template.DefaultMaxFetchBytes).
	MaxTemplateBytes int64
	Logger           *slog.Logger
	// Ready, if set, is called once the node is ready, with the bound
	// gRPC and health addresses.
	Ready func(grpcAddr, healthAddr string)
}

// CheckNodeID says why id cannot name a node's Lease, or nil.
func CheckNodeID(id string) error {
	if msgs := validation.IsDNS1123Subdomain(id); len(msgs) > 0 {
		return fmt.Errorf("node id %q is not a DNS-1123 subdomain (lower case letters, digits, '-' and '.')", id)
	}
	return nil
}

// ErrTakenOver is Run's error when another process took the node's Lease:
// one that runs with the same node id.
var ErrTakenOver = membership.ErrTakenOver

// shutdownGrace is how long calls in flight may run on once a shutdown
// began, after the node destroyed its sandboxes (which ends most of them).
const shutdownGrace = 10 * time.Second

// Run runs the node agent until ctx ends, then shuts it down: not ready,
// no new calls, every sandbox destroyed, the Lease deleted. It returns nil
// then, or the error that stopped it (ErrTakenOver wrapped, when another
// process took the node's Lease).
func Run(ctx context.Context, cfg Config) error {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	cfg.Host.Logger = log
	if err := CheckNodeID(cfg.NodeID); err != nil {
		return fmt.Errorf("nodeagent: %w", err)
	}
	if cfg.Token == "" {
		return errors.New("nodeagent: a node token is required")
	}
	leases, err := leaseClient(cfg.Kubeconfig, cfg.Namespace)
	if err != nil {
		return err
	}
	start := time.Now()

	// 1. The node: own data dir, instance, cgroup parents; swept.
	host, err := nodehost.Open(ctx, cfg.Host)
	if err != nil {
		return fmt.Errorf("nodeagent: %w", err)
	}
	defer host.Close(context.Background())
	local := node.NewLocal(host.Node)

	a := &agent{host: host, local: local, log: log, poke: make(chan struct{}, 1)}
	life, endLife := context.WithCancel(context.WithoutCancel(ctx))
	defer endLife()
	if cfg.ControlPlane != "" {
		a.fetch = newFetcher(life, cfg.ControlPlane, cfg.Token, cfg.ControlPlaneTLS, host.Templates, cfg.MaxTemplateBytes, log, a.templatesChanged)
	}
	if err := a.templatesChanged(); err != nil {
		return fmt.Errorf("nodeagent: %w", err)
	}

	// 2. Health first (a probe sees "not ready" rather than nothing).
	hln, err := net.Listen("tcp", cfg.HealthListen)
	if err != nil {
		return fmt.Errorf("nodeagent: health listener: %w", err)
	}
	hsrv := &http.Server{Handler: a.healthHandler(), ReadHeaderTimeout: 5 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	go func() { _ = hsrv.Serve(hln) }()
	defer hsrv.Close()

	// 3. The contract over gRPC.
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("nodeagent: %w", err)
	}
	gsrv, err := grpcnode.NewServer(&serving{Node: local, a: a}, grpcnode.ServerConfig{Token: cfg.Token, TLS: cfg.TLS,
		AllowInsecure: cfg.Insecure, Logger: log})
	if err != nil {
		ln.Close()
		return fmt.Errorf("nodeagent: %w", err)
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- gsrv.Serve(ln) }()
	defer gsrv.Stop()
	advertise, err := advertiseAddr(cfg.Advertise, ln.Addr().String())
	if err != nil {
		return fmt.Errorf("nodeagent: %w", err)
	}

	// 4. The Lease, with the node's capacity and address.
	written := &observedLeases{Leases: leases, first: make(chan struct{})}
	hb, err := membership.NewHeartbeat(written, membership.HeartbeatConfig{NodeID: cfg.NodeID, Address: advertise,
		LeaseDuration: cfg.LeaseDuration, Logger: log, OnLapse: func() { a.lapsed(ctx) }}, a.capacity(ctx))
	if err != nil {
		return fmt.Errorf("nodeagent: %w", err)
	}
	hbCtx, stopHB := context.WithCancel(context.WithoutCancel(ctx))
	defer stopHB()
	hbDone := make(chan error, 1)
	go func() { hbDone <- hb.Run(hbCtx) }()
	go a.reportCapacity(hbCtx, hb)

	// 5. Ready once the Lease is written.
	var runErr error
	select {
	case <-written.first:
		a.ready.Store(true)
		log.Info("evalbox node ready", "node", cfg.NodeID, "addr", ln.Addr().String(), "advertise", advertise,
			"health", hln.Addr().String(), "runtimes", host.Node.Runtimes(), "templates", len(a.templateDigests()),
			"start_to_ready_ms", time.Since(start).Milliseconds())
		if cfg.Ready != nil {
			cfg.Ready(ln.Addr().String(), hln.Addr().String())
		}
		select {
		case <-ctx.Done():
		case runErr = <-hbDone:
			hbDone <- runErr
		case runErr = <-serveErr:
		}
	case <-ctx.Done():
	case runErr = <-hbDone:
		hbDone <- runErr
	case runErr = <-serveErr:
	}
	if errors.Is(runErr, membership.ErrTakenOver) {
		runErr = fmt.Errorf("nodeagent: another process took the Lease of node %q (node ids must be unique in the cluster): %w", cfg.NodeID, runErr)
	} else if runErr != nil {
		runErr = fmt.Errorf("nodeagent: %w", runErr)
	}

	// Shutdown: not ready, no new calls, every sandbox destroyed (which
	// ends the calls that wait on them), then the Lease deleted.
	log.Info("node shutting down")
	a.ready.Store(false)
	a.closing.Store(true)
	stopped := make(chan struct{})
	go func() { gsrv.GracefulStop(); close(stopped) }()
	shutCtx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	endLife() // fetches in flight stop
	if err := host.Node.Close(shutCtx); err != nil {
		log.Error("closing node", "err", err)
	}
	select {
	case <-stopped:
	case <-time.After(shutdownGrace):
		log.Warn("node calls still running after the grace period; cutting them")
		gsrv.Stop()
	}
	stopHB()
	if err := <-hbDone; err != nil && !errors.Is(err, membership.ErrTakenOver) {
		log.Warn("leaving the cluster", "err", err)
	}
	return runErr
}

// leaseClient returns the Leases of namespace, from a kubeconfig file or
// the in-cluster configuration.
func leaseClient(kubeconfig, namespace string) (membership.Leases, error) {
	var rc *rest.Config
	var err error
	if kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("nodeagent: kubernetes client: %w", err)
	}
	cs, err := coordinationv1.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("nodeagent: kubernetes client: %w", err)
	}
	return cs.Leases(namespace), nil
}

// advertiseAddr is the address control planes dial: given, or the bound
// listen address, whose host is $POD_IP or the host's first global address
// when it is the unspecified address.
func advertiseAddr(given, bound string) (string, error) {
	if given != "" {
		return given, nil
	}
	host, port, err := net.SplitHostPort(bound)
	if err != nil {
		return "", err
	}
	ip := net.ParseIP(host)
	if ip != nil && !ip.IsUnspecified() {
		return bound, nil
	}
	if pod := os.Getenv("POD_IP"); pod != "" {
		return net.JoinHostPort(pod, port), nil
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", fmt.Errorf("the host's addresses (give --advertise): %w", err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.IsGlobalUnicast() && n.IP.To4() != nil {
			return net.JoinHostPort(n.IP.String(), port), nil
		}
	}
	return "", errors.New("no address to advertise: give --advertise")
}

// agent is a running node agent's state.
type agent struct {
	host  *nodehost.Host
	local *node.Local
	fetch *fetcher
	log   *slog.Logger

	ready, closing atomic.Bool
	templates      atomic.Pointer[[]string]
	poke           chan struct{} // 1-buffered: the capacity may have changed
}

// templatesChanged reads the digests of the templates the node holds again.
func (a *agent) templatesChanged() error {
	ds, err := a.host.Templates.Digests()
	if err != nil {
		return err
	}
	a.templates.Store(&ds)
	a.changed()
	return nil
}

func (a *agent) templateDigests() []string {
	if p := a.templates.Load(); p != nil {
		return *p
	}
	return nil
}

func (a *agent) changed() {
	select {
	case a.poke <- struct{}{}:
	default:
	}
}

// capacity is what the Lease says of the node now.
func (a *agent) capacity(ctx context.Context) membership.Capacity {
	st, _ := a.local.Capacity(ctx)
	free := st.Free()
	return membership.Capacity{
		CPUs:      goruntime.NumCPU(),
		MemoryMB:  st.Budget.MemoryBytes >> 20,
		Pids:      st.Budget.Pids,
		Free:      membership.Resources{MemoryMB: free.MemoryBytes >> 20, Pids: free.Pids},
		Runtimes:  a.host.Node.Runtimes(),
		Templates: a.templateDigests(),
		Sandboxes: st.Sandboxes,
	}
}

// capacityPoll is how often the capacity is looked at for changes that no
// call of the contract announces (a sandbox that died, a pool refill).
const capacityPoll = time.Second

// reportCapacity hands the capacity to hb whenever it changed: at once
// after a create, destroy or fetch, else within capacityPoll. The
// Heartbeat bounds how often that is written (MinWriteInterval).
func (a *agent) reportCapacity(ctx context.Context, hb *membership.Heartbeat) {
	last := a.capacity(ctx)
	t := time.NewTicker(capacityPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-a.poke:
		}
		c := a.capacity(ctx)
		if reflect.DeepEqual(c, last) {
			continue
		}
		if err := hb.SetCapacity(c); err != nil {
			a.log.Warn("capacity not reported", "err", err)
			continue
		}
		last = c
	}
}

// healthHandler serves /healthz (200 while the process runs) and /readyz
// (200 once swept, serving and the Lease written; 503 before and while it
// shuts down).
func (a *agent) healthHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !a.ready.Load() {
			w.Header().Set("Content-Length", strconv.Itoa(len("not ready\n")))
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not ready\n"))
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	return mux
}

// serving is the node as the agent serves it: a create of a template the
// node lacks fetches it first, and creates and destroys report the
// capacity change at once.
type serving struct {
	nodeapi.Node
	a *agent
}

func (s *serving) Create(ctx context.Context, req nodeapi.CreateRequest) (nodeapi.SandboxInfo, error) {
	if s.a.closing.Load() {
		return nodeapi.SandboxInfo{}, nodeapi.ErrNodeClosed
	}
	info, err := s.Node.Create(ctx, req)
	if errors.Is(err, nodeapi.ErrTemplateMissing) && s.a.fetch != nil && req.ContentDigest != "" {
		if ferr := s.a.fetch.fetch(ctx, req.Spec.Template, req.ContentDigest); ferr != nil {
			s.a.log.Warn("template fetch failed", "template", req.Spec.Template, "err", ferr)
			return nodeapi.SandboxInfo{}, &nodeapi.TemplateMissingError{Digest: req.Spec.Template}
		}
		info, err = s.Node.Create(ctx, req)
	}
	s.a.changed()
	return info, err
}

func (s *serving) Destroy(ctx context.Context, id string) error {
	err := s.Node.Destroy(ctx, id)
	s.a.changed()
	return err
}

// lapsed ends every sandbox the node handed out when its Lease went a
// whole lease duration without a renewal (an outage of the API server, a
// partition): the control plane has counted the node lost and ended those
// sandboxes' rows, and nothing would end them here otherwise (untrusted
// code running past its TTL, on capacity nobody counts). The warm pools
// stay: nobody was given them.
func (a *agent) lapsed(ctx context.Context) {
	n, err := a.host.Node.DestroyGiven(context.WithoutCancel(ctx))
	if err != nil {
		a.log.Error("node: ending the sandboxes of the lapsed Lease", "sandboxes", n, "err", err)
		return
	}
	a.log.Warn("node: the Lease lapsed; its sandboxes were ended as the control plane counts them lost", "sandboxes", n)
}
