package network_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/evalbox/evalbox/internal/runtime/network"
	"github.com/evalbox/evalbox/internal/runtime/network/networktest"
)

// newNetns returns a new network namespace (only lo, up) standing for a
// sandbox's; it is freed at the end of t.
func newNetns(t *testing.T) netns.NsHandle {
	t.Helper()
	var ns netns.NsHandle
	errc := make(chan error, 1)
	go func() {
		// The thread is never unlocked: it ends with the goroutine, and
		// with it its changed namespace.
		goruntime.LockOSThread()
		var err error
		ns, err = netns.New()
		errc <- err
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	// Bring lo up, as every runtime does.
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// inNetns runs f on a thread in ns (then discards the thread).
func inNetns[T any](t *testing.T, ns netns.NsHandle, f func() (T, error)) (T, error) {
	t.Helper()
	type result struct {
		v   T
		err error
	}
	c := make(chan result, 1)
	go func() {
		goruntime.LockOSThread()
		if err := netns.Set(ns); err != nil {
			c <- result{err: err}
			return
		}
		v, err := f()
		c <- result{v, err}
	}()
	r := <-c
	return r.v, r.err
}

// dial connects from ns to addr and returns the first line it reads, or
// the error.
func dial(t *testing.T, ns netns.NsHandle, addr string) string {
	t.Helper()
	line, err := inNetns(t, ns, func() (string, error) {
		c, err := net.DialTimeout("tcp4", addr, 3*time.Second)
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		return bufio.NewReader(c).ReadString('\n')
	})
	if err != nil {
		return "error: " + err.Error()
	}
	return strings.TrimSpace(line)
}

// serve answers every TCP connection to ln with a greeting.
func serve(t *testing.T, ln net.Listener, greeting string) {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, greeting)
			c.Close()
		}
	}()
}

