package membership

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// EventType is what happened to a node.
type EventType int

// The events a Watcher reports. NodeExpired and NodeLeft both mean the node
// is gone, and what ran on it with it: the control plane drains it on
// either.
const (
	// NodeAdded: a node is live that was not: new, back after it
	// expired, or a new incarnation of one that restarted.
	NodeAdded EventType = iota + 1
	// NodeUpdated: a live node's address or capacity changed (renewals
	// alone are not reported).
	NodeUpdated
	// NodeExpired: a live node did not renew in time, or restarted (a
	// new acquireTime: NodeAdded follows for the new incarnation).
	NodeExpired
	// NodeLeft: a live node's Lease was deleted: it stopped cleanly.
	NodeLeft
)

func (t EventType) String() string {
	switch t {
	case NodeAdded:
		return "added"
	case NodeUpdated:
		return "updated"
	case NodeExpired:
		return "expired"
	case NodeLeft:
		return "left"
	}
	return "EventType(" + strconv.Itoa(int(t)) + ")"
}

// Event is a change of a node. Node is the node as it is after an add or
// update, and as it was last seen live after an expiry or leave.
type Event struct {
	Type EventType
	Node Node
}

// WatcherConfig configures a Watcher.
type WatcherConfig struct {
	// OnEvent is called with every event, in order, from Run's goroutine.
	// It may block: events queue meanwhile, and expiries are judged late.
	// Nil means no events (Nodes still answers).
	OnEvent func(Event)
	// Logger logs Leases that are not node Leases and the informer's
	// own messages. Nil means slog.Default().
	Logger *slog.Logger
}

// Watcher follows the node Leases of a namespace and judges which nodes are
// live.
//
// Expiry is judged on the Watcher's clock, not on the renewTime a node
// writes with its own: a node is live until leaseDuration after the
// Watcher saw its last renewal (the way client-go's leader election and
// the node lifecycle controller judge), so clock skew between hosts does
// not make a dead node live nor a live one dead. A Lease seen for the first
// time (at start, after a relist) counts as renewed at its renewTime if
// that is earlier than now: a Lease a dead node left an hour ago is not
// live for another lease duration. Expiries come from a timer, not only
// from events: a dead node writes nothing.
type Watcher struct {
	leases LeaseWatcher
	cfg    WatcherConfig
	log    *slog.Logger

	synced chan struct{} // closed once the initial list is applied
	poke   chan struct{} // 1-buffered: state changed, or events are pending

	mu      sync.Mutex
	nodes   map[string]*entry
	pending []Event
}

// entry is a node Lease's state: the last node it described, when its
// renewal was seen, and whether it counts as live.
type entry struct {
	node Node
	live bool
}

// NewWatcher returns a Watcher of the node Leases that leases lists.
func NewWatcher(leases LeaseWatcher, cfg WatcherConfig) *Watcher {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Watcher{
		leases: leases,
		cfg:    cfg,
		log:    cfg.Logger,
		synced: make(chan struct{}),
		poke:   make(chan struct{}, 1),
		nodes:  map[string]*entry{},
	}
}

// Synced is closed once the Watcher has applied the namespace's Leases as
// first listed: before then, Nodes may lack nodes that are live.
func (w *Watcher) Synced() <-chan struct{} { return w.synced }

// Nodes returns the live nodes, by id.
func (w *Watcher) Nodes() []Node {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	var ns []Node
	for _, e := range w.nodes {
		if e.live && e.node.Expires.After(now) {
			ns = append(ns, e.node)
		}
	}
	slices.SortFunc(ns, func(a, b Node) int { return strings.Compare(a.ID, b.ID) })
	return ns
}

