package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/runtime/network"
	"github.com/evalbox/evalbox/internal/runtime/network/networktest"
	"github.com/evalbox/evalbox/pkg/client"
)

// TestNetwork checks network "outbound" and "none" on every runtime,
// against a fake internet on this machine (nothing leaves it): outbound
// sandboxes reach it through NAT, but not the host (where the server
// listens on every address), private ranges, or another sandbox; a
// sandbox without network reaches nothing.
func TestNetwork(t *testing.T) {
	// First, so that its cleanup runs after the server has stopped. The
	// chains the server installs are the suite's (TestMain).
	inet := networktest.Setup(t)
	s := startServerT(t, serverOptions{listenAll: true})
	_, serverPort, _ := net.SplitHostPort(s.addr)
	hostAddrs := hostIPv4s(t)
	// The server answers on the host's addresses, from the host.
	for _, a := range hostAddrs {
		c, err := net.DialTimeout("tcp4", net.JoinHostPort(a.String(), serverPort), 5*time.Second)
		if err != nil {
			t.Fatalf("the server is not reachable from the host at %s: %v", a, err)
		}
		c.Close()
	}
	inetAddr := net.JoinHostPort(inet.Server.String(), fmt.Sprint(inet.Port))

	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			c, _, _ := newTeam(t, s, client.Limits{MaxSandboxes: 10, MaxConcurrentExec: 10})
			create := func(netMode string) *client.Sandbox {
				t.Helper()
				t0 := time.Now()
				sb, err := c.CreateSandbox(ctxT(t, 2*time.Minute), client.CreateSandboxRequest{Template: "base", Runtime: rt, Network: client.Network(netMode)})
				if err != nil {
					t.Fatalf("create %s sandbox: %v", netMode, err)
				}
				t.Logf("create %s/%s: %v", rt, netMode, time.Since(t0).Round(time.Millisecond))
				t.Cleanup(func() {
					if err := c.DeleteSandbox(context.Background(), sb.ID); err != nil && !client.IsNotFound(err) {
						t.Errorf("delete %s: %v", sb.ID, err)
					}
					assertGone(t, s, sb.ID)
				})
				if sb.Network != netMode {
					t.Fatalf("sandbox network = %q, want %q", sb.Network, netMode)
				}
				return sb
			}
			sh := func(id, cmd string) string {
				t.Helper()
				return strings.TrimSpace(mustExec(t, c, id, client.ExecRequest{Cmd: cmd, Timeout: 30}).Stdout)
			}
			// dial connects from sandbox id to addr and returns the first
			// line read, or a line starting with "dial error".
			dial := func(id, addr string) string {
				t.Helper()
				host, port, _ := net.SplitHostPort(addr)
				t0 := time.Now()
				out := sh(id, fmt.Sprintf(`if out=$(timeout 5 bash -c 'exec 3<>/dev/tcp/%s/%s && head -n1 <&3' 2>&1); then echo "$out"; else echo "dial error $?: $out" | tr '\n' ' '; fi`, host, port))
				t.Logf("%s: dial %s: %s (%v)", id, addr, out, time.Since(t0).Round(time.Millisecond))
				return out
			}
			refused := func(id, addr string) {
				t.Helper()
				if got := dial(id, addr); !strings.HasPrefix(got, "dial error") {
					t.Errorf("dial %s from %s: %q, want an error", addr, id, got)
				}
			}
			a := create(client.NetworkOutbound)
			b := create(client.NetworkOutbound)
			none := create(client.NetworkNone)
			aAddr, bAddr := sandboxAddr(t, sh(a.ID, "hostname -I")), sandboxAddr(t, sh(b.ID, "hostname -I"))
			if aAddr == bAddr {
				t.Fatalf("two sandboxes have address %s", aAddr)
			}

			// A service in sandbox b, reachable from b itself.
			bService := net.JoinHostPort(bAddr.String(), "8000")
			if _, err := c.StartProcess(ctxT(t, time.Minute), b.ID, client.ExecRequest{Argv: []string{"perl", "-MIO::Socket::INET", "-e",
				`$s = IO::Socket::INET->new(Listen => 5, LocalPort => 8000, ReuseAddr => 1) or die "listen: $!"; while ($c = $s->accept) { print $c "sandbox b\n"; close $c }`}}); err != nil {
				t.Fatal(err)
			}
			var got string
			for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
				if got = dial(b.ID, bService); got == "sandbox b" {
					break
				}
			}
			if got != "sandbox b" {
				t.Fatalf("sandbox b's own service: %q", got)
			}

			// Outbound TCP reaches the fake internet, NAT'd to the host.
			if got := dial(a.ID, inetAddr); !strings.HasPrefix(got, inet.Gateway.String()+":") {
				t.Fatalf("fake internet from an outbound sandbox: %q, want a connection from %s", got, inet.Gateway)
			}
			// Not the server on any host address (its sandbox-side
			// gateway included), private ranges, or another sandbox.
			gateway := aAddr.Prev()
			for _, h := range append(hostAddrs, gateway) {
				refused(a.ID, net.JoinHostPort(h.String(), serverPort))
			}
			refused(a.ID, net.JoinHostPort(inet.Private.String(), fmt.Sprint(inet.Port)))
			refused(a.ID, bService)

			// Network none: nothing, not even the host.
			refused(none.ID, inetAddr)
			refused(none.ID, net.JoinHostPort(hostAddrs[0].String(), serverPort))
			if out := sh(none.ID, "hostname -I"); out != "" && !strings.HasPrefix(out, "127.") {
				t.Errorf("addresses of a sandbox without network: %q", out)
			}
		})
	}
}

