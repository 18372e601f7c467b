package namespaces

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Outbound networking: each sandbox gets a veth pair, eth0 inside with the
// .2 of a /30 from the pool and a default route to the .1 on the host end
// ("evb<N>"). Host-wide iptables chains, installed once and matching every
// evb+ interface, NAT the pool to the outside and filter it: no traffic to
// the host itself, none between sandboxes, none into sandboxes that they
// did not start, no spoofed sources, and no destinations in EgressDeny
// except DNS to the configured resolvers.

const (
	hostIfPrefix = "evb"
	linkAlias    = "evalbox:" // + cgroup parent + ":" + sandbox id, on the host end
	chainFwd     = "EVALBOX-FWD"
	chainIn      = "EVALBOX-IN"
	chainNAT     = "EVALBOX-NAT"
)

// defaultPool is the default outbound address pool.
var defaultPool = netip.MustParsePrefix("10.200.0.0/16")

// specialRanges are the IPv4 ranges an outbound sandbox may not reach by
// default: "this network", RFC 1918, CGNAT, loopback, link-local (cloud
// metadata), IETF protocol assignments, benchmarking, multicast, reserved.
var specialRanges = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("240.0.0.0/4"),
}

type network struct {
	// alias prefixes the alias of this runtime's host links, so that
	// runtimes of other evalbox instances on the host are never swept.
	alias string
	pool  netip.Prefix
	alloc *ipAllocator
	dns   []netip.Addr
	deny  []netip.Prefix // nil: specialRanges + host subnets
	log   *slog.Logger

	rulesMu sync.Mutex
	rulesOK bool
}

// netLease is one sandbox's share of the outbound network.
type netLease struct {
	idx    int
	block  netip.Prefix
	hostIf string
}

func newNetwork(cfg Config) (*network, error) {
	pool := cfg.OutboundPool
	if !pool.IsValid() {
		pool = defaultPool
	}
	alloc, err := newIPAllocator(pool)
	if err != nil {
		return nil, err
	}
	n := &network{alias: linkAlias + cfg.CgroupParent + ":", pool: pool.Masked(), alloc: alloc, dns: cfg.DNS, deny: cfg.EgressDeny, log: cfg.Logger}
	if n.log == nil {
		n.log = slog.Default()
	}
	if n.dns == nil {
		n.dns = hostResolvers()
	}
	return n, nil
}

// hostResolvers returns the host's IPv4 nameservers that a sandbox can
// reach (not loopback), from /etc/resolv.conf or, when that only names a
// local stub, from systemd-resolved's upstream list.
func hostResolvers() []netip.Addr {
	for _, p := range []string{"/etc/resolv.conf", "/run/systemd/resolve/resolv.conf"} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var out []netip.Addr
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) < 2 || f[0] != "nameserver" {
				continue
			}
			a, err := netip.ParseAddr(f[1])
			if err == nil && a.Is4() && !a.IsLoopback() && !a.IsUnspecified() {
				out = append(out, a)
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	return nil
}

// resolvConf is the /etc/resolv.conf of outbound sandboxes.
func (n *network) resolvConf() string {
	if len(n.dns) == 0 {
		return "# evalbox: no DNS resolver is reachable from this sandbox\n"
	}
	var b strings.Builder
	for _, a := range n.dns {
		b.WriteString("nameserver " + a.String() + "\n")
	}
	return b.String()
}

