package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/evalbox/evalbox/internal/fleet"
	"github.com/evalbox/evalbox/internal/fleet/membership"
	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/internal/nodeapi/grpcnode"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/internal/template"
)

// Where sandboxes run (Config.Nodes).
const (
	// NodesLocal runs one node in process (the embedded server).
	NodesLocal = "local"
	// NodesKubernetes runs none: the node agents whose Leases are in the
	// namespace serve sandboxes over gRPC.
	NodesKubernetes = "kubernetes"
)

// FleetConfig says how an API replica finds and reaches its node agents
// (Config.Nodes = NodesKubernetes).
type FleetConfig struct {
	// Kubeconfig is the kubeconfig file ("": in-cluster).
	Kubeconfig string
	// Namespace holds the node Leases ("": evalbox).
	Namespace string
	// NodeTLSCA verifies the nodes' certificates; NodeTLSCert and
	// NodeTLSKey are this replica's client certificate for mutual TLS.
	// All empty: plaintext, which grpcnode allows to loopback nodes only.
	NodeTLSCA, NodeTLSCert, NodeTLSKey string
	// NodeTLSServerName is the name every node's certificate is checked
	// against (one certificate for the fleet's nodes, which are dialled by
	// pod IP); empty: the host of each node's address.
	NodeTLSServerName string
	// SyncTimeout bounds the wait for the first list of Leases at start
	// (0: 30 s).
	SyncTimeout time.Duration
}

// noBuildsOnFleet is why a replica refuses template builds and imports.
const noBuildsOnFleet = "template builds and imports are not implemented with --nodes kubernetes (a build runs in a sandbox on the server's own node, and this server has none); build or import the template on an embedded server"

// fleetPlane is a replica's view of its nodes: the Lease watcher and the
// Router fed by it.
type fleetPlane struct {
	router  *fleet.Router
	watcher *membership.Watcher
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	mu     sync.Mutex
	onLost func(nodeID, reason string)
}

