package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/spf13/cobra"

	"github.com/evalbox/evalbox/internal/runtime/network/fakenet"
	"github.com/evalbox/evalbox/pkg/client"
)

type networkOpts struct {
	runtimes     []string
	templatesDir string
	n            int
	mb           int
	rpsSeconds   time.Duration
}

func networkCommand() *cobra.Command {
	var o networkOpts
	cmd := &cobra.Command{
		Use:   "network",
		Short: "Egress through the rules proxy against direct, port URLs (both forms, WebSocket, a large download), rule updates",
		Long: `Starts evalbox serve (this binary) on a temporary data dir and a fake internet
on this machine (a network namespace behind a veth pair: nothing leaves the
host), then measures per runtime, as users see it:

- egress: a fresh connection and an echo (p50/p99) and the throughput of a
  download, from an outbound sandbox (direct, NAT) and from a rules sandbox
  (through the egress proxy, allowed by a CIDR);
- port URLs: HTTP request latency through the path form and the host form,
  against the same request made inside the sandbox (the difference is what
  the port URL adds), requests per second with 8 clients, a WebSocket echo
  round trip, and a large download;
- rule updates: PUT /v1/sandboxes/{id}/network.

Needs root (the fake internet's namespace). Prints a Markdown table.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runNetwork(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.runtimes, "runtimes", []string{client.RuntimeGVisor, client.RuntimeNamespaces}, "runtimes to measure")
	f.StringVar(&o.templatesDir, "templates-dir", "/var/lib/evalbox/templates", "template directory (built by evalbox template init)")
	f.IntVar(&o.n, "n", 300, "samples per latency")
	f.IntVar(&o.mb, "mb", 100, "size of the downloads in MB")
	f.DurationVar(&o.rpsSeconds, "rps-time", 3*time.Second, "how long each requests-per-second run lasts")
	return cmd
}

// The bench's fake internet (apart from the test suite's networktest).
var (
	benchGateway = netip.MustParseAddr("203.0.113.50")
	benchServer  = netip.MustParseAddr("198.51.100.50")
)

const benchServerPort = 9000

// startFakeInternet starts the egress target: on benchServer:9000, a line
// "get N" is answered with N bytes (then the end); other lines are echoed.
func startFakeInternet() (stop func(), err error) {
	fn, err := fakenet.New(fakenet.Config{HostIf: "evxbench0", PeerIf: "evxbench1", Gateway: benchGateway, Addrs: []netip.Addr{benchServer}})
	if err != nil {
		return nil, err
	}
	var ln net.Listener
	if err := fn.Do(func() (err error) { ln, err = net.Listen("tcp4", fmt.Sprintf(":%d", benchServerPort)); return err }); err != nil {
		fn.Close()
		return nil, err
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 1<<20)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if n, ok := strings.CutPrefix(strings.TrimSpace(line), "get "); ok {
						left, _ := strconv.ParseInt(n, 10, 64)
						for left > 0 {
							k, err := c.Write(buf[:min(left, int64(len(buf)))])
							if err != nil {
								return
							}
							left -= int64(k)
						}
						return
					}
					if _, err := io.WriteString(c, line); err != nil {
						return
					}
				}
			}()
		}
	}()
	return func() { ln.Close(); wg.Wait(); fn.Close() }, nil
}

// egressProbe runs in a sandbox: n fresh connections with an echo each,
// then a download of mb MiB; prints {"lat": [ms…], "bytes": n, "secs": s}.
const egressProbe = `
import json, socket, sys, time
host, port, n, mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
lat = []
for _ in range(n):
    t = time.perf_counter()
    s = socket.create_connection((host, port), timeout=10)
    s.sendall(b"echo\n")
    f = s.makefile("rb")
    assert f.readline() == b"echo\n"
    lat.append((time.perf_counter() - t) * 1000)
    f.close(); s.close()
s = socket.create_connection((host, port), timeout=30)
s.sendall(b"get %d\n" % (mb << 20))
t = time.perf_counter(); got = 0
while True:
    b = s.recv(1 << 20)
    if not b:
        break
    got += len(b)
print(json.dumps({"lat": lat, "bytes": got, "secs": time.perf_counter() - t}))
`

// benchPortServer runs in a sandbox: HTTP/1.1 with keep-alive on 8000 (/small:
// two bytes; /big?N: N bytes) and a WebSocket echo on 8765.
const benchPortServer = `
import base64, hashlib, http.server, socket, struct, threading
BUF = bytes(1 << 20)
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def log_message(self, *a):
        pass
    def do_GET(self):
        if self.path.startswith("/big"):
            n = int(self.path.split("?")[1])
            self.send_response(200)
            self.send_header("Content-Length", str(n))
            self.end_headers()
            while n > 0:
                k = min(n, len(BUF))
                self.wfile.write(BUF[:k])
                n -= k
            return
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
def exact(c, n):
    b = b""
    while len(b) < n:
        d = c.recv(n - len(b))
        if not d:
            raise EOFError
        b += d
    return b
def ws(c):
    req = b""
    while b"\r\n\r\n" not in req:
        req += c.recv(4096)
    key = [l.split(b":", 1)[1].strip() for l in req.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key:")][0]
    acc = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + acc + b"\r\n\r\n")
    while True:
        h = exact(c, 2)
        op, n = h[0] & 15, h[1] & 127
        if n == 126:
            n = struct.unpack(">H", exact(c, 2))[0]
        elif n == 127:
            n = struct.unpack(">Q", exact(c, 8))[0]
        mask = exact(c, 4) if h[1] & 128 else bytes(4)
        data = bytes(b ^ mask[i % 4] for i, b in enumerate(exact(c, n)))
        if op == 8:
            c.sendall(b"\x88\x00")
            return
        c.sendall(bytes([128 | op, len(data)]) + data if len(data) < 126 else bytes([128 | op, 126]) + struct.pack(">H", len(data)) + data)
def wsserve():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 8765))
    s.listen(16)
    while True:
        c, _ = s.accept()
        threading.Thread(target=ws, args=(c,), daemon=True).start()