// attach creates the veth pair of sandbox id whose init process is pid,
// configures both ends and the sandbox's default route.
func (n *network) attach(ctx context.Context, id string, pid int) (_ *netLease, retErr error) {
	if err := n.ensureRules(ctx); err != nil {
		return nil, err
	}
	var l *netLease
	for attempt := 0; l == nil; attempt++ {
		idx, block, err := n.alloc.allocate()
		if err != nil {
			return nil, err
		}
		name := hostIfPrefix + strconv.Itoa(idx)
		veth := &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: name},
			PeerName:      guestIface,
			PeerNamespace: netlink.NsPid(pid),
		}
		err = netlink.LinkAdd(veth)
		switch {
		case err == nil:
			l = &netLease{idx: idx, block: block, hostIf: name}
		case errors.Is(err, unix.EEXIST) && attempt < 3:
			// A link of an earlier run (Sweep removes those): leave the
			// block marked as used and take another.
			n.log.Warn("namespaces: veth name taken, skipping its block", "link", name)
		default:
			n.alloc.release(idx)
			return nil, fmt.Errorf("create veth %s: %w", name, err)
		}
	}
	defer func() {
		if retErr != nil {
			n.detach(l)
		}
	}()
	host, err := netlink.LinkByName(l.hostIf)
	if err != nil {
		return nil, err
	}
	if err := netlink.LinkSetAlias(host, n.alias+id); err != nil {
		return nil, fmt.Errorf("alias %s: %w", l.hostIf, err)
	}
	// No IPv6 on the link (it would bypass the IPv4 rules); strict reverse
	// path filtering, so a sandbox cannot use another one's address.
	if err := writeSysctl("/proc/sys/net/ipv6/conf/"+l.hostIf+"/disable_ipv6", "1"); err != nil && !errors.Is(err, unix.ENOENT) {
		return nil, fmt.Errorf("disable ipv6 on %s: %w", l.hostIf, err)
	}
	if err := writeSysctl("/proc/sys/net/ipv4/conf/"+l.hostIf+"/rp_filter", "1"); err != nil {
		return nil, fmt.Errorf("rp_filter on %s: %w", l.hostIf, err)
	}
	if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: ipNet(hostAddr(l.block), l.block.Bits())}); err != nil {
		return nil, fmt.Errorf("address %s: %w", l.hostIf, err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return nil, fmt.Errorf("up %s: %w", l.hostIf, err)
	}

	ns, err := netns.GetFromPid(pid)
	if err != nil {
		return nil, fmt.Errorf("sandbox netns: %w", err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink in sandbox: %w", err)
	}
	defer h.Close()
	guest, err := h.LinkByName(guestIface)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", guestIface, err)
	}
	if err := h.AddrAdd(guest, &netlink.Addr{IPNet: ipNet(guestAddr(l.block), l.block.Bits())}); err != nil {
		return nil, fmt.Errorf("sandbox address: %w", err)
	}
	if err := h.LinkSetUp(guest); err != nil {
		return nil, fmt.Errorf("sandbox link up: %w", err)
	}
	gw := hostAddr(l.block).AsSlice()
	if err := h.RouteAdd(&netlink.Route{LinkIndex: guest.Attrs().Index, Gw: gw}); err != nil {
		return nil, fmt.Errorf("sandbox default route: %w", err)
	}
	return l, nil
}

// detach deletes the sandbox's veth pair (if the kernel has not already)
// and frees its addresses.
func (n *network) detach(l *netLease) {
	if link, err := netlink.LinkByName(l.hostIf); err == nil {
		if err := netlink.LinkDel(link); err != nil {
			var nf netlink.LinkNotFoundError
			if !errors.As(err, &nf) && !errors.Is(err, unix.ENODEV) {
				n.log.Error("namespaces: delete veth", "link", l.hostIf, "err", err)
			}
		}
	}
	n.alloc.release(l.idx)
}

// links returns the host ends of sandbox links, by sandbox id.
func (n *network) links() (map[string][]netlink.Link, error) {
	all, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	out := map[string][]netlink.Link{}
	for _, l := range all {
		a := l.Attrs()
		if id, ok := strings.CutPrefix(a.Alias, n.alias); ok && strings.HasPrefix(a.Name, hostIfPrefix) {
			out[id] = append(out[id], l)
		}
	}
	return out, nil
}

// ids returns the ids of sandboxes that have a link on the host.
func (n *network) ids() ([]string, error) {
	m, err := n.links()
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	return ids, nil
}

// removeID deletes the links of sandbox id (after a crash, when no lease
// is known).
func (n *network) removeID(id string) error {
	m, err := n.links()
	if err != nil {
		return err
	}
	for _, l := range m[id] {
		if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
			return fmt.Errorf("delete %s: %w", l.Attrs().Name, err)
		}
	}
	return nil
}

func (n *network) leftovers(id string) []string {
	m, err := n.links()
	if err != nil {
		return []string{"links: " + err.Error()}
	}
	var out []string
	for _, l := range m[id] {
		out = append(out, "link "+l.Attrs().Name)
	}
	return out
}

