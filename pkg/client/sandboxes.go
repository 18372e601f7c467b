package client

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/url"
	"time"
)

// CreateSandbox creates a sandbox and returns it once it is running. It is
// not retried unless the Client was made WithRetryCreate.
func (c *Client) CreateSandbox(ctx context.Context, req CreateSandboxRequest) (*Sandbox, error) {
	var sb Sandbox
	err := c.do(ctx, &request{method: http.MethodPost, path: "/sandboxes", in: &req, retry: c.retryCreate}, &sb)
	if err != nil {
		return nil, err
	}
	return &sb, nil
}

// GetSandbox returns a sandbox (also one that ended).
func (c *Client) GetSandbox(ctx context.Context, id string) (*Sandbox, error) {
	if err := checkIDs(id); err != nil {
		return nil, err
	}
	var sb Sandbox
	if err := c.do(ctx, &request{method: http.MethodGet, path: "/sandboxes/" + seg(id), retry: true}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// ListOptions filters ListSandboxes.
type ListOptions struct {
	// Metadata keeps the sandboxes whose metadata has all these pairs.
	Metadata map[string]string
	// All also lists sandboxes that ended (deleted, expired, lost).
	All bool
}

// ListSandboxes lists the team's sandboxes, newest first.
func (c *Client) ListSandboxes(ctx context.Context, opts ListOptions) ([]Sandbox, error) {
	q := metadataQuery(opts.Metadata)
	if opts.All {
		if q == nil {
			q = url.Values{}
		}
		q.Set("state", "all")
	}
	var l SandboxList
	if err := c.do(ctx, &request{method: http.MethodGet, path: "/sandboxes", query: q, retry: true}, &l); err != nil {
		return nil, err
	}
	return l.Sandboxes, nil
}

// DeleteSandbox deletes a sandbox. Deleting one that already ended is not an
// error; an unknown id is (IsNotFound).
func (c *Client) DeleteSandbox(ctx context.Context, id string) error {
	if err := checkIDs(id); err != nil {
		return err
	}
	return c.do(ctx, &request{method: http.MethodDelete, path: "/sandboxes/" + seg(id), retry: true}, nil)
}

// errNoFilter guards DeleteSandboxes against deleting everything.
var errNoFilter = errors.New("evalbox: DeleteSandboxes needs at least one metadata pair")

// DeleteSandboxes deletes every running sandbox whose metadata has all the
// given pairs and returns their ids. At least one pair is required.
func (c *Client) DeleteSandboxes(ctx context.Context, metadata map[string]string) ([]string, error) {
	if len(metadata) == 0 {
		return nil, errNoFilter
	}
	var res DeleteResult
	err := c.do(ctx, &request{method: http.MethodDelete, path: "/sandboxes", query: metadataQuery(metadata), retry: true}, &res)
	if err != nil {
		return nil, err
	}
	return res.Deleted, nil
}

// SetTimeout sets a running sandbox's expiry to now + timeout (rounded up to
// whole seconds, bounded by the server's maximum) and returns the sandbox.
func (c *Client) SetTimeout(ctx context.Context, id string, timeout time.Duration) (*Sandbox, error) {
	if err := checkIDs(id); err != nil {
		return nil, err
	}
	req := SetTimeoutRequest{Timeout: int(math.Ceil(timeout.Seconds()))}
	var sb Sandbox
	err := c.do(ctx, &request{method: http.MethodPost, path: "/sandboxes/" + seg(id) + "/timeout", in: &req, retry: true}, &sb)
	if err != nil {
		return nil, err
	}
	return &sb, nil
}

func metadataQuery(md map[string]string) url.Values {
	if len(md) == 0 {
		return nil
	}
	q := make(url.Values, len(md))
	for k, v := range md {
		q.Set("metadata."+k, v)
	}
	return q
}

// SetNetwork changes a running sandbox's network: between outbound and
// rules, and the lists of rules, live (new connections follow within a
// second; open ones the rules now deny are cut). A sandbox created with
// network none cannot be opened (conflict).
func (c *Client) SetNetwork(ctx context.Context, id string, n NetworkSpec) (*Sandbox, error) {
	if err := checkIDs(id); err != nil {
		return nil, err
	}
	body := n
	if body.Mode == NetworkRules || body.Allow != nil || body.Deny != nil {
		// Always the object form here: it says the lists are replaced.
		body.Allow, body.Deny = nonNil(body.Allow), nonNil(body.Deny)
	}
	var sb Sandbox
	err := c.do(ctx, &request{method: http.MethodPut, path: "/sandboxes/" + seg(id) + "/network", in: &body, retry: true}, &sb)
	if err != nil {
		return nil, err
	}
	return &sb, nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// SetPorts replaces the port settings of a running sandbox (a port not
// listed is private: the API key or the traffic token opens it).
func (c *Client) SetPorts(ctx context.Context, id string, ports []PortSpec) (*Sandbox, error) {
	if err := checkIDs(id); err != nil {
		return nil, err
	}
	if ports == nil {
		ports = []PortSpec{}
	}
	var sb Sandbox
	err := c.do(ctx, &request{method: http.MethodPut, path: "/sandboxes/" + seg(id) + "/ports", in: &SetPortsRequest{Ports: ports}, retry: true}, &sb)
	if err != nil {
		return nil, err
	}
	return &sb, nil
}

// RotateTrafficToken gives a running sandbox a new traffic token and
// returns it; the previous one stops working at once.
func (c *Client) RotateTrafficToken(ctx context.Context, id string) (string, error) {
	if err := checkIDs(id); err != nil {
		return "", err
	}
	var t TrafficToken
	if err := c.do(ctx, &request{method: http.MethodPost, path: "/sandboxes/" + seg(id) + "/traffic-token"}, &t); err != nil {
		return "", err
	}
	return t.TrafficToken, nil
}
