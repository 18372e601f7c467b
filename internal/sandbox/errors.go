package sandbox

import (
	"errors"
	"fmt"

	"github.com/evalbox/evalbox/internal/agentproto"
	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/pkg/client"
)

func errorf(code, format string, args ...any) *apierr.Error {
	return apierr.Errorf(code, format, args...)
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
		return &apierr.Error{Code: code, Message: ae.Message, Err: err}
	}
	if errors.Is(err, agentproto.ErrSessionClosed) {
		return &apierr.Error{Code: client.CodeSandboxNotRunning, Message: fmt.Sprintf("sandbox %s stopped", id), Err: err}
	}
	return err
}