threading.Thread(target=wsserve, daemon=True).start()
http.server.ThreadingHTTPServer(("127.0.0.1", 8000), H).serve_forever()
`

// insideProbe runs in a sandbox: n requests to its own server, the
// baseline of the port URL's latency; prints [ms…].
const insideProbe = `
import http.client, json, socket, sys, time
n = int(sys.argv[1])
c = http.client.HTTPConnection("127.0.0.1", 8000)
c.connect()
c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
lat = []
for _ in range(n):
    t = time.perf_counter()
    c.request("GET", "/small")
    r = c.getresponse(); r.read()
    lat.append((time.perf_counter() - t) * 1000)
print(json.dumps(lat))
`

func runNetwork(ctx context.Context, w io.Writer, o networkOpts) error {
	if os.Geteuid() != 0 {
		return errors.New("bench network needs root (its fake internet is a network namespace)")
	}
	stopNet, err := startFakeInternet()
	if err != nil {
		return err
	}
	defer stopNet()
	s, err := startServer(ctx, o.templatesDir, "--sandbox-domain", "sandboxes.bench.test")
	if err != nil {
		return err
	}
	defer s.stop()
	return runRows(w, "network", o.runtimes, o.n, func(rt string) ([]row, error) { return benchNetwork(ctx, s, rt, o) })
}

func benchNetwork(ctx context.Context, s *server, rt string, o networkOpts) ([]row, error) {
	c := s.c
	var rows []row
	create := func(n client.NetworkSpec) (*client.Sandbox, error) {
		sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "python", Runtime: rt, Network: n, Timeout: 1800})
		if err != nil {
			return nil, err
		}
		return sb, nil
	}
	run := func(id string, argv ...string) (string, error) {
		r, err := c.Exec(ctx, id, client.ExecRequest{Argv: argv, Timeout: 600})
		if err == nil && r.ExitCode != 0 {
			err = fmt.Errorf("%s: exit %d: %s", argv[0], r.ExitCode, r.Stderr)
		}
		if err != nil {
			return "", err
		}
		return r.Stdout, nil
	}
	write := func(id, path, body string) error {
		_, err := c.WriteFile(ctx, id, path, strings.NewReader(body), int64(len(body)), 0o644)
		return err
	}

	// Egress: direct (outbound) and through the proxy (rules, a CIDR).
	for _, mode := range []client.NetworkSpec{client.Network(client.NetworkOutbound),
		{Mode: client.NetworkRules, Allow: []string{benchServer.String() + "/32"}}} {
		sb, err := create(mode)
		if err != nil {
			return rows, err
		}
		defer c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
		if err := write(sb.ID, "/tmp/egress.py", egressProbe); err != nil {
			return rows, err
		}
		out, err := run(sb.ID, "python3", "/tmp/egress.py", benchServer.String(), strconv.Itoa(benchServerPort), strconv.Itoa(o.n), strconv.Itoa(o.mb))
		if err != nil {
			return rows, fmt.Errorf("egress %s: %w", mode.Mode, err)
		}
		var res struct {
			Lat   []float64 `json:"lat"`
			Bytes int64     `json:"bytes"`
			Secs  float64   `json:"secs"`
		}
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			return rows, fmt.Errorf("egress %s: %w: %q", mode.Mode, err, out)
		}
		how := "direct (outbound)"
		if mode.Mode == client.NetworkRules {
			how = "through the proxy (rules)"
		}
		rows = append(rows, row{rt, "egress: new connection + echo, " + how, msSample(res.Lat), ""},
			row{rt, "egress: download, " + how, nil, fmt.Sprintf("%.0f MB/s (%d MiB)", float64(res.Bytes)/res.Secs/1e6, res.Bytes>>20)})
	}

	// Rule updates.
	rules, err := create(client.NetworkSpec{Mode: client.NetworkRules, Allow: []string{"pypi.org"}})
	if err != nil {
		return rows, err
	}
	defer c.DeleteSandbox(context.WithoutCancel(ctx), rules.ID)
	var upd sample
	for i := range min(o.n, 100) {
		allow := []string{"pypi.org", "*.pythonhosted.org"}
		if i%2 == 1 {
			allow = []string{"github.com"}
		}
		d, err := timeIt(func() error {
			_, err := c.SetNetwork(ctx, rules.ID, client.NetworkSpec{Mode: client.NetworkRules, Allow: allow})
			return err
		})
		if err != nil {
			return rows, fmt.Errorf("rule update: %w", err)
		}
		upd = append(upd, d)
	}
	rows = append(rows, row{rt, "rule update (PUT …/network)", upd, "applied on the node before it answers"})

	// Port URLs.
	sb, err := create(client.Network(client.NetworkNone))
	if err != nil {
		return rows, err
	}
	defer c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
	if err := write(sb.ID, "/tmp/ports.py", benchPortServer); err != nil {
		return rows, err
	}
	if err := write(sb.ID, "/tmp/inside.py", insideProbe); err != nil {
		return rows, err
	}
	if _, err := c.StartProcess(ctx, sb.ID, client.ExecRequest{Argv: []string{"python3", "/tmp/ports.py"}}); err != nil {
		return rows, err
	}
	pathURL := c.PortURL(sb.ID, 8000)
	hostName := "8000-" + sb.ID + "." + sb.Domain
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	get := func(ctx context.Context, url, host string) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if host != "" {
			req.Host = host
		}
		req.Header.Set(client.HeaderTrafficToken, sb.TrafficToken)
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return nil
	}
	for deadline := time.Now().Add(time.Minute); get(ctx, pathURL+"small", "") != nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			return rows, errors.New("the sandbox's port server did not answer")
		}
	}
	out, err := run(sb.ID, "python3", "/tmp/inside.py", strconv.Itoa(o.n))
	if err != nil {
		return rows, err
	}
	var inside []float64
	if err := json.Unmarshal([]byte(out), &inside); err != nil {
		return rows, fmt.Errorf("inside: %w", err)
	}
	base := msSample(inside)
	rows = append(rows, row{rt, "HTTP request inside the sandbox (baseline)", base, ""})
	for _, form := range []struct{ name, url, host string }{
		{"path form", pathURL + "small", ""},
		{"host form", c.BaseURL() + "/small", hostName},
	} {
		// A warm-up first: the first requests of a form pay for its
		// connection and for waking the sandbox's threads.
		for range 50 {
			if err := get(ctx, form.url, form.host); err != nil {
				return rows, err
			}
		}
		var lat sample
		for range o.n {
			d, err := timeIt(func() error { return get(ctx, form.url, form.host) })
			if err != nil {
				return rows, err
			}
			lat = append(lat, d)
		}
		rps, err := requestsPerSecond(ctx, o.rpsSeconds, 8, func(ctx context.Context) error { return get(ctx, form.url, form.host) })
		if err != nil {
			return rows, err
		}
		rows = append(rows, row{rt, "HTTP request, port URL " + form.name, lat,
			fmt.Sprintf("+%s ms p50 over the baseline; %.0f req/s with 8 clients", ms(lat.pct(50)-base.pct(50)), rps)})
	}
	// A large download, three times: one takes a fraction of a second,
	// which this machine's noise moves by a quarter.
	var rates []float64
	for range 3 {
		t0 := time.Now()
		if err := get(ctx, pathURL+"big?"+strconv.Itoa(o.mb<<20), ""); err != nil {
			return rows, err
		}
		rates = append(rates, float64(o.mb<<20)/time.Since(t0).Seconds()/1e6)
	}
	slices.Sort(rates)
	rows = append(rows, row{rt, "download through a port URL", nil,
		fmt.Sprintf("%.0f MB/s, median of 3 (%.0f–%.0f; %d MiB each)", rates[1], rates[0], rates[2], o.mb)})
	// WebSocket echo.
	wsURL := "ws" + strings.TrimPrefix(c.PortURL(sb.ID, 8765), "http")
	conn, _, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: http.Header{client.HeaderTrafficToken: {sb.TrafficToken}}})
	if err != nil {
		return rows, fmt.Errorf("websocket: %w", err)
	}
	defer conn.CloseNow()
	var rtt sample
	for range o.n {
		d, err := timeIt(func() error {
			if err := conn.Write(ctx, websocket.MessageText, []byte("ping")); err != nil {
				return err
			}
			_, b, err := conn.Read(ctx)
			if err == nil && string(b) != "ping" {
				err = fmt.Errorf("echo %q", b)
			}
			return err
		})
		if err != nil {
			return rows, fmt.Errorf("websocket: %w", err)
		}
		rtt = append(rtt, d)
	}
	conn.Close(websocket.StatusNormalClosure, "")
	rows = append(rows, row{rt, "WebSocket echo round trip, port URL", rtt, ""})
	return rows, nil
}

// requestsPerSecond runs f from workers goroutines for d and returns the
// rate of successful calls.
func requestsPerSecond(ctx context.Context, d time.Duration, workers int, f func(context.Context) error) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var mu sync.Mutex
	var n int
	var firstErr error
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				err := f(ctx)
				mu.Lock()
				if err == nil {
					n++
				} else if ctx.Err() == nil && firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return float64(n) / time.Since(start).Seconds(), firstErr
}

func msSample(v []float64) sample {
	out := make(sample, len(v))
	for i, x := range v {
		out[i] = time.Duration(x * float64(time.Millisecond))
	}
	return out
}
