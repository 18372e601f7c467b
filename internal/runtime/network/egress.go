package network

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/time/rate"

	"github.com/evalbox/evalbox/internal/netrules"
)

// Egress rules (network mode "rules", docs/design/network.md). A sandbox
// with rules keeps its outbound link, and three things limit it:
//
//   - its TCP is redirected (nat PREROUTING, chain <prefix>-PX-<n>) to the
//     Manager's egress proxy (proxy.go), which reads the name the
//     connection asks for (TLS SNI, HTTP Host), checks it and the address
//     against the rules, resolves allowed names itself and dials them from
//     the host;
//   - its DNS (udp and tcp 53, to any address) is redirected to the
//     Manager's resolver (resolver.go), which answers allowed names only
//     and remembers which addresses it gave for which name;
//   - everything else it sends (UDP, ICMP, and TCP flows older than the
//     rules) meets the filter chain <prefix>-SB-<n>: the CIDR allows minus
//     the CIDR denies, the rest refused.
//
// The always-refused destinations (the deny list, the host, other
// sandboxes) stay in front of all three: the FWD chain's deny list for
// packets, Manager.refused for the addresses the proxy dials and the
// resolver returns.

// egressState is one rules sandbox's: its rules, the answers the resolver
// gave it, and the proxy's connections of it.
type egressState struct {
	addr netip.Addr // the sandbox's address (its /30's guest end)

	mu    sync.Mutex
	rules *netrules.Rules
	// answers maps an address the resolver returned to this sandbox to
	// the name asked and when the record lapses; synth, the synthetic
	// IPv4 addresses given for names that have IPv6 addresses only.
	answers map[netip.Addr]answer
	synth   map[string]netip.Addr
	conns   map[*proxyConn]struct{}
	closed  bool
	// active counts the proxy's connections of the sandbox (open and
	// being judged); dns bounds the rate of its DNS questions.
	active atomic.Int64
	dns    *rate.Limiter
}

// Bounds of one rules sandbox's use of the proxy and the resolver, and of
// all sandboxes' of the proxy: a sandbox cannot take the node's file
// descriptors or flood its resolvers.
const (
	maxConnsPerSandbox = 1024
	maxConns           = 16384
	dnsRate            = 200 // questions a second
	dnsBurst           = 400
)

type answer struct {
	name  string
	until time.Time
}

// Bounds of a sandbox's resolver records.
const (
	maxAnswers = 4096
	// minAnswerTTL keeps a record at least this long, whatever its DNS
	// TTL: programs connect later than the TTL says (they cache).
	minAnswerTTL = 10 * time.Minute
)

// currentRules returns the sandbox's rules (never nil while it is known).
func (st *egressState) currentRules() *netrules.Rules {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.rules
}

// remember records that the resolver answered addr for name.
func (st *egressState) remember(addr netip.Addr, name string, ttl time.Duration) {
	st.mu.Lock()
	defer st.mu.Unlock()
	now := time.Now()
	if len(st.answers) >= maxAnswers {
		for a, an := range st.answers {
			if now.After(an.until) {
				delete(st.answers, a)
			}
		}
		for a := range st.answers {
			if len(st.answers) < maxAnswers {
				break
			}
			delete(st.answers, a) // the oldest are not known: any one
		}
	}
	st.answers[addr] = answer{name: name, until: now.Add(max(ttl, minAnswerTTL))}
}

// nameOf returns the name the resolver gave addr for, if it did lately.
func (st *egressState) nameOf(addr netip.Addr) (string, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	an, ok := st.answers[addr]
	if !ok || time.Now().After(an.until) {
		return "", false
	}
	return an.name, true
}

// synthFor returns the synthetic IPv4 address of name for this sandbox
// (for a name with IPv6 addresses only: the sandbox has IPv4 only, and the
// proxy reaches the name over the host's IPv6).
func (st *egressState) synthFor(name string) (netip.Addr, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if a, ok := st.synth[name]; ok {
		return a, true
	}
	if len(st.synth) >= maxAnswers {
		return netip.Addr{}, false
	}
	a := synthBase
	for range len(st.synth) + 1 {
		a = a.Next()
	}
	st.synth[name] = a
	return a, true
}

