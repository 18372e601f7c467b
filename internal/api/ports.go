package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/pkg/client"
)

// Port URLs (docs/design/network.md): /v1/sandboxes/{id}/ports/{port}/…
// reaches a server that listens on that port of the sandbox's loopback,
// through a connection its agent opens from inside (Node.ConnectPort): plain
// HTTP, streamed bodies and Server-Sent Events unbuffered, and WebSocket
// upgrades. The caller's API key never reaches the sandbox.

// portHostSuffix names the synthetic host of a port's connections in the
// proxy's transport ("<id>-<port>.evalbox-port"): its connection pool is
// per sandbox port.
const portHostSuffix = ".evalbox-port"

// portTarget is the sandbox port a request goes to, and who it acts as,
// from the handler to the proxy's Rewrite, transport and answers.
type portTarget struct {
	team, id string
	port     int
	// prefix is the path form's prefix (removed before forwarding); ""
	// for the host form.
	prefix string
	// cookie, when set, is the traffic token to keep in a cookie (it came
	// in the query: a browser's first request).
	cookie string
	secure bool
}

type portTargetKey struct{}

func targetOf(ctx context.Context) *portTarget {
	t, _ := ctx.Value(portTargetKey{}).(*portTarget)
	return t
}

// newPortProxy returns the reverse proxy of port URLs, whose transport
// dials sandbox ports through svc.
func (s *Server) newPortProxy() *httputil.ReverseProxy {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, _, _ := net.SplitHostPort(addr)
			id, port, ok := parsePortHost(host)
			t := targetOf(ctx)
			if !ok || t == nil || t.id != id || t.port != port {
				return nil, fmt.Errorf("api: port proxy: bad address %q", addr)
			}
			return s.dialPort(ctx, t.team, id, port)
		},
		// Bounds per sandbox port: connections at once (more requests
		// wait for one), and idle ones kept.
		MaxConnsPerHost:     64,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true, // the sandbox's bytes, as it sent them
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := targetOf(pr.In.Context())
			pr.Out.URL.Scheme = "http"
			// The pool of connections is per sandbox port (the team is
			// checked at each request, before this).
			pr.Out.URL.Host = t.id + "-" + strconv.Itoa(t.port) + portHostSuffix
			if t.prefix != "" {
				// The path below the port, as the caller encoded it (a
				// %2F stays one).
				rest := strings.TrimPrefix(pr.In.URL.EscapedPath(), t.prefix)
				if p, err := url.PathUnescape(rest); err == nil {
					pr.Out.URL.Path, pr.Out.URL.RawPath = p, rest
				} else {
					pr.Out.URL.Path, pr.Out.URL.RawPath = "/"+pr.In.PathValue("path"), ""
				}
			}
			pr.Out.URL.RawQuery = stripQueryParam(pr.In.URL.RawQuery, client.QueryTrafficToken)
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
			if t.prefix != "" {
				pr.Out.Header.Set("X-Forwarded-Prefix", t.prefix)
			}
			// The caller's credentials are evalbox's, not the sandbox's.
			pr.Out.Header.Del("Authorization")
			pr.Out.Header.Del(client.HeaderTrafficToken)
			stripCookie(pr.Out.Header)
			if pr.Out.Body != nil && pr.Out.Body != http.NoBody {
				// When its end is known, the transport's read past it
				// (which finds the end) need not reach the server's
				// body, which the handler's return closes; and the
				// transport does not close it (sizedBody).
				left := pr.Out.ContentLength
				if left <= 0 {
					left = -1
				}
				pr.Out.Body = &sizedBody{r: pr.Out.Body, left: left}
			}
		},
		Transport:     tr,
		FlushInterval: -1, // streams and events as they come
		BufferPool:    portBuffers{},
		// Only evalbox marks its own errors: a sandbox cannot pass its
		// answers off as evalbox's.
		ModifyResponse: func(resp *http.Response) error {
			resp.Header.Del(client.HeaderError)
			// The token's cookie is evalbox's: a sandbox may not set it
			// (for itself or, on the API's origin, for another sandbox).
			if cs := resp.Header.Values("Set-Cookie"); len(cs) > 0 {
				resp.Header.Del("Set-Cookie")
				for _, c := range cs {
					if n, _, _ := strings.Cut(c, "="); !isTokenCookie(strings.TrimSpace(n)) {
						resp.Header.Add("Set-Cookie", c)
					}
				}
			}
			if t := targetOf(resp.Request.Context()); t != nil && t.cookie != "" {
				c := &http.Cookie{Name: tokenCookie(t.secure), Value: t.cookie, Path: "/", HttpOnly: true,
					Secure: t.secure, SameSite: http.SameSiteLaxMode}
				resp.Header.Add("Set-Cookie", c.String())
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			// The request runs full duplex (proxyPort), so net/http
			// does not consume its body before the answer, as it does
			// by default: read what is left of a small one, or the
			// connection, which the client keeps for its next request,
			// is closed (and reset) under it after this answer.
			if r.Body != nil { // r is the outgoing request: nil without a body
				_, _ = io.CopyN(io.Discard, r.Body, 256<<10)
			}
			t := targetOf(r.Context())
			if !errors.As(err, new(*apierr.Error)) && !errors.Is(err, context.Canceled) {
				// What broke between the proxy and the sandbox's
				// server (the answer says only that it did).
				s.log.Info("port proxy: no answer", "sandbox", t.id, "port", t.port, "err", err)
				if s.endedMidRequest(r.Context(), t, err) {
					writeErrorBody(w, http.StatusGone, client.ErrorDetail{Code: client.CodeSandboxNotRunning,
						Message: fmt.Sprintf("sandbox %s ended while the request to its port %d ran", t.id, t.port)})
					return
				}
			}
			writePortError(w, t.port, err)
		},
	}
}

