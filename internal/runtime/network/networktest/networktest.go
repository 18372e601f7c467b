// Package networktest is what tests of outbound networking share: a fake
// "internet" on this machine for sandboxes to reach, network Managers of
// their own (Manager: their links and iptables chains have names of their
// own, so that their pools, resolvers and deny lists never replace the
// rules of the evalbox servers on the host, such as the e2e suite's), and
// exclusive use of those chains while a test runs (the test binaries of
// several packages run at the same time). It needs root.
package networktest

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/evalbox/evalbox/internal/runtime/network"
	"github.com/evalbox/evalbox/internal/runtime/network/fakenet"
	"github.com/evalbox/evalbox/internal/tlstest"
)

// lockName is an abstract unix socket: bound by the test that holds the
// lock, released by the kernel even if that process dies, and leaving no
// file behind.
const lockName = "@evalbox-networktest-lock"

// Link names of the fake internet (not evb*, so the sandbox rules do not
// match them).
const (
	hostIf = "evxinet0"
	peerIf = "evxinet1"
)

// FakeInternet is a network namespace standing for the outside world,
// linked to the host by a veth pair. Only host routes to its two
// addresses lead there, so nothing leaves the machine. It serves TCP on
// Port of every address, answering each connection with one line, the
// peer address it sees (ip:port), then closing it.
type FakeInternet struct {
	// Gateway is the host's address on the link: the source address
	// that sandboxes' NAT'd connections arrive from. It is a /32
	// (TEST-NET-3), so the default egress deny list (which adds the host's
	// subnets) covers only it, not Server.
	Gateway netip.Addr
	// Server is a public-looking address (TEST-NET-2): not in the default
	// egress deny list, so outbound sandboxes reach it.
	Server netip.Addr
	// Private is an RFC 1918 address of the same server: reachable from
	// the host, denied to sandboxes by the default rules.
	Private netip.Addr
	// Unnamed is another public-looking address of the server, which no
	// DNS name points at.
	Unnamed netip.Addr
	// Port is the TCP port served on every address.
	Port int

	// Server6 is Server's IPv6 address (documentation range): the host
	// reaches it over the link (Gateway6 is the host's end).
	Server6, Gateway6 netip.Addr
	// DNS is the fake internet's resolver (udp and tcp): Names' records.
	DNS netip.AddrPort
	// CAFile is the PEM file of the test CA that signed the certificate
	// of the TLS servers (for every name of Names).
	CAFile string
}

// The fake internet's services, on every address of the server (IPv4 and
// IPv6).
const (
	// HTTPSPort answers every request with "tls <SNI> host <Host> at
	// <the address it came to>".
	HTTPSPort = 443
	// HTTPPort answers every request with "http host <Host> at <address>".
	HTTPPort = 80
	// EchoPort echoes what it receives (TCP); UDPEchoPort too (UDP).
	EchoPort    = 7
	UDPEchoPort = 9
)

// Names are the fake internet's DNS records: names of Server (A), of
// Server6 only (AAAA), and of addresses no sandbox may reach (for DNS
// rebinding).
var Names = map[string][]string{
	"allowed.test": {"198.51.100.2"},
	"denied.test":  {"198.51.100.2"},
	"other.test":   {"198.51.100.2"},
	"echo.test":    {"198.51.100.2"},
	"a.wild.test":  {"198.51.100.2"},
	"b.wild.test":  {"198.51.100.2"},
	"wild.test":    {"198.51.100.2"},
	"v6.test":      {"2001:db8:5::2"},
	"rebind.test":  {"127.0.0.1", "169.254.169.254", "172.16.5.5", "10.200.0.1"},
}

// The names of the links and chains of test Managers (Manager).
const (
	LinkPrefix  = "evt"
	ChainPrefix = "EVBTEST"
)

// Setup takes exclusive use of the test chains for the rest of t
// (Exclusive) and returns a running fake internet.
func Setup(t testing.TB) *FakeInternet {
	t.Helper()
	Exclusive(t)
	return newFakeInternet(t)
}

// Exclusive takes, for the rest of t, exclusive use of the chains of test
// Managers and of the right to compare the host's evalbox chains against a
// baseline: no other test that takes it (every test of outbound
// networking does) installs or removes rules meanwhile. At the end of t it
// restores net.ipv4.ip_forward.
func Exclusive(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("outbound networking needs root")
	}
	for _, c := range []string{"iptables", "iptables-restore"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Skipf("%s not installed", c)
		}
	}
	lock(t)
	fwd, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", fwd, 0o644); err != nil {
			t.Error(err)
		}
	})
}

