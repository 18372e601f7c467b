package namespaces

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/evalbox/evalbox/internal/runtime"
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

// fakeInternet is a network namespace standing for the outside world,
// linked to the host by a veth pair (not named evb*, so the sandbox rules
// do not match it). It serves TCP on every address, answering each
// connection with the peer address it sees.
type fakeInternet struct {
	ns   netns.NsHandle
	ln   net.Listener
	port int
}

const (
	inetHostIf = "evxinet0"
	inetPeerIf = "evxinet1"
)

var (
	inetHost    = netip.MustParseAddr("198.51.100.1") // TEST-NET-2: not in the deny list
	inetServer  = netip.MustParseAddr("198.51.100.2")
	privateAddr = netip.MustParseAddr("172.16.5.5") // RFC 1918: denied
)

func newFakeInternet(t *testing.T) *fakeInternet {
	t.Helper()
	f := &fakeInternet{}
	// Create the namespace and the listener on a locked thread, then put
	// the thread back.
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		ns, err := netns.New()
		if err != nil {
			errc <- err
			return
		}
		f.ns = ns
		f.ln, err = net.Listen("tcp4", "0.0.0.0:0")
		if serr := netns.Set(orig); serr != nil {
			errc <- serr // thread stays locked and dies with the goroutine
			return
		}
		goruntime.UnlockOSThread()
		errc <- err
	}()
	if err := <-errc; err != nil {
		t.Fatalf("fake internet: %v", err)
	}
	f.port = f.ln.Addr().(*net.TCPAddr).Port
	t.Cleanup(func() {
		f.ln.Close()
		if l, err := netlink.LinkByName(inetHostIf); err == nil {
			netlink.LinkDel(l)
		}
		f.ns.Close()
	})
	go func() {
		for {
			c, err := f.ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s\n", c.RemoteAddr())
			c.Close()
		}
	}()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: inetHostIf}, PeerName: inetPeerIf, PeerNamespace: netlink.NsFd(f.ns)}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	host, err := netlink.LinkByName(inetHostIf)
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(netlink.AddrAdd(host, &netlink.Addr{IPNet: ipNet(inetHost, 30)}))
	must(netlink.LinkSetUp(host))
	must(netlink.RouteAdd(&netlink.Route{LinkIndex: host.Attrs().Index, Dst: ipNet(privateAddr, 32), Gw: inetServer.AsSlice()}))
	h, err := netlink.NewHandleAt(f.ns, unix.NETLINK_ROUTE)
	must(err)
	defer h.Close()
	peer, err := h.LinkByName(inetPeerIf)
	must(err)
	must(h.AddrAdd(peer, &netlink.Addr{IPNet: ipNet(inetServer, 30)}))
	must(h.AddrAdd(peer, &netlink.Addr{IPNet: ipNet(privateAddr, 32)}))
	must(h.LinkSetUp(peer))
	lo, err := h.LinkByName("lo")
	must(err)
	must(h.LinkSetUp(lo))
	must(h.RouteAdd(&netlink.Route{LinkIndex: peer.Attrs().Index, Gw: inetHost.AsSlice()}))
	return f
}

// removeRules undoes what ensureRules installs on the host, and restores
// ip_forward.
func removeRules(t *testing.T, ipForward string) {
	for _, args := range [][]string{
		{"-t", "filter", "-D", "FORWARD", "-j", chainFwd},
		{"-t", "filter", "-D", "INPUT", "-j", chainIn},
		{"-t", "nat", "-D", "POSTROUTING", "-j", chainNAT},
		{"-t", "filter", "-F", chainFwd}, {"-t", "filter", "-X", chainFwd},
		{"-t", "filter", "-F", chainIn}, {"-t", "filter", "-X", chainIn},
		{"-t", "nat", "-F", chainNAT}, {"-t", "nat", "-X", chainNAT},
	} {
		// Absent rules and chains (a test that failed early) are fine.
		exec.Command("iptables", append([]string{"--wait"}, args...)...).Run()
	}
	for _, table := range []string{"filter", "nat"} {
		out, err := exec.Command("iptables", "--wait", "-t", table, "-S").CombinedOutput()
		if err != nil || strings.Contains(string(out), "EVALBOX") {
			t.Errorf("iptables %s after cleanup: %v\n%s", table, err, out)
		}
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte(ipForward), 0o644); err != nil {
		t.Error(err)
	}
}

