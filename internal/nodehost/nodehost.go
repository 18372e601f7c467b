// Package nodehost assembles one host's node: its data dir, template
// registry (the built-ins' directory and the store under the data dir), the
// instance id that names its host-wide objects, the runtime drivers and
// their shared outbound network, the host capacity, and node.Node, swept of
// what a previous process of the same data dir left. `evalbox serve` (the
// embedded node, internal/server) and `evalbox node` (internal/nodeagent)
// both open their node with Open, so that the two never drift apart.
package nodehost

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/evalbox/evalbox/internal/instance"
	"github.com/evalbox/evalbox/internal/node"
	"github.com/evalbox/evalbox/internal/runtime"
	"github.com/evalbox/evalbox/internal/runtime/gvisor"
	"github.com/evalbox/evalbox/internal/runtime/namespaces"
	"github.com/evalbox/evalbox/internal/runtime/network"
	"github.com/evalbox/evalbox/internal/template"
	"github.com/evalbox/evalbox/pkg/client"
)

// Config configures a host's node.
type Config struct {
	// DataDir holds the node's files (sandbox state, runsc's root, the
	// template store under images/); its absolute path names the instance
	// (instance.ID), so two nodes of one host need two data dirs.
	// Required.
	DataDir string
	// Runsc and Agent are the paths of the runsc and evalbox-agent
	// binaries (default: next to the running executable).
	Runsc string
	Agent string
	// TemplatesDir holds the built-in templates (default
	// <DataDir>/templates); a cache that several nodes may share.
	TemplatesDir string
	// Mirror is the Debian mirror built-ins are bootstrapped from;
	// Builtins are built (if missing or stale) before the node opens.
	Mirror   string
	Builtins []string
	// Runtimes to enable (default both).
	Runtimes []string
	// Build is the shape of template build sandboxes.
	Build node.BuildConfig
	// Capacity sizes the host budget (zero values: derived from the host).
	Capacity node.CapacityConfig
	// EgressDNS and AllowPrivate configure the outbound network
	// (network.Config's Upstream and AllowPrivate).
	EgressDNS    []netip.AddrPort
	AllowPrivate []netip.Prefix
	Logger       *slog.Logger
}

// Host is an open node and what it is made of.
type Host struct {
	Node      *node.Node
	Templates *template.Registry
	// Instance is the instance id of the data dir (cgroup parents, link
	// aliases carry it).
	Instance string
	// Agent is the guest agent's path, as resolved.
	Agent string

	log     *slog.Logger
	closers []io.Closer
	netm    *network.Manager
}

