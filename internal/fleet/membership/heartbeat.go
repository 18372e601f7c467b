package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// ErrTakenOver is what Run returns when another process took the node's
// Lease: one started later with the same node id. The newest process wins;
// the older one stops renewing (and leaves the Lease to the new one), since
// two processes renewing one Lease would each look to the control plane
// like the node restarting.
var ErrTakenOver = errors.New("membership: the node's Lease was taken over by another process with its id")

// HeartbeatConfig configures a Heartbeat.
type HeartbeatConfig struct {
	// NodeID names the Lease and is its holder: unique across the
	// cluster, and a DNS-1123 subdomain. Required.
	NodeID string
	// Address is where the node's contract listens (host:port), for the
	// control plane.
	Address string
	// LeaseDuration is how long a renewal counts: a node that dies is
	// drained this long after its last renewal. Whole seconds (the
	// Lease's unit), at least 1 s. Zero means 15 s.
	LeaseDuration time.Duration
	// RenewInterval is how often the Lease is renewed. Zero means a third
	// of LeaseDuration, so that two renewals in a row may fail before it
	// expires.
	RenewInterval time.Duration
	// MinWriteInterval bounds how often capacity changes are written:
	// SetCapacity between two writes waits for the later one. A node may
	// change its capacity with every sandbox it starts, and each write is
	// an etcd write. Zero means 1 s.
	MinWriteInterval time.Duration
	// OnLapse, when set, is called on Run's goroutine when no renewal
	// succeeded for a whole lease duration, before the new incarnation's
	// first write: the control plane has counted the node expired by then
	// and ended what it ran there, which the node should end too.
	OnLapse func()
	// Logger logs renewal failures and recoveries. Nil means
	// slog.Default().
	Logger *slog.Logger
}

// Heartbeat holds a node's Lease: Run creates it and renews it until its
// context ends, then deletes it.
type Heartbeat struct {
	leases Leases
	cfg    HeartbeatConfig
	log    *slog.Logger

	mu       sync.Mutex
	capacity string        // encoded
	changed  chan struct{} // 1-buffered: SetCapacity was called
}

// NewHeartbeat returns a Heartbeat for the node cfg names, in the namespace
// of leases, starting with capacity c.
func NewHeartbeat(leases Leases, cfg HeartbeatConfig, c Capacity) (*Heartbeat, error) {
	if msgs := validation.IsDNS1123Subdomain(cfg.NodeID); len(msgs) > 0 {
		return nil, fmt.Errorf("membership: node id %q: %v", cfg.NodeID, msgs)
	}
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration = 15 * time.Second
	}
	if cfg.LeaseDuration < time.Second || cfg.LeaseDuration%time.Second != 0 {
		return nil, fmt.Errorf("membership: lease duration %v is not a whole number of seconds (at least 1)", cfg.LeaseDuration)
	}
	if cfg.RenewInterval == 0 {
		cfg.RenewInterval = cfg.LeaseDuration / 3
	}
	if cfg.RenewInterval <= 0 || cfg.RenewInterval >= cfg.LeaseDuration {
		return nil, fmt.Errorf("membership: renew interval %v is not within the lease duration %v", cfg.RenewInterval, cfg.LeaseDuration)
	}
	if cfg.MinWriteInterval == 0 {
		cfg.MinWriteInterval = min(time.Second, cfg.RenewInterval)
	}
	if cfg.MinWriteInterval < 0 || cfg.MinWriteInterval > cfg.RenewInterval {
		return nil, fmt.Errorf("membership: min write interval %v is not within the renew interval %v", cfg.MinWriteInterval, cfg.RenewInterval)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	enc, err := c.encode()
	if err != nil {
		return nil, err
	}
	return &Heartbeat{
		leases:   leases,
		cfg:      cfg,
		log:      cfg.Logger.With("node", cfg.NodeID),
		capacity: enc,
		changed:  make(chan struct{}, 1),
	}, nil
}

// SetCapacity makes the next write carry c, and makes it come early (but
// no sooner than MinWriteInterval after the previous one). It returns an
// error, and changes nothing, when c is over MaxCapacityBytes.
func (h *Heartbeat) SetCapacity(c Capacity) error {
	enc, err := c.encode()
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.capacity = enc
	h.mu.Unlock()
	select {
	case h.changed <- struct{}{}:
	default:
	}
	return nil
}