// ensureRules enables forwarding and (re)installs the host-wide evalbox
// iptables chains and the jumps to them. It runs once per Runtime, on the
// first outbound sandbox; the rules match interfaces by prefix, so no
// per-sandbox rule exists.
func (n *network) ensureRules(ctx context.Context) error {
	n.rulesMu.Lock()
	defer n.rulesMu.Unlock()
	if n.rulesOK {
		return nil
	}
	if err := writeSysctl("/proc/sys/net/ipv4/ip_forward", "1"); err != nil {
		return fmt.Errorf("enable ip_forward: %w", err)
	}
	deny := n.deny
	if deny == nil {
		var err error
		if deny, err = defaultDeny(); err != nil {
			return err
		}
	}
	rules := n.ruleset(deny)
	restore := exec.CommandContext(ctx, "iptables-restore", "--noflush", "--wait")
	restore.Stdin = strings.NewReader(rules)
	if out, err := restore.CombinedOutput(); err != nil {
		return fmt.Errorf("iptables-restore: %w: %s", err, bytes.TrimSpace(out))
	}
	for _, j := range [][]string{
		{"filter", "FORWARD", "-j", chainFwd},
		{"filter", "INPUT", "-j", chainIn},
		{"nat", "POSTROUTING", "-j", chainNAT},
	} {
		check := append([]string{"--wait", "-t", j[0], "-C", j[1]}, j[2:]...)
		if exec.CommandContext(ctx, "iptables", check...).Run() == nil {
			continue
		}
		ins := append([]string{"--wait", "-t", j[0], "-I", j[1], "1"}, j[2:]...)
		if out, err := exec.CommandContext(ctx, "iptables", ins...).CombinedOutput(); err != nil {
			return fmt.Errorf("iptables %s: %w: %s", strings.Join(ins, " "), err, bytes.TrimSpace(out))
		}
	}
	n.rulesOK = true
	return nil
}

// ruleset renders the evalbox chains for iptables-restore --noflush
// (declaring a chain flushes it, so this replaces the previous version).
func (n *network) ruleset(deny []netip.Prefix) string {
	var b strings.Builder
	w := func(f string, a ...any) { fmt.Fprintf(&b, f+"\n", a...) }
	ifs := hostIfPrefix + "+"
	w("*filter")
	w(":%s - [0:0]", chainFwd)
	w(":%s - [0:0]", chainIn)
	// Into sandboxes: only replies; nothing between sandboxes.
	w("-A %s -o %s -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT", chainFwd, ifs)
	w("-A %s -i %s -o %s -j REJECT --reject-with icmp-admin-prohibited", chainFwd, ifs, ifs)
	w("-A %s -o %s -j DROP", chainFwd, ifs)
	// Out of sandboxes.
	w("-A %s -i %s ! -s %s -j DROP", chainFwd, ifs, n.pool)
	for _, d := range n.dns {
		w("-A %s -i %s -d %s/32 -p udp --dport 53 -j ACCEPT", chainFwd, ifs, d)
		w("-A %s -i %s -d %s/32 -p tcp --dport 53 -j ACCEPT", chainFwd, ifs, d)
	}
	// Refused rather than dropped, so that a connect fails at once.
	for _, p := range deny {
		w("-A %s -i %s -d %s -j REJECT --reject-with icmp-admin-prohibited", chainFwd, ifs, p)
	}
	w("-A %s -i %s -j ACCEPT", chainFwd, ifs)
	// The host itself is off limits.
	w("-A %s -i %s -j REJECT --reject-with icmp-admin-prohibited", chainIn, ifs)
	w("COMMIT")
	w("*nat")
	w(":%s - [0:0]", chainNAT)
	w("-A %s -s %s ! -o %s -j MASQUERADE", chainNAT, n.pool, ifs)
	w("COMMIT")
	return b.String()
}

// defaultDeny is specialRanges plus every IPv4 subnet the host has an
// address in (its LANs), except sandbox links.
func defaultDeny() ([]netip.Prefix, error) {
	deny := append([]netip.Prefix(nil), specialRanges...)
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("list host addresses: %w", err)
	}
	for _, a := range addrs {
		if a.IPNet == nil || strings.HasPrefix(a.Label, hostIfPrefix) {
			continue
		}
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		if !ok {
			continue
		}
		ones, _ := a.Mask.Size()
		p := netip.PrefixFrom(ip, ones).Masked()
		covered := false
		for _, d := range deny {
			if d.Bits() <= p.Bits() && d.Contains(p.Addr()) {
				covered = true
				break
			}
		}
		if !covered {
			deny = append(deny, p)
		}
	}
	return deny, nil
}

func ipNet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, 32)}
}
