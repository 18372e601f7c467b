// Package client is the Go client of the evalbox REST API (/v1).
//
// A Client is safe for concurrent use; create one and share it. All Clients
// that use the default HTTP client share one connection pool, sized for the
// hot path of creating, running commands in and deleting thousands of
// sandboxes.
//
//	c := client.FromEnv() // EVALBOX_API_URL, EVALBOX_API_KEY
//	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "python", Timeout: 600})
//	if err != nil { … }
//	defer c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
//	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"python3", "-c", "print(1)"}, Timeout: 5})
//
// Errors answered by the server are *APIError (see IsNotFound and friends).
// Idempotent requests are retried on 429 and 503 answers, honouring
// Retry-After; creating a sandbox is only retried with WithRetryCreate, and
// commands (exec, process start, signal) are never retried.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"
)

// DefaultBaseURL is the API address used when none is configured: the
// default listen address of `evalbox serve`.
const DefaultBaseURL = "http://127.0.0.1:8700"

// Environment variables read by FromEnv.
const (
	EnvAPIURL = "EVALBOX_API_URL"
	EnvAPIKey = "EVALBOX_API_KEY"
)

const (
	defaultUserAgent    = "evalbox-go"
	defaultRetries      = 3
	defaultMaxRetryWait = 30 * time.Second
	minBackoff          = 100 * time.Millisecond
	maxBackoff          = 5 * time.Second
	// expectContinueMin is the upload size above which the body waits for
	// the server's 100 Continue; smaller uploads skip that round trip.
	expectContinueMin = 1 << 20
	// maxDrain bounds how much of an unread body is discarded to keep its
	// connection reusable; past it the connection is closed instead.
	maxDrain = 256 << 10
)

// Client calls the evalbox API. Create it with New or FromEnv.
type Client struct {
	base         string // scheme://host[:port][/prefix], without /v1 or a trailing slash
	auth         string // "Bearer <key>", or "" without a key
	hc           *http.Client
	userAgent    string
	retries      int
	retryCreate  bool
	maxRetryWait time.Duration
	// sleep waits d or until ctx is done; replaced in tests to observe waits.
	sleep func(ctx context.Context, d time.Duration) error
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient makes the Client send its requests with hc instead of the
// shared default (whose Transport keeps many idle connections per host).
// hc should have no Timeout: deadlines come from each call's context, and
// streams and long execs would be cut by a client-wide timeout.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) { c.hc = hc }
}

// WithUserAgent sets the User-Agent header.
func WithUserAgent(ua string) Option {
	return func(c *Client) { c.userAgent = ua }
}

// WithRetries sets how many times an idempotent request is retried after a
// 429 or 503 answer (default 3; 0 disables retries).
func WithRetries(n int) Option {
	return func(c *Client) { c.retries = max(n, 0) }
}

// WithMaxRetryWait sets the longest single wait before a retry (default
// 30s). A Retry-After longer than this is not waited for: the error is
// returned at once.
func WithMaxRetryWait(d time.Duration) Option {
	return func(c *Client) { c.maxRetryWait = d }
}

// WithRetryCreate makes CreateSandbox retry on 429 (too_many_sandboxes) and
// 503 answers like an idempotent call. Those answers mean nothing was
// created, so this is safe; it is off by default because waiting for a slot
// is a caller's decision (see also CreateSandboxRequest.WaitSeconds, which
// queues on the server instead).
func WithRetryCreate(on bool) Option {
	return func(c *Client) { c.retryCreate = on }
}

