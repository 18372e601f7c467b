package network

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// specialRanges are the IPv4 ranges an outbound sandbox may not reach by
// default: "this network", RFC 1918, CGNAT, loopback, link-local (cloud
// metadata), IETF protocol assignments, benchmarking, multicast, reserved,
// and the cloud metadata addresses outside those.
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
	// Cloud metadata outside link-local: Alibaba's (in CGNAT, above) and
	// Azure's WireServer (a public address).
	netip.MustParsePrefix("100.100.100.200/32"),
	netip.MustParsePrefix("168.63.129.16/32"),
}

// SpecialRanges returns the special-purpose IPv4 ranges that are part of
// the default egress deny list: "this network", RFC 1918, CGNAT, loopback,
// link-local (cloud metadata), IETF protocol assignments, benchmarking,
// multicast and reserved.
func SpecialRanges() []netip.Prefix { return append([]netip.Prefix(nil), specialRanges...) }

// ensureRules enables forwarding and (re)installs the host-wide evalbox
// iptables chains and the jumps to them. It runs once per Manager, on the
// first Attach; the rules match interfaces by prefix, so no per-sandbox
// rule exists.
func (m *Manager) ensureRules(ctx context.Context) error {
	m.rulesMu.Lock()
	defer m.rulesMu.Unlock()
	if m.rulesOK {
		return nil
	}
	if err := writeSysctl("/proc/sys/net/ipv4/ip_forward", "1"); err != nil {
		return fmt.Errorf("enable ip_forward: %w", err)
	}
	unlock, err := lockHostRules()
	if err != nil {
		return err
	}
	defer unlock()
	deny := m.deny
	if deny == nil {
		if deny, err = defaultDeny(m.linkPrefix); err != nil {
			return err
		}
	}
	// The chains of rules sandboxes' jumps are shared with the other
	// servers of the host and never flushed here.
	if err := ensureChain(ctx, "nat", m.chainProxy); err != nil {
		return err
	}
	if err := ensureChain(ctx, "filter", m.chainRules); err != nil {
		return err
	}
	if err := iptablesRestore(ctx, m.ruleset(deny)); err != nil {
		return err
	}
	for _, c := range m.Chains() {
		if c[1] == m.chainFwd {
			continue // the ruleset's own jump
		}
		j := []string{c[0], c[1], "-j", c[2]}
		check := append([]string{"--wait", "-t", j[0], "-C", j[1]}, j[2:]...)
		if exec.CommandContext(ctx, "iptables", check...).Run() == nil {
			continue
		}
		ins := append([]string{"--wait", "-t", j[0], "-I", j[1], "1"}, j[2:]...)
		if out, err := exec.CommandContext(ctx, "iptables", ins...).CombinedOutput(); err != nil {
			return fmt.Errorf("iptables %s: %w: %s", strings.Join(ins, " "), err, bytes.TrimSpace(out))
		}
	}
	m.denyInUse = deny
	m.rulesOK = true
	m.sweepChainsLocked(ctx) // under the host lock, taken above
	return nil
}

// rulesLockFile serialises installing chains and jumps among the processes
// (and Managers) of the host: the check for a jump and its insertion are
// two iptables commands, and servers that did both at once inserted the
// jump twice (a rule no one removes).
const rulesLockFile = "/run/evalbox/iptables.lock"

// lockHostRules takes the host-wide lock (flock, released with the file)
// and returns its release.
func lockHostRules() (func(), error) {
	if err := os.MkdirAll(filepath.Dir(rulesLockFile), 0o755); err != nil {
		return nil, fmt.Errorf("network: rules lock: %w", err)
	}
	f, err := os.OpenFile(rulesLockFile, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("network: rules lock: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("network: rules lock: %w", err)
	}
	return func() { f.Close() }, nil
}

// ruleset renders the evalbox chains for iptables-restore --noflush
// (declaring a chain flushes it, so this replaces the previous version).
func (m *Manager) ruleset(deny []netip.Prefix) string {
	var b strings.Builder
	w := func(f string, a ...any) { fmt.Fprintf(&b, f+"\n", a...) }
	ifs := m.linkPrefix + "+"
	w("*filter")
	w(":%s - [0:0]", m.chainFwd)
	w(":%s - [0:0]", m.chainIn)
	// Into sandboxes: only replies; nothing between sandboxes.
	w("-A %s -o %s -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT", m.chainFwd, ifs)
	w("-A %s -i %s -o %s -j REJECT --reject-with icmp-admin-prohibited", m.chainFwd, ifs, ifs)
	w("-A %s -o %s -j DROP", m.chainFwd, ifs)
	// Out of sandboxes. Rules sandboxes meet their own chain first
	// (egress.go): it refuses, or returns what their rules allow to the
	// rules below, which refuse what no sandbox may reach.
	w("-A %s -i %s ! -s %s -j DROP", m.chainFwd, ifs, m.pool)
	w("-A %s -i %s -j %s", m.chainFwd, ifs, m.chainRules)
	for _, d := range m.dns {
		w("-A %s -i %s -d %s/32 -p udp --dport 53 -j ACCEPT", m.chainFwd, ifs, d)
		w("-A %s -i %s -d %s/32 -p tcp --dport 53 -j ACCEPT", m.chainFwd, ifs, d)
	}
	// The operator's private ranges (serve --allow-private).
	for _, p := range m.allowPrivate {
		if p.Addr().Is4() {
			w("-A %s -i %s -d %s -j ACCEPT", m.chainFwd, ifs, p)
		}
	}
	// Refused rather than dropped, so that a connect fails at once.
	for _, p := range deny {
		w("-A %s -i %s -d %s -j REJECT --reject-with icmp-admin-prohibited", m.chainFwd, ifs, p)
	}
	w("-A %s -i %s -j ACCEPT", m.chainFwd, ifs)
	// The host itself is off limits, but for the connections of rules
	// sandboxes redirected to their server's egress proxy and resolver:
	// their own chain accepts those (and only those), and nothing else
	// (broadcast, a connection another rule redirected) enters it here.
	w("-A %s -i %s -m conntrack --ctstate DNAT -j %s", m.chainIn, ifs, m.chainRules)
	w("-A %s -i %s -j REJECT --reject-with icmp-admin-prohibited", m.chainIn, ifs)
	w("COMMIT")
	w("*nat")
	w(":%s - [0:0]", m.chainNAT)
	w("-A %s -s %s ! -o %s -j MASQUERADE", m.chainNAT, m.pool, ifs)
	w("COMMIT")
	return b.String()
}

// defaultDeny is specialRanges plus every IPv4 subnet the host has an
// address in (its LANs), except sandbox links (evalbox's, and those named
// linkPrefix).
func defaultDeny(linkPrefix string) ([]netip.Prefix, error) {
	deny := append([]netip.Prefix(nil), specialRanges...)
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("list host addresses: %w", err)
	}
	for _, a := range addrs {
		if a.IPNet == nil || strings.HasPrefix(a.Label, HostIfPrefix) || strings.HasPrefix(a.Label, linkPrefix) {
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
