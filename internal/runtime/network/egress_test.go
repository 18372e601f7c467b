package network_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/evalbox/evalbox/internal/netrules"
	"github.com/evalbox/evalbox/internal/runtime/network"
	"github.com/evalbox/evalbox/internal/runtime/network/networktest"
)

// egressSandbox is a bare network namespace attached as a rules sandbox.
type egressSandbox struct {
	t     *testing.T
	ns    netns.NsHandle
	lease *network.Lease
	links *network.Links
	roots *x509.CertPool
}

func (s *egressSandbox) set(allow, deny []string) {
	s.t.Helper()
	r, err := netrules.Parse(allow, deny)
	if err != nil {
		s.t.Fatal(err)
	}
	if err := s.links.SetEgress(context.Background(), s.lease, r); err != nil {
		s.t.Fatalf("set egress %v %v: %v", allow, deny, err)
	}
}

// lookup resolves name in the sandbox (A records, asked of a server that
// does not exist: whatever server it names, the sandbox's questions reach
// evalbox's resolver): its IPv4 addresses, or the error. (A dns.Client
// dials on the calling goroutine, so on the sandbox's thread; net.Resolver
// would not.)
func (s *egressSandbox) lookup(name string) ([]netip.Addr, error) {
	return inNetns(s.t, s.ns, func() ([]netip.Addr, error) {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), dns.TypeA)
		in, _, err := (&dns.Client{Timeout: 3 * time.Second}).Exchange(m, "192.0.2.53:53")
		if err != nil {
			return nil, err
		}
		if in.Rcode != dns.RcodeSuccess {
			return nil, fmt.Errorf("%s: %s", name, dns.RcodeToString[in.Rcode])
		}
		var out []netip.Addr
		for _, rr := range in.Answer {
			if a, ok := rr.(*dns.A); ok {
				ip, _ := netip.AddrFromSlice(a.A.To4())
				out = append(out, ip)
			}
		}
		return out, nil
	})
}

// query asks the sandbox's resolver for a record of any type and returns
// the answer's rcode and records.
func (s *egressSandbox) query(name string, qtype uint16) (*dns.Msg, error) {
	return inNetns(s.t, s.ns, func() (*dns.Msg, error) {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), qtype)
		in, _, err := (&dns.Client{Timeout: 3 * time.Second}).Exchange(m, "192.0.2.53:53")
		return in, err
	})
}

// https connects to addr with TLS for name and returns the server's
// answer ("tls <sni> host <host>") or "error: …".
func (s *egressSandbox) https(addr, name string) string {
	s.t.Helper()
	out, err := inNetns(s.t, s.ns, func() (string, error) {
		d := &net.Dialer{Timeout: 5 * time.Second}
		c, err := tls.DialWithDialer(d, "tcp4", addr, &tls.Config{ServerName: name, RootCAs: s.roots})
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", name)
		b, err := io.ReadAll(c)
		return lastLine(string(b)), err
	})
	if err != nil {
		return "error: " + err.Error()
	}
	return out
}

// http sends a plain HTTP request with Host host to addr.
func (s *egressSandbox) http(addr, host string) string {
	s.t.Helper()
	out, err := inNetns(s.t, s.ns, func() (string, error) {
		c, err := net.DialTimeout("tcp4", addr, 5*time.Second)
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host)
		b, err := io.ReadAll(c)
		if len(b) == 0 && err == nil {
			err = io.ErrUnexpectedEOF
		}
		return lastLine(string(b)), err
	})
	if err != nil {
		return "error: " + err.Error()
	}
	return out
}

// udp sends a datagram to addr and returns the echo, or "error: …".
func (s *egressSandbox) udp(addr string) string {
	s.t.Helper()
	out, err := inNetns(s.t, s.ns, func() (string, error) {
		c, err := net.Dial("udp4", addr)
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Second))
		if _, err := c.Write([]byte("ping")); err != nil {
			return "", err
		}
		b := make([]byte, 64)
		n, err := c.Read(b)
		return string(b[:n]), err
	})
	if err != nil {
		return "error: " + err.Error()
	}
	return out
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return strings.TrimSpace(s)
}

