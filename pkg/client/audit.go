package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// AuditQuery selects rows of the audit log (ListAudit). Zero fields select
// all.
type AuditQuery struct {
	TeamID string
	Action string
	// Since (inclusive) and Until (exclusive) bound the rows' times.
	Since, Until time.Time
	// Limit bounds the page (0: the server's default, 100; at most 1000).
	Limit int
	// Cursor is a previous page's NextCursor.
	Cursor string
}

// ListAudit returns a page of the audit log, newest first (admin key
// only). Pass its NextCursor as q.Cursor for the next page.
func (c *Client) ListAudit(ctx context.Context, q AuditQuery) (*AuditList, error) {
	v := url.Values{}
	if q.TeamID != "" {
		v.Set("team", q.TeamID)
	}
	if q.Action != "" {
		v.Set("action", q.Action)
	}
	if !q.Since.IsZero() {
		v.Set("since", q.Since.UTC().Format(time.RFC3339Nano))
	}
	if !q.Until.IsZero() {
		v.Set("until", q.Until.UTC().Format(time.RFC3339Nano))
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	if q.Cursor != "" {
		v.Set("cursor", q.Cursor)
	}
	var l AuditList
	if err := c.do(ctx, &request{method: http.MethodGet, path: "/audit", query: v, retry: true}, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// maxMetricsBytes bounds what Metrics reads.
const maxMetricsBytes = 64 << 20

// Metrics returns the server's metrics in Prometheus's text format (GET
// /metrics; admin key only).
func (c *Client) Metrics(ctx context.Context) ([]byte, error) {
	resp, err := c.send(ctx, &request{method: http.MethodGet, path: "/metrics", root: true, retry: true})
	if err != nil {
		return nil, err
	}
	defer closeBody(resp.Body)
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxMetricsBytes))
	if err != nil {
		return nil, fmt.Errorf("evalbox: reading metrics: %w", err)
	}
	return b, nil
}