// Run watches until ctx ends, through apiserver restarts and watch
// failures (the informer lists again and resumes), and returns nil then. It
// may be called once.
func (w *Watcher) Run(ctx context.Context) error {
	klog := logr.FromSlogHandler(w.log.Handler())
	_, ctrl := cache.NewInformerWithOptions(cache.InformerOptions{
		Logger: &klog,
		ListerWatcher: &cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
				opts.LabelSelector = nodeSelector
				return w.leases.List(ctx, opts)
			},
			WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
				opts.LabelSelector = nodeSelector
				return w.leases.Watch(ctx, opts)
			},
		},
		ObjectType: &coordinationv1.Lease{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { w.observe(obj) },
			UpdateFunc: func(_, obj any) { w.observe(obj) },
			DeleteFunc: w.deleted,
		},
	})
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { ctrl.RunWithContext(ctx) })
	wg.Go(func() {
		if cache.WaitForCacheSync(ctx.Done(), ctrl.HasSynced) {
			close(w.synced)
		}
	})
	defer wg.Wait()

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		w.mu.Lock()
		next := w.expireLocked(time.Now())
		evs := w.pending
		w.pending = nil
		w.mu.Unlock()
		if w.cfg.OnEvent != nil {
			for _, e := range evs {
				w.cfg.OnEvent(e)
			}
		}
		if next.IsZero() {
			timer.Stop()
		} else {
			timer.Reset(time.Until(next))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-w.poke:
		case <-timer.C:
		}
	}
}

// observe applies a Lease as added or updated.
func (w *Watcher) observe(obj any) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	n, err := nodeFromLease(l)
	now := time.Now()
	w.mu.Lock()
	defer w.poked()
	defer w.mu.Unlock()
	prev := w.nodes[l.Name]
	if err != nil {
		// Not a Lease this package wrote (or written by a newer
		// version it cannot read): not a live node.
		w.log.Warn("membership: ignoring Lease", "lease", l.Name, "resourceVersion", l.ResourceVersion, "err", err)
		if prev != nil && prev.live {
			w.pending = append(w.pending, Event{NodeExpired, prev.node})
		}
		delete(w.nodes, l.Name)
		return
	}

	seen := now // a renewal seen now counts from now
	switch {
	case prev == nil:
		seen = minTime(now, n.RenewTime)
	case n.RenewTime.Equal(prev.node.RenewTime):
		seen = prev.node.Expires.Add(-prev.node.LeaseDuration) // not a renewal
	}
	n.Expires = seen.Add(n.LeaseDuration)
	live := n.Expires.After(now)

	wasLive := prev != nil && prev.live
	switch {
	case wasLive && live && !n.AcquireTime.Equal(prev.node.AcquireTime):
		w.pending = append(w.pending, Event{NodeExpired, prev.node}, Event{NodeAdded, n})
	case wasLive && live:
		if n.Address != prev.node.Address || !capacityEqual(n.Capacity, prev.node.Capacity) {
			w.pending = append(w.pending, Event{NodeUpdated, n})
		}
	case wasLive:
		w.pending = append(w.pending, Event{NodeExpired, prev.node})
	case live:
		w.pending = append(w.pending, Event{NodeAdded, n})
	}
	w.nodes[l.Name] = &entry{node: n, live: live}
}

// deleted applies a deleted Lease.
func (w *Watcher) deleted(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj // deleted while the watch was down
	}
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.poked()
	defer w.mu.Unlock()
	if prev := w.nodes[l.Name]; prev != nil && prev.live {
		w.pending = append(w.pending, Event{NodeLeft, prev.node})
	}
	delete(w.nodes, l.Name)
}

// poked wakes Run to deliver events and re-arm its timer.
func (w *Watcher) poked() {
	select {
	case w.poke <- struct{}{}:
	default:
	}
}

// expireLocked marks the live nodes whose time is up as expired and
// returns the next expiry to come (zero: none).
func (w *Watcher) expireLocked(now time.Time) time.Time {
	var next time.Time
	for _, e := range w.nodes {
		if !e.live {
			continue
		}
		if !e.node.Expires.After(now) {
			e.live = false
			w.pending = append(w.pending, Event{NodeExpired, e.node})
			continue
		}
		if next.IsZero() || e.node.Expires.Before(next) {
			next = e.node.Expires
		}
	}
	return next
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func capacityEqual(a, b Capacity) bool {
	return a.CPUs == b.CPUs && a.MemoryMB == b.MemoryMB && a.Pids == b.Pids && a.Free == b.Free &&
		a.Sandboxes == b.Sandboxes && slices.Equal(a.Runtimes, b.Runtimes) && slices.Equal(a.Templates, b.Templates)
}
