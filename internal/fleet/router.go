// Package fleet drives many nodes as one: Router is a nodeapi.Node over the
// live nodes of a cluster (membership.Watcher), so that the sandbox service
// does not know whether it talks to one node or a fleet
// (docs/design/fleet.md). Create places the sandbox (internal/fleet/placement)
// and forwards to the chosen node, trying the next one when a node refuses;
// every other call goes to the sandbox's node. When a node is lost (its
// Lease expired, it restarted, it left), every call on its sandboxes,
// in flight or later, fails with a *nodeapi.NodeLostError and Wait returns.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/evalbox/evalbox/internal/fleet/membership"
	"github.com/evalbox/evalbox/internal/fleet/placement"
	"github.com/evalbox/evalbox/internal/nodeapi"
)

// MaxTries is how many nodes a create tries before it fails.
const MaxTries = 3

// Dialer connects to a node's contract. The Router dials each node once,
// when it first needs it, and closes the connection when the node is lost.
type Dialer func(n membership.Node) (nodeapi.Node, io.Closer, error)

// Config configures a Router.
type Config struct {
	// Dial connects to a node (grpcnode.Dial and NewClient, with the
	// node token and TLS). Required.
	Dial Dialer
	// Lookup returns the id of the node a sandbox runs on, for sandboxes
	// this Router did not create (another replica, or before a restart):
	// the store's row. Nil: only the Router's own.
	Lookup func(ctx context.Context, sandboxID string) (nodeID string, err error)
	// LookupSnapshot returns the id of the node that holds a snapshot,
	// for snapshots this Router did not take: the store's row. Nil: only
	// the Router's own.
	LookupSnapshot func(ctx context.Context, snapshotID string) (nodeID string, err error)
	// OnNodeLost is called, from the event's goroutine, after a node was
	// lost and its sandboxes' calls failed. Nil: nothing.
	OnNodeLost func(nodeID, reason string)
	// Rand makes placement's random picks (nil: a random seed).
	Rand   *rand.Rand
	Logger *slog.Logger
}

// Router is a nodeapi.Node over the live nodes. Feed it the Watcher's events
// (HandleEvent). It is safe for concurrent use.
type Router struct {
	cfg Config
	log *slog.Logger

	mu        sync.Mutex
	rnd       *rand.Rand
	members   map[string]*member // live nodes, by id
	sandboxes map[string]*member // sandbox id → the node incarnation it runs on
	snapshots map[string]*member // snapshot id → the node incarnation that holds it
	pools     map[string]nodeapi.PoolSpec
}

var _ nodeapi.Node = (*Router)(nil)

// member is one incarnation of a live node.
type member struct {
	id string
	// ctx ends, with lostErr as its cause, when the node is lost.
	ctx    context.Context
	cancel context.CancelCauseFunc

	// Guarded by Router.mu.
	node   membership.Node
	placed []*placed
	client nodeapi.Node
	closer io.Closer
}

// placed is a create this Router sent to a node that the node's Lease may
// not count yet.
type placed struct {
	cost nodeapi.Resources
	done time.Time // zero while the create runs
}

