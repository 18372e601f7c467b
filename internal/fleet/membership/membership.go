// Package membership is how the control plane knows which node agents are
// alive, through Kubernetes rather than a protocol of evalbox's own: each node
// holds a coordination.k8s.io/v1 Lease named after it and renews it
// (Heartbeat), carrying its address and its Capacity; the control plane
// watches the namespace's Leases (Watcher) and counts a node as live only
// while its Lease is renewed in time. A node that stops cleanly deletes its
// Lease and leaves at once; one that dies (kill -9, a lost host) stops
// renewing and expires after its lease duration, which is when the control
// plane drains it.
//
// The Lease of node "n":
//
//	metadata.name                   n (a DNS-1123 subdomain)
//	metadata.labels                 evalbox.dev/role=node (the Watcher lists only these)
//	metadata.annotations            evalbox.dev/address: host:port of its node contract
//	                                evalbox.dev/capacity: its Capacity, JSON
//	spec.holderIdentity             n
//	spec.leaseDurationSeconds       how long a renewal counts
//	spec.acquireTime                when this process of the node took the Lease (its incarnation)
//	spec.renewTime                  its last renewal, on the node's clock
//
// What the package needs of the API server is the namespace's Leases, as
// client-go's typed client has them (clientset.CoordinationV1().Leases(ns)),
// and the RBAC of deploy/kubernetes/rbac.yaml.
package membership

import (
	"context"
	"errors"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// The Lease's label and annotations (see the package comment).
const (
	LabelRole          = "evalbox.dev/role"
	RoleNode           = "node"
	AnnotationAddress  = "evalbox.dev/address"
	AnnotationCapacity = "evalbox.dev/capacity"
)

// nodeSelector selects the Leases of nodes: a namespace may hold others
// (leader election, other software's).
var nodeSelector = LabelRole + "=" + RoleNode

// Leases is what a Heartbeat does with its namespace's Leases; client-go's
// LeaseInterface has it.
type Leases interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error)
	Create(ctx context.Context, lease *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error)
	Update(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// LeaseWatcher is what a Watcher does with its namespace's Leases;
// client-go's LeaseInterface has it.
type LeaseWatcher interface {
	List(ctx context.Context, opts metav1.ListOptions) (*coordinationv1.LeaseList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// Node is a node as its Lease describes it.
type Node struct {
	// ID is the node's instance id: the Lease's name and holder.
	ID string
	// Address is where its node contract listens (host:port).
	Address  string
	Capacity Capacity
	// AcquireTime is when the node's current process took its Lease;
	// another value means the node restarted (or lapsed: see
	// Heartbeat.Run), and what the previous one ran is gone. RenewTime is
	// its last renewal. Both are on the node's clock.
	AcquireTime, RenewTime time.Time
	LeaseDuration          time.Duration
	// Expires is when the Watcher counts the node expired unless it
	// renews first, on the Watcher's clock.
	Expires time.Time
}

// errNotNode is a Lease with the node label that is not a node's Lease as
// this package writes them.
var errNotNode = errors.New("membership: not a node Lease")

// nodeFromLease reads a node's Lease. Expires is left to the Watcher.
func nodeFromLease(l *coordinationv1.Lease) (Node, error) {
	s := l.Spec
	switch {
	case s.HolderIdentity == nil || *s.HolderIdentity != l.Name:
		return Node{}, fmt.Errorf("%w: holder is not %q", errNotNode, l.Name)
	case s.LeaseDurationSeconds == nil || *s.LeaseDurationSeconds <= 0:
		return Node{}, fmt.Errorf("%w: no lease duration", errNotNode)
	case s.RenewTime == nil:
		return Node{}, fmt.Errorf("%w: no renew time", errNotNode)
	}
	c, err := decodeCapacity(l.Annotations[AnnotationCapacity])
	if err != nil {
		return Node{}, fmt.Errorf("%w: %w", errNotNode, err)
	}
	n := Node{
		ID:            l.Name,
		Address:       l.Annotations[AnnotationAddress],
		Capacity:      c,
		RenewTime:     s.RenewTime.Time,
		LeaseDuration: time.Duration(*s.LeaseDurationSeconds) * time.Second,
	}
	if s.AcquireTime != nil {
		n.AcquireTime = s.AcquireTime.Time
	}
	return n, nil
}
