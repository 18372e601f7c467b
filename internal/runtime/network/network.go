// Package network gives sandboxes of every runtime driver "outbound"
// networking: NAT'd IPv4 egress through the host, no inbound connections,
// and no traffic to the host itself, to other sandboxes or to private and
// special address ranges.
//
// Each outbound sandbox gets a veth pair: eth0 inside its network
// namespace with the .2 of a /30 from the pool and a default route to the
// .1 on the host end ("evb<N>"). Host-wide iptables chains, installed once
// per Manager on the first Attach and matching every evb+ interface, NAT
// the pool to the outside and filter it: no traffic to the host itself,
// none between sandboxes, none into sandboxes that they did not start, no
// spoofed sources (rp_filter on each link), and no destinations in
// Config.EgressDeny except DNS to the configured resolvers. Attach sets
// net.ipv4.ip_forward=1 on the host; the chains stay in place when the
// process stops (other evalbox instances on the host use them too). IPv6
// is off on the host end of every link.
//
// One Manager owns the address pool: every driver of a process must use
// the same Manager (each through its own Links, see Manager.Links), so
// that no two sandboxes get the same /30. Host links carry an alias naming
// the Manager's scope (one per evalbox instance), the driver and the
// sandbox, so that Sweep after a restart finds exactly its own links and
// never those of another driver or instance.
package network

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
	"strconv"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

const (
	// HostIfPrefix starts the name of the host end of every sandbox link.
	HostIfPrefix = "evb"
	// GuestIface is the name of the sandbox end of its link.
	GuestIface = "eth0"
	// aliasPrefix + scope + ":" + driver + ":" + sandbox id is the alias
	// of a sandbox's host link.
	aliasPrefix = "evalbox:"
)

// The host-wide iptables chains (filter FORWARD and INPUT, nat POSTROUTING
// jump to them).
const (
	ChainFwd = "EVALBOX-FWD"
	ChainIn  = "EVALBOX-IN"
	ChainNAT = "EVALBOX-NAT"
)

// DefaultPool is the default outbound address pool.
var DefaultPool = netip.MustParsePrefix("10.200.0.0/16")

// Config configures a Manager.
type Config struct {
	// Scope names the evalbox instance on the host (e.g. a hash of its
	// data dir); it is part of every link alias. [A-Za-z0-9._-], at most
	// 64 characters.
	Scope string
	// Pool is the IPv4 range from which outbound sandboxes get their /30
	// links; default DefaultPool.
	Pool netip.Prefix
	// DNS are the resolvers written to an outbound sandbox's
	// /etc/resolv.conf (ResolvConf) and allowed through the egress filter
	// (port 53). Nil means the host's non-loopback IPv4 nameservers; an
	// empty non-nil slice means none.
	DNS []netip.Addr
	// EgressDeny are the destinations an outbound sandbox may not reach
	// (except DNS above). Nil means the default: SpecialRanges plus every
	// IPv4 subnet the host is attached to (when the rules are installed).
	// Traffic to the host itself is always refused.
	EgressDeny []netip.Prefix
	// LinkPrefix and ChainPrefix name the Manager's host-wide objects: the
	// host ends of its links are <LinkPrefix><N> (default HostIfPrefix,
	// at most 8 lowercase letters) and its chains <ChainPrefix>-FWD, -IN
	// and -NAT (default "EVALBOX": ChainFwd, ChainIn, ChainNAT; at most 20
	// of A-Z, 0-9 and -), whose rules match its links only. Every evalbox
	// server uses the defaults and shares them, since the rules depend
	// only on the host. A Manager with another pool, resolvers or deny
	// list (a test) must use its own names: installing its rules under
	// the shared names would replace those of every server on the host.
	LinkPrefix  string
	ChainPrefix string
	// Upstream are the resolvers the egress resolver of rules sandboxes
	// asks (nil: DNS, on port 53).
	Upstream []netip.AddrPort
	// AllowPrivate are ranges of the deny list that sandboxes may reach
	// all the same (an operator's choice, serve --allow-private): for
	// outbound sandboxes, and for rules sandboxes whose rules allow them.
	// They never open the host itself or other sandboxes.
	AllowPrivate []netip.Prefix
	// Logger receives operational logs; default slog.Default().
	Logger *slog.Logger
}