// synthBase starts the synthetic addresses: 198.18.0.0/15 is for
// benchmarking (RFC 2544), never a real destination, and refused to
// sandboxes' packets by the default deny list; only the proxy, which sees
// a TCP connection's original destination, gives it a meaning.
var (
	synthBase  = netip.MustParseAddr("198.18.0.0")
	synthRange = netip.MustParsePrefix("198.18.0.0/15")
)

// gateway is the Manager's egress proxy and resolver, and the rules
// sandboxes they serve, by address. It starts with the first rules
// sandbox.
type gateway struct {
	m        *Manager
	proxyLn  *net.TCPListener
	dnsPort  int
	resolver *resolver
	mu       sync.Mutex
	byAddr   map[netip.Addr]*egressState
	wg       sync.WaitGroup
	active   atomic.Int64 // the proxy's connections, all sandboxes'
	cacheMu  sync.Mutex
	cache    map[string]cached // lookup's
	// hostPrefixes are the host's addresses and subnets (hostNets).
	hostMu       sync.Mutex
	hostAt       time.Time
	hostOK       bool
	hostPrefixes []netip.Prefix
}

// gatewayStart starts m's gateway once.
func (m *Manager) gatewayStart() (*gateway, error) {
	m.gwMu.Lock()
	defer m.gwMu.Unlock()
	if m.closed {
		return nil, errors.New("network: manager closed")
	}
	if m.gw != nil {
		return m.gw, nil
	}
	g := &gateway{m: m, byAddr: map[netip.Addr]*egressState{}, cache: map[string]cached{}}
	// On every address (the redirect rewrites the destination to the
	// sandbox link's host end); connections from elsewhere than a rules
	// sandbox are closed at once.
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4zero})
	if err != nil {
		return nil, fmt.Errorf("network: egress proxy: %w", err)
	}
	g.proxyLn = ln
	r, err := newResolver(g)
	if err != nil {
		ln.Close()
		return nil, err
	}
	g.resolver, g.dnsPort = r, r.port
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		g.serveProxy()
	}()
	m.gw = g
	m.log.Info("network: egress proxy and resolver started", "proxy_port", ln.Addr().(*net.TCPAddr).Port, "dns_port", g.dnsPort)
	return g, nil
}

// close stops the gateway and cuts its connections.
func (g *gateway) close() {
	g.proxyLn.Close()
	g.resolver.close()
	g.mu.Lock()
	states := make([]*egressState, 0, len(g.byAddr))
	for _, st := range g.byAddr {
		states = append(states, st)
	}
	g.byAddr = map[netip.Addr]*egressState{}
	g.mu.Unlock()
	for _, st := range states {
		st.close()
	}
	g.wg.Wait()
}

// state returns the rules sandbox of an address (nil: none).
func (g *gateway) state(a netip.Addr) *egressState {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.byAddr[a.Unmap()]
}

// set gives the sandbox at addr rules, cuts its connections they deny, and
// returns the rules it had (nil: none).
func (g *gateway) set(addr netip.Addr, r *netrules.Rules) (prev *netrules.Rules) {
	g.mu.Lock()
	st := g.byAddr[addr]
	if st == nil {
		st = &egressState{addr: addr, answers: map[netip.Addr]answer{}, synth: map[string]netip.Addr{}, conns: map[*proxyConn]struct{}{},
			dns: rate.NewLimiter(dnsRate, dnsBurst)}
		g.byAddr[addr] = st
	}
	g.mu.Unlock()
	st.mu.Lock()
	prev, st.rules = st.rules, r
	conns := make([]*proxyConn, 0, len(st.conns))
	for c := range st.conns {
		conns = append(conns, c)
	}
	st.mu.Unlock()
	for _, c := range conns {
		if _, ok := g.permitConn(st, r, c); !ok {
			g.m.log.Debug("network: egress connection cut by new rules", "sandbox_addr", addr, "name", c.name, "dst", c.origDst)
			c.cut()
		}
	}
	return prev
}

// remove forgets the sandbox at addr; cut also ends its connections.
func (g *gateway) remove(addr netip.Addr, cut bool) {
	g.mu.Lock()
	st := g.byAddr[addr]
	delete(g.byAddr, addr)
	g.mu.Unlock()
	if st != nil && cut {
		st.close()
	}
}

func (st *egressState) close() {
	st.mu.Lock()
	st.closed = true
	conns := make([]*proxyConn, 0, len(st.conns))
	for c := range st.conns {
		conns = append(conns, c)
	}
	st.mu.Unlock()
	for _, c := range conns {
		c.cut()
	}
}