// Manager returns a network Manager of cfg with the test names (LinkPrefix,
// ChainPrefix): the rules it installs match its links only and leave the
// evalbox chains alone. At the end of t its chains and the jumps to them
// are removed. Call Setup or Exclusive first.
func Manager(t testing.TB, cfg network.Config) *network.Manager {
	t.Helper()
	cfg.LinkPrefix, cfg.ChainPrefix = LinkPrefix, ChainPrefix
	m, err := network.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { RemoveChains(t, m) })
	return m
}

// RemoveChains deletes m's chains and the jumps to them, and fails t if
// any is left.
func RemoveChains(t testing.TB, m *network.Manager) {
	chains := m.Chains()
	for _, c := range chains {
		// Every copy of the jump; absent rules and chains (nothing was
		// installed) are fine.
		for exec.Command("iptables", "--wait", "-t", c[0], "-D", c[1], "-j", c[2]).Run() == nil {
		}
	}
	// The per-sandbox chains of rules sandboxes (a failed test's).
	var own [][2]string
	for _, p := range m.ChainPrefixes() {
		out, _ := exec.Command("iptables", "--wait", "-t", p[0], "-S").Output()
		for _, line := range strings.Split(string(out), "\n") {
			if name, ok := strings.CutPrefix(line, "-N "+p[1]); ok {
				own = append(own, [2]string{p[0], p[1] + name})
			}
		}
	}
	for _, c := range chains {
		_ = exec.Command("iptables", "--wait", "-t", c[0], "-F", c[2]).Run()
	}
	for _, c := range own {
		_ = exec.Command("iptables", "--wait", "-t", c[0], "-F", c[1]).Run()
		_ = exec.Command("iptables", "--wait", "-t", c[0], "-X", c[1]).Run()
	}
	for _, c := range chains {
		_ = exec.Command("iptables", "--wait", "-t", c[0], "-X", c[2]).Run()
	}
	for _, table := range []string{"filter", "nat"} {
		out, err := exec.Command("iptables", "--wait", "-t", table, "-S").CombinedOutput()
		if err != nil {
			t.Errorf("iptables %s after cleanup: %v\n%s", table, err, out)
			continue
		}
		for _, c := range chains {
			if strings.Contains(string(out), c[2]) {
				t.Errorf("iptables %s after cleanup still has %s:\n%s", table, c[2], out)
			}
		}
	}
}

// lock binds the lock socket, waiting for another holder to finish, and
// releases it at the end of t.
func lock(t testing.TB) {
	deadline := time.Now().Add(10 * time.Minute)
	for {
		ln, err := net.Listen("unix", lockName)
		if err == nil {
			t.Cleanup(func() { ln.Close() })
			return
		}
		if !errors.Is(err, unix.EADDRINUSE) || time.Now().After(deadline) {
			t.Fatalf("networktest lock: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func newFakeInternet(t testing.TB) *FakeInternet {
	t.Helper()
	f := &FakeInternet{
		Gateway:  netip.MustParseAddr("203.0.113.1"),
		Server:   netip.MustParseAddr("198.51.100.2"),
		Private:  netip.MustParseAddr("172.16.5.5"),
		Unnamed:  netip.MustParseAddr("198.51.100.3"),
		Server6:  netip.MustParseAddr("2001:db8:5::2"),
		Gateway6: netip.MustParseAddr("2001:db8:5::1"),
	}
	f.DNS = netip.AddrPortFrom(f.Server, 53)
	ca := tlstest.NewCA(t)
	f.CAFile = ca.File
	names := make([]string, 0, len(Names)+1)
	for n := range Names {
		names = append(names, n)
	}
	sort.Strings(names)
	certFile, keyFile := ca.IssueServer(t, append(names, "*.wild.test")...)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	fn, err := fakenet.New(fakenet.Config{HostIf: hostIf, PeerIf: peerIf, Gateway: f.Gateway, Gateway6: f.Gateway6,
		Addrs: []netip.Addr{f.Server, f.Private, f.Unnamed, f.Server6}})
	if err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	var svc *services
	if err := fn.Do(func() error {
		var err error
		if ln, err = net.Listen("tcp4", "0.0.0.0:0"); err != nil {
			return err
		}
		if svc, err = listenServices(cert); err != nil {
			ln.Close()
		}
		return err
	}); err != nil {
		fn.Close()
		t.Fatalf("fake internet: %v", err)
	}
	f.Port = ln.Addr().(*net.TCPAddr).Port
	svc.serve()
	served := make(chan struct{})
	go func() {
		defer close(served)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s\n", c.RemoteAddr())
			c.Close()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-served
		svc.close()
		if err := fn.Close(); err != nil {
			t.Errorf("fake internet: %v", err)
		}
	})
	return f
}
