package network

import (
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestIPAllocator(t *testing.T) {
	a, err := newIPAllocator(netip.MustParsePrefix("10.9.0.0/28"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[netip.Prefix]bool{}
	var idxs []int
	for range 4 {
		i, p, err := a.allocate()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] || p.Bits() != 30 || !netip.MustParsePrefix("10.9.0.0/28").Contains(p.Addr()) {
			t.Fatalf("bad block %v", p)
		}
		seen[p] = true
		idxs = append(idxs, i)
	}
	if _, _, err := a.allocate(); err != errPoolExhausted {
		t.Fatalf("5th allocation in a /28: %v", err)
	}
	a.release(idxs[2])
	a.release(idxs[2]) // double release is harmless
	i, p, err := a.allocate()
	if err != nil || i != idxs[2] || p != netip.MustParsePrefix("10.9.0.8/30") {
		t.Fatalf("reallocation = %d %v %v", i, p, err)
	}
	if hostAddr(p) != netip.MustParseAddr("10.9.0.9") || guestAddr(p) != netip.MustParseAddr("10.9.0.10") {
		t.Fatalf("addresses of %v: %v %v", p, hostAddr(p), guestAddr(p))
	}
	for _, bad := range []string{"10.0.0.0/31", "fd00::/64"} {
		if _, err := newIPAllocator(netip.MustParsePrefix(bad)); err == nil {
			t.Errorf("pool %s accepted", bad)
		}
	}
}

func TestNames(t *testing.T) {
	for _, bad := range []string{"", "a:b", "a b", strings.Repeat("x", 65)} {
		if _, err := New(Config{Scope: bad}); err == nil {
			t.Errorf("scope %q accepted", bad)
		}
	}
	m, err := New(Config{Scope: "evalbox-ns-1a2b3c4d", DNS: []netip.Addr{}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Links("gvisor:x"); err == nil {
		t.Error("driver name with ':' accepted")
	}
	l, err := m.Links("gvisor")
	if err != nil || l.alias != "evalbox:evalbox-ns-1a2b3c4d:gvisor:" {
		t.Fatalf("Links = %+v, %v", l, err)
	}
	if got := m.ResolvConf(); !strings.Contains(got, "no DNS resolver") {
		t.Errorf("ResolvConf without resolvers = %q", got)
	}
	m2, err := New(Config{Scope: "s", DNS: []netip.Addr{netip.MustParseAddr("192.0.2.53")}})
	if err != nil {
		t.Fatal(err)
	}
	if got := m2.ResolvConf(); got != "nameserver 192.0.2.53\n" {
		t.Errorf("ResolvConf = %q", got)
	}
}

// The generated ruleset, with DNS exceptions and the default deny list,
// is accepted by iptables-restore (in test mode: nothing is installed).
func TestRulesetParses(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if _, err := exec.LookPath("iptables-restore"); err != nil {
		t.Skip("iptables-restore not installed")
	}
	m, err := New(Config{Scope: "test", DNS: []netip.Addr{netip.MustParseAddr("10.255.255.53")}})
	if err != nil {
		t.Fatal(err)
	}
	deny, err := defaultDeny(HostIfPrefix)
	if err != nil {
		t.Fatal(err)
	}
	rules := m.ruleset(deny)
	for _, want := range []string{
		"-A EVALBOX-FWD -i evb+ -d 10.255.255.53/32 -p udp --dport 53 -j ACCEPT",
		"-A EVALBOX-FWD -i evb+ -d 10.0.0.0/8 -j REJECT",
		"-A EVALBOX-NAT -s 10.200.0.0/16 ! -o evb+ -j MASQUERADE",
	} {
		if !strings.Contains(rules, want) {
			t.Errorf("ruleset lacks %q:\n%s", want, rules)
		}
	}
	cmd := exec.Command("iptables-restore", "--test", "--noflush")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("iptables-restore --test: %v: %s\n%s", err, out, rules)
	}
}

// TestAllowPrivateNeverOpensLoopback: --allow-private cannot open the
// host's loopback (all of 127.0.0.0/8 reaches the host's servers), this
// host, link-local or metadata; a gateway refuses those even if a range
// that covers them got in, and opens what the operator asked otherwise.
func TestAllowPrivateNeverOpensLoopback(t *testing.T) {
	for p, ok := range map[string]bool{
		"10.0.0.0/8": true, "192.168.7.0/24": true, "fd12:3456::/32": true,
		"127.0.0.0/8": false, "127.0.0.2/32": false, "0.0.0.0/0": false, "0.0.0.0/8": false, "169.254.169.254/32": false,
		"::1/128": false, "::/0": false, "fe80::/64": false, "fd00:ec2::/64": false, "100.64.0.0/10": false, "168.63.129.0/24": false,
	} {
		if err := CheckAllowPrivate(netip.MustParsePrefix(p)); (err == nil) != ok {
			t.Errorf("CheckAllowPrivate(%s) = %v", p, err)
		}
	}
	g := &gateway{m: &Manager{pool: netip.MustParsePrefix("10.200.0.0/16"),
		allowPrivate: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}},
		hostOK: true, hostAt: time.Now(), hostPrefixes: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("192.0.2.10/32")}}
	for a, want := range map[string]bool{
		"127.0.0.2": true, "127.255.255.254": true, "0.0.0.0": true, "169.254.169.254": true, "::1": true, "fe80::1": true,
		"fd00:ec2::254": true, "::ffff:127.0.0.2": true, "192.0.2.10": true, "10.200.0.5": true,
		"100.100.100.200": true, "168.63.129.16": true,
		"10.1.2.3": false, "192.168.1.1": false,
	} {
		if got := g.refused(netip.MustParseAddr(a)); got != want {
			t.Errorf("refused(%s) = %v, want %v", a, got, want)
		}
	}
}