// Run takes the node's Lease and renews it every RenewInterval until ctx
// ends; then it deletes the Lease, so that the node leaves at once, and
// returns nil (or why the delete failed: the Lease then expires on its own).
//
// Renewals are updates conditional on the resourceVersion last written, so
// nothing another writer did is overwritten unseen. A failed renewal (the
// apiserver restarting, a network error) is retried with backoff, up to
// RenewInterval apart, for as long as ctx lasts. When no renewal succeeded
// for a whole lease duration, the control plane may have counted the node
// expired and drained it: the next write then starts a new incarnation (a
// new acquireTime), which the Watcher reports as the node having restarted.
//
// The Lease is taken at the start whatever it holds: it is named after
// this node, so an existing one was left by a previous process of it (one
// that was killed). Run returns ErrTakenOver, without deleting the Lease,
// when a later process takes it in turn.
func (h *Heartbeat) Run(ctx context.Context) error {
	s := &holder{h: h, acquired: now()}
	retryMin := min(500*time.Millisecond, h.cfg.RenewInterval/4)
	var (
		lastWrite time.Time // start of the last successful write
		delay     time.Duration
		failures  int
	)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return s.leave()
		case <-h.changed:
			// Write early, but not more often than MinWriteInterval.
			if failures == 0 {
				wait := time.Until(lastWrite.Add(h.cfg.MinWriteInterval))
				timer.Reset(max(0, wait))
			}
			continue
		case <-timer.C:
		}

		start := time.Now()
		if !lastWrite.IsZero() && start.Sub(lastWrite) >= h.cfg.LeaseDuration {
			s.newIncarnation()
			h.log.Warn("membership: no renewal for a whole lease duration; taking the Lease as a new incarnation", "since", lastWrite)
			lastWrite = time.Time{}
			if h.cfg.OnLapse != nil {
				h.cfg.OnLapse()
			}
		}
		err := s.write(ctx)
		switch {
		case err == nil:
			if failures > 0 {
				h.log.Info("membership: Lease renewed again", "failures", failures)
			}
			lastWrite, delay, failures = start, 0, 0
			timer.Reset(h.cfg.RenewInterval)
		case errors.Is(err, ErrTakenOver):
			h.log.Error("membership: stopping", "err", err)
			return err
		case ctx.Err() != nil:
			return s.leave()
		default:
			failures++
			if failures == 1 {
				h.log.Warn("membership: renewing the Lease failed; retrying", "err", err)
			} else {
				h.log.Debug("membership: renewing the Lease failed again", "err", err, "failures", failures)
			}
			delay = min(max(2*delay, retryMin), h.cfg.RenewInterval)
			// ±20 %, so that nodes an outage hit together do not
			// return together.
			timer.Reset(time.Duration(float64(delay) * (0.8 + 0.4*rand.Float64())))
		}
	}
}

// now is the time written into a Lease, to the microsecond: a MicroTime
// travels as such in JSON, so a time read back compares equal to the one
// written only once truncated.
func now() metav1.MicroTime {
	return metav1.NewMicroTime(time.Now().Truncate(time.Microsecond))
}

// holder is one Run's state.
type holder struct {
	h        *Heartbeat
	acquired metav1.MicroTime      // this incarnation's acquireTime
	earlier  []metav1.MicroTime    // this Run's earlier ones (lapses)
	held     bool                  // a write of this Run succeeded: it took the Lease
	cur      *coordinationv1.Lease // the Lease as last written or read; nil: unknown
}

// newIncarnation starts a new incarnation after a lapse.
func (s *holder) newIncarnation() {
	s.earlier = append(s.earlier, s.acquired)
	s.acquired = now()
}

// ours reports whether l was last written by this Run, in any of its
// incarnations: a write cut short may have landed unseen before a lapse.
func (s *holder) ours(l *coordinationv1.Lease) bool {
	if heldBy(l, s.h.cfg.NodeID, s.acquired) {
		return true
	}
	for _, a := range s.earlier {
		if heldBy(l, s.h.cfg.NodeID, a) {
			return true
		}
	}
	return false
}

