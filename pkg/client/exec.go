package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Exec runs a command in a sandbox and returns once it ended, with its
// output buffered (see ExecRequest.MaxOutputBytes). A non-zero exit code,
// a timeout or a signal is not an error: see ExecResult.Status. Exec is not
// retried.
func (c *Client) Exec(ctx context.Context, id string, req ExecRequest) (*ExecResult, error) {
	if err := checkIDs(id); err != nil {
		return nil, err
	}
	var res ExecResult
	if err := c.do(ctx, &request{method: http.MethodPost, path: "/sandboxes/" + seg(id) + "/exec", in: &req}, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// ExecStream runs a command in a sandbox and copies its stdout and stderr
// to the given writers as they are produced (a nil writer discards). It
// returns the result once the command ended; the result's Stdout and Stderr
// are empty (the output went to the writers). Cancelling ctx closes the
// stream, which kills the command. ExecStream is not retried.
func (c *Client) ExecStream(ctx context.Context, id string, req ExecRequest, stdout, stderr io.Writer) (*ExecResult, error) {
	if err := checkIDs(id); err != nil {
		return nil, err
	}
	return c.stream(ctx, &request{
		method: http.MethodPost, path: "/sandboxes/" + seg(id) + "/exec", in: &req, accept: ContentTypeNDJSON,
	}, stdout, stderr)
}

// StartProcess starts a background command and returns at once.
func (c *Client) StartProcess(ctx context.Context, id string, req ExecRequest) (*Process, error) {
	if err := checkIDs(id); err != nil {
		return nil, err
	}
	var p Process
	if err := c.do(ctx, &request{method: http.MethodPost, path: "/sandboxes/" + seg(id) + "/processes", in: &req}, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// ListProcesses lists a sandbox's background processes, running and ended.
func (c *Client) ListProcesses(ctx context.Context, id string) ([]Process, error) {
	if err := checkIDs(id); err != nil {
		return nil, err
	}
	var l ProcessList
	if err := c.do(ctx, &request{method: http.MethodGet, path: "/sandboxes/" + seg(id) + "/processes", retry: true}, &l); err != nil {
		return nil, err
	}
	return l.Processes, nil
}

// GetProcess returns one background process; pid is its Process.ID.
func (c *Client) GetProcess(ctx context.Context, id, pid string) (*Process, error) {
	if err := checkIDs(id, pid); err != nil {
		return nil, err
	}
	var p Process
	if err := c.do(ctx, &request{method: http.MethodGet, path: processPath(id, pid, ""), retry: true}, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// WaitProcess waits up to timeout (0 = the server's maximum wait) for a
// background process to end and returns its result with the captured
// output. When it is still running at the timeout the error satisfies
// IsWaitTimeout and the process keeps running.
func (c *Client) WaitProcess(ctx context.Context, id, pid string, timeout time.Duration) (*ExecResult, error) {
	if err := checkIDs(id, pid); err != nil {
		return nil, err
	}
	var q url.Values
	if timeout > 0 {
		q = url.Values{"timeout": {strconv.FormatFloat(timeout.Seconds(), 'f', -1, 64)}}
	}
	var res ExecResult
	if err := c.do(ctx, &request{method: http.MethodPost, path: processPath(id, pid, "/wait"), query: q, retry: true}, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// StreamProcess copies a background process's output to the given writers
// (a nil writer discards): first what it printed so far, then new output as
// it comes, until it ends; it returns the result (without output).
// Cancelling ctx stops the stream, not the process.
func (c *Client) StreamProcess(ctx context.Context, id, pid string, stdout, stderr io.Writer) (*ExecResult, error) {
	if err := checkIDs(id, pid); err != nil {
		return nil, err
	}
	return c.stream(ctx, &request{
		method: http.MethodGet, path: processPath(id, pid, "/stream"), accept: ContentTypeNDJSON, retry: true,
	}, stdout, stderr)
}

// SignalProcess sends a signal ("SIGTERM", "TERM" or "15") to a background
// process.
func (c *Client) SignalProcess(ctx context.Context, id, pid, signal string) error {
	if err := checkIDs(id, pid); err != nil {
		return err
	}
	return c.do(ctx, &request{method: http.MethodPost, path: processPath(id, pid, "/signal"), in: &SignalRequest{Signal: signal}}, nil)
}

// WriteStdin writes data (at most 1 MiB a call) to the stdin of a
// background process started with KeepStdin, then closes its stdin if
// closeAfter.
func (c *Client) WriteStdin(ctx context.Context, id, pid string, data []byte, closeAfter bool) error {
	if err := checkIDs(id, pid); err != nil {
		return err
	}
	q := url.Values{}
	if closeAfter {
		q.Set("close", "true")
	}
	return c.do(ctx, &request{method: http.MethodPost, path: processPath(id, pid, "/stdin"), query: q,
		raw: bytes.NewReader(data), rawSize: int64(len(data))}, nil)
}

// KillProcess sends SIGKILL to a background process and its whole tree.
func (c *Client) KillProcess(ctx context.Context, id, pid string) error {
	if err := checkIDs(id, pid); err != nil {
		return err
	}
	return c.do(ctx, &request{method: http.MethodDelete, path: processPath(id, pid, ""), retry: true}, nil)
}

func processPath(id, pid, suffix string) string {
	return "/sandboxes/" + seg(id) + "/processes/" + seg(pid) + suffix
}

// errNoExit is returned when a stream ends before its exit event.
var errNoExit = fmt.Errorf("evalbox: the stream ended before the exit event: %w", io.ErrUnexpectedEOF)

// stream performs a request answered with NDJSON ExecEvents.
func (c *Client) stream(ctx context.Context, r *request, stdout, stderr io.Writer) (*ExecResult, error) {
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	resp, err := c.send(ctx, r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == ContentTypeJSON {
		// A server that does not stream answers the buffered result.
		var res ExecResult
		if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
			return nil, fmt.Errorf("evalbox: decoding the answer of %s %s: %w", r.method, r.path, err)
		}
		if _, err := io.WriteString(stdout, res.Stdout); err != nil {
			return nil, err
		}
		if _, err := io.WriteString(stderr, res.Stderr); err != nil {
			return nil, err
		}
		res.Stdout, res.Stderr = "", ""
		return &res, nil
	}
	return readEvents(resp.Body, stdout, stderr)
}

// readEvents consumes an NDJSON stream of ExecEvents up to its last event.
func readEvents(body io.Reader, stdout, stderr io.Writer) (*ExecResult, error) {
	dec := json.NewDecoder(body)
	for {
		var ev ExecEvent
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				return nil, errNoExit
			}
			return nil, fmt.Errorf("evalbox: reading the stream: %w", err)
		}
		switch ev.Type {
		case EventStdout:
			if _, err := io.WriteString(stdout, ev.Data); err != nil {
				return nil, err
			}
		case EventStderr:
			if _, err := io.WriteString(stderr, ev.Data); err != nil {
				return nil, err
			}
		case EventExit:
			if ev.Result == nil {
				return nil, errors.New("evalbox: exit event without a result")
			}
			return ev.Result, nil
		case EventError:
			e := &APIError{Code: CodeInternal, Message: "error event without detail"}
			if ev.Error != nil {
				e.Code, e.Message = ev.Error.Code, ev.Error.Message
			}
			return nil, e
		}
		// Unknown event types are skipped: newer servers may add some.
	}
}
