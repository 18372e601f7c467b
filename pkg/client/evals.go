package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// CreateEval starts an eval run on the server: every sample is judged
// against its problem's test program or I/O cases, in its own fresh
// sandbox (mode trial) or in slices sharing a sandbox (mode batch). The run
// goes on when the caller leaves; follow it with GetEval and EvalResults.
func (c *Client) CreateEval(ctx context.Context, req CreateEvalRequest) (*EvalRun, error) {
	var run EvalRun
	if err := c.do(ctx, &request{method: http.MethodPost, path: "/evals", in: &req}, &run); err != nil {
		return nil, err
	}
	return &run, nil
}

// GetEval returns an eval run with its progress (and summary once ended).
func (c *Client) GetEval(ctx context.Context, id string) (*EvalRun, error) {
	if err := checkIDs(id); err != nil {
		return nil, err
	}
	var run EvalRun
	if err := c.do(ctx, &request{method: http.MethodGet, path: "/evals/" + seg(id), retry: true}, &run); err != nil {
		return nil, err
	}
	return &run, nil
}

// ListEvals lists the team's eval runs, newest first.
func (c *Client) ListEvals(ctx context.Context) ([]EvalRun, error) {
	var l EvalRunList
	if err := c.do(ctx, &request{method: http.MethodGet, path: "/evals", retry: true}, &l); err != nil {
		return nil, err
	}
	return l.Runs, nil
}

// CancelEval stops a running eval run; its finished results stay.
func (c *Client) CancelEval(ctx context.Context, id string) (*EvalRun, error) {
	if err := checkIDs(id); err != nil {
		return nil, err
	}
	var run EvalRun
	if err := c.do(ctx, &request{method: http.MethodPost, path: "/evals/" + seg(id) + "/cancel"}, &run); err != nil {
		return nil, err
	}
	return &run, nil
}

// EvalResults calls fn with each finished result of an eval run, in the
// samples' order.
func (c *Client) EvalResults(ctx context.Context, id string, fn func(EvalResult) error) error {
	if err := checkIDs(id); err != nil {
		return err
	}
	resp, err := c.send(ctx, &request{method: http.MethodGet, path: "/evals/" + seg(id) + "/results", accept: ContentTypeNDJSON, retry: true})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var r EvalResult
		if err := dec.Decode(&r); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("evalbox: reading eval results: %w", err)
		}
		if err := fn(r); err != nil {
			return err
		}
	}
}
