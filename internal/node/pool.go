package node

import (
	"context"
	"errors"
	"sort"
	"time"

	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/internal/runtime"
)

// pool keeps up to target ready sandboxes of one PoolKey. A pooled sandbox
// is handed out once and never returns to the pool: every trial starts
// from a fresh sandbox.
type pool struct {
	key    PoolKey
	name   string // the template's name, for PoolStatus
	target int
	ready  []*Sandbox // oldest first
	kick   chan struct{}
}

// SetPool sets how many ready sandboxes of key the node keeps (0 stops
// refilling; ready ones stay until claimed or Close). Refills happen in
// the background, one start at a time per pool.
func (n *Node) SetPool(key PoolKey, target int) { n.setPool(key, "", target) }

// setPool is SetPool; name (if not "") is the template's name PoolStatus
// shows.
func (n *Node) setPool(key PoolKey, name string, target int) {
	n.mu.Lock()
	p, ok := n.pools[key]
	if !ok {
		p = &pool{key: key, kick: make(chan struct{}, 1)}
		n.pools[key] = p
		n.wg.Add(1)
		go n.refill(p)
	}
	p.target = target
	if name != "" {
		p.name = name
	}
	n.mu.Unlock()
	p.poke()
}

func (p *pool) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// PoolStatus is the state of one warm pool.
type PoolStatus = nodeapi.PoolStatus

// Pools reports every warm pool, in a stable order.
func (n *Node) Pools() []PoolStatus {
	n.mu.Lock()
	out := make([]PoolStatus, 0, len(n.pools))
	for _, p := range n.pools {
		out = append(out, PoolStatus{Spec: p.key, TemplateName: p.name, Target: p.target, Ready: len(p.ready)})
	}
	n.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Spec.String() < out[j].Spec.String() })
	return out
}

// claim takes the oldest live ready sandbox of key, or returns nil.
func (n *Node) claim(key PoolKey) *Sandbox {
	n.mu.Lock()
	p, ok := n.pools[key]
	if !ok {
		n.mu.Unlock()
		return nil
	}
	var dead []*Sandbox
	var got *Sandbox
	for len(p.ready) > 0 {
		sb := p.ready[0]
		p.ready[0] = nil
		p.ready = p.ready[1:]
		select {
		case <-sb.Done():
			dead = append(dead, sb)
			continue
		default:
		}
		sb.FromPool = true
		got = sb
		break
	}
	n.mu.Unlock()
	p.poke()
	for _, sb := range dead {
		n.log.Warn("pooled sandbox died before claim", "sandbox", sb.ID)
		_ = n.destroy(context.Background(), sb)
	}
	return got
}

// refill keeps p at its target until the node closes.
func (n *Node) refill(p *pool) {
	defer n.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-n.closed
		cancel()
	}()
	backoff := time.Second
	// A refill takes only capacity that is free and that no create
	// queues for: ready sandboxes are a bet, creates come first.
	admit := func(_ context.Context, cost runtime.Resources) (func(), error) {
		return n.capacity.TryReserve(cost)
	}
	waitingLogged := false
	for {
		select {
		case <-n.closed:
			return
		case <-p.kick:
		}
		for {
			n.mu.Lock()
			need := p.target - len(p.ready)
			n.mu.Unlock()
			if need <= 0 {
				break
			}
			changed := n.capacity.Changed()
			sb, err := n.start(ctx, p.key, admit, nil)
			if errors.Is(err, ErrInsufficientCapacity) {
				if !waitingLogged {
					n.log.Warn("warm pool waits for host capacity", "pool", p.key.String(), "missing", need, "err", err)
					waitingLogged = true
				}
				// Again when capacity is given back (or MemAvailable
				// may have risen).
				select {
				case <-n.closed:
					return
				case <-changed:
				case <-time.After(time.Second):
				}
				continue
			}
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				n.log.Error("warm pool start failed", "pool", p.key.String(), "err", err, "retry_in", backoff)
				select {
				case <-n.closed:
					return
				case <-time.After(backoff):
				}
				backoff = min(backoff*2, 30*time.Second)
				continue
			}
			backoff = time.Second
			if waitingLogged {
				n.log.Info("warm pool refills again", "pool", p.key.String())
				waitingLogged = false
			}
			n.mu.Lock()
			p.ready = append(p.ready, sb)
			n.mu.Unlock()
		}
	}
}