// Manager owns the outbound address pool and the host-wide rules. It is
// safe for concurrent use.
type Manager struct {
	scope string
	pool  netip.Prefix
	alloc *ipAllocator
	dns   []netip.Addr
	deny  []netip.Prefix // nil: SpecialRanges + host subnets
	log   *slog.Logger
	// linkPrefix starts the names of its host links; chainFwd, chainIn
	// and chainNAT are its chains (Config.LinkPrefix, Config.ChainPrefix).
	linkPrefix                  string
	chainFwd, chainIn, chainNAT string
	// chainProxy (nat, from PREROUTING) and chainRules (filter, from
	// chainFwd) hold the jumps to the per-sandbox chains of rules
	// sandboxes (egress.go), whose names they start.
	chainProxy, chainRules string
	upstream               []netip.AddrPort
	allowPrivate           []netip.Prefix

	rulesMu sync.Mutex
	rulesOK bool
	// denyInUse is the deny list installed (Config.EgressDeny or the
	// default), once the rules are.
	denyInUse []netip.Prefix

	gwMu   sync.Mutex
	gw     *gateway // the egress proxy and resolver, from the first rules sandbox
	closed bool
}

// New returns a Manager. It changes nothing on the host: the rules are
// installed by the first Attach.
func New(cfg Config) (*Manager, error) {
	if !validName(cfg.Scope) {
		return nil, fmt.Errorf("network: invalid scope %q", cfg.Scope)
	}
	pool := cfg.Pool
	if !pool.IsValid() {
		pool = DefaultPool
	}
	alloc, err := newIPAllocator(pool)
	if err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	linkPrefix, chainPrefix := cfg.LinkPrefix, cfg.ChainPrefix
	if linkPrefix == "" {
		linkPrefix = HostIfPrefix
	}
	if chainPrefix == "" {
		chainPrefix = "EVALBOX"
	}
	if !validLinkPrefix(linkPrefix) || !validChainPrefix(chainPrefix) {
		return nil, fmt.Errorf("network: invalid link or chain prefix %q, %q", linkPrefix, chainPrefix)
	}
	for _, p := range cfg.AllowPrivate {
		if err := CheckAllowPrivate(p); err != nil {
			return nil, fmt.Errorf("network: allow-private: %w", err)
		}
	}
	m := &Manager{scope: cfg.Scope, pool: pool.Masked(), alloc: alloc, dns: cfg.DNS, deny: cfg.EgressDeny, log: cfg.Logger,
		linkPrefix: linkPrefix, chainFwd: chainPrefix + "-FWD", chainIn: chainPrefix + "-IN", chainNAT: chainPrefix + "-NAT",
		chainProxy: chainPrefix + "-PX", chainRules: chainPrefix + "-SB", upstream: cfg.Upstream, allowPrivate: cfg.AllowPrivate}
	if m.log == nil {
		m.log = slog.Default()
	}
	if m.dns == nil {
		m.dns = hostResolvers()
	}
	if m.upstream == nil {
		for _, a := range m.dns {
			m.upstream = append(m.upstream, netip.AddrPortFrom(a, 53))
		}
	}
	return m, nil
}

// Close stops the egress proxy and resolver (when rules sandboxes started
// them), cutting their connections. Sandboxes keep their links; call it
// after destroying them.
func (m *Manager) Close() error {
	m.gwMu.Lock()
	g := m.gw
	m.gw, m.closed = nil, true
	m.gwMu.Unlock()
	if g != nil {
		g.close()
	}
	return nil
}

// validName reports whether s is a usable scope or driver name.
func validName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '.' && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

func validLinkPrefix(s string) bool {
	if s == "" || len(s) > 8 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 'a' || s[i] > 'z' {
			return false
		}
	}
	return true
}

