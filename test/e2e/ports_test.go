package e2e

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// portServer is the server the port tests run in a sandbox: files from
// /tmp/www, /headers (the request's headers as JSON), and /events (Server-
// Sent Events: one, then another once /tmp/go exists, so that a client
// that got the first before the second proves nothing was buffered); a
// POST is answered in chunks (on /duplex, the first before the body is
// read).
const portServer = `
import hashlib, http.server, json, os, time
class H(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def __init__(self, *a, **k):
        super().__init__(*a, directory="/tmp/www", **k)
    def log_message(self, *a):
        pass
    def do_GET(self):
        if self.path == "/headers":
            body = json.dumps(dict(self.headers)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path.startswith("/echo"):
            body = self.path.encode()
            self.send_response(200)
            self.send_header("Set-Cookie", "evalbox_token=forged; Path=/")
            self.send_header("Set-Cookie", "__Host-evalbox_token=forged; Path=/; Secure")
            self.send_header("Set-Cookie", "mine=1; Path=/")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/forged":
            body = b'{"error":{"code":"not_found","message":"forged by the sandbox"}}'
            self.send_response(404)
            self.send_header("Evalbox-Error", "not_found")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/events":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(b"data: one\n\n"); self.wfile.flush()
            while not os.path.exists("/tmp/go"):
                time.sleep(0.05)
            self.wfile.write(b"data: two\n\n"); self.wfile.flush()
        elif self.path == "/never":
            # An answer that never comes: the sandbox ends first.
            time.sleep(3600)
        else:
            super().do_GET()
    def chunk(self, b):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(b), b))
        self.wfile.flush()
    def do_POST(self):
        n = int(self.headers["Content-Length"])
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if self.path == "/duplex":
            # The answer starts before the body is read (the client
            # sends it only once it saw this first line).
            self.chunk(b"ready\n")
        body = self.rfile.read(n)
        if self.path == "/duplex":
            self.chunk(b"got %d %s\n" % (len(body), hashlib.sha256(body).hexdigest().encode()))
        else:
            for i in range(5):
                self.chunk(b"%d %d\n" % (i, len(body)))
        self.wfile.write(b"0\r\n\r\n")
http.server.ThreadingHTTPServer(("127.0.0.1", 8000), H).serve_forever()
`

