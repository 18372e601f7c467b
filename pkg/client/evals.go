package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
)

// CreateEval starts an eval run on the server: every sample is judged
// against its problem's test program or I/O cases, in its own fresh
// sandbox (mode trial) or in slices sharing a sandbox (mode batch). The run
// goes on when the caller leaves; follow it with EvalEvents (or GetEval)
// and read its verdicts with EvalResults.
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

// DeleteEval deletes an eval run that has ended (its input, results and
// summary), freeing what it counted against the team's storage. A run
// still queued or running is a conflict: cancel it first.
func (c *Client) DeleteEval(ctx context.Context, id string) error {
	if err := checkIDs(id); err != nil {
		return err
	}
	return c.do(ctx, &request{method: http.MethodDelete, path: "/evals/" + seg(id), retry: true}, nil)
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

// errEvalNoEnd is what following an eval run returns when its event stream
// closed before the run's end event (the server stopped).
var errEvalNoEnd = fmt.Errorf("evalbox: the eval run's event stream ended before the run did: %w", io.ErrUnexpectedEOF)

// EvalEvents follows a running eval run: fn gets a "run" event with its
// progress, then a "result" event for every verdict recorded after it,
// "progress" events (at most about once a second, when the counts
// changed) and last an "end" event with the ended run and its summary.
// An ended run gives "run" and "end" at once. It returns nil after fn
// took the end event, fn's error, the stream's "error" event as an
// *APIError, or an error wrapping io.ErrUnexpectedEOF when the stream was
// cut (a restarted server resumes the run: follow it again). The results
// recorded before the "run" event are EvalResults'.
func (c *Client) EvalEvents(ctx context.Context, id string, fn func(EvalEvent) error) error {
	return c.evalEvents(ctx, id, true, fn)
}

// EvalProgressEvents is EvalEvents without the "result" events.
func (c *Client) EvalProgressEvents(ctx context.Context, id string, fn func(EvalEvent) error) error {
	return c.evalEvents(ctx, id, false, fn)
}

func (c *Client) evalEvents(ctx context.Context, id string, results bool, fn func(EvalEvent) error) error {
	if err := checkIDs(id); err != nil {
		return err
	}
	req := &request{method: http.MethodGet, path: "/evals/" + seg(id) + "/events", accept: ContentTypeNDJSON, retry: true}
	if !results {
		req.query = url.Values{"results": {"false"}}
	}
	resp, err := c.send(ctx, req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var ev EvalEvent
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				return errEvalNoEnd
			}
			return fmt.Errorf("evalbox: reading eval events: %w", err)
		}
		switch ev.Type {
		case EvalEventError:
			e := &APIError{Code: CodeInternal, Message: "error event without detail"}
			if ev.Error != nil {
				e.Code, e.Message = ev.Error.Code, ev.Error.Message
			}
			return e
		case EvalEventRun, EvalEventProgress, EvalEventEnd:
			if ev.Run == nil {
				return fmt.Errorf("evalbox: eval %s event without the run", ev.Type)
			}
		case EvalEventResult:
			if ev.Result == nil {
				return errors.New("evalbox: eval result event without the result")
			}
		default:
			continue // newer servers may add event types
		}
		if err := fn(ev); err != nil {
			return err
		}
		if ev.Type == EvalEventEnd {
			return nil
		}
	}
}
