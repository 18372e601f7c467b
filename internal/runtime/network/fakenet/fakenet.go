// Package fakenet stands in for the internet on this machine: a network
// namespace linked to the host by a veth pair, with host routes to its
// addresses only, so that nothing sent there leaves the machine. Servers
// started in it (Do) are reached from the host, and from outbound
// sandboxes through NAT, as the internet would be. The tests of outbound
// networking (networktest) and `evalbox bench network` use it. It needs
// root.
package fakenet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	goruntime "runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Config names a fake internet's link and addresses.
type Config struct {
	// HostIf and PeerIf name the veth pair's ends (not evb*, so that no
	// sandbox rule matches them).
	HostIf, PeerIf string
	// Gateway (IPv4) and Gateway6 (IPv6, optional) are the host's
	// addresses on the link: where NAT'd and proxied connections come
	// from. Use /32 addresses outside the egress deny list's ranges.
	Gateway, Gateway6 netip.Addr
	// Addrs are the namespace's addresses (IPv4 and IPv6), each routed
	// from the host.
	Addrs []netip.Addr
}

// Net is a running fake internet.
type Net struct {
	ns     netns.NsHandle
	hostIf string
}

// New makes the namespace and its link. A link of HostIf's name that
// exists already is an error (a leftover of an earlier run).
func New(cfg Config) (_ *Net, err error) {
	if _, err := netlink.LinkByName(cfg.HostIf); err == nil {
		return nil, fmt.Errorf("fakenet: link %s exists: a leftover of an earlier run?", cfg.HostIf)
	}
	n := &Net{hostIf: cfg.HostIf}
	errc := make(chan error, 1)
	go func() {
		// The thread is never unlocked: it ends with the goroutine, and
		// its namespace with it.
		goruntime.LockOSThread()
		var err error
		n.ns, err = netns.New()
		errc <- err
	}()
	if err := <-errc; err != nil {
		return nil, fmt.Errorf("fakenet: %w", err)
	}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: cfg.HostIf}, PeerName: cfg.PeerIf,
		PeerNamespace: netlink.NsFd(int(n.ns))}); err != nil {
		return nil, fmt.Errorf("fakenet: veth: %w", err)
	}
	host, err := netlink.LinkByName(cfg.HostIf)
	if err != nil {
		return nil, fmt.Errorf("fakenet: %w", err)
	}
	h, err := netlink.NewHandleAt(n.ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("fakenet: %w", err)
	}
	defer h.Close()
	peer, err := h.LinkByName(cfg.PeerIf)
	if err != nil {
		return nil, fmt.Errorf("fakenet: %w", err)
	}
	lo, err := h.LinkByName("lo")
	if err != nil {
		return nil, fmt.Errorf("fakenet: %w", err)
	}
	steps := []error{netlink.AddrAdd(host, addr(cfg.Gateway))}
	if cfg.Gateway6.IsValid() {
		steps = append(steps, netlink.AddrAdd(host, addr(cfg.Gateway6)))
	}
	steps = append(steps, netlink.LinkSetUp(host), h.LinkSetUp(peer), h.LinkSetUp(lo),
		h.RouteAdd(&netlink.Route{LinkIndex: peer.Attrs().Index, Dst: prefix(cfg.Gateway), Scope: netlink.SCOPE_LINK}))
	if cfg.Gateway6.IsValid() {
		steps = append(steps, h.RouteAdd(&netlink.Route{LinkIndex: peer.Attrs().Index, Dst: prefix(cfg.Gateway6), Scope: netlink.SCOPE_LINK}))
	}
	for _, a := range cfg.Addrs {
		steps = append(steps, h.AddrAdd(peer, addr(a)),
			netlink.RouteAdd(&netlink.Route{LinkIndex: host.Attrs().Index, Dst: prefix(a), Scope: netlink.SCOPE_LINK}))
	}
	if err := errors.Join(steps...); err != nil {
		return nil, fmt.Errorf("fakenet: %w", err)
	}
	return n, nil
}

// Do runs f on a thread in the namespace, then puts the thread back:
// sockets that f opens belong to the namespace (and stay there after).
func (n *Net) Do(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(n.ns); err != nil {
			errc <- err
			return
		}
		ferr := f()
		if err := netns.Set(orig); err != nil {
			// The thread stays locked and dies with the goroutine.
			errc <- errors.Join(ferr, err)
			return
		}
		goruntime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Close deletes the link (its peer goes with it) and the namespace.
func (n *Net) Close() error {
	var err error
	if l, lerr := netlink.LinkByName(n.hostIf); lerr == nil {
		err = netlink.LinkDel(l)
	}
	if n.ns.IsOpen() {
		err = errors.Join(err, n.ns.Close())
	}
	return err
}

// addr is a /32, or a /128 without duplicate address detection (usable at
// once).
func addr(a netip.Addr) *netlink.Addr {
	if a.Is6() {
		return &netlink.Addr{IPNet: prefix(a), Flags: unix.IFA_F_NODAD}
	}
	return &netlink.Addr{IPNet: prefix(a)}
}

func prefix(a netip.Addr) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}
}