// Open assembles the node of cfg and sweeps what a previous process of its
// data dir left (sandboxes, cgroups, state directories), then keeps
// sweeping every minute. On error nothing stays open.
func Open(ctx context.Context, cfg Config) (_ *Host, err error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.DataDir == "" {
		return nil, errors.New("nodehost: data dir is required")
	}
	// The data dir holds every sandbox's state and the templates: the
	// owner's alone, also when it existed before.
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("nodehost: %w", err)
	}
	if err := os.Chmod(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("nodehost: %w", err)
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
	// The namespaces runtime's init stage: evalbox-nsinit beside this
	// binary when it is there (it starts in a fraction of the time this
	// binary's package initialisation takes), else this binary.
	nsInit := filepath.Join(exeDir, "evalbox-nsinit")
	if fi, err := os.Stat(nsInit); err != nil || !fi.Mode().IsRegular() {
		nsInit = ""
	}
	if _, err := os.Stat(cfg.Agent); err != nil {
		return nil, fmt.Errorf("nodehost: agent binary: %w (build cmd/evalbox-agent, or pass --agent)", err)
	}
	if cfg.TemplatesDir == "" {
		cfg.TemplatesDir = filepath.Join(cfg.DataDir, "templates")
	}
	if len(cfg.Runtimes) == 0 {
		cfg.Runtimes = []string{client.RuntimeGVisor, client.RuntimeNamespaces}
	}

	templates, err := template.Open(cfg.TemplatesDir, log)
	if err != nil {
		return nil, fmt.Errorf("nodehost: %w", err)
	}
	for _, name := range cfg.Builtins {
		if _, err := templates.EnsureBuiltin(ctx, name, cfg.Mirror, io.Discard); err != nil {
			return nil, fmt.Errorf("nodehost: %w", err)
		}
	}
	// Built, imported and fetched templates and the layer cache are this
	// node's state (the built-ins' directory is a cache that nodes may
	// share).
	if err := templates.UseStore(filepath.Join(cfg.DataDir, "images")); err != nil {
		return nil, fmt.Errorf("nodehost: %w", err)
	}

	h := &Host{Templates: templates, Agent: cfg.Agent, log: log}
	defer func() {
		if err != nil {
			h.closeRuntimes()
		}
	}()
	// Host-wide names (cgroup parents, link aliases) carry the instance,
	// so that two nodes on one host never sweep each other's sandboxes.
	h.Instance = instance.ID(cfg.DataDir)
	// One outbound network for all drivers: one address pool.
	netm, err := network.New(network.Config{Scope: h.Instance, Upstream: cfg.EgressDNS, AllowPrivate: cfg.AllowPrivate, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("nodehost: %w", err)
	}
	h.netm = netm // closed after the runtimes (closeRuntimes)
	var runtimes []runtime.Runtime
	for _, name := range cfg.Runtimes {
		switch name {
		case client.RuntimeGVisor:
			gv, err := gvisor.New(gvisor.Config{Runsc: cfg.Runsc, RootDir: filepath.Join(cfg.DataDir, "runsc"),
				CgroupParent: instance.GVisorCgroupParent(h.Instance), Network: netm, Logger: log})
			if err != nil {
				return nil, fmt.Errorf("nodehost: %w", err)
			}
			runtimes = append(runtimes, gv)
			h.closers = append(h.closers, gv)
		case client.RuntimeNamespaces:
			ns, err := namespaces.New(namespaces.Config{CgroupParent: instance.NamespacesCgroupParent(h.Instance), Network: netm, Logger: log, InitPath: nsInit})
			if err != nil {
				return nil, fmt.Errorf("nodehost: %w", err)
			}
			runtimes = append(runtimes, ns)
			h.closers = append(h.closers, ns)
		default:
			return nil, fmt.Errorf("nodehost: unknown runtime %q", name)
		}
	}
	capacity, err := node.NewCapacity(cfg.Capacity)
	if err != nil {
		return nil, fmt.Errorf("nodehost: %w", err)
	}
	h.Node, err = node.New(node.Config{Runtimes: runtimes, Templates: templates, AgentPath: cfg.Agent,
		StateDir: filepath.Join(cfg.DataDir, "sandboxes"), SnapshotDir: filepath.Join(cfg.DataDir, "snapshots"), Build: cfg.Build, Capacity: capacity, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("nodehost: %w", err)
	}
	if removed, err := h.Node.Sweep(ctx); err != nil {
		log.Warn("sweeping leftovers", "err", err)
	} else if len(removed) > 0 {
		log.Info("removed leftover sandboxes", "count", len(removed))
	}
	h.Node.SweepEvery(time.Minute)
	return h, nil
}

// Close destroys every sandbox of the node (node.Node.Close), then closes
// the runtime drivers. Calling it again does nothing more.
func (h *Host) Close(ctx context.Context) error {
	err := h.Node.Close(ctx)
	h.closeRuntimes()
	return err
}

func (h *Host) closeRuntimes() {
	for _, c := range h.closers {
		if err := c.Close(); err != nil {
			h.log.Warn("closing runtime", "err", err)
		}
	}
	h.closers = nil
	if h.netm != nil {
		_ = h.netm.Close()
		h.netm = nil
	}
}