func validChainPrefix(s string) bool {
	if s == "" || len(s) > 20 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

// Chains returns the Manager's host-wide iptables chains as table and
// chain name, and the chain that jumps to each (a built-in one, but for
// the rules chain, jumped to from the FWD chain).
func (m *Manager) Chains() [][3]string {
	return [][3]string{{"filter", "FORWARD", m.chainFwd}, {"filter", "INPUT", m.chainIn}, {"nat", "POSTROUTING", m.chainNAT},
		{"nat", "PREROUTING", m.chainProxy}, {"filter", m.chainFwd, m.chainRules}}
}

// ChainPrefixes returns the prefixes of the per-sandbox chains of rules
// sandboxes ("<prefix>-PX-" in nat, "<prefix>-SB-" in filter).
func (m *Manager) ChainPrefixes() [][2]string {
	return [][2]string{{"nat", m.chainProxy + "-"}, {"filter", m.chainRules + "-"}}
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

// ResolvConf is the /etc/resolv.conf of outbound sandboxes.
func (m *Manager) ResolvConf() string {
	if len(m.dns) == 0 {
		return "# evalbox: no DNS resolver is reachable from this sandbox\n"
	}
	var b strings.Builder
	for _, a := range m.dns {
		b.WriteString("nameserver " + a.String() + "\n")
	}
	return b.String()
}

// Links returns the view of one driver on the Manager: the links it
// attaches, finds and removes are told apart from other drivers' by their
// alias. driver follows the rules of Config.Scope.
func (m *Manager) Links(driver string) (*Links, error) {
	if !validName(driver) {
		return nil, fmt.Errorf("network: invalid driver name %q", driver)
	}
	return &Links{m: m, alias: aliasPrefix + m.scope + ":" + driver + ":"}, nil
}

// Links attaches sandboxes of one driver to the outbound network.
type Links struct {
	m *Manager
	// alias prefixes the alias of this driver's host links.
	alias string
}

// Lease is one sandbox's share of the outbound network: its /30 and the
// host end of its link.
type Lease struct {
	id     string
	idx    int
	block  netip.Prefix
	hostIf string

	// mu serialises SetEgress and Detach: egress is set once the
	// sandbox has chains and the gateway's state (rules, maybe lifted),
	// detached once Detach began (no SetEgress succeeds after).
	mu       sync.Mutex
	egress   bool
	detached bool
}

// maxTakenLinks is how many taken link names an Attach skips before it
// gives up (each skipped block stays marked used).
const maxTakenLinks = 1024

// HostLink is the name of the host end of the sandbox's link.
func (l *Lease) HostLink() string { return l.hostIf }

// Prefix is the sandbox's /30.
func (l *Lease) Prefix() netip.Prefix { return l.block }

// HostAddr is the host end's address (the sandbox's gateway).
func (l *Lease) HostAddr() netip.Addr { return hostAddr(l.block) }

// GuestAddr is the sandbox's address.
func (l *Lease) GuestAddr() netip.Addr { return guestAddr(l.block) }

// Attach installs the host rules if needed, then creates the veth pair of
// sandbox id with its GuestIface end in the network namespace ns, gives
// both ends their addresses, brings them up and adds the sandbox's default
// route. It does not touch lo or the guest end's sysctls. On error nothing
// of the link is left. ns stays open (the caller closes it).
func (l *Links) Attach(ctx context.Context, id string, ns netns.NsHandle) (_ *Lease, retErr error) {
	m := l.m
	if err := m.ensureRules(ctx); err != nil {
		return nil, err
	}
	var lease *Lease
	for attempt := 0; lease == nil; attempt++ {
		idx, block, err := m.alloc.allocate()
		if err != nil {
			return nil, err
		}
		name := m.linkPrefix + strconv.Itoa(idx)
		veth := &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: name},
			PeerName:      GuestIface,
			PeerNamespace: netlink.NsFd(int(ns)),
		}
		err = netlink.LinkAdd(veth)
		switch {
		case err == nil:
			lease = &Lease{id: id, idx: idx, block: block, hostIf: name}
		case errors.Is(err, unix.EEXIST) && attempt < maxTakenLinks:
			// A link of an earlier run or of another instance (Sweep
			// removes the former): leave the block marked as used and
			// take another. Another server on the host holds a run of
			// them (its own allocator counts from the same start), so
			// many may be taken in a row.
			m.log.Warn("network: veth name taken, skipping its block", "link", name)
		default:
			m.alloc.release(idx)
			return nil, fmt.Errorf("create veth %s: %w", name, err)
		}
	}
	defer func() {
		if retErr != nil {
			l.Detach(lease)
		}
	}()
	if err := m.dropStaleChains(ctx, lease.idx, lease.hostIf); err != nil {
		return nil, err
	}
	host, err := netlink.LinkByName(lease.hostIf)
	if err != nil {
		return nil, err
	}
	if err := netlink.LinkSetAlias(host, l.alias+id); err != nil {
		return nil, fmt.Errorf("alias %s: %w", lease.hostIf, err)
	}
	// No IPv6 on the link (it would bypass the IPv4 rules); strict reverse
	// path filtering, so a sandbox cannot use another one's address.
	if err := writeSysctl("/proc/sys/net/ipv6/conf/"+lease.hostIf+"/disable_ipv6", "1"); err != nil && !errors.Is(err, unix.ENOENT) {
		return nil, fmt.Errorf("disable ipv6 on %s: %w", lease.hostIf, err)
	}
	if err := writeSysctl("/proc/sys/net/ipv4/conf/"+lease.hostIf+"/rp_filter", "1"); err != nil {
		return nil, fmt.Errorf("rp_filter on %s: %w", lease.hostIf, err)
	}
	if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: ipNet(hostAddr(lease.block), lease.block.Bits())}); err != nil {
		return nil, fmt.Errorf("address %s: %w", lease.hostIf, err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return nil, fmt.Errorf("up %s: %w", lease.hostIf, err)
	}

	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink in sandbox: %w", err)
	}
	defer h.Close()
	guest, err := h.LinkByName(GuestIface)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", GuestIface, err)
	}
	if err := h.AddrAdd(guest, &netlink.Addr{IPNet: ipNet(guestAddr(lease.block), lease.block.Bits())}); err != nil {
		return nil, fmt.Errorf("sandbox address: %w", err)
	}
	if err := h.LinkSetUp(guest); err != nil {
		return nil, fmt.Errorf("sandbox link up: %w", err)
	}
	gw := hostAddr(lease.block).AsSlice()
	if err := h.RouteAdd(&netlink.Route{LinkIndex: guest.Attrs().Index, Gw: gw}); err != nil {
		return nil, fmt.Errorf("sandbox default route: %w", err)
	}
	return lease, nil
}

