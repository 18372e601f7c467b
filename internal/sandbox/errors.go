package sandbox

import (
	"errors"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/pkg/client"
)

func errorf(code, format string, args ...any) *apierr.Error {
	return apierr.Errorf(code, format, args...)
}

// agentCodes maps the agent's error codes to the API's; another is a
// bad_request.
var agentCodes = map[string]string{
	nodeapi.CodeNotFound:   client.CodeNotFound,
	nodeapi.CodeExists:     client.CodeConflict,
	nodeapi.CodePermission: client.CodeForbidden,
	nodeapi.CodeNoSpace:    client.CodeNoSpace,
	nodeapi.CodeTooLarge:   client.CodePayloadTooLarge,
	nodeapi.CodeInternal:   client.CodeInternal,
}

// nodeErr maps a node error to an API error: the agent's refusals keep
// their meaning, a node that cannot be reached is unavailable. Others
// (the node's failures) stay internal.
func nodeErr(err error) error {
	var ae *nodeapi.AgentError
	if errors.As(err, &ae) {
		code, ok := agentCodes[ae.Code]
		if !ok {
			code = client.CodeBadRequest
		}
		return &apierr.Error{Code: code, Message: ae.Message, Err: err}
	}
	if errors.Is(err, nodeapi.ErrNodeUnreachable) {
		return &apierr.Error{Code: client.CodeUnavailable, RetryAfter: 1, Err: err,
			Message: "the sandbox's node cannot be reached; try again"}
	}
	return err
}