// sandboxAddr parses the sandbox's own IPv4 address from `hostname -I`.
func sandboxAddr(t *testing.T, out string) netip.Addr {
	t.Helper()
	for _, f := range strings.Fields(out) {
		if a, err := netip.ParseAddr(f); err == nil && a.Is4() && network.DefaultPool.Contains(a) {
			return a
		}
	}
	t.Fatalf("no outbound address in %q", out)
	return netip.Addr{}
}

// hostIPv4s returns the host's IPv4 addresses other than loopback and
// sandbox links.
func hostIPv4s(t *testing.T) []netip.Addr {
	t.Helper()
	ifaces, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagLoopback != 0 || strings.HasPrefix(ifc.Name, network.HostIfPrefix) {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP.To4()); ok {
					out = append(out, ip)
				}
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("the host has no IPv4 address besides loopback")
	}
	return out
}

// netProbe is the rules tests' client in a sandbox (python3, stdlib only):
//
//	probe https HOST NAME   TLS to HOST:443 with SNI and Host NAME
//	probe http HOST NAME    plain HTTP to HOST (:80 unless HOST has a
//	                        port) with Host NAME
//	probe resolve NAME      its IPv4 addresses (DNS, then /etc/hosts)
//	probe udp HOST PORT     a datagram to an echo server
//	probe hold HOST FILE    an echo connection to HOST:7 held open: FILE
//	                        says "open", then "cut" when it breaks
//
// It prints one line: the server's answer, or "error: …".
const netProbe = `
import socket, ssl, sys, time
def https(host, name):
    ctx = ssl.create_default_context(cafile="/tmp/ca.pem")
    s = ctx.wrap_socket(socket.create_connection((host, 443), timeout=5), server_hostname=name)
    return request(s, name)
def http(host, name):
    port = 80
    if host.count(":") == 1:
        host, port = host.split(":")
    return request(socket.create_connection((host, int(port)), timeout=5), name)
def request(s, name):
    s.sendall(("GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % name).encode())
    data = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        data += b
    lines = data.decode().strip().splitlines()
    if not lines:
        raise EOFError("no answer")
    return lines[-1]
def resolve(name):
    return " ".join(sorted({a[4][0] for a in socket.getaddrinfo(name, 80, socket.AF_INET, socket.SOCK_STREAM)}))
def udp(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(2)
    s.sendto(b"ping", (host, int(port)))
    return s.recv(64).decode()
def hold(host, path):
    s = socket.create_connection((host, 7), timeout=5)
    f = s.makefile("rwb")
    f.write(b"one\n"); f.flush()
    assert f.readline() == b"one\n"
    open(path, "w").write("open\n")
    s.settimeout(30)
    try:
        while True:
            f.write(b"more\n"); f.flush()
            if f.readline() != b"more\n":
                break
            time.sleep(0.02)
    except OSError:
        pass
    open(path, "w").write("cut\n")
    return "cut"
try:
    print(globals()[sys.argv[1]](*sys.argv[2:]))
except Exception as e:
    print("error: %s: %s" % (type(e).__name__, e))
`