// TestEgressRules drives a rules sandbox against the fake internet: names
// at SNI and Host (not only at DNS), IP literals, wildcards, CIDRs, UDP,
// IPv6, live updates with the cut of an open connection, DNS of denied
// names and DNS rebinding, and the destinations always refused.
func TestEgressRules(t *testing.T) {
	inet := networktest.Setup(t)
	m := networktest.Manager(t, network.Config{Scope: "egress", Upstream: []netip.AddrPort{inet.DNS}})
	t.Cleanup(func() { m.Close() })
	links, err := m.Links("ns")
	if err != nil {
		t.Fatal(err)
	}
	ns := newNetns(t)
	lease, err := links.Attach(context.Background(), "rules-1", ns)
	if err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(inet.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	sb := &egressSandbox{t: t, ns: ns, lease: lease, links: links, roots: roots}
	srv := inet.Server.String()
	https := net.JoinHostPort(srv, fmt.Sprint(networktest.HTTPSPort))
	plain := net.JoinHostPort(srv, fmt.Sprint(networktest.HTTPPort))
	ok := func(got, want string) {
		t.Helper()
		if got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
	refused := func(got string) {
		t.Helper()
		if !strings.HasPrefix(got, "error") {
			t.Errorf("got %q, want a refusal", got)
		}
	}

	// Nothing allowed: no DNS, no TCP, no UDP.
	sb.set(nil, nil)

	if _, err := sb.lookup("allowed.test"); err == nil {
		t.Error("DNS answered under empty rules")
	}
	refused(sb.https(https, "allowed.test"))
	refused(sb.udp(net.JoinHostPort(srv, fmt.Sprint(networktest.UDPEchoPort))))

	// Domain rules.
	sb.set([]string{"allowed.test", "*.wild.test"}, []string{"denied.test"})
	addrs, err := sb.lookup("allowed.test")
	if err != nil || len(addrs) != 1 || addrs[0] != inet.Server {
		t.Fatalf("lookup allowed.test = %v, %v", addrs, err)
	}
	ok(sb.https(https, "allowed.test"), "tls allowed.test host allowed.test at 198.51.100.2")
	ok(sb.http(plain, "allowed.test"), "http host allowed.test at 198.51.100.2")
	ok(sb.https(https, "a.wild.test"), "tls a.wild.test host a.wild.test at 198.51.100.2")
	// The wildcard is for subdomains only.
	refused(sb.https(https, "wild.test"))
	// A denied name is refused at SNI and Host, though the sandbox has
	// the right address (as from /etc/hosts).
	refused(sb.https(https, "denied.test"))
	refused(sb.http(plain, "denied.test"))
	refused(sb.https(https, "other.test"))
	if _, err := sb.lookup("denied.test"); err == nil {
		t.Error("DNS resolved denied.test")
	}
	// No tunnel: a name the rules do not allow never reaches a resolver
	// (the fake internet's answers TXT for any name), nor do other types.
	for _, q := range []struct {
		name  string
		qtype uint16
	}{{"made-up-tunnel-label.other.test", dns.TypeTXT}, {"allowed.test", dns.TypeTXT}, {"made-up.other.test", dns.TypeA}} {
		in, err := sb.query(q.name, q.qtype)
		if err != nil || len(in.Answer) > 0 {
			t.Errorf("%s %s: %v, %v: want no answer", q.name, dns.TypeToString[q.qtype], in, err)
		}
	}
	// An IP literal under domain rules: only because the resolver gave
	// that address for an allowed name.
	ok(sb.http(plain, srv), "http host "+srv+" at "+srv)
	unnamed := net.JoinHostPort(inet.Unnamed.String(), fmt.Sprint(networktest.HTTPPort))
	refused(sb.http(unnamed, inet.Unnamed.String()))
	// A name asked of an address that is not the name's: the proxy dials
	// the name's own addresses (as it resolves them), not the sandbox's.
	ok(sb.http(unnamed, "allowed.test"), "http host allowed.test at 198.51.100.2")

	// Names are judged wherever they show: a ClientHello sent after the
	// proxy stopped waiting, the second request of a keep-alive
	// connection, a request after blank lines.
	late := func(name string) string {
		out, err := inNetns(t, ns, func() (string, error) {
			c, err := net.DialTimeout("tcp4", https, 5*time.Second)
			if err != nil {
				return "", err
			}
			defer c.Close()
			time.Sleep(500 * time.Millisecond)
			tc := tls.Client(c, &tls.Config{ServerName: name, RootCAs: roots})
			tc.SetDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", name)
			b, err := io.ReadAll(tc)
			if len(b) == 0 && err == nil {
				err = io.ErrUnexpectedEOF // cut
			}
			return lastLine(string(b)), err
		})
		if err != nil {
			return "error: " + err.Error()
		}
		return out
	}
	ok(late("allowed.test"), "tls allowed.test host allowed.test at 198.51.100.2")
	refused(late("other.test"))
	raw := func(payload string) string {
		out, err := inNetns(t, ns, func() (string, error) {
			c, err := net.DialTimeout("tcp4", plain, 5*time.Second)
			if err != nil {
				return "", err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			io.WriteString(c, payload)
			b, err := io.ReadAll(c)
			return strings.Join(strings.Fields(strings.ReplaceAll(string(b), "\r\n", " ")), " "), err
		})
		if err != nil {
			return "error: " + err.Error()
		}
		return out
	}
	keepAlive := raw("GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\nGET / HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n")
	if strings.Contains(keepAlive, "other.test") {
		t.Errorf("a keep-alive connection's second Host: %q", keepAlive)
	}
	if got := raw("\r\n\r\nGET / HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n"); strings.Contains(got, "other.test") {
		t.Errorf("a request after blank lines: %q", got)
	}
	if got := raw("POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: other.test\r\n\r\n"); strings.Contains(got, "other.test") {
		t.Errorf("an ambiguous request: %q", got)
	}
	// A body, chunked, then another request of an allowed name.
	if got := raw("POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: a.wild.test\r\nConnection: close\r\n\r\n"); !strings.Contains(got, "http host allowed.test") || !strings.Contains(got, "http host a.wild.test") {
		t.Errorf("a chunked body and a second request: %q", got)
	}
	// An upgrade its server did not take, then a request of a refused name
	// (a lenient server reads "_GET" as a method): the first request is
	// allowed and may be answered before the proxy cuts the connection at
	// the second, which never reaches the server.
	if got := raw("GET / HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: x\r\n\r\n_GET / HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n"); strings.Contains(got, "other.test") {
		t.Errorf("a request after an upgrade not taken: %q", got)
	}
	// What lenient servers read and a strict parser might not: refused.
	for _, payload := range []string{
		"GET /a b HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n",
		"GET http://allowed.test/ HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: allowed.test\r\nX: y\r\n Content-Length: 0\r\nConnection: close\r\n\r\n",
	} {
		if got := raw(payload); strings.Contains(got, "other.test") || strings.Contains(got, "http host") {
			t.Errorf("%q: answered %q", payload, got)
		}
	}
	// Another name allowed, of the address dialled: fine.
	if got := raw("GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\nGET / HTTP/1.1\r\nHost: b.wild.test\r\nConnection: close\r\n\r\n"); !strings.Contains(got, "http host b.wild.test") {
		t.Errorf("two allowed names of one address: %q", got)
	}

	// DNS rebinding: an allowed name whose records point at refused
	// addresses resolves to nothing, and the proxy never dials them.
	sb.set([]string{"rebind.test"}, nil)
	if addrs, err := sb.lookup("rebind.test"); err == nil && len(addrs) > 0 {
		t.Errorf("rebind.test resolved to %v", addrs)
	}
	refused(sb.http(plain, "rebind.test"))
	// The fresh rules forget the old names' addresses? No: the records
	// stay, but allowed.test is not allowed any more.
	refused(sb.http(plain, srv))

	// CIDR rules: allow and deny, IP literals, UDP.
	sb.set([]string{inet.Server.String() + "/32"}, nil)
	ok(sb.http(plain, srv), "http host "+srv+" at "+srv)
	ok(sb.udp(net.JoinHostPort(srv, fmt.Sprint(networktest.UDPEchoPort))), "ping")
	sb.set([]string{"198.51.100.0/24"}, []string{inet.Server.String() + "/32"})
	refused(sb.http(plain, srv))
	refused(sb.udp(net.JoinHostPort(srv, fmt.Sprint(networktest.UDPEchoPort))))
	// A CIDR never opens what is always refused.
	sb.set([]string{"0.0.0.0/0"}, nil)
	ok(sb.http(plain, srv), "http host "+srv+" at "+srv)
	refused(sb.http(net.JoinHostPort(inet.Private.String(), fmt.Sprint(inet.Port)), "x"))
	refused(sb.http("169.254.169.254:80", "metadata"))
	refused(sb.http(net.JoinHostPort(inet.Gateway.String(), "22"), "host"))
	refused(sb.http(net.JoinHostPort(lease.HostAddr().String(), "22"), "host"))

	// IPv6: a name with IPv6 addresses only is reached through the proxy
	// (a synthetic IPv4 address in the sandbox); an IPv6 deny refuses it.
	sb.set([]string{"v6.test"}, nil)
	addrs, err = sb.lookup("v6.test")
	if err != nil || len(addrs) != 1 {
		t.Fatalf("lookup v6.test = %v, %v", addrs, err)
	}
	v6 := net.JoinHostPort(addrs[0].String(), fmt.Sprint(networktest.HTTPSPort))
	ok(sb.https(v6, "v6.test"), "tls v6.test host v6.test at 2001:db8:5::2")
	sb.set([]string{"v6.test"}, []string{"2001:db8::/32"})
	refused(sb.https(v6, "v6.test"))

	// Live update: an open connection that the new rules deny is cut.
	sb.set([]string{"echo.test"}, nil)
	if _, err := sb.lookup("echo.test"); err != nil {
		t.Fatal(err)
	}
	cut := make(chan string, 1)
	opened := make(chan struct{})
	go func() {
		out, err := inNetns(t, ns, func() (string, error) {
			c, err := net.DialTimeout("tcp4", net.JoinHostPort(srv, fmt.Sprint(networktest.EchoPort)), 5*time.Second)
			if err != nil {
				return "", err
			}
			defer c.Close()
			r := bufio.NewReader(c)
			fmt.Fprintln(c, "one")
			if l, err := r.ReadString('\n'); err != nil || l != "one\n" {
				return "", fmt.Errorf("echo: %q, %v", l, err)
			}
			close(opened)
			c.SetDeadline(time.Now().Add(20 * time.Second))
			for {
				if _, err := fmt.Fprintln(c, "more"); err != nil {
					return "cut", nil
				}
				if _, err := r.ReadString('\n'); err != nil {
					return "cut", nil
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
		if err != nil {
			out = "error: " + err.Error()
		}
		cut <- out
	}()
	select {
	case <-opened:
	case got := <-cut:
		t.Fatalf("echo connection: %s", got)
	}
	t0 := time.Now()
	sb.set([]string{"allowed.test"}, nil)
	select {
	case got := <-cut:
		if got != "cut" {
			t.Fatalf("echo connection: %s", got)
		}
		t.Logf("open connection cut %v after the update", time.Since(t0).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		t.Fatal("the open connection was not cut by the update")
	}
	// And back: new connections follow at once.
	sb.set([]string{"echo.test"}, nil)
	ok(sb.http(plain, "echo.test"), "http host echo.test at 198.51.100.2")

	// Lifting the rules: outbound again; a connection made under the
	// rules carries on, and rules set later judge it again.
	held := holdEcho(t, ns, net.JoinHostPort(srv, fmt.Sprint(networktest.EchoPort)))
	if err := links.SetEgress(context.Background(), lease, nil); err != nil {
		t.Fatal(err)
	}
	ok(sb.http(plain, "denied.test"), "http host denied.test at 198.51.100.2")
	if err := held.echo(); err != nil {
		t.Errorf("a proxied connection after the rules were lifted: %v", err)
	}
	sb.set([]string{"allowed.test"}, nil)
	if err := held.echo(); err == nil {
		t.Error("a connection the new rules deny was not cut")
	}
	held.c.Close()

	// Broadcast into the host stays refused, whatever the rules allow.
	sb.set([]string{"0.0.0.0/0"}, nil)
	hostUDP, err := net.ListenPacket("udp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hostUDP.Close()
	go func() {
		b := make([]byte, 64)
		for {
			n, a, err := hostUDP.ReadFrom(b)
			if err != nil {
				return
			}
			hostUDP.WriteTo(b[:n], a)
		}
	}()
	hostPort := hostUDP.LocalAddr().(*net.UDPAddr).Port
	bcast := lease.Prefix().Addr().Next().Next().Next() // the /30's broadcast
	for _, a := range []string{bcast.String(), lease.HostAddr().String()} {
		if got := sb.udp(net.JoinHostPort(a, fmt.Sprint(hostPort))); !strings.HasPrefix(got, "error") {
			t.Errorf("UDP to the host at %s: %q", a, got)
		}
	}

	// Detach removes the sandbox's chains.
	sb.set([]string{"allowed.test"}, nil)
	if left := links.Leftovers("rules-1"); len(left) != 3 {
		t.Errorf("leftovers of a rules sandbox = %v, want its link and two chains", left)
	}
	links.Detach(lease)
	if left := links.Leftovers("rules-1"); len(left) != 0 {
		t.Errorf("leftovers after detach: %v", left)
	}

	// A crash: a rules sandbox's link goes with its namespace (another
	// server's, which died), its chains stay. A running server's next
	// link of that index (an outbound sandbox) must not inherit them, and
	// its sweep removes those of links gone.
	for _, viaSweep := range []bool{false, true} {
		next := networktest.Manager(t, network.Config{Scope: "egress", Upstream: []netip.AddrPort{inet.DNS}})
		nl, err := next.Links("ns")
		if err != nil {
			t.Fatal(err)
		}
		warm, err := nl.Attach(context.Background(), "warm", newNetns(t)) // its rules installed
		if err != nil {
			t.Fatal(err)
		}
		nl.Detach(warm)
		crashed := networktest.Manager(t, network.Config{Scope: "egress", Upstream: []netip.AddrPort{inet.DNS}})
		cl, err := crashed.Links("ns")
		if err != nil {
			t.Fatal(err)
		}
		// The allocators go round: crashed's first link takes next's
		// last index, its second the one next takes next.
		first, err := cl.Attach(context.Background(), "first", newNetns(t))
		if err != nil {
			t.Fatal(err)
		}
		dead, err := cl.Attach(context.Background(), "rules-dead", newNetns(t))
		if err != nil {
			t.Fatal(err)
		}
		(&egressSandbox{t: t, ns: ns, lease: dead, links: cl}).set([]string{"allowed.test"}, nil)
		chain := fmt.Sprintf("%s-PX-%s", networktest.ChainPrefix, strings.TrimPrefix(dead.HostLink(), networktest.LinkPrefix))
		link, err := netlink.LinkByName(dead.HostLink())
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkDel(link); err != nil {
			t.Fatal(err)
		}
		cl.Detach(first)
		crashed.Close()
		if !chainExists(chain) {
			t.Fatalf("%s gone with the link", chain)
		}
		if viaSweep {
			nl.SweepChains(context.Background())
			if chainExists(chain) {
				t.Errorf("%s survived the sweep", chain)
			}
			next.Close()
			continue
		}
		ns3 := newNetns(t)
		l3, err := nl.Attach(context.Background(), "outbound-next", ns3)
		if err != nil {
			t.Fatal(err)
		}
		if l3.HostLink() != dead.HostLink() {
			t.Fatalf("the next sandbox got %s, not %s", l3.HostLink(), dead.HostLink())
		}
		if chainExists(chain) {
			t.Errorf("%s still there for the link's next sandbox", chain)
		}
		unnamed := net.JoinHostPort(inet.Unnamed.String(), fmt.Sprint(networktest.HTTPPort))
		ok((&egressSandbox{t: t, ns: ns3}).http(unnamed, "x"), "http host x at "+inet.Unnamed.String())
		nl.Detach(l3)
		next.Close()
	}
}

// heldConn is a connection held open from a sandbox to an echo server.
type heldConn struct {
	t  *testing.T
	ns netns.NsHandle
	c  net.Conn
	r  *bufio.Reader
}

func holdEcho(t *testing.T, ns netns.NsHandle, addr string) *heldConn {
	t.Helper()
	c, err := inNetns(t, ns, func() (net.Conn, error) { return net.DialTimeout("tcp4", addr, 5*time.Second) })
	if err != nil {
		t.Fatal(err)
	}
	h := &heldConn{t: t, ns: ns, c: c, r: bufio.NewReader(c)}
	if err := h.echo(); err != nil {
		t.Fatal(err)
	}
	return h
}

// echo sends a line and reads it back.
func (h *heldConn) echo() error {
	h.c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := fmt.Fprintln(h.c, "ping"); err != nil {
		return err
	}
	l, err := h.r.ReadString('\n')
	if err == nil && l != "ping\n" {
		err = fmt.Errorf("echo %q", l)
	}
	return err
}

func chainExists(name string) bool {
	return exec.Command("iptables", "--wait", "-t", "nat", "-n", "-L", name).Run() == nil
}