// New returns a Client for the API at baseURL (e.g. "http://127.0.0.1:8700";
// a trailing "/v1" is accepted) that authenticates with apiKey. An empty
// baseURL means DefaultBaseURL.
func New(baseURL, apiKey string, opts ...Option) *Client {
	if baseURL == "" {
		baseURL = DefaultBaseURL
	}
	base := strings.TrimRight(baseURL, "/")
	base = strings.TrimSuffix(base, "/v1")
	c := &Client{
		base:         base,
		hc:           sharedHTTPClient(),
		userAgent:    defaultUserAgent,
		retries:      defaultRetries,
		maxRetryWait: defaultMaxRetryWait,
		sleep:        sleepCtx,
	}
	if apiKey != "" {
		c.auth = "Bearer " + apiKey
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// FromEnv returns a Client configured from EVALBOX_API_URL (default
// DefaultBaseURL) and EVALBOX_API_KEY.
func FromEnv(opts ...Option) *Client {
	return New(os.Getenv(EnvAPIURL), os.Getenv(EnvAPIKey), opts...)
}

// BaseURL returns the API address the Client talks to (without /v1).
func (c *Client) BaseURL() string { return c.base }

// sharedHTTPClient is the default http.Client of every Client: one
// Transport, so that all Clients in a process reuse the same connections.
var sharedHTTPClient = sync.OnceValue(func() *http.Client {
	t := &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: (&net.Dialer{
			Timeout:   30 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   512,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		// Larger buffers than the 4 KiB default: file transfers and
		// output streams move megabytes.
		WriteBufferSize: 64 << 10,
		ReadBufferSize:  64 << 10,
	}
	return &http.Client{Transport: t}
})

// request describes one API call.
type request struct {
	method string
	path   string // below /v1, already escaped: "/sandboxes/sb-1/exec"
	query  url.Values
	// in is marshalled as the JSON body when not nil.
	in any
	// raw is a streamed body (file upload) of rawSize bytes (-1 unknown),
	// of type rawType (default application/octet-stream).
	raw     io.Reader
	rawSize int64
	rawType string
	accept  string
	// retry allows retrying on 429/503 answers.
	retry bool
	// root: path is below the server's root, not /v1 (GET /metrics).
	root bool
}

// send performs r and returns the response when its status is 2xx; any other
// status is returned as an *APIError. The caller closes the response body.
func (c *Client) send(ctx context.Context, r *request) (*http.Response, error) {
	u := c.base + "/v1" + r.path
	if r.root {
		u = c.base + r.path
	}
	if len(r.query) > 0 {
		u += "?" + r.query.Encode()
	}
	var payload []byte
	if r.in != nil {
		var err error
		if payload, err = json.Marshal(r.in); err != nil {
			return nil, fmt.Errorf("evalbox: encoding %s %s request: %w", r.method, r.path, err)
		}
	}
	// A raw body can only be sent again if it can be rewound.
	rawStart := int64(-1)
	if r.raw != nil && r.retry && c.retries > 0 {
		if s, ok := r.raw.(io.Seeker); ok {
			if off, err := s.Seek(0, io.SeekCurrent); err == nil {
				rawStart = off
			}
		}
	}
	for attempt := 0; ; attempt++ {
		var body io.Reader
		if payload != nil {
			// A *bytes.Reader also gives the request a GetBody, which lets
			// net/http resend it on a stale keep-alive connection.
			body = bytes.NewReader(payload)
		}
		req, err := http.NewRequestWithContext(ctx, r.method, u, body)
		if err != nil {
			return nil, fmt.Errorf("evalbox: %w", err)
		}
		switch {
		case payload != nil:
			req.Header.Set("Content-Type", ContentTypeJSON)
		case r.raw != nil:
			if attempt > 0 {
				if _, err := r.raw.(io.Seeker).Seek(rawStart, io.SeekStart); err != nil {
					return nil, fmt.Errorf("evalbox: rewinding the body to retry: %w", err)
				}
			}
			req.ContentLength = r.rawSize
			if r.rawSize == 0 {
				req.Body = http.NoBody
			} else {
				// NopCloser: the caller owns r.raw. net/http looks through
				// io.NopCloser, so an *os.File still goes out with sendfile.
				req.Body = io.NopCloser(r.raw)
			}
			ct := r.rawType
			if ct == "" {
				ct = ContentTypeOctetStream
			}
			req.Header.Set("Content-Type", ct)
			if r.rawSize > expectContinueMin {
				// Let the server refuse (404, 413 from the Content-Length,
				// …) before the body is sent. Not for chunked bodies: there
				// the server learns nothing new from the headers.
				req.Header.Set("Expect", "100-continue")
			}
		}
		if c.auth != "" {
			req.Header.Set("Authorization", c.auth)
		}
		if c.userAgent != "" {
			req.Header.Set("User-Agent", c.userAgent)
		}
		accept := r.accept
		if accept == "" {
			accept = ContentTypeJSON
		}
		req.Header.Set("Accept", accept)

		resp, err := c.hc.Do(req)
		if err != nil {
			return nil, fmt.Errorf("evalbox: %w", err)
		}
		if resp.StatusCode >= 200 && resp.StatusCode < 300 {
			return resp, nil
		}
		apiErr := decodeError(resp)
		if !r.retry || attempt >= c.retries || !retryableStatus(apiErr.Status) ||
			(r.raw != nil && rawStart < 0) {
			return nil, apiErr
		}
		wait := apiErr.RetryAfter
		if wait <= 0 {
			wait = backoff(attempt)
		}
		if wait > c.maxRetryWait {
			return nil, apiErr
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return nil, apiErr
		}
		if err := c.sleep(ctx, wait); err != nil {
			return nil, fmt.Errorf("evalbox: %w while waiting to retry after: %w", err, apiErr)
		}
	}
}

// do performs r and decodes a JSON answer into out (when out is not nil).
func (c *Client) do(ctx context.Context, r *request, out any) error {
	resp, err := c.send(ctx, r)
	if err != nil {
		return err
	}
	defer closeBody(resp.Body)
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("evalbox: decoding the answer of %s %s: %w", r.method, r.path, err)
	}
	return nil
}

// closeBody drains what is left of a small body so that its connection is
// reused, then closes it.
func closeBody(b io.ReadCloser) {
	_, _ = io.Copy(io.Discard, io.LimitReader(b, maxDrain))
	_ = b.Close()
}

func retryableStatus(status int) bool {
	return status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable
}

// backoff is the wait before retry attempt+1 when the server gave no
// Retry-After: exponential from 100ms, capped at 5s, with ±20% jitter.
func backoff(attempt int) time.Duration {
	d := minBackoff << min(attempt, 10)
	d = min(d, maxBackoff)
	jitter := time.Duration(rand.Int64N(int64(d)/5*2+1)) - d/5
	return d + jitter
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// seg escapes one path segment (an id).
func seg(s string) string { return url.PathEscape(s) }

// errEmptyID is returned before any request when an id argument is empty,
// which would otherwise address another endpoint.
var errEmptyID = errors.New("evalbox: empty id")

func checkIDs(ids ...string) error {
	for _, id := range ids {
		if id == "" {
			return errEmptyID
		}
	}
	return nil
}
