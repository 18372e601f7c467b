package namespaces

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/evalbox/evalbox/internal/runtime"
	"github.com/evalbox/evalbox/internal/runtime/network"
	"github.com/evalbox/evalbox/internal/runtime/network/networktest"
)

func TestOutbound(t *testing.T) {
	inet := networktest.Setup(t)
	netm := networktest.Manager(t, network.Config{
		Scope:      fmt.Sprintf("evalbox-ns-test-%d", os.Getpid()),
		Pool:       netip.MustParsePrefix("10.231.0.0/24"),
		DNS:        []netip.Addr{},
		EgressDeny: network.SpecialRanges(), // not the host's subnets
	})
	r := newRuntime(t, Config{Network: netm})

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

	// A stale link holding the first name: its block is skipped. (Another
	// test process of the host using the test Managers' names may hold it
	// already: that is a stale name too.)
	first := networktest.LinkPrefix + "0"
	stale := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: first}, PeerName: "evxstale1"}
	if err := netlink.LinkAdd(stale); err == nil {
		defer netlink.LinkDel(stale)
	} else if _, lerr := netlink.LinkByName(first); lerr != nil {
		t.Fatal(err)
	}

	spec := testSpec(t, "outbound")
	spec.Network = runtime.NetworkOutbound
	a := startSandbox(t, r, spec)
	if a.s.lease.HostLink() == first {
		t.Errorf("first sandbox got %s, held by a stale link", first)
	}
	other := testSpec(t, "outbound-2")
	other.Network = runtime.NetworkOutbound
	b := startSandbox(t, r, other)

	dial := func(a *agent, addr string) string {
		t.Helper()
		out, _ := a.run(fmt.Sprintf("standin dial %s 2000", addr))
		return strings.TrimSpace(out)
	}
	// Out to the "internet", NATed to the host's address on that link.
	if got := dial(a, fmt.Sprintf("%s:%d", inet.Server, inet.Port)); !strings.HasPrefix(got, fmt.Sprintf(`dial got "%s:`, inet.Gateway)) {
		t.Fatalf("internet: %q", got)
	}
	// Not to private ranges, the host itself, or the other sandbox.
	for _, addr := range []string{
		fmt.Sprintf("%s:%d", inet.Private, inet.Port),
		fmt.Sprintf("%s:%d", inet.Gateway, hostPort),
		fmt.Sprintf("%s:%d", a.s.lease.HostAddr(), hostPort),
		fmt.Sprintf("127.0.0.1:%d", hostPort),
		fmt.Sprintf("%s:%d", b.s.lease.GuestAddr(), 22),
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
	hostIf := a.s.lease.HostLink()
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

func BenchmarkColdStartOutbound(b *testing.B) {
	networktest.Setup(b)
	netm := networktest.Manager(b, network.Config{Scope: fmt.Sprintf("evalbox-ns-test-%d", os.Getpid()),
		Pool: netip.MustParsePrefix("10.231.0.0/24"), DNS: []netip.Addr{}})
	benchColdStart(b, newRuntime(b, Config{Network: netm}), runtime.NetworkOutbound)
}
