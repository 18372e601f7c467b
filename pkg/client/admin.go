package client

import (
	"context"
	"net/http"
)

// Health reports whether the server is up and which runtimes it offers. It
// needs no API key.
func (c *Client) Health(ctx context.Context) (*Health, error) {
	var h Health
	if err := c.do(ctx, &request{method: http.MethodGet, path: "/health", retry: true}, &h); err != nil {
		return nil, err
	}
	return &h, nil
}

// Capacity reports the host capacity sandboxes are admitted against: pids
// and memory budgets, what is reserved and free (admin key only).
func (c *Client) Capacity(ctx context.Context) (*Capacity, error) {
	var cp Capacity
	if err := c.do(ctx, &request{method: http.MethodGet, path: "/capacity", retry: true}, &cp); err != nil {
		return nil, err
	}
	return &cp, nil
}

// CreateTeam creates a team (admin key only).
func (c *Client) CreateTeam(ctx context.Context, req CreateTeamRequest) (*Team, error) {
	var t Team
	if err := c.do(ctx, &request{method: http.MethodPost, path: "/teams", in: &req}, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// ListTeams lists all teams (admin key only).
func (c *Client) ListTeams(ctx context.Context) ([]Team, error) {
	var l TeamList
	if err := c.do(ctx, &request{method: http.MethodGet, path: "/teams", retry: true}, &l); err != nil {
		return nil, err
	}
	return l.Teams, nil
}

// GetTeam returns a team (admin key only).
func (c *Client) GetTeam(ctx context.Context, id string) (*Team, error) {
	if err := checkIDs(id); err != nil {
		return nil, err
	}
	var t Team
	if err := c.do(ctx, &request{method: http.MethodGet, path: "/teams/" + seg(id), retry: true}, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// UpdateTeam replaces a team's limits (admin key only).
func (c *Client) UpdateTeam(ctx context.Context, id string, req UpdateTeamRequest) (*Team, error) {
	if err := checkIDs(id); err != nil {
		return nil, err
	}
	var t Team
	if err := c.do(ctx, &request{method: http.MethodPatch, path: "/teams/" + seg(id), in: &req, retry: true}, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// CreateKey creates an API key; the returned APIKey.Key is the secret, shown
// only this once.
func (c *Client) CreateKey(ctx context.Context, req CreateKeyRequest) (*APIKey, error) {
	var k APIKey
	if err := c.do(ctx, &request{method: http.MethodPost, path: "/keys", in: &req}, &k); err != nil {
		return nil, err
	}
	return &k, nil
}

// ListKeys lists the API keys of the caller's team (all keys for an admin
// key), without secrets.
func (c *Client) ListKeys(ctx context.Context) ([]APIKey, error) {
	var l KeyList
	if err := c.do(ctx, &request{method: http.MethodGet, path: "/keys", retry: true}, &l); err != nil {
		return nil, err
	}
	return l.Keys, nil
}

// RevokeKey revokes an API key by its id.
func (c *Client) RevokeKey(ctx context.Context, id string) error {
	if err := checkIDs(id); err != nil {
		return err
	}
	return c.do(ctx, &request{method: http.MethodDelete, path: "/keys/" + seg(id), retry: true}, nil)
}

// ListPools reports the server's warm pools (admin key only).
func (c *Client) ListPools(ctx context.Context) ([]Pool, error) {
	var out PoolList
	if err := c.do(ctx, &request{method: http.MethodGet, path: "/pools", retry: true}, &out); err != nil {
		return nil, err
	}
	return out.Pools, nil
}