// New returns a Router with no nodes.
func New(cfg Config) *Router {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	rnd := cfg.Rand
	if rnd == nil {
		rnd = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	return &Router{cfg: cfg, log: cfg.Logger, rnd: rnd,
		members: map[string]*member{}, sandboxes: map[string]*member{}, snapshots: map[string]*member{}, pools: map[string]nodeapi.PoolSpec{}}
}

// HandleEvent applies a membership event (WatcherConfig.OnEvent).
func (r *Router) HandleEvent(ev membership.Event) {
	switch ev.Type {
	case membership.NodeAdded:
		r.lose(ev.Node.ID, "it restarted") // a stale incarnation, if any
		ctx, cancel := context.WithCancelCause(context.Background())
		m := &member{id: ev.Node.ID, ctx: ctx, cancel: cancel, node: ev.Node}
		r.mu.Lock()
		r.members[m.id] = m
		pools := slices.Collect(maps.Values(r.pools))
		r.mu.Unlock()
		r.log.Info("fleet: node joined", "node", m.id, "address", ev.Node.Address)
		if len(pools) > 0 {
			go r.setPools(m, pools)
		}
	case membership.NodeUpdated:
		r.mu.Lock()
		if m := r.members[ev.Node.ID]; m != nil {
			if m.node.Address != ev.Node.Address && m.closer != nil {
				_ = m.closer.Close()
				m.client, m.closer = nil, nil
			}
			m.node = ev.Node
			m.prune()
		}
		r.mu.Unlock()
	case membership.NodeExpired:
		r.lose(ev.Node.ID, "its lease expired")
	case membership.NodeLeft:
		r.lose(ev.Node.ID, "it left the fleet")
	}
}

// lose ends a node's incarnation: its sandboxes' calls fail with a
// NodeLostError and their Waits return.
func (r *Router) lose(id, why string) {
	r.mu.Lock()
	m := r.members[id]
	if m == nil {
		r.mu.Unlock()
		return
	}
	delete(r.members, id)
	closer := m.closer
	m.client, m.closer = nil, nil
	r.mu.Unlock()
	err := &nodeapi.NodeLostError{NodeID: id, Why: why}
	m.cancel(err)
	if closer != nil {
		_ = closer.Close()
	}
	r.log.Warn("fleet: node lost", "node", id, "why", why)
	if r.cfg.OnNodeLost != nil {
		r.cfg.OnNodeLost(id, err.Error())
	}
}

// prune drops the creates the node's Lease counts: those that finished
// before the Watcher saw its last write. Called with Router.mu held.
func (m *member) prune() {
	seen := m.node.Expires.Add(-m.node.LeaseDuration)
	m.placed = slices.DeleteFunc(m.placed, func(p *placed) bool { return !p.done.IsZero() && p.done.Before(seen) })
}

// clientLocked returns the node's client, dialling it the first time.
func (r *Router) clientLocked(m *member) (nodeapi.Node, error) {
	if m.client != nil {
		return m.client, nil
	}
	c, closer, err := r.cfg.Dial(m.node)
	if err != nil {
		return nil, fmt.Errorf("fleet: dial node %s: %w: %w", m.id, nodeapi.ErrNodeUnreachable, err)
	}
	m.client, m.closer = c, closer
	return c, nil
}

// Nodes returns the ids of the live nodes, sorted.
func (r *Router) Nodes() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.members))
}

// Live reports whether a node is live.
func (r *Router) Live(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.members[id] != nil
}

// Create places the sandbox and starts it on the chosen node; a node that
// has no room, cannot be reached or lacks the template is dropped and the
// next one tried, up to MaxTries nodes.
func (r *Router) Create(ctx context.Context, req nodeapi.CreateRequest) (nodeapi.SandboxInfo, error) {
	if req.Snapshot != "" {
		return r.createFromSnapshot(ctx, req)
	}
	preq := placement.Request{Runtime: req.Spec.Runtime, Template: req.Spec.Template, Shape: req.Spec.Shape}
	cost := preq.Cost()
	tried := map[string]bool{}
	var last error
	for len(tried) < MaxTries {
		m, p, c, err := r.place(preq, cost, req.Wait != 0, tried)
		if err != nil {
			if last != nil {
				return nodeapi.SandboxInfo{}, last
			}
			return nodeapi.SandboxInfo{}, err
		}
		if m == nil {
			break
		}
		tried[m.id] = true
		info, err := call(ctx, m, func(ctx context.Context) (nodeapi.SandboxInfo, error) { return c.Create(ctx, req) })
		r.mu.Lock()
		if err == nil {
			p.done = time.Now()
			r.sandboxes[info.ID] = m
		} else {
			m.placed = slices.DeleteFunc(m.placed, func(q *placed) bool { return q == p })
		}
		r.mu.Unlock()
		if err == nil {
			info.Node = m.id
			return info, nil
		}
		if ctx.Err() != nil || !retryCreate(err) {
			return nodeapi.SandboxInfo{}, err
		}
		r.log.Info("fleet: node refused a create; trying another", "node", m.id, "err", err)
		last = err
	}
	if last != nil {
		return nodeapi.SandboxInfo{}, last
	}
	return nodeapi.SandboxInfo{}, &nodeapi.CapacityError{Resource: "memory", Need: cost.MemoryBytes}
}

// retryCreate reports whether a create's failure on one node is worth
// trying on another.
func retryCreate(err error) bool {
	return errors.Is(err, nodeapi.ErrInsufficientCapacity) || errors.Is(err, nodeapi.ErrNodeUnreachable) ||
		errors.Is(err, nodeapi.ErrTemplateMissing) || errors.Is(err, nodeapi.ErrNodeLost) ||
		errors.Is(err, nodeapi.ErrNodeClosed)
}