// write writes the Lease once: a renewal of the Lease last written, or its
// creation, or a takeover of one a previous process left.
func (s *holder) write(ctx context.Context) error {
	h := s.h
	// A write that hangs for half a lease duration is abandoned, so that
	// a retry still fits before the Lease expires.
	ctx, cancel := context.WithTimeout(ctx, max(h.cfg.RenewInterval, h.cfg.LeaseDuration/2))
	defer cancel()
	// A conflict or a missing Lease is not a failure to back off from:
	// read again and write at once, a few times.
	for range 3 {
		if s.cur == nil {
			got, err := h.leases.Get(ctx, h.cfg.NodeID, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: h.cfg.NodeID}}
				s.fill(l)
				created, err := h.leases.Create(ctx, l, metav1.CreateOptions{})
				if apierrors.IsAlreadyExists(err) {
					continue
				}
				if err != nil {
					return fmt.Errorf("membership: creating Lease %s: %w", h.cfg.NodeID, err)
				}
				s.cur, s.held = created, true
				return nil
			case err != nil:
				return fmt.Errorf("membership: reading Lease %s: %w", h.cfg.NodeID, err)
			}
			s.cur = got
		}
		l := s.cur.DeepCopy()
		s.fill(l)
		updated, err := h.leases.Update(ctx, l, metav1.UpdateOptions{})
		switch {
		case apierrors.IsConflict(err):
			// Someone wrote the Lease since. Before this Run first
			// took it, that may be the previous process (still
			// renewing): take it all the same. After, it was another
			// process of this node, a newer one.
			got, gerr := h.leases.Get(ctx, h.cfg.NodeID, metav1.GetOptions{})
			if gerr == nil && s.held && !s.ours(got) {
				s.cur = nil
				return fmt.Errorf("%w (acquired %v)", ErrTakenOver, acquireTime(got))
			}
			s.cur = nil
			continue
		case apierrors.IsNotFound(err):
			s.cur = nil // deleted meanwhile: create it again
			continue
		case err != nil:
			return fmt.Errorf("membership: renewing Lease %s: %w", h.cfg.NodeID, err)
		}
		s.cur, s.held = updated, true
		return nil
	}
	return fmt.Errorf("membership: Lease %s keeps changing under its writes", h.cfg.NodeID)
}

// fill sets what the node writes into l: its holder, duration, times,
// label, address and capacity. A new incarnation counts a transition.
func (s *holder) fill(l *coordinationv1.Lease) {
	h := s.h
	h.mu.Lock()
	capacity := h.capacity
	h.mu.Unlock()
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[LabelRole] = RoleNode
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[AnnotationAddress] = h.cfg.Address
	l.Annotations[AnnotationCapacity] = capacity
	if !heldBy(l, h.cfg.NodeID, s.acquired) {
		var n int32
		if l.Spec.LeaseTransitions != nil {
			n = *l.Spec.LeaseTransitions
			if l.Spec.AcquireTime != nil {
				n++ // a previous incarnation held it
			}
		}
		l.Spec.LeaseTransitions = &n
	}
	id := h.cfg.NodeID
	secs := int32(h.cfg.LeaseDuration / time.Second)
	acquired, renewed := s.acquired, now()
	l.Spec.HolderIdentity = &id
	l.Spec.LeaseDurationSeconds = &secs
	l.Spec.AcquireTime = &acquired
	l.Spec.RenewTime = &renewed
}

// heldBy reports whether l is held by the incarnation of node id that
// acquired it at acquired.
func heldBy(l *coordinationv1.Lease, id string, acquired metav1.MicroTime) bool {
	s := l.Spec
	return s.HolderIdentity != nil && *s.HolderIdentity == id && s.AcquireTime != nil && s.AcquireTime.Equal(&acquired)
}

func acquireTime(l *coordinationv1.Lease) time.Time {
	if l.Spec.AcquireTime == nil {
		return time.Time{}
	}
	return l.Spec.AcquireTime.Time
}

// leave deletes the Lease if this incarnation holds it: conditional on the
// resourceVersion last written, and read again when that is unknown or
// stale (a write that ctx cut short may have landed all the same). A Lease
// another process took over stays. ctx has ended already: the delete gets
// a few seconds of its own.
func (s *holder) leave() error {
	h := s.h
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cur := s.cur
	for range 3 {
		if cur == nil {
			got, err := h.leases.Get(ctx, h.cfg.NodeID, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				return nil // never written
			case err != nil:
				return fmt.Errorf("membership: reading Lease %s to delete it (it expires in %v): %w", h.cfg.NodeID, h.cfg.LeaseDuration, err)
			case !s.ours(got):
				h.log.Info("membership: stopped; the Lease is not this process's, left in place")
				return nil
			}
			cur = got
		}
		uid, rv := cur.UID, cur.ResourceVersion
		err := h.leases.Delete(ctx, cur.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
		switch {
		case err == nil || apierrors.IsNotFound(err):
			h.log.Info("membership: left (Lease deleted)")
			return nil
		case apierrors.IsConflict(err):
			cur = nil // written since: by whom?
		default:
			return fmt.Errorf("membership: deleting Lease %s (it expires in %v): %w", h.cfg.NodeID, h.cfg.LeaseDuration, err)
		}
	}
	return fmt.Errorf("membership: Lease %s keeps changing under its delete", h.cfg.NodeID)
}