// Detach deletes the sandbox's veth pair (unless it is already gone) and
// frees its /30. A link of that name that is no longer the sandbox's
// (removed by RemoveID, then reused by another instance) is left alone.
// Detaching twice is harmless.
func (l *Links) Detach(lease *Lease) {
	lease.mu.Lock()
	had := lease.egress
	lease.egress, lease.detached = false, true
	lease.mu.Unlock()
	if had {
		if g := l.m.gatewayIfStarted(); g != nil {
			g.remove(lease.GuestAddr(), true)
		}
		if err := l.m.removeSandboxChains(context.Background(), lease.idx); err != nil {
			l.m.log.Error("network: remove a sandbox's egress chains", "link", lease.hostIf, "err", err)
		}
	}
	if link, err := netlink.LinkByName(lease.hostIf); err == nil && link.Attrs().Alias == l.alias+lease.id {
		if err := netlink.LinkDel(link); err != nil {
			var nf netlink.LinkNotFoundError
			if !errors.As(err, &nf) && !errors.Is(err, unix.ENODEV) {
				l.m.log.Error("network: delete veth", "link", lease.hostIf, "err", err)
			}
		}
	}
	l.m.alloc.release(lease.idx)
}

// links returns the host ends of this driver's sandbox links, by sandbox id.
func (l *Links) links() (map[string][]netlink.Link, error) {
	all, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	out := map[string][]netlink.Link{}
	for _, link := range all {
		a := link.Attrs()
		if id, ok := strings.CutPrefix(a.Alias, l.alias); ok && strings.HasPrefix(a.Name, l.m.linkPrefix) {
			out[id] = append(out[id], link)
		}
	}
	return out, nil
}

// IDs returns the ids of this driver's sandboxes that have a link on the
// host.
func (l *Links) IDs() ([]string, error) {
	m, err := l.links()
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	return ids, nil
}

// RemoveID deletes the links of sandbox id (after a crash, when no lease
// is known). The /30 of a lease of this process stays taken until Detach.
func (l *Links) RemoveID(id string) error {
	m, err := l.links()
	if err != nil {
		return err
	}
	for _, link := range m[id] {
		if n, ok := l.linkIndex(link.Attrs().Name); ok {
			if err := l.m.removeSandboxChains(context.Background(), n); err != nil {
				return fmt.Errorf("remove the egress chains of %s: %w", link.Attrs().Name, err)
			}
		}
		if err := netlink.LinkDel(link); err != nil && !errors.Is(err, unix.ENODEV) {
			return fmt.Errorf("delete %s: %w", link.Attrs().Name, err)
		}
	}
	return nil
}

// linkIndex is the n of a host link <linkPrefix><n>.
func (l *Links) linkIndex(name string) (int, bool) {
	s, ok := strings.CutPrefix(name, l.m.linkPrefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}

// Leftovers lists the host links of sandbox id ("link evb<N>").
func (l *Links) Leftovers(id string) []string {
	m, err := l.links()
	if err != nil {
		return []string{"links: " + err.Error()}
	}
	var out []string
	for _, link := range m[id] {
		out = append(out, "link "+link.Attrs().Name)
		if n, ok := l.linkIndex(link.Attrs().Name); ok {
			out = append(out, l.m.sandboxChainsOf(n)...)
		}
	}
	return out
}

func ipNet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, 32)}
}

func writeSysctl(p, v string) error {
	fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	_, err = unix.Write(fd, []byte(v))
	return err
}