// refused reports whether addr is a destination no sandbox may reach,
// whatever its rules: the deny list (special and private ranges, the
// host's IPv4 subnets) but the operator's AllowPrivate ranges, the IPv6
// special ranges, the sandbox pool, and every address and subnet of the
// host, IPv4 and IPv6 (a host whose addresses cannot be read refuses
// everything).
func (g *gateway) refused(addr netip.Addr) bool {
	addr = addr.Unmap()
	if !addr.IsValid() || addr.Zone() != "" {
		return true
	}
	m := g.m
	if m.pool.Contains(addr) {
		return true
	}
	host, ok := g.hostNets()
	if !ok {
		return true
	}
	for _, p := range host {
		if p.Bits() == addr.BitLen() && p.Addr() == addr {
			return true // the host itself, whatever the operator opens
		}
	}
	if neverOpen(addr) {
		return true // loopback, link-local, metadata: whatever the operator opens
	}
	for _, p := range m.allowPrivate {
		if p.Contains(addr) {
			return false
		}
	}
	for _, p := range host {
		if p.Contains(addr) {
			return true
		}
	}
	special := specialRanges6
	if addr.Is4() {
		special = m.denyList()
	}
	for _, p := range special {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// hostNets returns the host's addresses (as /32 and /128 prefixes) and
// subnets (IPv4 and IPv6), but the sandbox links', read again every few
// seconds; false when they cannot be read.
func (g *gateway) hostNets() ([]netip.Prefix, bool) {
	g.hostMu.Lock()
	defer g.hostMu.Unlock()
	if g.hostOK && time.Since(g.hostAt) < 5*time.Second {
		return g.hostPrefixes, true
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		g.m.log.Warn("network: reading the host's addresses", "err", err)
		return g.hostPrefixes, g.hostOK
	}
	var out []netip.Prefix
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || a.IPNet == nil {
			continue
		}
		ip = ip.Unmap()
		out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
		ones, _ := a.Mask.Size()
		if ip.IsLinkLocalUnicast() || g.m.pool.Contains(ip) {
			continue // special ranges already; the pool is refused
		}
		out = append(out, netip.PrefixFrom(ip, ones).Masked())
	}
	g.hostPrefixes, g.hostAt, g.hostOK = out, time.Now(), true
	return out, true
}

// specialRanges6 are the IPv6 destinations no sandbox reaches: the
// unspecified and loopback addresses, IPv4-mapped and -translated ones
// (they lead to IPv4 addresses the IPv4 list judges), discard, 6to4 and
// Teredo (they embed IPv4 addresses), unique local (fd00:ec2::254, a
// cloud's metadata service, among them), link-local, site-local and
// multicast.
// neverOpenRanges are what --allow-private may not open: the host's
// loopback (all of 127.0.0.0/8 reaches the host, not only 127.0.0.1, and
// with it every port bound to 0.0.0.0 or to loopback), "this host"
// (0.0.0.0/8, ::), link-local and the cloud metadata addresses (those in
// it, Alibaba's 100.100.100.200 and Azure's WireServer 168.63.129.16).
var neverOpenRanges = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("100.100.100.200/32"),
	netip.MustParsePrefix("168.63.129.16/32"),
	netip.MustParsePrefix("::/127"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("fd00:ec2::254/128"),
}

func neverOpen(addr netip.Addr) bool {
	for _, p := range neverOpenRanges {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// CheckAllowPrivate checks a range an operator opens (serve
// --allow-private): a CIDR that does not overlap loopback, "this host",
// link-local or the metadata addresses, which no sandbox may reach.
func CheckAllowPrivate(p netip.Prefix) error {
	if !p.IsValid() || p.Masked() != p {
		return fmt.Errorf("%s is not a CIDR (want one such as 10.1.0.0/16)", p)
	}
	for _, n := range neverOpenRanges {
		if n.Overlaps(p) {
			return fmt.Errorf("%s overlaps %s, which no sandbox may reach (loopback, this host, link-local or metadata)", p, n)
		}
	}
	return nil
}

var specialRanges6 = []netip.Prefix{
	netip.MustParsePrefix("::/127"),
	netip.MustParsePrefix("::ffff:0:0/96"),
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
	netip.MustParsePrefix("100::/64"),
	netip.MustParsePrefix("2001::/32"),
	netip.MustParsePrefix("2002::/16"),
	netip.MustParsePrefix("fc00::/7"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("fec0::/10"),
	netip.MustParsePrefix("ff00::/8"),
}

// denyList is the IPv4 deny list in force (Config.EgressDeny, or the
// default computed when the rules were installed).
func (m *Manager) denyList() []netip.Prefix {
	m.rulesMu.Lock()
	defer m.rulesMu.Unlock()
	if m.denyInUse != nil {
		return m.denyInUse
	}
	if m.deny != nil {
		return m.deny
	}
	return specialRanges
}

// Chain names of one rules sandbox (its link's index n).
func (m *Manager) proxyChain(n int) string { return m.chainProxy + "-" + strconv.Itoa(n) }
func (m *Manager) ruleChain(n int) string  { return m.chainRules + "-" + strconv.Itoa(n) }

// SetEgress limits the sandbox of lease to r (nil: lifts the limit): see
// runtime.EgressFilter. On error the previous rules stay. Calls for one
// lease are serialised, and none succeeds once the lease is detached.
//
// Lifting the rules keeps the sandbox's state and chains in a lifted form
// (nothing redirected, everything forwarded, the proxied connections
// still carried and judged as allowed), so that connections made under
// the rules survive the change and new rules later judge them again.
func (l *Links) SetEgress(ctx context.Context, lease *Lease, r *netrules.Rules) error {
	m := l.m
	lease.mu.Lock()
	defer lease.mu.Unlock()
	if lease.detached {
		return fmt.Errorf("network: sandbox %s is detached", lease.id)
	}
	if r == nil && !lease.egress {
		return nil // never had rules
	}
	g, err := m.gatewayStart()
	if err != nil {
		return err
	}
	eff := r
	if r == nil {
		eff = allowAll
	}
	addr, first := lease.GuestAddr(), !lease.egress
	if first {
		// Before the redirect exists: no connection to judge yet.
		g.set(addr, eff)
	}
	if err := m.applySandboxChains(ctx, lease.hostIf, lease.idx, r, g, first); err != nil {
		if first {
			g.remove(addr, false)
		}
		return err
	}
	if !first {
		g.set(addr, eff) // cuts the open connections eff denies
	}
	lease.egress = true
	return nil
}

// allowAll judges the proxied connections of a sandbox whose rules were
// lifted: every destination but those always refused.
var allowAll = func() *netrules.Rules {
	r, err := netrules.Parse([]string{"0.0.0.0/0", "::/0"}, nil)
	if err != nil {
		panic(err)
	}
	return r
}()

// gatewayIfStarted returns the gateway, or nil before the first rules
// sandbox.
func (m *Manager) gatewayIfStarted() *gateway {
	m.gwMu.Lock()
	defer m.gwMu.Unlock()
	return m.gw
}

// applySandboxChains (re)writes the sandbox's two chains in one
// iptables-restore and, the first time, adds the jumps to them. r nil
// writes the lifted form (nothing redirected, everything returned to the
// FWD chain, whose deny list still applies).
func (m *Manager) applySandboxChains(ctx context.Context, hostIf string, n int, r *netrules.Rules, g *gateway, first bool) error {
	px, sb := m.proxyChain(n), m.ruleChain(n)
	proxyPort := g.proxyLn.Addr().(*net.TCPAddr).Port
	var b strings.Builder
	w := func(f string, a ...any) { fmt.Fprintf(&b, f+"\n", a...) }
	w("*nat")
	w(":%s - [0:0]", px)
	if r != nil {
		w("-A %s -p udp --dport 53 -j REDIRECT --to-ports %d", px, g.dnsPort)
		w("-A %s -p tcp --dport 53 -j REDIRECT --to-ports %d", px, g.dnsPort)
		w("-A %s -p tcp -j REDIRECT --to-ports %d", px, proxyPort)
	}
	w("COMMIT")
	w("*filter")
	w(":%s - [0:0]", sb)
	// Into the host (from chainIn, redirected connections only): this
	// server's proxy and resolver, nothing else.
	for _, pp := range [][2]any{{"tcp", proxyPort}, {"udp", g.dnsPort}, {"tcp", g.dnsPort}} {
		w("-A %s -m addrtype --dst-type LOCAL -p %s --dport %d -m conntrack --ctstate DNAT -j ACCEPT", sb, pp[0], pp[1])
	}
	w("-A %s -m addrtype ! --dst-type UNICAST -j REJECT --reject-with icmp-admin-prohibited", sb)
	w("-A %s -m addrtype --dst-type LOCAL -j REJECT --reject-with icmp-admin-prohibited", sb)
	if r == nil {
		w("-A %s -j RETURN", sb)
	} else {
		// Out (from chainFwd, before its DNS rule and its deny list, which
		// apply after a RETURN). DNS that was not redirected is a flow
		// older than the rules: cut.
		w("-A %s -p udp --dport 53 -j REJECT --reject-with icmp-admin-prohibited", sb)
		w("-A %s -p tcp --dport 53 -j REJECT --reject-with tcp-reset", sb)
		allow, deny := r.Prefixes()
		for _, p := range deny {
			if p.Addr().Is4() {
				w("-A %s -d %s -j REJECT --reject-with icmp-admin-prohibited", sb, p)
			}
		}
		for _, p := range allow {
			if p.Addr().Is4() {
				w("-A %s -d %s -j RETURN", sb, p)
			}
		}
		// TCP flows that began before the rules (the proxy carries the rest).
		w("-A %s -p tcp -j REJECT --reject-with tcp-reset", sb)
		w("-A %s -j REJECT --reject-with icmp-admin-prohibited", sb)
	}
	w("COMMIT")
	unlock, err := lockHostRules()
	if err != nil {
		return err
	}
	defer unlock()
	if err := iptablesRestore(ctx, b.String()); err != nil {
		if first {
			m.dropChains(ctx, n)
		}
		return err
	}
	if !first {
		return nil
	}
	// The filter jump first, the nat one after (dropChains removes them
	// the other way round): a nat jump never stands without the filter
	// one, which is what dropStaleChains looks for.
	for _, j := range [][]string{
		{"filter", m.chainRules, "-i", hostIf, "-j", sb},
		{"nat", m.chainProxy, "-i", hostIf, "-j", px},
	} {
		if err := ensureRule(ctx, j[0], j[1], j[2:]...); err != nil {
			m.dropChains(ctx, n)
			return err
		}
	}
	return nil
}

// removeSandboxChains removes the jumps to the sandbox's chains and the
// chains themselves.
func (m *Manager) removeSandboxChains(ctx context.Context, n int) error {
	unlock, err := lockHostRules()
	if err != nil {
		return err
	}
	defer unlock()
	return m.dropChains(ctx, n)
}

// dropChains removes the chains of link n and every jump to them (under
// the host lock). Absent ones are fine.
func (m *Manager) dropChains(ctx context.Context, n int) error {
	var errs []error
	for _, c := range [][3]string{{"nat", m.chainProxy, m.proxyChain(n)}, {"filter", m.chainRules, m.ruleChain(n)}} {
		table, parent, chain := c[0], c[1], c[2]
		rules, err := exec.CommandContext(ctx, "iptables", "--wait", "-t", table, "-S", parent).Output()
		if err == nil {
			for _, line := range strings.Split(string(rules), "\n") {
				f := strings.Fields(line)
				if len(f) < 2 || f[0] != "-A" || !strings.HasSuffix(line, "-j "+chain) {
					continue
				}
				args := append([]string{"--wait", "-t", table, "-D"}, f[1:]...)
				if out, err := exec.CommandContext(ctx, "iptables", args...).CombinedOutput(); err != nil {
					errs = append(errs, fmt.Errorf("iptables %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out)))
				}
			}
		}
		if exec.CommandContext(ctx, "iptables", "--wait", "-t", table, "-n", "-L", chain).Run() != nil {
			continue // no such chain
		}
		for _, op := range []string{"-F", "-X"} {
			if out, err := exec.CommandContext(ctx, "iptables", "--wait", "-t", table, op, chain).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("iptables -t %s %s %s: %w: %s", table, op, chain, err, bytes.TrimSpace(out)))
			}
		}
	}
	return errors.Join(errs...)
}

// sandboxChainsOf lists the per-sandbox chains of link n that exist.
func (m *Manager) sandboxChainsOf(n int) []string {
	var out []string
	for _, c := range [][2]string{{"nat", m.proxyChain(n)}, {"filter", m.ruleChain(n)}} {
		if exec.Command("iptables", "--wait", "-t", c[0], "-n", "-L", c[1]).Run() == nil {
			out = append(out, "iptables chain "+c[0]+"/"+c[1])
		}
	}
	return out
}

// sweepChains removes the per-sandbox chains whose link is gone (a crash
// left them, or a sandbox whose namespace died with its link): those of
// this Manager's names only. The chains are listed before the links: a
// chain is made after its link and removed before it, so a chain seen
// first whose link is absent after is stale, never one of a sandbox being
// made.
func (m *Manager) sweepChains(ctx context.Context) {
	unlock, err := lockHostRules()
	if err != nil {
		return
	}
	defer unlock()
	m.sweepChainsLocked(ctx)
}

// sweepChainsLocked is sweepChains under the host lock.
func (m *Manager) sweepChainsLocked(ctx context.Context) {
	var found []int
	for _, c := range [][2]string{{"nat", m.chainProxy}, {"filter", m.chainRules}} {
		out, err := exec.CommandContext(ctx, "iptables", "--wait", "-t", c[0], "-S").Output()
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(out), "\n") {
			if name, ok := strings.CutPrefix(line, "-N "+c[1]+"-"); ok {
				if n, err := strconv.Atoi(name); err == nil && !slices.Contains(found, n) {
					found = append(found, n)
				}
			}
		}
	}
	if len(found) == 0 {
		return
	}
	links := map[string]bool{}
	all, err := netlink.LinkList()
	if err != nil {
		return
	}
	for _, l := range all {
		links[l.Attrs().Name] = true
	}
	for _, n := range found {
		if links[m.linkPrefix+strconv.Itoa(n)] {
			continue
		}
		if err := m.dropChains(ctx, n); err != nil {
			m.log.Warn("network: removing a leftover sandbox chain", "link", m.linkPrefix+strconv.Itoa(n), "err", err)
		}
	}
}

// SweepChains removes the chains of rules sandboxes whose link is gone
// (drivers call it as they sweep).
func (l *Links) SweepChains(ctx context.Context) { l.m.sweepChains(ctx) }

// dropStaleChains removes chains of link n that a sandbox of an earlier
// life of that link left (its link went with its namespace): called when
// the link is made anew, so that no rule of the old sandbox applies to the
// new one.
//
// It costs one iptables call on every outbound attach: whether the filter
// jump of link n is there (no nat jump stands without it; chains without
// jumps apply to nothing, and the sweep removes them with their link).
func (m *Manager) dropStaleChains(ctx context.Context, n int, hostIf string) error {
	if exec.CommandContext(ctx, "iptables", "--wait", "-t", "filter", "-C", m.chainRules, "-i", hostIf, "-j", m.ruleChain(n)).Run() != nil {
		return nil
	}
	m.log.Info("network: removing the chains an earlier sandbox of a link left", "link", m.linkPrefix+strconv.Itoa(n))
	return m.removeSandboxChains(ctx, n)
}

// iptablesRestore applies rules with iptables-restore --noflush.
func iptablesRestore(ctx context.Context, rules string) error {
	restore := exec.CommandContext(ctx, "iptables-restore", "--noflush", "--wait")
	restore.Stdin = strings.NewReader(rules)
	if out, err := restore.CombinedOutput(); err != nil {
		return fmt.Errorf("iptables-restore: %w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// ensureRule appends a rule to a chain unless it is there.
func ensureRule(ctx context.Context, table, chain string, rule ...string) error {
	check := append([]string{"--wait", "-t", table, "-C", chain}, rule...)
	if exec.CommandContext(ctx, "iptables", check...).Run() == nil {
		return nil
	}
	add := append([]string{"--wait", "-t", table, "-A", chain}, rule...)
	if out, err := exec.CommandContext(ctx, "iptables", add...).CombinedOutput(); err != nil {
		return fmt.Errorf("iptables %s: %w: %s", strings.Join(add, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// ensureChain creates a chain unless it exists (never flushing it: other
// servers' sandboxes have rules in the shared ones).
func ensureChain(ctx context.Context, table, chain string) error {
	if exec.CommandContext(ctx, "iptables", "--wait", "-t", table, "-n", "-L", chain).Run() == nil {
		return nil
	}
	if out, err := exec.CommandContext(ctx, "iptables", "--wait", "-t", table, "-N", chain).CombinedOutput(); err != nil {
		if exec.CommandContext(ctx, "iptables", "--wait", "-t", table, "-n", "-L", chain).Run() == nil {
			return nil // made meanwhile
		}
		return fmt.Errorf("iptables -t %s -N %s: %w: %s", table, chain, err, bytes.TrimSpace(out))
	}
	return nil
}