// place chooses a node not tried yet and records the create on it. With
// wait, a request no node has room for now goes to the node with the most
// room that runs the runtime, to queue there. It returns a nil member when
// no node is left, and ErrUnknownRuntime when no live node runs it.
func (r *Router) place(req placement.Request, cost nodeapi.Resources, wait bool, tried map[string]bool) (*member, *placed, nodeapi.Node, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	nodes := make([]placement.Node, 0, len(r.members))
	hasRuntime := false
	for id, m := range r.members {
		if !slices.Contains(m.node.Capacity.Runtimes, req.Runtime) {
			continue
		}
		hasRuntime = true
		if tried[id] {
			continue
		}
		m.prune()
		nodes = append(nodes, placementNode(m, r.hasPool(id, req)))
	}
	if !hasRuntime {
		return nil, nil, nil, fmt.Errorf("fleet: no live node runs %q: %w", req.Runtime, nodeapi.ErrUnknownRuntime)
	}
	ids := placement.Place(nodes, req, r.rnd, 1)
	if len(ids) == 0 && wait && len(nodes) > 0 {
		// Queue on the node with the most room: it admits FIFO.
		best := slices.MaxFunc(nodes, func(a, b placement.Node) int {
			return cmpInt(a.Free.MemoryBytes-a.Placed.MemoryBytes, b.Free.MemoryBytes-b.Placed.MemoryBytes)
		})
		ids = []string{best.ID}
	}
	if len(ids) == 0 {
		return nil, nil, nil, nil
	}
	m := r.members[ids[0]]
	c, err := r.clientLocked(m)
	if err != nil {
		return nil, nil, nil, err
	}
	p := &placed{cost: cost}
	m.placed = append(m.placed, p)
	return m, p, c, nil
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// hasPool reports whether this Router set a warm pool of req's spec on the
// node (a pool's readiness is not known: its target is what counts).
func (r *Router) hasPool(_ string, req placement.Request) bool {
	for _, p := range r.pools {
		if p.Target > 0 && p.Spec.Template == req.Template && p.Spec.Runtime == req.Runtime && p.Spec.Shape == req.Shape {
			return true
		}
	}
	return false
}

func placementNode(m *member, warm bool) placement.Node {
	c := m.node.Capacity
	n := placement.Node{ID: m.id, Runtimes: c.Runtimes, Templates: c.Templates, WarmPool: warm,
		Budget: nodeapi.Resources{Pids: c.Pids, MemoryBytes: c.MemoryMB << 20},
		Free:   nodeapi.Resources{Pids: c.Free.Pids, MemoryBytes: c.Free.MemoryMB << 20}}
	for _, p := range m.placed {
		n.Placed.Pids += p.cost.Pids
		n.Placed.MemoryBytes += p.cost.MemoryBytes
	}
	return n
}

// route returns the node incarnation a sandbox runs on and its client.
func (r *Router) route(ctx context.Context, id string) (*member, nodeapi.Node, error) {
	return r.routeIn(ctx, "sandbox", id, r.sandboxes, r.cfg.Lookup, nodeapi.ErrSandboxNotFound)
}

// routeSnapshot is route for the node that holds a snapshot.
func (r *Router) routeSnapshot(ctx context.Context, id string) (*member, nodeapi.Node, error) {
	return r.routeIn(ctx, "snapshot", id, r.snapshots, r.cfg.LookupSnapshot, nodeapi.ErrSnapshotNotFound)
}

// routeIn finds the node of id in known (under r.mu), or through lookup.
func (r *Router) routeIn(ctx context.Context, what, id string, known map[string]*member,
	lookup func(context.Context, string) (string, error), notFound error) (*member, nodeapi.Node, error) {
	r.mu.Lock()
	m := known[id]
	r.mu.Unlock()
	if m == nil {
		if lookup == nil {
			return nil, nil, fmt.Errorf("fleet: %s %s: %w", what, id, notFound)
		}
		nodeID, err := lookup(ctx, id)
		if err != nil {
			return nil, nil, fmt.Errorf("fleet: %s %s: %w", what, id, err)
		}
		r.mu.Lock()
		m = r.members[nodeID]
		if m == nil {
			r.mu.Unlock()
			return nil, nil, &nodeapi.NodeLostError{NodeID: nodeID, Why: "it is not live"}
		}
		known[id] = m
		r.mu.Unlock()
	}
	if err := context.Cause(m.ctx); err != nil {
		return nil, nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := context.Cause(m.ctx); err != nil {
		return nil, nil, err
	}
	c, err := r.clientLocked(m)
	return m, c, err
}

// call runs f under ctx, cut short when m is lost: then it fails with the
// node's NodeLostError, whatever f returned.
func call[T any](ctx context.Context, m *member, f func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(m.ctx, func() { cancel(context.Cause(m.ctx)) })
	defer stop()
	v, err := f(ctx)
	if err != nil {
		if lost := context.Cause(m.ctx); lost != nil {
			var zero T
			return zero, lost
		}
	}
	return v, err
}

// on runs f on the node of sandbox id.
func on[T any](r *Router, ctx context.Context, id string, f func(context.Context, nodeapi.Node) (T, error)) (T, error) {
	m, c, err := r.route(ctx, id)
	if err != nil {
		var zero T
		return zero, err
	}
	return call(ctx, m, func(ctx context.Context) (T, error) { return f(ctx, c) })
}

// Destroy destroys a sandbox on its node. A sandbox of a lost node is gone
// already: not an error.
func (r *Router) Destroy(ctx context.Context, id string) error {
	_, err := on(r, ctx, id, func(ctx context.Context, c nodeapi.Node) (struct{}, error) {
		return struct{}{}, c.Destroy(ctx, id)
	})
	if errors.Is(err, nodeapi.ErrNodeLost) || errors.Is(err, nodeapi.ErrSandboxNotFound) {
		err = nil
	}
	if err == nil {
		r.mu.Lock()
		delete(r.sandboxes, id)
		r.mu.Unlock()
	}
	return err
}

// Wait waits for the sandbox's end on its node. When the node is lost it
// returns an End whose Reason says so, with the *nodeapi.NodeLostError.
func (r *Router) Wait(ctx context.Context, id string) (nodeapi.End, error) {
	end, err := on(r, ctx, id, func(ctx context.Context, c nodeapi.Node) (nodeapi.End, error) { return c.Wait(ctx, id) })
	var lost *nodeapi.NodeLostError
	if errors.As(err, &lost) {
		return nodeapi.End{Reason: lost.Error()}, err
	}
	return end, err
}

func (r *Router) Exec(ctx context.Context, id string, req nodeapi.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (nodeapi.ExitInfo, error) {
	return on(r, ctx, id, func(ctx context.Context, c nodeapi.Node) (nodeapi.ExitInfo, error) {
		return c.Exec(ctx, id, req, stdin, stdout, stderr)
	})
}

func (r *Router) StartProcess(ctx context.Context, id string, req nodeapi.ExecRequest) (nodeapi.ProcInfo, error) {
	return on(r, ctx, id, func(ctx context.Context, c nodeapi.Node) (nodeapi.ProcInfo, error) {
		return c.StartProcess(ctx, id, req)
	})
}

func (r *Router) ListProcesses(ctx context.Context, id string) ([]nodeapi.ProcInfo, error) {
	return on(r, ctx, id, func(ctx context.Context, c nodeapi.Node) ([]nodeapi.ProcInfo, error) { return c.ListProcesses(ctx, id) })
}

func (r *Router) AttachProcess(ctx context.Context, id, procID string, stdout, stderr io.Writer) (nodeapi.ExitInfo, error) {
	return on(r, ctx, id, func(ctx context.Context, c nodeapi.Node) (nodeapi.ExitInfo, error) {
		return c.AttachProcess(ctx, id, procID, stdout, stderr)
	})
}

func (r *Router) WaitProcess(ctx context.Context, id, procID string) (nodeapi.ExitInfo, error) {
	return on(r, ctx, id, func(ctx context.Context, c nodeapi.Node) (nodeapi.ExitInfo, error) {
		return c.WaitProcess(ctx, id, procID)
	})
}

// SetEgress sets the egress rules of a sandbox on its node.
// Snapshot snapshots a sandbox on its node, which then holds the
// snapshot.
func (r *Router) Snapshot(ctx context.Context, id string) (nodeapi.SnapshotInfo, error) {
	m, c, err := r.route(ctx, id)
	if err != nil {
		return nodeapi.SnapshotInfo{}, err
	}
	info, err := call(ctx, m, func(ctx context.Context) (nodeapi.SnapshotInfo, error) { return c.Snapshot(ctx, id) })
	if err == nil {
		r.mu.Lock()
		r.snapshots[info.ID] = m
		r.mu.Unlock()
	}
	return info, err
}

// DeleteSnapshot removes a snapshot from its node. One of a lost node is
// gone already: not an error.
func (r *Router) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	m, c, err := r.routeSnapshot(ctx, snapshotID)
	if err == nil {
		_, err = call(ctx, m, func(ctx context.Context) (struct{}, error) { return struct{}{}, c.DeleteSnapshot(ctx, snapshotID) })
	}
	if errors.Is(err, nodeapi.ErrNodeLost) || errors.Is(err, nodeapi.ErrSnapshotNotFound) {
		err = nil
	}
	if err == nil {
		r.mu.Lock()
		delete(r.snapshots, snapshotID)
		r.mu.Unlock()
	}
	return err
}

// createFromSnapshot creates a sandbox on the node that holds the
// snapshot (no placement: the image is there).
func (r *Router) createFromSnapshot(ctx context.Context, req nodeapi.CreateRequest) (nodeapi.SandboxInfo, error) {
	m, c, err := r.routeSnapshot(ctx, req.Snapshot)
	if err != nil {
		return nodeapi.SandboxInfo{}, err
	}
	info, err := call(ctx, m, func(ctx context.Context) (nodeapi.SandboxInfo, error) { return c.Create(ctx, req) })
	if err != nil {
		return nodeapi.SandboxInfo{}, err
	}
	r.mu.Lock()
	r.sandboxes[info.ID] = m
	r.mu.Unlock()
	info.Node = m.id
	return info, nil
}

func (r *Router) Pause(ctx context.Context, id string) error {
	_, err := on(r, ctx, id, func(ctx context.Context, c nodeapi.Node) (struct{}, error) {
		return struct{}{}, c.Pause(ctx, id)
	})
	return err
}

func (r *Router) Resume(ctx context.Context, id string, wait time.Duration) error {
	_, err := on(r, ctx, id, func(ctx context.Context, c nodeapi.Node) (struct{}, error) {
		return struct{}{}, c.Resume(ctx, id, wait)
	})
	return err
}

func (r *Router) SetEgress(ctx context.Context, id string, e *nodeapi.Egress) error {
	_, err := on(r, ctx, id, func(ctx context.Context, c nodeapi.Node) (struct{}, error) {
		return struct{}{}, c.SetEgress(ctx, id, e)
	})
	return err
}

// Stats samples a sandbox's CPU use on its node.
func (r *Router) Stats(ctx context.Context, id string) (nodeapi.SandboxStats, error) {
	return on(r, ctx, id, func(ctx context.Context, c nodeapi.Node) (nodeapi.SandboxStats, error) {
		return c.Stats(ctx, id)
	})
}

// Throttle changes a sandbox's CPU quota on its node.
func (r *Router) Throttle(ctx context.Context, id string, cpu float64) error {
	_, err := on(r, ctx, id, func(ctx context.Context, c nodeapi.Node) (struct{}, error) {
		return struct{}{}, c.Throttle(ctx, id, cpu)
	})
	return err
}

func (r *Router) SignalProcess(ctx context.Context, id, procID string, sig int) error {
	_, err := on(r, ctx, id, func(ctx context.Context, c nodeapi.Node) (struct{}, error) {
		return struct{}{}, c.SignalProcess(ctx, id, procID, sig)
	})
	return err
}

func (r *Router) WriteStdin(ctx context.Context, id, procID string, data []byte, closeAfter bool) error {
	_, err := on(r, ctx, id, func(ctx context.Context, c nodeapi.Node) (struct{}, error) {
		return struct{}{}, c.WriteStdin(ctx, id, procID, data, closeAfter)
	})
	return err
}

func (r *Router) WriteFile(ctx context.Context, id, path string, rd io.Reader, opts nodeapi.WriteOptions) (nodeapi.FileInfo, error) {
	return on(r, ctx, id, func(ctx context.Context, c nodeapi.Node) (nodeapi.FileInfo, error) {
		return c.WriteFile(ctx, id, path, rd, opts)
	})
}

// OpenFile opens a file on the sandbox's node; the reader fails when the
// node is lost while it is read.
func (r *Router) OpenFile(ctx context.Context, id, path string) (nodeapi.FileInfo, io.ReadCloser, error) {
	m, c, err := r.route(ctx, id)
	if err != nil {
		return nodeapi.FileInfo{}, nil, err
	}
	// The reader outlives this call: its context is cut when the node is
	// lost, and released when the reader is closed.
	rctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(m.ctx, func() { cancel(context.Cause(m.ctx)) })
	info, rc, err := c.OpenFile(rctx, id, path)
	if err != nil {
		stop()
		cancel(nil)
		if lost := context.Cause(m.ctx); lost != nil {
			return nodeapi.FileInfo{}, nil, lost
		}
		return nodeapi.FileInfo{}, nil, err
	}
	return info, &lostReader{rc: rc, m: m, release: func() { stop(); cancel(nil) }}, nil
}

// WatchDir watches a directory of a sandbox on its node. The watch
// outlives this call: it ends when the node is lost.
func (r *Router) WatchDir(ctx context.Context, id, path string, recursive bool) (nodeapi.DirWatch, error) {
	m, c, err := r.route(ctx, id)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(m.ctx, func() { cancel(context.Cause(m.ctx)) })
	w, err := c.WatchDir(wctx, id, path, recursive)
	if err != nil {
		stop()
		cancel(nil)
		if lost := context.Cause(m.ctx); lost != nil {
			return nil, lost
		}
		return nil, err
	}
	return &lostWatch{w: w, m: m, release: func() { stop(); cancel(nil) }}, nil
}

// lostWatch is a watch whose Next says when its node was lost.
type lostWatch struct {
	w       nodeapi.DirWatch
	m       *member
	release func()
}

func (l *lostWatch) Next() (nodeapi.WatchEvent, error) {
	ev, err := l.w.Next()
	if err != nil && err != io.EOF {
		if lost := context.Cause(l.m.ctx); lost != nil {
			return ev, lost
		}
	}
	return ev, err
}

func (l *lostWatch) Close() error {
	err := l.w.Close()
	l.release()
	return err
}

type lostReader struct {
	rc      io.ReadCloser
	m       *member
	release func()
}

func (l *lostReader) Read(p []byte) (int, error) {
	n, err := l.rc.Read(p)
	if err != nil && err != io.EOF {
		if lost := context.Cause(l.m.ctx); lost != nil {
			return n, lost
		}
	}
	return n, err
}

func (l *lostReader) Close() error {
	err := l.rc.Close()
	l.release()
	return err
}

// ConnectPort connects to a port of a sandbox on its node. The connection
// outlives this call: it is cut when the node is lost.
func (r *Router) ConnectPort(ctx context.Context, id string, port int) (nodeapi.PortConn, error) {
	m, c, err := r.route(ctx, id)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(m.ctx, func() { cancel(context.Cause(m.ctx)) })
	conn, err := c.ConnectPort(cctx, id, port)
	if err != nil {
		stop()
		cancel(nil)
		if lost := context.Cause(m.ctx); lost != nil {
			return nil, lost
		}
		return nil, err
	}
	return &lostPortConn{PortConn: conn, r: lostReader{rc: conn, m: m, release: func() { stop(); cancel(nil) }}}, nil
}

// lostPortConn is a port connection whose reads say when its node was lost.
type lostPortConn struct {
	nodeapi.PortConn
	r lostReader
}

func (l *lostPortConn) Read(p []byte) (int, error) { return l.r.Read(p) }
func (l *lostPortConn) Close() error               { return l.r.Close() }

func (r *Router) Stat(ctx context.Context, id, path string) (nodeapi.FileInfo, error) {
	return on(r, ctx, id, func(ctx context.Context, c nodeapi.Node) (nodeapi.FileInfo, error) { return c.Stat(ctx, id, path) })
}

func (r *Router) ListDir(ctx context.Context, id, path string) ([]nodeapi.FileInfo, error) {
	return on(r, ctx, id, func(ctx context.Context, c nodeapi.Node) ([]nodeapi.FileInfo, error) { return c.ListDir(ctx, id, path) })
}

func (r *Router) Mkdir(ctx context.Context, id, path string, opts nodeapi.MkdirOptions) (nodeapi.FileInfo, error) {
	return on(r, ctx, id, func(ctx context.Context, c nodeapi.Node) (nodeapi.FileInfo, error) {
		return c.Mkdir(ctx, id, path, opts)
	})
}

func (r *Router) Rename(ctx context.Context, id, path, target string) (nodeapi.FileInfo, error) {
	return on(r, ctx, id, func(ctx context.Context, c nodeapi.Node) (nodeapi.FileInfo, error) {
		return c.Rename(ctx, id, path, target)
	})
}

func (r *Router) Remove(ctx context.Context, id, path string, recursive bool) error {
	_, err := on(r, ctx, id, func(ctx context.Context, c nodeapi.Node) (struct{}, error) {
		return struct{}{}, c.Remove(ctx, id, path, recursive)
	})
	return err
}