// portPath serves the path form of a port URL:
// /v1/sandboxes/{id}/ports/{port}/….
func (s *Server) portPath(w http.ResponseWriter, r *http.Request) {
	id, port := r.PathValue("id"), r.PathValue("port")
	s.portServe(w, r, id, port, "/v1/sandboxes/"+id+"/ports/"+port)
}

// portByHost serves the host form of a port URL: {port}-{id}.{domain}.
func (s *Server) portByHost(w http.ResponseWriter, r *http.Request, id, port string) {
	s.portServe(w, r, id, port, "")
}

// portHost parses the host form's Host ("8000-sb_x.sandboxes.example.com",
// with or without a port) when the server has a sandbox domain.
func (s *Server) portHost(host string) (id, port string, ok bool) {
	if s.domain == "" {
		return "", "", false
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	name, found := strings.CutSuffix(strings.ToLower(strings.TrimSuffix(host, ".")), "."+s.domain)
	if !found || strings.Contains(name, ".") {
		return "", "", false
	}
	port, id, ok = strings.Cut(name, "-")
	if !ok || port == "" || id == "" || strings.Trim(port, "0123456789") != "" {
		return "", "", false // not a port's host (another name of the server's)
	}
	return id, port, true
}

// portServe authenticates a port request and proxies it to the port: the
// team's API key (another team's sandbox is not found), else the
// sandbox's traffic token (header, query or cookie), else the port must
// be public. A request without a valid credential is 401 whether the
// sandbox exists or not.
func (s *Server) portServe(w http.ResponseWriter, r *http.Request, id, portStr, prefix string) {
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 || strconv.Itoa(port) != portStr {
		writeError(w, errorf(client.CodeBadRequest, "port %q: want a number from 1 to 65535", portStr))
		return
	}
	t := &portTarget{id: id, port: port, prefix: prefix, secure: r.TLS != nil}
	if r.Header.Get("Authorization") != "" {
		p, ok := s.authenticate(w, r)
		if !ok {
			return
		}
		t.team = p.TeamID
		// The team's sandbox, or 404. (A token's check below read the
		// row already.)
		if _, err := s.svc.Get(r.Context(), t.team, id); err != nil {
			writePortError(w, port, err)
			return
		}
	} else {
		token := r.Header.Get(client.HeaderTrafficToken)
		queryToken := r.URL.Query().Get(client.QueryTrafficToken)
		if token == "" {
			token = queryToken
		}
		if token == "" && prefix == "" {
			if c, err := r.Cookie(tokenCookie(r.TLS != nil)); err == nil {
				token = c.Value
			}
		}
		a, err := s.svc.PortAccess(r.Context(), id, port, token)
		var ae *apierr.Error
		if err != nil && !(errors.As(err, &ae) && ae.Code == client.CodeNotFound) {
			writeError(w, err)
			return
		}
		if err != nil || !a.Allowed {
			writeError(w, errorf(client.CodeUnauthorized,
				"this port URL needs the team's API key (Authorization), the sandbox's traffic token (%s) or a public port", client.HeaderTrafficToken))
			return
		}
		t.team = a.TeamID
		if queryToken != "" && queryToken == token && prefix == "" {
			// The host form's origin is the sandbox port's own: the
			// browser keeps the token for it. (The path form shares the
			// API's origin, where a cookie would reach every sandbox's
			// pages: there the query carries the token each time.)
			t.cookie = token
		}
	}
	// The dial tells an ended sandbox (410) from a running one.
	s.proxyPort(w, r, t)
}

// proxyPort sends r to t's port and its answer back.
//
// The request runs full duplex: the sandbox's server may answer while
// its request's body still comes, as over a direct connection. Without
// it, net/http's server discards and closes the request's body when the
// answer's header goes out; the transport, still sending that body (its
// last read, which looks for bytes past Content-Length, comes after the
// server has sent it on), then fails the request and closes the
// connection under the answer's body, which the caller sees cut short.
func (s *Server) proxyPort(w http.ResponseWriter, r *http.Request, t *portTarget) {
	// Not every writer can (HTTP/2's is full duplex already).
	_ = http.NewResponseController(w).EnableFullDuplex()
	s.ports.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), portTargetKey{}, t)))
}

