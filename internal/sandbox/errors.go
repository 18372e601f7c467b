package sandbox

import (
	"errors"
	"fmt"

	"github.com/evalbox/evalbox/internal/agentproto"
	"github.com/evalbox/evalbox/pkg/client"
)

// Error is a failure the API reports to the caller with a stable code (one
// of the client.Code* constants). Anything else is an internal error.
type Error struct {
	Code    string
	Message string
	// RetryAfter, in seconds, for too_many_sandboxes / rate_limited.
	RetryAfter int
	Err        error
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }
func (e *Error) Unwrap() error { return e.Err }

// ErrOutOfMemory is wrapped by the error of a call during which the
// sandbox died because the code running in it went past its memory limit:
// the code's doing, unlike a sandbox killed from outside.
var ErrOutOfMemory = errors.New("sandbox out of memory")

// ErrStoppedDuringCall is wrapped by the error of a call during which the
// sandbox stopped (its agent's session ended) for a reason that is not
// known to be its memory limit: the code running in it may have done it,
// or the host.
var ErrStoppedDuringCall = errors.New("sandbox stopped during the call")

func errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// fromAgent maps an agent error to an API error.
func fromAgent(id string, err error) error {
	var ae *agentproto.Error
	if errors.As(err, &ae) {
		code := client.CodeBadRequest
		switch ae.Code {
		case agentproto.CodeNotFound:
			code = client.CodeNotFound
		case agentproto.CodeExists:
			code = client.CodeConflict
		case agentproto.CodePermission:
			code = client.CodeForbidden
		case agentproto.CodeNoSpace:
			code = client.CodeNoSpace
		case agentproto.CodeTooLarge:
			code = client.CodePayloadTooLarge
		case agentproto.CodeInternal:
			code = client.CodeInternal
		}
		return &Error{Code: code, Message: ae.Message, Err: err}
	}
	if errors.Is(err, agentproto.ErrSessionClosed) {
		return &Error{Code: client.CodeSandboxNotRunning, Message: fmt.Sprintf("sandbox %s stopped", id), Err: err}
	}
	return err
}