// startFleet watches the node Leases and returns once they were first
// listed. lookup finds the node of a sandbox this replica did not create.
func startFleet(ctx context.Context, cfg FleetConfig, token string, lookup nodeLookup, log *slog.Logger) (*fleetPlane, error) {
	if cfg.Namespace == "" {
		cfg.Namespace = "evalbox"
	}
	if cfg.SyncTimeout == 0 {
		cfg.SyncTimeout = 30 * time.Second
	}
	if token == "" {
		return nil, errors.New("server: --nodes kubernetes needs the node token (--node-token-file)")
	}
	var (
		tlsCfg *tls.Config
		err    error
	)
	if cfg.NodeTLSCA != "" || cfg.NodeTLSCert != "" || cfg.NodeTLSKey != "" {
		if (cfg.NodeTLSCert == "") != (cfg.NodeTLSKey == "") {
			return nil, errors.New("server: --node-tls-cert and --node-tls-key go together")
		}
		if tlsCfg, err = grpcnode.ClientTLS(cfg.NodeTLSCert, cfg.NodeTLSKey, cfg.NodeTLSCA); err != nil {
			return nil, fmt.Errorf("server: %w", err)
		}
		tlsCfg.ServerName = cfg.NodeTLSServerName
	} else if cfg.NodeTLSServerName != "" {
		return nil, errors.New("server: --node-tls-server-name needs the nodes' TLS settings (--node-tls-ca)")
	}
	var rc *rest.Config
	if cfg.Kubeconfig == "" {
		rc, err = rest.InClusterConfig()
	} else {
		rc, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("server: kubernetes client: %w", err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("server: kubernetes client: %w", err)
	}
	fp := &fleetPlane{}
	fp.router = fleet.New(fleet.Config{
		Dial: func(n membership.Node) (nodeapi.Node, io.Closer, error) {
			cc, err := grpcnode.Dial(n.Address, grpcnode.ClientConfig{Token: token, TLS: tlsCfg})
			if err != nil {
				return nil, nil, err
			}
			return grpcnode.NewClient(cc), cc, nil
		},
		Lookup:         lookup.sandbox,
		LookupSnapshot: lookup.snapshot,
		OnNodeLost: func(id, reason string) {
			fp.mu.Lock()
			f := fp.onLost
			fp.mu.Unlock()
			if f != nil {
				f(id, reason)
			}
		},
		Logger: log,
	})
	fp.watcher = membership.NewWatcher(cs.CoordinationV1().Leases(cfg.Namespace), membership.WatcherConfig{
		OnEvent: fp.router.HandleEvent, Logger: log,
	})
	wctx, cancel := context.WithCancel(context.Background())
	fp.cancel = cancel
	fp.wg.Go(func() { _ = fp.watcher.Run(wctx) })
	select {
	case <-fp.watcher.Synced():
	case <-time.After(cfg.SyncTimeout):
		fp.stop()
		return nil, fmt.Errorf("server: the node Leases of namespace %s were not listed within %s", cfg.Namespace, cfg.SyncTimeout)
	case <-ctx.Done():
		fp.stop()
		return nil, ctx.Err()
	}
	// The first events (the live nodes) reach the Router from the
	// watcher's goroutine: wait until it has them all.
	deadline := time.Now().Add(5 * time.Second)
	for len(fp.router.Nodes()) < len(fp.watcher.Nodes()) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	log.Info("fleet: watching node Leases", "namespace", cfg.Namespace, "nodes", fp.router.Nodes(), "tls", tlsCfg != nil)
	return fp, nil
}

// OnNodeLost sets what to do when a node is lost (the service drains its
// rows); set once the service exists.
func (fp *fleetPlane) OnNodeLost(f func(nodeID, reason string)) {
	fp.mu.Lock()
	fp.onLost = f
	fp.mu.Unlock()
}

func (fp *fleetPlane) stop() {
	fp.cancel()
	fp.wg.Wait()
}

// openTemplates opens the template registry of a replica without a node:
// the built-ins (which it resolves names to digests with, and serves to
// nodes that lack them) and the data dir's store.
func openTemplates(ctx context.Context, cfg Config, log *slog.Logger) (*template.Registry, error) {
	// The data dir holds the database, the admin key and every team's
	// templates: the owner's alone, also when it existed before.
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	if err := os.Chmod(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	dir := cfg.TemplatesDir
	if dir == "" {
		dir = filepath.Join(cfg.DataDir, "templates")
	}
	templates, err := template.Open(dir, log)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	for _, name := range cfg.Builtins {
		if _, err := templates.EnsureBuiltin(ctx, name, cfg.Mirror, io.Discard); err != nil {
			return nil, fmt.Errorf("server: %w", err)
		}
	}
	if err := templates.UseStore(filepath.Join(cfg.DataDir, "images")); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	return templates, nil
}

// nodeLookup reads the node of a sandbox or a snapshot from its row.
type nodeLookup struct {
	sandbox, snapshot func(context.Context, string) (string, error)
}

// lookupNode reads the node of a sandbox or a snapshot from its row.
func lookupNode(st *store.Store) nodeLookup {
	return nodeLookup{
		sandbox: func(ctx context.Context, id string) (string, error) {
			n, err := st.SandboxNode(ctx, id)
			if errors.Is(err, store.ErrNotFound) {
				return "", fmt.Errorf("%w: %w", nodeapi.ErrSandboxNotFound, err)
			}
			return n, err
		},
		snapshot: func(ctx context.Context, id string) (string, error) {
			n, err := st.SnapshotNode(ctx, id)
			if errors.Is(err, store.ErrNotFound) {
				return "", fmt.Errorf("%w: %w", nodeapi.ErrSnapshotNotFound, err)
			}
			return n, err
		},
	}
}

// noBuilds is the build runner of a replica without a node.
type noBuilds struct{}

func (noBuilds) RunBuildStep(context.Context, template.RunStep) (template.RunResult, error) {
	return template.RunResult{}, errors.New("server: " + noBuildsOnFleet)
}
