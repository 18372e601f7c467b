package fleet

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/evalbox/evalbox/internal/nodeapi"
)

// The node-wide calls answer for the whole fleet, as the API's admin
// endpoints show them: runtimes and templates any live node has, capacity
// summed, warm pools summed per spec.

// Runtimes lists the runtimes some live node runs, from their Leases.
func (r *Router) Runtimes(ctx context.Context) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, m := range r.members {
		for _, rt := range m.node.Capacity.Runtimes {
			if !slices.Contains(out, rt) {
				out = append(out, rt)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// TemplatesPresent returns the digests, of those given, that some live
// node holds (from their Leases).
func (r *Router) TemplatesPresent(ctx context.Context, digests []string) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, d := range digests {
		for _, m := range r.members {
			if slices.Contains(m.node.Capacity.Templates, d) {
				out = append(out, d)
				break
			}
		}
	}
	return out, nil
}

// each calls f on every live node at once and returns the answers of those
// that answered (an error only when none did and some failed).
func each[T any](r *Router, ctx context.Context, f func(context.Context, nodeapi.Node) (T, error)) ([]T, error) {
	r.mu.Lock()
	type target struct {
		m *member
		c nodeapi.Node
	}
	var ts []target
	var errs []error
	for _, m := range r.members {
		c, err := r.clientLocked(m)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ts = append(ts, target{m, c})
	}
	r.mu.Unlock()
	var mu sync.Mutex
	var out []T
	var wg sync.WaitGroup
	for _, t := range ts {
		wg.Go(func() {
			v, err := call(ctx, t.m, func(ctx context.Context) (T, error) { return f(ctx, t.c) })
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				r.log.Warn("fleet: node did not answer", "node", t.m.id, "err", err)
				errs = append(errs, err)
				return
			}
			out = append(out, v)
		})
	}
	wg.Wait()
	if len(out) == 0 && len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// Capacity sums the live nodes' capacities (MemoryAvailable is -1 when a
// node does not know its own).
func (r *Router) Capacity(ctx context.Context) (nodeapi.CapacityStatus, error) {
	all, err := each(r, ctx, func(ctx context.Context, c nodeapi.Node) (nodeapi.CapacityStatus, error) { return c.Capacity(ctx) })
	if err != nil {
		return nodeapi.CapacityStatus{}, err
	}
	var s nodeapi.CapacityStatus
	for _, c := range all {
		s.Budget.Pids += c.Budget.Pids
		s.Budget.MemoryBytes += c.Budget.MemoryBytes
		s.Reserved.Pids += c.Reserved.Pids
		s.Reserved.MemoryBytes += c.Reserved.MemoryBytes
		s.MemoryReserve += c.MemoryReserve
		if s.MemoryAvailable >= 0 {
			s.MemoryAvailable += c.MemoryAvailable
		}
		if c.MemoryAvailable < 0 {
			s.MemoryAvailable = -1
		}
		s.Sandboxes += c.Sandboxes
		s.Waiting += c.Waiting
	}
	return s, nil
}

// SetPool sets the pool on every live node, and on nodes that join later.
func (r *Router) SetPool(ctx context.Context, p nodeapi.PoolSpec) error {
	r.mu.Lock()
	r.pools[p.Spec.String()] = p
	r.mu.Unlock()
	_, err := each(r, ctx, func(ctx context.Context, c nodeapi.Node) (struct{}, error) { return struct{}{}, c.SetPool(ctx, p) })
	return err
}

// setPools sets the Router's pools on a node that joined.
func (r *Router) setPools(m *member, pools []nodeapi.PoolSpec) {
	r.mu.Lock()
	c, err := r.clientLocked(m)
	r.mu.Unlock()
	for _, p := range pools {
		if err == nil {
			_, err = call(m.ctx, m, func(ctx context.Context) (struct{}, error) { return struct{}{}, c.SetPool(ctx, p) })
		}
		if err != nil {
			r.log.Warn("fleet: setting a warm pool on a node that joined", "node", m.id, "pool", p.Spec.String(), "err", err)
			return
		}
	}
}

// Pools sums every live node's pools per spec (targets and ready).
func (r *Router) Pools(ctx context.Context) ([]nodeapi.PoolStatus, error) {
	all, err := each(r, ctx, func(ctx context.Context, c nodeapi.Node) ([]nodeapi.PoolStatus, error) { return c.Pools(ctx) })
	if err != nil {
		return nil, err
	}
	by := map[string]*nodeapi.PoolStatus{}
	for _, ps := range all {
		for _, p := range ps {
			k := p.Spec.String()
			if s := by[k]; s != nil {
				s.Target += p.Target
				s.Ready += p.Ready
				continue
			}
			by[k] = &p
		}
	}
	out := make([]nodeapi.PoolStatus, 0, len(by))
	for _, p := range by {
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b nodeapi.PoolStatus) int { return cmp.Compare(a.Spec.String(), b.Spec.String()) })
	return out, nil
}
