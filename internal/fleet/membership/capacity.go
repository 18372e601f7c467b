package membership

import (
	"encoding/json"
	"fmt"
)

// MaxCapacityBytes bounds a Capacity's JSON. The Lease is written whole at
// every renewal, so the capacity rides along in every etcd write a node
// makes: a typical one is well under 1 KiB; 64 KiB (about 900 template
// digests) is a quarter of the apiserver's 256 KiB limit on all of an
// object's annotations together, and a bound on what a node can make etcd
// carry.
const MaxCapacityBytes = 64 << 10

// Capacity is what a node tells the control plane of itself in its Lease:
// what it has, what is free, and what it holds already, for placement. The
// node and the control plane share this one definition; its JSON is the
// wire form (the Lease's AnnotationCapacity), so fields are only ever
// added, never renamed.
type Capacity struct {
	// CPUs is the host's logical CPU count.
	CPUs int `json:"cpu"`
	// MemoryMB and Pids are the budgets the node admits sandboxes against
	// (internal/node's Capacity: the host less its reserve, memory times
	// the overcommit).
	MemoryMB int64 `json:"memory_mb"`
	Pids     int64 `json:"pids"`
	// Free is what is left of those budgets now.
	Free Resources `json:"free"`
	// Runtimes are the sandbox runtimes the node serves ("gvisor",
	// "namespaces").
	Runtimes []string `json:"runtimes"`
	// Templates are the digests of the templates the node holds, so that
	// placement can prefer a node that need not fetch one.
	Templates []string `json:"templates"`
	// Sandboxes is how many sandboxes run on the node (warm pools
	// included).
	Sandboxes int `json:"sandboxes"`
}

// Resources is an amount of the resources a node budgets.
type Resources struct {
	MemoryMB int64 `json:"memory_mb"`
	Pids     int64 `json:"pids"`
}

// encode returns c's wire form, or an error when it is over
// MaxCapacityBytes.
func (c Capacity) encode() (string, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return "", fmt.Errorf("membership: capacity: %w", err)
	}
	if len(b) > MaxCapacityBytes {
		return "", fmt.Errorf("membership: capacity is %d bytes of JSON, over %d (%d templates)", len(b), MaxCapacityBytes, len(c.Templates))
	}
	return string(b), nil
}

func decodeCapacity(s string) (Capacity, error) {
	var c Capacity
	if len(s) > MaxCapacityBytes {
		return c, fmt.Errorf("membership: capacity is %d bytes, over %d", len(s), MaxCapacityBytes)
	}
	if err := json.Unmarshal([]byte(s), &c); err != nil {
		return c, fmt.Errorf("membership: capacity: %w", err)
	}
	return c, nil
}
