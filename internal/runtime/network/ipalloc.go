package network

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
)

// errPoolExhausted is returned when every /30 of the pool is in use.
var errPoolExhausted = errors.New("outbound address pool exhausted")

// ipAllocator hands out the /30 blocks of an IPv4 pool: one per outbound
// sandbox, .1 for the host end of its link and .2 for the sandbox end.
type ipAllocator struct {
	base netip.Addr // first address of the pool

	mu   sync.Mutex
	used []bool // by block index
	next int    // where the search for a free block starts
}

func newIPAllocator(pool netip.Prefix) (*ipAllocator, error) {
	pool = pool.Masked()
	if !pool.Addr().Is4() || pool.Bits() > 30 {
		return nil, fmt.Errorf("outbound pool %s: want an IPv4 prefix of /30 or larger", pool)
	}
	return &ipAllocator{base: pool.Addr(), used: make([]bool, 1<<(30-pool.Bits()))}, nil
}

// allocate returns a free block and its index.
func (a *ipAllocator) allocate() (int, netip.Prefix, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := len(a.used)
	for i := range n {
		idx := (a.next + i) % n
		if !a.used[idx] {
			a.used[idx] = true
			a.next = (idx + 1) % n
			return idx, a.block(idx), nil
		}
	}
	return 0, netip.Prefix{}, errPoolExhausted
}

// release frees block idx. Releasing a free block is a no-op.
func (a *ipAllocator) release(idx int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if idx >= 0 && idx < len(a.used) {
		a.used[idx] = false
	}
}

// block returns the /30 with index idx.
func (a *ipAllocator) block(idx int) netip.Prefix {
	b := a.base.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(idx) * 4
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), 30)
}

// hostAddr and guestAddr are the two usable addresses of a /30.
func hostAddr(p netip.Prefix) netip.Addr  { return p.Addr().Next() }
func guestAddr(p netip.Prefix) netip.Addr { return p.Addr().Next().Next() }
