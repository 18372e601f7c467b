package client

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// PortURL is the URL of a port of a sandbox (the path form): a request to
// it, or below it, that carries the team's API key (as Port sends it)
// reaches the server listening on that port in the sandbox. It ends with
// "/".
func (c *Client) PortURL(id string, port int) string {
	return c.base + "/v1/sandboxes/" + seg(id) + "/ports/" + strconv.Itoa(port) + "/"
}

// HostPortURL is the host form of a port's URL, on a server with a sandbox
// domain (serve --sandbox-domain; Sandbox.Domain, Health.SandboxDomain):
// {port}-{id}.{domain}, with the scheme and port of the client's base URL.
// It ends with "/". An empty domain gives "" (the server has none).
func (c *Client) HostPortURL(id string, port int, domain string) string {
	if domain == "" {
		return ""
	}
	u, err := url.Parse(c.base)
	if err != nil {
		return ""
	}
	host := strconv.Itoa(port) + "-" + id + "." + domain
	if p := u.Port(); p != "" {
		host = net.JoinHostPort(host, p)
	}
	return u.Scheme + "://" + host + "/"
}

// Port sends an HTTP request to the server listening on port in sandbox
// id, through its port URL, with the API key (which evalbox does not pass
// on). path is below the port's root ("/index.html?x=1"). Whatever the
// sandbox's server answers is the response, any status; an answer of
// evalbox's own (the sandbox ended, nothing listens there: port_closed, no
// such sandbox) is an *APIError. A redirect is returned, not followed (the
// sandbox's server chooses where it points; following it with the key
// could reach evalbox's own API). The caller closes the response's body.
func (c *Client) Port(ctx context.Context, method, id string, port int, path string, body io.Reader) (*http.Response, error) {
	if err := checkIDs(id); err != nil {
		return nil, err
	}
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("evalbox: port %d: want 1 to 65535", port)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.PortURL(id, port)+strings.TrimPrefix(path, "/"), body)
	if err != nil {
		return nil, fmt.Errorf("evalbox: %w", err)
	}
	if c.auth != "" {
		req.Header.Set("Authorization", c.auth)
	}
	if c.userAgent != "" {
		req.Header.Set("User-Agent", c.userAgent)
	}
	// Redirects are not followed: the port's server chooses them, and a
	// redirect to evalbox's own API would carry the key there.
	hc := &http.Client{Transport: c.hc.Transport, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("evalbox: %w", err)
	}
	if resp.Header.Get(HeaderError) != "" {
		return nil, decodeError(resp)
	}
	return resp, nil
}