// endedMidRequest reports whether the connection to a sandbox's port broke
// because the sandbox ended (its TTL, a delete, its node lost) rather than
// because its server closed it: the answer is then 410, as for a request
// that comes after the end, not 502.
func (s *Server) endedMidRequest(ctx context.Context, t *portTarget, err error) bool {
	if errors.As(err, new(*nodeapi.StoppedError)) || errors.As(err, new(*nodeapi.NodeLostError)) ||
		errors.Is(err, nodeapi.ErrSandboxNotFound) {
		return true
	}
	sb, gerr := s.svc.Get(context.WithoutCancel(ctx), t.team, t.id)
	return gerr == nil && sb.State != client.StateRunning
}

// servePortAs proxies r to a port of the team's sandbox, whose access the
// caller checked (the E2B layer, by its tokens); r's path is the path in
// the sandbox.
func (s *Server) servePortAs(w http.ResponseWriter, r *http.Request, teamID, id string, port int) {
	t := &portTarget{id: id, port: port, team: teamID, secure: r.TLS != nil}
	s.proxyPort(w, r, t)
}

// portRoot sends /v1/sandboxes/{id}/ports/{port} to its directory, so that
// the relative links of the sandbox's pages resolve under it.
func (s *Server) portRoot(w http.ResponseWriter, r *http.Request) {
	u := *r.URL
	u.Path += "/"
	if u.RawPath != "" {
		u.RawPath += "/"
	}
	http.Redirect(w, r, u.String(), http.StatusPermanentRedirect)
}

// writePortError answers a port request that did not reach the sandbox's
// server: an ended sandbox is 410 Gone (its URLs are gone for good).
func writePortError(w http.ResponseWriter, port int, err error) {
	var ae *apierr.Error
	if errors.As(err, &ae) {
		if ae.Code == client.CodeSandboxNotRunning {
			writeErrorBody(w, http.StatusGone, client.ErrorDetail{Code: ae.Code, Message: ae.Message})
			return
		}
		writeError(w, err)
		return
	}
	if errors.Is(err, context.Canceled) {
		writeError(w, err)
		return
	}
	// The connection to the sandbox's server broke before its answer.
	writeErrorBody(w, http.StatusBadGateway, client.ErrorDetail{Code: client.CodePortClosed,
		Message: fmt.Sprintf("the server on port %d closed the connection before answering", port)})
}

// stripQueryParam removes every name=… of a raw query, keeping the rest
// as it was written.
func stripQueryParam(raw, name string) string {
	if raw == "" {
		return raw
	}
	parts := strings.Split(raw, "&")
	kept := parts[:0]
	for _, p := range parts {
		k, _, _ := strings.Cut(p, "=")
		if uk, err := url.QueryUnescape(k); err != nil || uk == name {
			continue // the token, or a key no one reads as it is written
		}
		kept = append(kept, p)
	}
	return strings.Join(kept, "&")
}

// tokenCookie names the traffic token's cookie: over TLS with the
// __Host- prefix, which browsers keep to its host alone (no Domain, no
// sibling subdomain can set it).
func tokenCookie(secure bool) string {
	if secure {
		return "__Host-" + client.QueryTrafficToken
	}
	return client.QueryTrafficToken
}

func isTokenCookie(name string) bool {
	return name == client.QueryTrafficToken || name == "__Host-"+client.QueryTrafficToken
}

