package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// ListTariffs lists the server's tariffs.
func (c *Client) ListTariffs(ctx context.Context) ([]Tariff, error) {
	var l TariffList
	if err := c.do(ctx, &request{method: http.MethodGet, path: "/tariffs", retry: true}, &l); err != nil {
		return nil, err
	}
	return l.Tariffs, nil
}

// GetTariff returns a tariff by name.
func (c *Client) GetTariff(ctx context.Context, name string) (Tariff, error) {
	var t Tariff
	if err := checkIDs(name); err != nil {
		return t, err
	}
	err := c.do(ctx, &request{method: http.MethodGet, path: "/tariffs/" + seg(name), retry: true}, &t)
	return t, err
}

// PutTariff creates or replaces a tariff (admin key only). Sandboxes keep
// the prices they were created with.
func (c *Client) PutTariff(ctx context.Context, name string, req PutTariffRequest) (Tariff, error) {
	var t Tariff
	if err := checkIDs(name); err != nil {
		return t, err
	}
	err := c.do(ctx, &request{method: http.MethodPut, path: "/tariffs/" + seg(name), in: req, retry: true}, &t)
	return t, err
}

// DeleteTariff deletes a tariff (admin key only).
func (c *Client) DeleteTariff(ctx context.Context, name string) error {
	if err := checkIDs(name); err != nil {
		return err
	}
	return c.do(ctx, &request{method: http.MethodDelete, path: "/tariffs/" + seg(name), retry: true}, nil)
}

// UsageOptions select a usage report. Zero times: the last 30 days; ""
// GroupBy: by tariff; "" Team: the caller's (another team, or "all", needs
// an admin key).
type UsageOptions struct {
	From, To time.Time
	GroupBy  string
	Team     string
}

// Usage returns the metered usage (GET /v1/usage).
func (c *Client) Usage(ctx context.Context, o UsageOptions) (UsageReport, error) {
	q := url.Values{}
	if !o.From.IsZero() {
		q.Set("from", o.From.UTC().Format(time.RFC3339Nano))
	}
	if !o.To.IsZero() {
		q.Set("to", o.To.UTC().Format(time.RFC3339Nano))
	}
	if o.GroupBy != "" {
		q.Set("group_by", o.GroupBy)
	}
	if o.Team != "" {
		q.Set("team", o.Team)
	}
	var r UsageReport
	err := c.do(ctx, &request{method: http.MethodGet, path: "/usage", query: q, retry: true}, &r)
	return r, err
}

// Balance returns the caller's team's balance, or (admin key) teamID's.
func (c *Client) Balance(ctx context.Context, teamID string) (Balance, error) {
	q := url.Values{}
	if teamID != "" {
		q.Set("team", teamID)
	}
	var b Balance
	err := c.do(ctx, &request{method: http.MethodGet, path: "/balance", query: q, retry: true}, &b)
	return b, err
}

// Ledger returns the latest entries of the caller's team's ledger, or
// (admin key) teamID's, newest first (0 limit: the server's 100).
func (c *Client) Ledger(ctx context.Context, teamID string, limit int) ([]LedgerEntry, error) {
	q := url.Values{}
	if teamID != "" {
		q.Set("team", teamID)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var l LedgerList
	if err := c.do(ctx, &request{method: http.MethodGet, path: "/balance/ledger", query: q, retry: true}, &l); err != nil {
		return nil, err
	}
	return l.Entries, nil
}

// TopUp adds to a team's balance (admin key only) and returns the balance
// after it. Not retried: a retry could top up twice.
func (c *Client) TopUp(ctx context.Context, teamID string, req TopUpRequest) (Balance, error) {
	var b Balance
	if err := checkIDs(teamID); err != nil {
		return b, err
	}
	err := c.do(ctx, &request{method: http.MethodPost, path: "/teams/" + seg(teamID) + "/balance", in: req}, &b)
	return b, err
}