// TestPortURL: a server in a sandbox, reached through its port URL (path
// form) on both runtimes, with network none: files, a 64 MiB download
// whole, 200 chunked answers on one connection each whole, an answer that
// starts before its request's body is sent (full duplex), events
// unbuffered, the API key kept from the sandbox; refused
// without a key, 404 for another team, 502 port_closed on a port with
// nothing on it, 400 for a bad port, and 410 once the sandbox ended.
func TestPortURL(t *testing.T) {
	t.Parallel()
	c, _, key := newTeam(t, srv, client.Limits{MaxSandboxes: 4, MaxConcurrentExec: 8})
	_, _, otherKey := newTeam(t, srv, client.Limits{MaxSandboxes: 1, MaxConcurrentExec: 1})
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			sb := mustCreate(t, c, client.CreateSandboxRequest{Template: "python", Runtime: rt, Timeout: 600})
			mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "mkdir -p /tmp/www && echo hello > /tmp/www/index.html && head -c 64M /dev/urandom > /tmp/www/big"})
			if _, err := c.WriteFile(ctxT(t, time.Minute), sb.ID, "/tmp/server.py", strings.NewReader(portServer), int64(len(portServer)), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := c.StartProcess(ctxT(t, time.Minute), sb.ID, client.ExecRequest{Argv: []string{"python3", "/tmp/server.py"}}); err != nil {
				t.Fatal(err)
			}
			base := fmt.Sprintf("%s/v1/sandboxes/%s/ports/8000", srv.url, sb.ID)
			// do sends a request with a header (an API key when it is a
			// bare key) and, when host is set, that Host (the host form).
			do := func(url, host string, header ...string) *http.Response {
				t.Helper()
				req, err := http.NewRequestWithContext(ctxT(t, 2*time.Minute), "GET", url, nil)
				if err != nil {
					t.Fatal(err)
				}
				switch len(header) {
				case 1:
					if header[0] != "" {
						req.Header.Set("Authorization", "Bearer "+header[0])
					}
				case 2:
					req.Header.Set(header[0], header[1])
				}
				if host != "" {
					req.Host = host
				}
				resp, err := http.DefaultTransport.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				return resp
			}
			get := func(url, key string) *http.Response { t.Helper(); return do(url, "", key) }
			body := func(resp *http.Response) string {
				t.Helper()
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return fmt.Sprintf("%d %s", resp.StatusCode, b)
			}
			// Until the server listens: 502 port_closed.
			deadline := time.Now().Add(time.Minute)
			for {
				resp := get(base+"/index.html", key)
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					if string(body) != "hello\n" {
						t.Fatalf("index.html: %q", body)
					}
					break
				}
				if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), client.CodePortClosed) || time.Now().After(deadline) {
					t.Fatalf("before the server listens: %d %s", resp.StatusCode, body)
				}
				time.Sleep(100 * time.Millisecond)
			}

			// A large download, whole.
			want := strings.Fields(mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "sha256sum /tmp/www/big"}).Stdout)[0]
			resp := get(base+"/big", key)
			h := sha256.New()
			n, err := io.Copy(h, resp.Body)
			resp.Body.Close()
			if err != nil || n != 64<<20 || hex.EncodeToString(h.Sum(nil)) != want {
				t.Errorf("big: %d bytes, %v, sha256 %x; want %s", n, err, h.Sum(nil), want)
			}

			// The sandbox never sees the API key.
			resp = get(base+"/headers", key)
			var headers map[string]string
			err = json.NewDecoder(resp.Body).Decode(&headers)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range headers {
				if strings.EqualFold(k, "Authorization") || strings.Contains(v, key) {
					t.Errorf("the sandbox got the caller's key in %s: %q", k, v)
				}
			}
			if headers["X-Forwarded-Prefix"] != "/v1/sandboxes/"+sb.ID+"/ports/8000" {
				t.Errorf("X-Forwarded-Prefix %q", headers["X-Forwarded-Prefix"])
			}

			// The Go client: the sandbox's answers, whatever their status,
			// are responses; evalbox's refusals are errors, and a sandbox
			// cannot pass one of its answers off as evalbox's.
			if resp, err := c.Port(ctxT(t, time.Minute), http.MethodGet, sb.ID, 8000, "/index.html", nil); err != nil || resp.StatusCode != http.StatusOK {
				t.Errorf("Port: %v, %v", resp, err)
			} else {
				resp.Body.Close()
			}
			if resp, err := c.Port(ctxT(t, time.Minute), http.MethodGet, sb.ID, 8000, "forged", nil); err != nil || resp.StatusCode != http.StatusNotFound || resp.Header.Get(client.HeaderError) != "" {
				t.Errorf("a sandbox's 404 with a forged %s header: %+v, %v", client.HeaderError, resp, err)
			} else {
				resp.Body.Close()
			}
			if _, err := c.Port(ctxT(t, time.Minute), http.MethodGet, sb.ID, 8001, "/", nil); client.ErrorCode(err) != client.CodePortClosed {
				t.Errorf("Port on a closed port: %v", err)
			}

			// Many answers in chunks on one connection, each whole.
			keepAlive := &http.Client{Transport: &http.Transport{}}
			defer keepAlive.CloseIdleConnections()
			payload := strings.Repeat("x", 1000)
			for i := range 200 {
				req, _ := http.NewRequestWithContext(ctxT(t, time.Minute), "POST", base+"/chunks", strings.NewReader(payload))
				req.Header.Set("Authorization", "Bearer "+key)
				resp, err := keepAlive.Do(req)
				if err != nil {
					t.Fatalf("chunked answer %d: %v", i, err)
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if want := "0 1000\n1 1000\n2 1000\n3 1000\n4 1000\n"; err != nil || string(b) != want {
					t.Fatalf("chunked answer %d: %q, %v; want %q", i, b, err, want)
				}
			}
			// evalbox's own answer to a request with a body (nothing on
			// the port) leaves the connection usable for the next one.
			conn, err := net.Dial("tcp", srv.addr)
			if err != nil {
				t.Fatal(err)
			}
			cr := bufio.NewReader(conn)
			for i, req := range []string{
				"POST /v1/sandboxes/" + sb.ID + "/ports/8001/x HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer " + key + "\r\nContent-Length: 5\r\n\r\nhello",
				"GET /v1/sandboxes/" + sb.ID + "/ports/8000/index.html HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer " + key + "\r\n\r\n",
			} {
				conn.SetDeadline(time.Now().Add(time.Minute))
				if _, err := io.WriteString(conn, req); err != nil {
					t.Fatalf("request %d on one connection: %v", i, err)
				}
				resp, err := http.ReadResponse(cr, nil)
				if err != nil {
					t.Fatalf("answer %d on one connection: %v", i, err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if want := []int{http.StatusBadGateway, http.StatusOK}[i]; resp.StatusCode != want || (i == 0 && resp.Close) {
					t.Fatalf("answer %d on one connection: %d (close %v), want %d on a connection kept", i, resp.StatusCode, resp.Close, want)
				}
			}
			conn.Close()

			// Full duplex: the answer starts before the request's body
			// is sent, and goes on after it.
			pr, pw := io.Pipe()
			upload := strings.Repeat("0123456789abcdef", 1<<12) // 64 KiB
			req, _ := http.NewRequestWithContext(ctxT(t, time.Minute), "POST", base+"/duplex", pr)
			req.ContentLength = int64(len(upload))
			req.Header.Set("Authorization", "Bearer "+key)
			// The body goes once the answer began, or after a while
			// (a proxy that waits for it before answering fails then).
			began := make(chan struct{})
			go func() {
				select {
				case <-began:
				case <-time.After(5 * time.Second):
				}
				io.WriteString(pw, upload)
				pw.Close()
			}()
			resp, err = keepAlive.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			r := bufio.NewReader(resp.Body)
			if line, err := r.ReadString('\n'); err != nil || line != "ready\n" {
				t.Fatalf("full duplex, before the body: %q, %v", line, err)
			}
			close(began)
			sum := sha256.Sum256([]byte(upload))
			if line, err := r.ReadString('\n'); err != nil || line != fmt.Sprintf("got %d %x\n", len(upload), sum) {
				t.Errorf("full duplex, after the body: %q, %v", line, err)
			}
			resp.Body.Close()

			// Events as they come: the second waits for /tmp/go.
			resp = get(base+"/events", key)
			r = bufio.NewReader(resp.Body)
			if line, err := r.ReadString('\n'); err != nil || line != "data: one\n" {
				t.Fatalf("first event: %q %v", line, err)
			}
			mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "touch /tmp/go"})
			r.ReadString('\n')
			if line, err := r.ReadString('\n'); err != nil || line != "data: two\n" {
				t.Errorf("second event: %q %v", line, err)
			}
			resp.Body.Close()

			// Refusals.
			for _, c := range []struct {
				url, key string
				status   int
				code     string
			}{
				{base + "/index.html", "", http.StatusUnauthorized, client.CodeUnauthorized},
				{base + "/index.html", otherKey, http.StatusNotFound, client.CodeNotFound},
				{fmt.Sprintf("%s/v1/sandboxes/%s/ports/8001/", srv.url, sb.ID), key, http.StatusBadGateway, client.CodePortClosed},
				{fmt.Sprintf("%s/v1/sandboxes/%s/ports/0/", srv.url, sb.ID), key, http.StatusBadRequest, client.CodeBadRequest},
				{fmt.Sprintf("%s/v1/sandboxes/%s/ports/http/", srv.url, sb.ID), key, http.StatusBadRequest, client.CodeBadRequest},
				{fmt.Sprintf("%s/v1/sandboxes/sb-nope/ports/8000/", srv.url), key, http.StatusNotFound, client.CodeNotFound},
			} {
				resp := get(c.url, c.key)
				var eb client.ErrorBody
				json.NewDecoder(resp.Body).Decode(&eb)
				resp.Body.Close()
				if resp.StatusCode != c.status || eb.Error.Code != c.code {
					t.Errorf("GET %s (key %v): %d %+v, want %d %s", c.url, c.key != "", resp.StatusCode, eb.Error, c.status, c.code)
				}
			}
			// The traffic token, in place of the key: header, query (which
			// sets a cookie), cookie; never passed on; rotated.
			if !strings.HasPrefix(sb.TrafficToken, "evt_") {
				t.Fatalf("traffic token %q", sb.TrafficToken)
			}
			if got, err := c.GetSandbox(ctxT(t, time.Minute), sb.ID); err != nil || got.TrafficToken != "" {
				t.Errorf("GET shows the traffic token: %q, %v", got.TrafficToken, err)
			}
			token := sb.TrafficToken
			if got := body(do(base+"/index.html", "", client.HeaderTrafficToken, token)); got != "200 hello\n" {
				t.Errorf("with the traffic token: %s", got)
			}
			// The query form: on the path form, each time (no cookie on the
			// API's origin); the token never reaches the sandbox, however
			// its key is written.
			resp = get(base+"/echo?x=1&"+client.QueryTrafficToken+"="+token+"&evalbox%5Ftoken="+token+"&y=2", "")
			if got := body(resp); got != "200 /echo?x=1&y=2" {
				t.Errorf("with the token in the query: %s", got)
			}
			for _, c := range resp.Header.Values("Set-Cookie") {
				if strings.Contains(c, "evalbox_token") {
					t.Errorf("a token cookie on the path form, or the sandbox's own: %q", c)
				}
			}
			if cs := resp.Header.Values("Set-Cookie"); len(cs) != 1 || !strings.HasPrefix(cs[0], "mine=1") {
				t.Errorf("the sandbox's other cookies: %q", cs)
			}
			if got := body(do(base+"/index.html", "", "Cookie", client.QueryTrafficToken+"="+token)); !strings.HasPrefix(got, "401 ") {
				t.Errorf("a token cookie on the path form: %s", got)
			}
			resp = do(base+"/headers", "", client.HeaderTrafficToken, token)
			seen, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(seen), token) {
				t.Errorf("the sandbox's view of a token request: %s", seen)
			}
			for _, bad := range []string{"evt_wrong", token + "x", ""} {
				if got := body(do(base+"/index.html", "", client.HeaderTrafficToken, bad)); !strings.HasPrefix(got, "401 ") {
					t.Errorf("with token %q: %s", bad, got)
				}
			}
			// Another sandbox's token opens only that sandbox.
			if got := body(do(fmt.Sprintf("%s/v1/sandboxes/sb-nope/ports/8000/", srv.url), "", client.HeaderTrafficToken, token)); !strings.HasPrefix(got, "401 ") {
				t.Errorf("a token on an unknown sandbox: %s", got)
			}
			newToken, err := c.RotateTrafficToken(ctxT(t, time.Minute), sb.ID)
			if err != nil || newToken == token {
				t.Fatalf("rotate: %q, %v", newToken, err)
			}
			if got := body(do(base+"/index.html", "", client.HeaderTrafficToken, token)); !strings.HasPrefix(got, "401 ") {
				t.Errorf("the old token after a rotation: %s", got)
			}
			if got := body(do(base+"/index.html", "", client.HeaderTrafficToken, newToken)); got != "200 hello\n" {
				t.Errorf("the new token: %s", got)
			}

			// A public port: open without credentials, other ports not.
			if _, err := c.SetPorts(ctxT(t, time.Minute), sb.ID, []client.PortSpec{{Port: 8000, Public: true}}); err != nil {
				t.Fatal(err)
			}
			if got := body(get(base+"/index.html", "")); got != "200 hello\n" {
				t.Errorf("a public port without credentials: %s", got)
			}
			if got := body(get(fmt.Sprintf("%s/v1/sandboxes/%s/ports/8001/", srv.url, sb.ID), "")); !strings.HasPrefix(got, "401 ") {
				t.Errorf("a private port beside a public one: %s", got)
			}
			if _, err := c.SetPorts(ctxT(t, time.Minute), sb.ID, []client.PortSpec{{Port: 0}}); client.ErrorCode(err) != client.CodeBadRequest {
				t.Errorf("port 0: %v", err)
			}
			if _, err := c.SetPorts(ctxT(t, time.Minute), sb.ID, nil); err != nil {
				t.Fatal(err)
			}
			if got := body(get(base+"/index.html", "")); !strings.HasPrefix(got, "401 ") {
				t.Errorf("no longer public: %s", got)
			}

			// The host form: {port}-{id}.{domain}, the path as it is.
			if sb.Domain != sandboxDomain {
				t.Errorf("sandbox domain %q", sb.Domain)
			}
			hostURL := c.HostPortURL(sb.ID, 8000, sb.Domain)
			if want := "http://8000-" + sb.ID + "." + sandboxDomain + ":" + strings.Split(srv.addr, ":")[1] + "/"; hostURL != want {
				t.Errorf("host form URL %q, want %q", hostURL, want)
			}
			host := "8000-" + sb.ID + "." + sandboxDomain
			if got := body(do(srv.url+"/index.html", host, key)); got != "200 hello\n" {
				t.Errorf("host form: %s", got)
			}
			if got := body(do(srv.url+"/index.html", strings.ToUpper(host)+":80", client.HeaderTrafficToken, newToken)); got != "200 hello\n" {
				t.Errorf("host form with the token: %s", got)
			}
			// In a browser: the query once, then the cookie, for this
			// host only; neither reaches the sandbox.
			resp = do(srv.url+"/index.html?"+client.QueryTrafficToken+"="+newToken, host)
			cookie := resp.Header.Get("Set-Cookie")
			if got := body(resp); got != "200 hello\n" || !strings.HasPrefix(cookie, client.QueryTrafficToken+"="+newToken) ||
				!strings.Contains(cookie, "HttpOnly") || !strings.Contains(cookie, "Path=/") || strings.Contains(cookie, "Domain") {
				t.Errorf("host form with the token in the query: %s, Set-Cookie %q", got, cookie)
			}
			if got := body(do(srv.url+"/index.html", host, "Cookie", "a=b; "+client.QueryTrafficToken+"="+newToken)); got != "200 hello\n" {
				t.Errorf("host form with the token's cookie: %s", got)
			}
			resp = do(srv.url+"/headers", host, "Cookie", "a=b; "+client.QueryTrafficToken+"="+newToken)
			seen, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(seen), newToken) || !strings.Contains(string(seen), "a=b") {
				t.Errorf("the sandbox's view of a cookie request: %s", seen)
			}
			if got := body(do(srv.url+"/index.html", host, "")); !strings.HasPrefix(got, "401 ") {
				t.Errorf("host form without credentials: %s", got)
			}
			if got := body(do(srv.url+"/index.html", host, otherKey)); !strings.HasPrefix(got, "404 ") {
				t.Errorf("host form with another team's key: %s", got)
			}
			if got := body(do(srv.url+"/", "8001-"+sb.ID+"."+sandboxDomain, key)); !strings.HasPrefix(got, "502 ") {
				t.Errorf("host form of a closed port: %s", got)
			}
			// The API itself is not a port's host.
			if got := body(do(srv.url+"/v1/health", "api."+sandboxDomain, "")); !strings.HasPrefix(got, "200 ") {
				t.Errorf("the API under the domain: %s", got)
			}
			resp = do(srv.url+"/headers", host, key)
			headers = map[string]string{}
			json.NewDecoder(resp.Body).Decode(&headers)
			resp.Body.Close()
			if headers["X-Forwarded-Prefix"] != "" || headers["X-Forwarded-Host"] != host {
				t.Errorf("host form headers: %v", headers)
			}

			// The port's root is its directory.
			resp = get(base, key)
			resp.Body.Close()
			if resp.StatusCode != http.StatusPermanentRedirect || resp.Header.Get("Location") != "/v1/sandboxes/"+sb.ID+"/ports/8000/" {
				t.Errorf("the port's root: %d, Location %q", resp.StatusCode, resp.Header.Get("Location"))
			}

			// Gone with the sandbox, also for a request in flight: 410,
			// not the 502 of a server that closed its connection.
			type answer struct {
				resp *http.Response
				err  error
			}
			inFlight := make(chan answer, 1)
			go func() {
				req, _ := http.NewRequestWithContext(ctxT(t, 2*time.Minute), "GET", base+"/never", nil)
				req.Header.Set("Authorization", "Bearer "+key)
				resp, err := http.DefaultClient.Do(req)
				inFlight <- answer{resp, err}
			}()
			time.Sleep(500 * time.Millisecond)
			if err := c.DeleteSandbox(context.Background(), sb.ID); err != nil {
				t.Fatal(err)
			}
			if a := <-inFlight; a.err != nil {
				t.Errorf("a request in flight when its sandbox ends: %v", a.err)
			} else if got := body(a.resp); a.resp.StatusCode != http.StatusGone || a.resp.Header.Get(client.HeaderError) != client.CodeSandboxNotRunning {
				t.Errorf("a request in flight when its sandbox ends: %s (%s)", got, a.resp.Header.Get(client.HeaderError))
			}
			resp = get(base+"/index.html", key)
			resp.Body.Close()
			if resp.StatusCode != http.StatusGone && resp.StatusCode != http.StatusNotFound {
				t.Errorf("after the delete: %d, want 410 or 404", resp.StatusCode)
			}
		})
	}
}