// TestNetworkRules checks network mode "rules" on both runtimes against
// the fake internet, through the real server: names judged at SNI and
// Host (an /etc/hosts entry for a denied name does not help), IP literals,
// wildcards, CIDR allows and denies, UDP, IPv6, live updates both ways
// with an open connection cut, DNS for denied names and DNS rebinding, and
// the destinations always refused (the API port, another sandbox,
// 169.254.169.254); and the bad input that changes nothing.
func TestNetworkRules(t *testing.T) {
	inet := networktest.Setup(t)
	s := startServerT(t, serverOptions{listenAll: true, args: []string{"--egress-dns", inet.DNS.String()}})
	_, serverPort, _ := net.SplitHostPort(s.addr)
	hostAddrs := hostIPv4s(t)
	ca, err := os.ReadFile(inet.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	srvIP := inet.Server.String()
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			c, _, _ := newTeam(t, s, client.Limits{MaxSandboxes: 10, MaxConcurrentExec: 10})
			create := func(n client.NetworkSpec) *client.Sandbox {
				t.Helper()
				sb, err := c.CreateSandbox(ctxT(t, 2*time.Minute), client.CreateSandboxRequest{Template: "python", Runtime: rt, Network: n, Timeout: 600})
				if err != nil {
					t.Fatalf("create %+v: %v", n, err)
				}
				t.Cleanup(func() {
					if err := c.DeleteSandbox(context.Background(), sb.ID); err != nil && !client.IsNotFound(err) {
						t.Errorf("delete %s: %v", sb.ID, err)
					}
					assertGone(t, s, sb.ID)
				})
				for _, f := range []struct{ path, body string }{{"/tmp/ca.pem", string(ca)}, {"/tmp/probe.py", netProbe}} {
					if _, err := c.WriteFile(ctxT(t, time.Minute), sb.ID, f.path, strings.NewReader(f.body), int64(len(f.body)), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				return sb
			}
			probe := func(id string, args ...string) string {
				t.Helper()
				t0 := time.Now()
				r := mustExec(t, c, id, client.ExecRequest{Argv: append([]string{"python3", "/tmp/probe.py"}, args...), Timeout: 30})
				out := strings.TrimSpace(r.Stdout + r.Stderr)
				t.Logf("%s: probe %s: %s (%v)", id, strings.Join(args, " "), out, time.Since(t0).Round(time.Millisecond))
				return out
			}
			want := func(got, want string) {
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
			set := func(id string, allow, deny []string) {
				t.Helper()
				sb, err := c.SetNetwork(ctxT(t, time.Minute), id, client.NetworkSpec{Mode: client.NetworkRules, Allow: allow, Deny: deny})
				if err != nil {
					t.Fatalf("set network %v %v: %v", allow, deny, err)
				}
				if sb.Network != client.NetworkRules || !slices.Equal(sb.NetworkRules.Allow, nonNil(allow)) || !slices.Equal(sb.NetworkRules.Deny, nonNil(deny)) {
					t.Fatalf("after the update: %s %+v", sb.Network, sb.NetworkRules)
				}
			}

			sb := create(client.NetworkSpec{Mode: client.NetworkRules, Allow: []string{"allowed.test", "*.wild.test"}, Deny: []string{"denied.test"}})
			if sb.Network != client.NetworkRules || sb.NetworkRules == nil || len(sb.NetworkRules.Allow) != 2 {
				t.Fatalf("created %s %+v", sb.Network, sb.NetworkRules)
			}
			// Domains over HTTPS and HTTP; wildcards for subdomains only.
			want(probe(sb.ID, "https", "allowed.test", "allowed.test"), "tls allowed.test host allowed.test at "+srvIP)
			want(probe(sb.ID, "http", "allowed.test", "allowed.test"), "http host allowed.test at "+srvIP)
			want(probe(sb.ID, "https", "a.wild.test", "a.wild.test"), "tls a.wild.test host a.wild.test at "+srvIP)
			refused(probe(sb.ID, "https", "wild.test", "wild.test"))
			// DNS of a denied name, and of a name not allowed.
			refused(probe(sb.ID, "resolve", "denied.test"))
			refused(probe(sb.ID, "resolve", "other.test"))
			// A denied name is refused at SNI and Host, even with the right
			// address in /etc/hosts.
			mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "echo '" + srvIP + " denied.test other.test' >> /etc/hosts"})
			want(probe(sb.ID, "resolve", "denied.test"), srvIP)
			refused(probe(sb.ID, "https", "denied.test", "denied.test"))
			refused(probe(sb.ID, "http", "denied.test", "denied.test"))
			refused(probe(sb.ID, "https", "other.test", "other.test"))
			// An IP literal under domain rules: refused, but for the
			// addresses evalbox's DNS gave for an allowed name.
			refused(probe(sb.ID, "http", inet.Unnamed.String(), inet.Unnamed.String()))
			want(probe(sb.ID, "http", srvIP, srvIP), "http host "+srvIP+" at "+srvIP)
			// A name asked of another address reaches the name's own.
			want(probe(sb.ID, "http", inet.Unnamed.String(), "allowed.test"), "http host allowed.test at "+srvIP)

			// CIDR allow and deny, UDP.
			set(sb.ID, []string{"198.51.100.0/24"}, []string{inet.Unnamed.String() + "/32"})
			want(probe(sb.ID, "http", srvIP, "x"), "http host x at "+srvIP)
			refused(probe(sb.ID, "http", inet.Unnamed.String(), "x"))
			want(probe(sb.ID, "udp", srvIP, fmt.Sprint(networktest.UDPEchoPort)), "ping")
			refused(probe(sb.ID, "udp", inet.Unnamed.String(), fmt.Sprint(networktest.UDPEchoPort)))

			// IPv6: an IPv6-only name through the proxy; an IPv6 deny.
			set(sb.ID, []string{"v6.test"}, nil)
			want(probe(sb.ID, "https", "v6.test", "v6.test"), "tls v6.test host v6.test at "+inet.Server6.String())
			set(sb.ID, []string{"v6.test"}, []string{"2001:db8::/32"})
			refused(probe(sb.ID, "https", "v6.test", "v6.test"))

			// DNS rebinding: an allowed name pointing at refused addresses.
			set(sb.ID, []string{"rebind.test"}, nil)
			refused(probe(sb.ID, "resolve", "rebind.test"))
			refused(probe(sb.ID, "http", "rebind.test", "rebind.test"))

			// Live update both ways: an open connection cut within a
			// second, then new connections allowed again.
			set(sb.ID, []string{"echo.test"}, nil)
			if _, err := c.StartProcess(ctxT(t, time.Minute), sb.ID, client.ExecRequest{Argv: []string{"python3", "/tmp/probe.py", "hold", "echo.test", "/tmp/hold"}}); err != nil {
				t.Fatal(err)
			}
			state := func() string {
				return strings.TrimSpace(mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "cat /tmp/hold 2>/dev/null || true"}).Stdout)
			}
			for deadline := time.Now().Add(30 * time.Second); state() != "open"; time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the held connection did not open: %q", state())
				}
			}
			t0 := time.Now()
			set(sb.ID, []string{"allowed.test"}, nil)
			for state() != "cut" {
				if time.Since(t0) > 5*time.Second {
					t.Fatal("the open connection was not cut by the update")
				}
				time.Sleep(20 * time.Millisecond)
			}
			t.Logf("open connection cut %v after the update was sent", time.Since(t0).Round(time.Millisecond))
			refused(probe(sb.ID, "http", "echo.test", "echo.test"))
			set(sb.ID, []string{"echo.test"}, nil)
			want(probe(sb.ID, "http", "echo.test", "echo.test"), "http host echo.test at "+srvIP)
			// To outbound and back.
			if got, err := c.SetNetwork(ctxT(t, time.Minute), sb.ID, client.Network(client.NetworkOutbound)); err != nil || got.Network != client.NetworkOutbound || got.NetworkRules != nil {
				t.Fatalf("to outbound: %+v, %v", got, err)
			}
			want(probe(sb.ID, "http", inet.Unnamed.String(), "x"), "http host x at "+inet.Unnamed.String())
			set(sb.ID, nil, nil)
			refused(probe(sb.ID, "http", inet.Unnamed.String(), "x"))

			// Always refused, whatever the rules: the API on every host
			// address (the sandbox's gateway too), another sandbox, the
			// metadata address, private ranges.
			other := create(client.Network(client.NetworkOutbound))
			if _, err := c.StartProcess(ctxT(t, time.Minute), other.ID, client.ExecRequest{Argv: []string{"python3", "-m", "http.server", "8000"}}); err != nil {
				t.Fatal(err)
			}
			otherAddr := sandboxAddr(t, strings.TrimSpace(mustExec(t, c, other.ID, client.ExecRequest{Cmd: "hostname -I"}).Stdout))
			set(sb.ID, []string{"0.0.0.0/0", "::/0"}, nil)
			want(probe(sb.ID, "http", inet.Unnamed.String(), "x"), "http host x at "+inet.Unnamed.String())
			gateway := sandboxAddr(t, strings.TrimSpace(mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "hostname -I"}).Stdout)).Prev()
			for _, h := range append(hostAddrs, gateway) {
				refused(probe(sb.ID, "http", h.String()+":"+serverPort, "x"))
			}
			refused(probe(sb.ID, "http", otherAddr.String()+":8000", "x"))
			refused(probe(sb.ID, "http", "169.254.169.254", "x"))
			refused(probe(sb.ID, "http", inet.Private.String(), "x"))
			refused(probe(sb.ID, "udp", "169.254.169.254", "123"))

			// Bad input: a 400 that names the entry, and nothing changes.
			before, err := c.GetSandbox(ctxT(t, time.Minute), sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			long := make([]string, 257)
			for i := range long {
				long[i] = fmt.Sprintf("h%d.example.com", i)
			}
			for _, bad := range []struct {
				spec client.NetworkSpec
				msg  string
			}{
				{client.NetworkSpec{Mode: client.NetworkRules, Allow: []string{"ok.test", "10.0.0.0/33"}}, `network.allow[1]: "10.0.0.0/33"`},
				{client.NetworkSpec{Mode: client.NetworkRules, Deny: []string{"bad_*.test"}}, `network.deny[0]`},
				{client.NetworkSpec{Mode: client.NetworkRules, Allow: []string{"1.2.3.4"}}, `network.allow[0]: "1.2.3.4"`},
				{client.NetworkSpec{Mode: client.NetworkRules, Allow: long}, "more than 256 entries"},
				{client.NetworkSpec{Mode: client.NetworkOutbound, Allow: []string{"x.test"}}, "need mode"},
				{client.NetworkSpec{Mode: "open"}, "network.mode"},
			} {
				_, err := c.SetNetwork(ctxT(t, time.Minute), sb.ID, bad.spec)
				if client.ErrorCode(err) != client.CodeBadRequest || !strings.Contains(err.Error(), bad.msg) {
					t.Errorf("update %+v: %v, want a 400 naming %q", bad.spec.Allow, err, bad.msg)
				}
				if _, err := c.CreateSandbox(ctxT(t, time.Minute), client.CreateSandboxRequest{Template: "python", Runtime: rt, Network: bad.spec}); client.ErrorCode(err) != client.CodeBadRequest {
					t.Errorf("create %+v: %v, want a 400", bad.spec.Allow, err)
				}
			}
			after, err := c.GetSandbox(ctxT(t, time.Minute), sb.ID)
			if err != nil || !reflect.DeepEqual(after.NetworkRules, before.NetworkRules) {
				t.Errorf("rules after failed updates: %+v, before %+v (%v)", after.NetworkRules, before.NetworkRules, err)
			}
			want(probe(sb.ID, "http", inet.Unnamed.String(), "x"), "http host x at "+inet.Unnamed.String())
			// A sandbox without network cannot be opened; none is no target.
			none := create(client.Network(client.NetworkNone))
			if _, err := c.SetNetwork(ctxT(t, time.Minute), none.ID, client.NetworkSpec{Mode: client.NetworkRules, Allow: []string{"allowed.test"}}); client.ErrorCode(err) != client.CodeConflict {
				t.Errorf("opening a none sandbox: %v, want conflict", err)
			}
			if _, err := c.SetNetwork(ctxT(t, time.Minute), sb.ID, client.Network(client.NetworkNone)); client.ErrorCode(err) != client.CodeConflict {
				t.Errorf("to none: %v, want conflict", err)
			}

			// The rules survive a pause (gVisor) and come with a fork, as
			// they are when it is taken (after an update): in force on the
			// new link before the restored processes run again (gVisor), or
			// before any command runs in a fork of files (namespaces).
			ctx := ctxT(t, 2*time.Minute)
			ruled := create(client.NetworkSpec{Mode: client.NetworkRules, Allow: []string{"allowed.test", "*.wild.test"}})
			set(ruled.ID, []string{"allowed.test"}, nil)
			if rt == client.RuntimeGVisor {
				if _, err := c.Pause(ctx, ruled.ID); err != nil {
					t.Fatal(err)
				}
				if _, err := c.Resume(ctx, ruled.ID, client.ResumeRequest{}); err != nil {
					t.Fatal(err)
				}
			}
			fork, err := c.Fork(ctx, ruled.ID, client.ForkRequest{Count: 1})
			if err != nil {
				t.Fatal(err)
			}
			f := fork.Sandboxes[0]
			t.Cleanup(func() {
				if err := c.DeleteSandbox(context.Background(), f.ID); err != nil && !client.IsNotFound(err) {
					t.Errorf("delete %s: %v", f.ID, err)
				}
				assertGone(t, s, f.ID)
			})
			if f.Network != client.NetworkRules || f.NetworkRules == nil || !slices.Equal(f.NetworkRules.Allow, []string{"allowed.test"}) {
				t.Errorf("fork's network: %s %+v", f.Network, f.NetworkRules)
			}
			for _, id := range []string{ruled.ID, f.ID} {
				want(probe(id, "https", "allowed.test", "allowed.test"), "tls allowed.test host allowed.test at "+srvIP)
				refused(probe(id, "https", "other.test", "other.test"))
				refused(probe(id, "https", "a.wild.test", "a.wild.test"))
				refused(probe(id, "http", inet.Unnamed.String(), inet.Unnamed.String()))
			}
		})
	}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
