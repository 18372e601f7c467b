package client

import (
	"context"
	"net/http"
)

// Execute runs each script in its own fresh sandbox (created, written, run
// with req.Timeout, deleted), up to the team's limits at a time, and returns
// one result per script in order. A script's failure (non-zero exit,
// timeout) is its result, not an error. Execute is not retried.
func (c *Client) Execute(ctx context.Context, req ExecuteRequest) (*ExecuteResponse, error) {
	var res ExecuteResponse
	if err := c.do(ctx, &request{method: http.MethodPost, path: "/execute", in: &req}, &res); err != nil {
		return nil, err
	}
	return &res, nil
}
