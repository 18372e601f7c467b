package api

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/auth"
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

// portTeamKey carries the team of a port request to the transport's dial.
type portTeamKey struct{}

// newPortProxy returns the reverse proxy of port URLs, whose transport
// dials sandbox ports through svc.
func (s *Server) newPortProxy() *httputil.ReverseProxy {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, _, _ := net.SplitHostPort(addr)
			id, port, ok := parsePortHost(host)
			team, _ := ctx.Value(portTeamKey{}).(string)
			if !ok || team == "" {
				return nil, fmt.Errorf("api: port proxy: bad address %q", addr)
			}
			// The connection may be pooled for later requests: the
			// request's end must not cut it (the transport closes it).
			// The dial itself is bounded (a sandbox that stopped its
			// own agent answers nothing).
			cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
			timer := time.AfterFunc(portDialTimeout, cancel)
			conn, err := s.svc.ConnectPort(cctx, team, id, port)
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
			return &portNetConn{PortConn: conn, addr: portAddr(host), cancel: cancel}, nil
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
			id, port := pr.In.PathValue("id"), pr.In.PathValue("port")
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = id + "-" + port + portHostSuffix
			// The path below the port, as the caller encoded it (a %2F
			// stays one).
			prefix := "/v1/sandboxes/" + id + "/ports/" + port
			rest := strings.TrimPrefix(pr.In.URL.EscapedPath(), prefix)
			if p, err := url.PathUnescape(rest); err == nil {
				pr.Out.URL.Path, pr.Out.URL.RawPath = p, rest
			} else {
				pr.Out.URL.Path, pr.Out.URL.RawPath = "/"+pr.In.PathValue("path"), ""
			}
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
			pr.Out.Header.Set("X-Forwarded-Prefix", "/v1/sandboxes/"+id+"/ports/"+port)
			// The caller's credentials are evalbox's, not the sandbox's.
			pr.Out.Header.Del("Authorization")
		},
		Transport:     tr,
		FlushInterval: -1, // streams and events as they come
		// Only evalbox marks its own errors: a sandbox cannot pass its
		// answers off as evalbox's.
		ModifyResponse: func(resp *http.Response) error {
			resp.Header.Del(client.HeaderError)
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			writePortError(w, r, err)
		},
	}
}

// portProxy serves a port URL of a sandbox of the team.
func (s *Server) portProxy(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 || strconv.Itoa(port) != r.PathValue("port") {
		writeError(w, errorf(client.CodeBadRequest, "port %q: want a number from 1 to 65535", r.PathValue("port")))
		return
	}
	if _, err := s.svc.Get(r.Context(), p.TeamID, r.PathValue("id")); err != nil {
		writePortError(w, r, err)
		return
	}
	ctx := context.WithValue(r.Context(), portTeamKey{}, p.TeamID)
	s.ports.ServeHTTP(w, r.WithContext(ctx))
}

// portRoot sends /v1/sandboxes/{id}/ports/{port} to its directory, so that
// the relative links of the sandbox's pages resolve under it.
func (s *Server) portRoot(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	u := *r.URL
	u.Path += "/"
	http.Redirect(w, r, u.String(), http.StatusPermanentRedirect)
}

// writePortError answers a port request that did not reach the sandbox's
// server: an ended sandbox is 410 Gone (its URLs are gone for good).
func writePortError(w http.ResponseWriter, r *http.Request, err error) {
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
		Message: fmt.Sprintf("the server on port %s closed the connection before answering", r.PathValue("port"))})
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