func TestOutbound(t *testing.T) {
	if _, err := exec.LookPath("iptables-restore"); err != nil {
		t.Skip("iptables-restore not installed")
	}
	fwd, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		t.Fatal(err)
	}
	r := newRuntime(t, Config{
		OutboundPool: netip.MustParsePrefix("10.231.0.0/24"),
		DNS:          []netip.Addr{},
		EgressDeny:   specialRanges, // not the host's subnets: the fake internet is one
	})
	inet := newFakeInternet(t)
	t.Cleanup(func() { removeRules(t, strings.TrimSpace(string(fwd))) })

	// A host service on every address.
	hostLn, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hostLn.Close()
	go func() {
		for {
			c, err := hostLn.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, "host service")
			c.Close()
		}
	}()
	hostPort := hostLn.Addr().(*net.TCPAddr).Port

	// A stale link holding the first name: its block is skipped.
	stale := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostIfPrefix + "0"}, PeerName: "evxstale1"}
	if err := netlink.LinkAdd(stale); err != nil {
		t.Fatal(err)
	}
	defer netlink.LinkDel(stale)

	spec := testSpec(t, "outbound")
	spec.Network = runtime.NetworkOutbound
	a := startSandbox(t, r, spec)
	if a.s.lease.hostIf != hostIfPrefix+"1" {
		t.Errorf("first sandbox got %s next to a stale %s0", a.s.lease.hostIf, hostIfPrefix)
	}
	other := testSpec(t, "outbound-2")
	other.Network = runtime.NetworkOutbound
	b := startSandbox(t, r, other)

	dial := func(a *agent, addr string) string {
		t.Helper()
		out, _ := a.run(fmt.Sprintf("%s dial %s 2000", runtime.AgentGuestPath, addr))
		return strings.TrimSpace(out)
	}
	// Out to the "internet", NATed to the host's address on that link.
	if got := dial(a, fmt.Sprintf("%s:%d", inetServer, inet.port)); !strings.HasPrefix(got, fmt.Sprintf(`dial got "%s:`, inetHost)) {
		t.Fatalf("internet: %q", got)
	}
	// Not to private ranges, the host itself, or the other sandbox.
	for _, addr := range []string{
		fmt.Sprintf("%s:%d", privateAddr, inet.port),
		fmt.Sprintf("%s:%d", inetHost, hostPort),
		fmt.Sprintf("%s:%d", hostAddr(a.s.lease.block), hostPort),
		fmt.Sprintf("127.0.0.1:%d", hostPort),
		fmt.Sprintf("%s:%d", guestAddr(b.s.lease.block), 22),
	} {
		t0 := time.Now()
		if got := dial(a, addr); !strings.HasPrefix(got, "dial error") {
			t.Errorf("dial %s from the sandbox: %q, want an error", addr, got)
		} else {
			t.Logf("dial %s: %s (%v)", addr, got, time.Since(t0).Round(time.Millisecond))
		}
	}
	// Inside: eth0 with the lease's address, no IPv6 on it.
	out := a.mustRun("cat /proc/net/dev; cat /proc/sys/net/ipv6/conf/eth0/disable_ipv6; cat /etc/resolv.conf")
	if !strings.Contains(out, "eth0:") || !strings.Contains(out, "\n1\n") || !strings.Contains(out, "no DNS resolver") {
		t.Errorf("sandbox network config: %q", out)
	}
	hostIf := a.s.lease.hostIf
	if got := r.Leftovers(spec.ID); !slices.Contains(got, "link "+hostIf) {
		t.Errorf("Leftovers of a live outbound sandbox = %q, want its link listed", got)
	}
	// The Destroy in the cleanup checks that the link is gone.
	ctx := context.Background()
	if err := a.s.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := netlink.LinkByName(hostIf); err == nil {
		t.Fatalf("%s still exists after Destroy", hostIf)
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
	n, err := newNetwork(Config{DNS: []netip.Addr{netip.MustParseAddr("10.255.255.53")}})
	if err != nil {
		t.Fatal(err)
	}
	deny, err := defaultDeny()
	if err != nil {
		t.Fatal(err)
	}
	rules := n.ruleset(deny)
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