// stripCookie removes the token's cookies from the request's Cookie
// headers.
func stripCookie(h http.Header) {
	lines := h.Values("Cookie")
	if len(lines) == 0 {
		return
	}
	var kept []string
	for _, line := range lines {
		for _, c := range strings.Split(line, ";") {
			c = strings.TrimSpace(c)
			if k, _, _ := strings.Cut(c, "="); c == "" || isTokenCookie(k) {
				continue
			}
			kept = append(kept, c)
		}
	}
	h.Del("Cookie")
	if len(kept) > 0 {
		h.Set("Cookie", strings.Join(kept, "; "))
	}
}

// parsePortHost splits "<id>-<port>.evalbox-port".
func parsePortHost(host string) (id string, port int, ok bool) {
	name, found := strings.CutSuffix(host, portHostSuffix)
	if !found {
		return "", 0, false
	}
	i := strings.LastIndexByte(name, '-')
	if i <= 0 {
		return "", 0, false
	}
	port, err := strconv.Atoi(name[i+1:])
	if err != nil {
		return "", 0, false
	}
	return name[:i], port, true
}

// portDialTimeout bounds a port connection's dial (the lookup, the node's
// stream, the agent's connect).
const portDialTimeout = 30 * time.Second

// portBufferSize is the size of the buffers that carry port URL bodies:
// ReverseProxy's default of 32 KiB makes a large download cost a write
// (and, flushed as it comes, a syscall) every 32 KiB; an idle stream (an
// open event stream, a WebSocket) holds one.
const portBufferSize = 128 << 10

// portBuffers is the reverse proxy's pool of body buffers.
type portBuffers struct{}

var portBufferPool = sync.Pool{New: func() any { b := make([]byte, portBufferSize); return &b }}

func (portBuffers) Get() []byte  { return *portBufferPool.Get().(*[]byte) }
func (portBuffers) Put(b []byte) { portBufferPool.Put(&b) }

// sizedBody is the body of a proxied request: of a known length (left ≥
// 0), it ends after it without reading further. Close does not close the
// server's body: the transport closes it when a dial fails, and a body
// closed before its end costs the client its connection (net/http's
// server does not reuse it), where the error answer can read what is
// left and keep it; the server closes it when the handler returns.
type sizedBody struct {
	r    io.Reader
	left int64 // -1: unknown
}

func (b *sizedBody) Read(p []byte) (int, error) {
	if b.left < 0 {
		return b.r.Read(p)
	}
	if b.left == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	if err == io.EOF && b.left > 0 {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

func (b *sizedBody) Close() error { return nil }

// dialPort connects to port of the team's sandbox id, as a net.Conn. The
// connection may be pooled for later requests: the dialling request's end
// must not cut it (its user closes it). The dial itself is bounded (a
// sandbox that stopped its own agent answers nothing).
func (s *Server) dialPort(ctx context.Context, teamID, id string, port int) (net.Conn, error) {
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	timer := time.AfterFunc(portDialTimeout, cancel)
	conn, err := s.svc.ConnectPort(cctx, teamID, id, port)
	if !timer.Stop() {
		if err == nil {
			conn.Close()
		}
		cancel()
		return nil, &apierr.Error{Code: client.CodePortClosed,
			Message: fmt.Sprintf("port %d of sandbox %s did not answer within %s", port, id, portDialTimeout)}
	}
	if err != nil {
		cancel()
		return nil, err
	}
	return &portNetConn{PortConn: conn, addr: portAddr(id + "-" + strconv.Itoa(port) + portHostSuffix), cancel: cancel}, nil
}

// portNetConn is a sandbox port's connection as the transport wants it.
// Deadlines are not kept: the transport closes the connection when it is
// done with it, and the sandbox's end ends it.
type portNetConn struct {
	nodeapi.PortConn
	addr   portAddr
	cancel context.CancelFunc // the dial's context, which governs the connection
}

func (c *portNetConn) Close() error {
	err := c.PortConn.Close()
	c.cancel()
	return err
}

func (c *portNetConn) LocalAddr() net.Addr              { return c.addr }
func (c *portNetConn) RemoteAddr() net.Addr             { return c.addr }
func (c *portNetConn) SetDeadline(time.Time) error      { return nil }
func (c *portNetConn) SetReadDeadline(time.Time) error  { return nil }
func (c *portNetConn) SetWriteDeadline(time.Time) error { return nil }

type portAddr string

func (a portAddr) Network() string { return "evalbox-port" }
func (a portAddr) String() string  { return string(a) }
