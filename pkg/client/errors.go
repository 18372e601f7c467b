package client

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// APIError is an error answered by the server: {"error":{"code","message"}}.
type APIError struct {
	// Status is the HTTP status; 0 for an error event inside a stream.
	Status int
	// Code is one of the Code* constants (or, for an answer that was not an
	// evalbox error body, the code its status maps to).
	Code    string
	Message string
	// RetryAfter is the server's Retry-After, when it sent one.
	RetryAfter time.Duration
}

// Error returns "code: message".
func (e *APIError) Error() string {
	if e.Message == "" {
		return e.Code
	}
	return e.Code + ": " + e.Message
}

// ErrorCode returns the code of the *APIError in err's chain, or "".
func ErrorCode(err error) string {
	var e *APIError
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// IsNotFound reports whether err is a not_found answer.
func IsNotFound(err error) bool { return ErrorCode(err) == CodeNotFound }

// IsConflict reports whether err is a conflict answer.
func IsConflict(err error) bool { return ErrorCode(err) == CodeConflict }

// IsTooManySandboxes reports whether err says the team is at its
// active-sandbox limit.
func IsTooManySandboxes(err error) bool { return ErrorCode(err) == CodeTooManySandboxes }

// IsRateLimited reports whether err says the team (or the key) is over its
// request rate limit (requests_per_minute, creates_per_minute) or at its
// concurrent-exec limit; its APIError.RetryAfter says when to retry.
func IsRateLimited(err error) bool { return ErrorCode(err) == CodeRateLimited }

// IsOutputBudgetExhausted reports whether err says the server's memory for
// buffered command output had no room: stream the output instead (ExecStream,
// StreamProcess), lower MaxOutputBytes, or retry later.
func IsOutputBudgetExhausted(err error) bool { return ErrorCode(err) == CodeOutputBudgetExhausted }

// IsStorageQuotaExceeded reports whether err says the team's storage
// limit would be passed.
func IsStorageQuotaExceeded(err error) bool { return ErrorCode(err) == CodeStorageQuotaExceeded }

// IsInsufficientBalance reports whether err says billing is on and the
// team's balance does not cover the sandbox: an admin tops it up.
func IsInsufficientBalance(err error) bool { return ErrorCode(err) == CodeInsufficientBalance }

// IsInsufficientCapacity reports whether err says the host had no room for
// a new sandbox (host pids or memory, shared by every team): retry later,
// or create with WaitSeconds to queue.
func IsInsufficientCapacity(err error) bool { return ErrorCode(err) == CodeInsufficientCapacity }

// IsSandboxNotRunning reports whether err says the sandbox ended.
func IsSandboxNotRunning(err error) bool { return ErrorCode(err) == CodeSandboxNotRunning }

// IsWaitTimeout reports whether err says a background process was still
// running when WaitProcess's timeout passed.
func IsWaitTimeout(err error) bool { return ErrorCode(err) == CodeTimeout }

// maxErrorBody bounds how much of an error answer is read.
const maxErrorBody = 64 << 10

// decodeError turns a non-2xx answer into an *APIError and closes its body.
func decodeError(resp *http.Response) *APIError {
	defer closeBody(resp.Body)
	e := &APIError{
		Status:     resp.StatusCode,
		RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After")),
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var eb ErrorBody
	if json.Unmarshal(body, &eb) == nil && eb.Error.Code != "" {
		e.Code, e.Message = eb.Error.Code, eb.Error.Message
		return e
	}
	// Not an evalbox error body (a proxy, or a server bug): keep what can be
	// said about it.
	e.Code = codeForStatus(resp.StatusCode)
	msg := strings.TrimSpace(string(body))
	if len(msg) > 200 {
		msg = msg[:200] + "…"
	}
	if msg == "" {
		msg = http.StatusText(resp.StatusCode)
	}
	e.Message = "HTTP " + strconv.Itoa(resp.StatusCode) + ": " + msg
	return e
}

func codeForStatus(status int) string {
	switch status {
	case http.StatusBadRequest:
		return CodeBadRequest
	case http.StatusUnauthorized:
		return CodeUnauthorized
	case http.StatusForbidden:
		return CodeForbidden
	case http.StatusNotFound:
		return CodeNotFound
	case http.StatusRequestTimeout:
		return CodeTimeout
	case http.StatusConflict:
		return CodeConflict
	case http.StatusRequestEntityTooLarge:
		return CodePayloadTooLarge
	case http.StatusTooManyRequests:
		return CodeRateLimited
	case http.StatusServiceUnavailable, http.StatusBadGateway, http.StatusGatewayTimeout:
		return CodeUnavailable
	}
	if status >= 500 {
		return CodeInternal
	}
	return CodeBadRequest
}

// parseRetryAfter reads a Retry-After header: delay-seconds or an HTTP date.
func parseRetryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
		if s <= 0 {
			return 0
		}
		return time.Duration(min(s, 24*3600)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0)
	}
	return 0
}