// TestAttach attaches two "sandboxes" (bare network namespaces) of two
// drivers and checks addresses, NAT, the filter, scoping by alias and
// cleanup.
func TestAttach(t *testing.T) {
	inet := networktest.Setup(t)
	ctx := context.Background()
	pool := netip.MustParsePrefix("10.232.0.0/24")
	scope := fmt.Sprintf("nettest-%d", os.Getpid())
	// Default egress deny list: the fake internet's server is not in it.
	m := networktest.Manager(t, network.Config{Scope: scope, Pool: pool, DNS: []netip.Addr{}})
	ga, err := m.Links("drv-a")
	if err != nil {
		t.Fatal(err)
	}
	gb, err := m.Links("drv-b")
	if err != nil {
		t.Fatal(err)
	}
	// Another instance on the host, with the same pool.
	other := networktest.Manager(t, network.Config{Scope: scope + "-other", Pool: pool, DNS: []netip.Addr{}})
	go2, err := other.Links("drv-a")
	if err != nil {
		t.Fatal(err)
	}

	nsA, nsB, nsC := newNetns(t), newNetns(t), newNetns(t)
	la, err := ga.Attach(ctx, "sb-a", nsA)
	if err != nil {
		t.Fatal(err)
	}
	defer ga.Detach(la)
	lb, err := gb.Attach(ctx, "sb-b", nsB)
	if err != nil {
		t.Fatal(err)
	}
	defer gb.Detach(lb)
	lc, err := go2.Attach(ctx, "sb-c", nsC)
	if err != nil {
		t.Fatal(err)
	}
	defer go2.Detach(lc)
	if la.Prefix() == lb.Prefix() || la.HostLink() == lb.HostLink() {
		t.Fatalf("two drivers of one manager got %v/%s and %v/%s", la.Prefix(), la.HostLink(), lb.Prefix(), lb.HostLink())
	}
	if lc.HostLink() == la.HostLink() || lc.HostLink() == lb.HostLink() || lc.Prefix() == la.Prefix() || lc.Prefix() == lb.Prefix() {
		t.Fatalf("the other instance got %v/%s next to %s and %s", lc.Prefix(), lc.HostLink(), la.HostLink(), lb.HostLink())
	}

	// The sandbox end: address and default route.
	h, err := netlink.NewHandleAt(nsA, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	eth, err := h.LinkByName(network.GuestIface)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := h.AddrList(eth, netlink.FAMILY_V4)
	if err != nil || len(addrs) != 1 || addrs[0].IPNet.String() != fmt.Sprintf("%s/30", la.GuestAddr()) {
		t.Fatalf("sandbox addresses %v, %v; want %s/30", addrs, err, la.GuestAddr())
	}
	routes, err := h.RouteList(nil, netlink.FAMILY_V4)
	if err != nil || !slices.ContainsFunc(routes, func(r netlink.Route) bool {
		return (r.Dst == nil || r.Dst.String() == "0.0.0.0/0") && r.Gw.String() == la.HostAddr().String()
	}) {
		t.Fatalf("sandbox routes %v, %v; want a default route via %s", routes, err, la.HostAddr())
	}

	// A host service on every address, and one in sandbox B.
	hostLn, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	serve(t, hostLn, "host service")
	hostPort := hostLn.Addr().(*net.TCPAddr).Port
	bLn, err := inNetns(t, nsB, func() (net.Listener, error) { return net.Listen("tcp4", "0.0.0.0:0") })
	if err != nil {
		t.Fatal(err)
	}
	serve(t, bLn, "sandbox b")
	bAddr := fmt.Sprintf("%s:%d", lb.GuestAddr(), bLn.Addr().(*net.TCPAddr).Port)
	if got := dial(t, nsB, bAddr); got != "sandbox b" {
		t.Fatalf("sandbox b's own service: %q", got)
	}

	// Out to the "internet", NAT'd to the host's address on that link.
	if got := dial(t, nsA, fmt.Sprintf("%s:%d", inet.Server, inet.Port)); !strings.HasPrefix(got, inet.Gateway.String()+":") {
		t.Fatalf("internet: %q, want a connection from %s", got, inet.Gateway)
	}
	// Not to private ranges, the host itself, or another sandbox.
	for _, addr := range []string{
		fmt.Sprintf("%s:%d", inet.Private, inet.Port),
		fmt.Sprintf("%s:%d", inet.Gateway, hostPort),
		fmt.Sprintf("%s:%d", la.HostAddr(), hostPort),
		fmt.Sprintf("%s:%d", lb.HostAddr(), hostPort),
		bAddr,
	} {
		t0 := time.Now()
		got := dial(t, nsA, addr)
		t.Logf("dial %s: %s (%v)", addr, got, time.Since(t0).Round(time.Millisecond))
		if !strings.HasPrefix(got, "error:") {
			t.Errorf("dial %s from a sandbox: %q, want an error", addr, got)
		}
	}

	// Each driver and instance sees its own links only.
	for _, c := range []struct {
		l    *network.Links
		want []string
	}{{ga, []string{"sb-a"}}, {gb, []string{"sb-b"}}, {go2, []string{"sb-c"}}} {
		if ids, err := c.l.IDs(); err != nil || !slices.Equal(ids, c.want) {
			t.Errorf("IDs of %s = %v, %v; want %v", c.l.Alias(), ids, err, c.want)
		}
	}
	if got := ga.Leftovers("sb-a"); !slices.Equal(got, []string{"link " + la.HostLink()}) {
		t.Errorf("Leftovers(sb-a) = %q", got)
	}
	if err := ga.RemoveID("sb-b"); err != nil {
		t.Fatal(err)
	}
	if err := go2.RemoveID("sb-a"); err != nil {
		t.Fatal(err)
	}
	if got := gb.Leftovers("sb-b"); len(got) != 1 {
		t.Fatalf("another driver's RemoveID took sb-b's link: %q", got)
	}
	if got := ga.Leftovers("sb-a"); len(got) != 1 {
		t.Fatalf("another instance's RemoveID took sb-a's link: %q", got)
	}
	// RemoveID (a sweep after a crash) removes the link; Detach then only
	// frees the block.
	if err := gb.RemoveID("sb-b"); err != nil {
		t.Fatal(err)
	}
	if got := gb.Leftovers("sb-b"); len(got) != 0 {
		t.Fatalf("Leftovers after RemoveID = %q", got)
	}
	gb.Detach(lb)
	ga.Detach(la)
	ga.Detach(la)
	go2.Detach(lc)
	for _, l := range []*network.Lease{la, lb, lc} {
		if _, err := netlink.LinkByName(l.HostLink()); err == nil {
			t.Errorf("%s still exists after Detach", l.HostLink())
		}
	}
	// The other instance skipped the two blocks whose link names were
	// taken; they stay marked.
	if n, o := m.BlocksInUse(), other.BlocksInUse(); n != 0 || o != 2 {
		t.Errorf("blocks taken after Detach: %d and %d, want 0 and 2", n, o)
	}

	// A failed Attach leaves no link and no block taken.
	if _, err := ga.Attach(ctx, "sb-bad", netns.None()); err == nil {
		t.Fatal("Attach to no namespace succeeded")
	}
	if ids, _ := ga.IDs(); len(ids) != 0 || m.BlocksInUse() != 0 {
		t.Fatalf("after a failed Attach: links of %v, %d blocks taken", ids, m.BlocksInUse())
	}
}

// evalboxRules returns the rules of the filter and nat tables that name
// the evalbox chains every server shares.
func evalboxRules(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, table := range []string{"filter", "nat"} {
		b, err := exec.Command("iptables-save", "-t", table).Output()
		if err != nil {
			t.Fatalf("iptables-save: %v", err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "-A ") && strings.Contains(l, "EVALBOX") {
				out = append(out, table+": "+l)
			}
		}
	}
	return out
}

// TestOwnNamesLeaveServersRules: a Manager with names of its own and
// another pool, no resolvers and its own deny list (a test's) installs
// its chains beside the evalbox chains, matching its links only, and
// leaves the evalbox chains, which every server on the host shares, as
// they were. (Tests used to install theirs under the shared names,
// replacing every running server's rules with their pool's.)
func TestOwnNamesLeaveServersRules(t *testing.T) {
	networktest.Exclusive(t)
	if got := mustNew(t, network.Config{Scope: "s"}).Chains(); fmt.Sprint(got) != "[[filter FORWARD EVALBOX-FWD] [filter INPUT EVALBOX-IN] [nat POSTROUTING EVALBOX-NAT] [nat PREROUTING EVALBOX-PX] [filter EVALBOX-FWD EVALBOX-SB]]" {
		t.Fatalf("default chains %v", got)
	}
	for _, bad := range []network.Config{{Scope: "s", LinkPrefix: "EVB"}, {Scope: "s", LinkPrefix: "toolongname"}, {Scope: "s", ChainPrefix: "x y"}} {
		if _, err := network.New(bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	before := evalboxRules(t)
	m := networktest.Manager(t, network.Config{Scope: fmt.Sprintf("own-%d", os.Getpid()), Pool: netip.MustParsePrefix("10.234.0.0/24"),
		DNS: []netip.Addr{}, EgressDeny: network.SpecialRanges()})
	links, err := m.Links("drv")
	if err != nil {
		t.Fatal(err)
	}
	lease, err := links.Attach(context.Background(), "sb-own", newNetns(t))
	if err != nil {
		t.Fatal(err)
	}
	defer links.Detach(lease)
	if !strings.HasPrefix(lease.HostLink(), networktest.LinkPrefix) {
		t.Errorf("host link %s", lease.HostLink())
	}
	if after := evalboxRules(t); !slices.Equal(after, before) {
		t.Errorf("the evalbox chains changed:\nbefore:\n%s\nafter:\n%s", strings.Join(before, "\n"), strings.Join(after, "\n"))
	}
	b, err := exec.Command("iptables-save").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"-A FORWARD -j " + networktest.ChainPrefix + "-FWD",
		"-A " + networktest.ChainPrefix + "-FWD ! -s 10.234.0.0/24 -i " + networktest.LinkPrefix + "+ -j DROP",
		"-A " + networktest.ChainPrefix + "-NAT -s 10.234.0.0/24 ! -o " + networktest.LinkPrefix + "+ -j MASQUERADE",
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("rules lack %q", want)
		}
	}
	if strings.Contains(string(b), "10.234.0.0/24 ! -o evb+") || strings.Contains(string(b), "10.234.0.0/24 -i evb+") {
		t.Errorf("a rule of the test's pool matches the servers' links:\n%s", b)
	}
}

func mustNew(t *testing.T, cfg network.Config) *network.Manager {
	t.Helper()
	m, err := network.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestConcurrentInstallOneJump: Managers installing the rules at once
// (servers starting together) leave one jump to each chain. The check for
// a jump and its insertion are two iptables commands: without the
// host-wide lock around them, several servers inserted it several times.
func TestConcurrentInstallOneJump(t *testing.T) {
	networktest.Exclusive(t)
	// Each Manager takes its first link name, evt0, and the others'
	// Attach skip it (at most 3 times).
	const n = 4
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		m := networktest.Manager(t, network.Config{Scope: fmt.Sprintf("jump-%d-%d", os.Getpid(), i),
			Pool: netip.MustParsePrefix("10.235.0.0/24"), DNS: []netip.Addr{}, EgressDeny: network.SpecialRanges()})
		links, err := m.Links("drv")
		if err != nil {
			t.Fatal(err)
		}
		ns := newNetns(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			lease, err := links.Attach(context.Background(), fmt.Sprintf("sb-j%d", i), ns)
			if err == nil {
				links.Detach(lease)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	b, err := exec.Command("iptables-save").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, jump := range []string{"-A FORWARD -j " + networktest.ChainPrefix + "-FWD", "-A INPUT -j " + networktest.ChainPrefix + "-IN",
		"-A POSTROUTING -j " + networktest.ChainPrefix + "-NAT"} {
		if got := strings.Count(string(b), jump+"\n"); got != 1 {
			t.Errorf("%d copies of %q", got, jump)
		}
	}
}

// TestAttachSkipsARunOfTakenNames: another server on the host holds a run
// of link names (its allocator counts from the same start): an Attach
// skips them all, however many, and gets the next free name and block.
func TestAttachSkipsARunOfTakenNames(t *testing.T) {
	networktest.Setup(t)
	ctx := context.Background()
	pool := netip.MustParsePrefix("10.233.0.0/24")
	scope := fmt.Sprintf("nettest-run-%d", os.Getpid())
	first := networktest.Manager(t, network.Config{Scope: scope, Pool: pool, DNS: []netip.Addr{}})
	other := networktest.Manager(t, network.Config{Scope: scope + "-other", Pool: pool, DNS: []netip.Addr{}})
	g1, err := first.Links("drv")
	if err != nil {
		t.Fatal(err)
	}
	g2, err := other.Links("drv")
	if err != nil {
		t.Fatal(err)
	}
	const held = 8 // more than the 3 an Attach once skipped
	var leases []*network.Lease
	for i := range held {
		l, err := g1.Attach(ctx, fmt.Sprintf("sb-%d", i), newNetns(t))
		if err != nil {
			t.Fatal(err)
		}
		defer g1.Detach(l)
		leases = append(leases, l)
	}
	l, err := g2.Attach(ctx, "sb-other", newNetns(t))
	if err != nil {
		t.Fatalf("Attach next to %d taken names: %v", held, err)
	}
	defer g2.Detach(l)
	for _, h := range leases {
		if h.HostLink() == l.HostLink() || h.Prefix() == l.Prefix() {
			t.Fatalf("the other instance got %s/%v, taken by the first", l.HostLink(), l.Prefix())
		}
	}
	if n := other.BlocksInUse(); n != held+1 {
		t.Errorf("the other instance has %d blocks marked, want %d (the skipped ones and its own)", n, held+1)
	}
}
