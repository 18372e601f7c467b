package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
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
	s, err := startServer(serverOptions{listenAll: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.stop(); err != nil {
			t.Errorf("stop server: %v", err)
		}
	})
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
				sb, err := c.CreateSandbox(ctxT(t, 2*time.Minute), client.CreateSandboxRequest{Template: "base", Runtime: rt, Network: netMode})
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
