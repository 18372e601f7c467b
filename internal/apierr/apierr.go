// Package apierr is the error the control plane's services give their
// callers: a stable code (one of the client.Code* constants) with a
// message, which the REST layer turns into its HTTP status and body. It is
// a leaf: services, the REST layer and the trial runner share it without
// importing one another.
package apierr

import (
	"errors"
	"fmt"
)

// Error is a failure reported to the caller with a stable code. Anything
// else is an internal error.
type Error struct {
	Code    string
	Message string
	// RetryAfter, in seconds, for too_many_sandboxes / rate_limited.
	RetryAfter int
	Err        error
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }
func (e *Error) Unwrap() error { return e.Err }

// Errorf returns an Error of code with a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Code is err's code when it is (or wraps) an Error, else "".
func Code(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// ErrOutOfMemory is wrapped by the error of a call during which the
// sandbox died because the code running in it went past its memory limit:
// the code's doing, unlike a sandbox killed from outside.
var ErrOutOfMemory = errors.New("sandbox out of memory")

// ErrStoppedDuringCall is wrapped by the error of a call during which the
// sandbox stopped (its agent's session ended, not ended by the server) for
// a reason that is not known to be its memory limit: the code running in
// it may have done it, or the host.
var ErrStoppedDuringCall = errors.New("sandbox stopped during the call")

// ErrNodeLost is wrapped by the error of a call on a sandbox whose node
// was lost (its Lease expired): an infrastructure failure, retried on a
// fresh sandbox elsewhere, never the doing of the code in the sandbox
// (unlike ErrStoppedDuringCall, which it never wraps).
var ErrNodeLost = errors.New("sandbox's node lost during the call")
