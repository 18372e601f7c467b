package grpcnode

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/nodeapi"
	pb "github.com/evalbox/evalbox/internal/nodeapi/nodepb"
	"github.com/evalbox/evalbox/pkg/client"
)

// agentCodes are the gRPC codes of the agent's error codes (another is
// InvalidArgument). The detail carries the agent's code itself.
var agentCodes = map[string]codes.Code{
	nodeapi.CodeNotFound:   codes.NotFound,
	nodeapi.CodeExists:     codes.AlreadyExists,
	nodeapi.CodePermission: codes.PermissionDenied,
	nodeapi.CodeNoSpace:    codes.ResourceExhausted,
	nodeapi.CodeTooLarge:   codes.ResourceExhausted,
	nodeapi.CodeInternal:   codes.Internal,
	// Nothing listens on the port: the sandbox's state, not the call's.
	nodeapi.CodeConnRefused: codes.FailedPrecondition,
}

// apiCodes are the gRPC codes of apierr codes (another is Unknown).
var apiCodes = map[string]codes.Code{
	client.CodeBadRequest:           codes.InvalidArgument,
	client.CodeNotFound:             codes.NotFound,
	client.CodeConflict:             codes.AlreadyExists,
	client.CodeForbidden:            codes.PermissionDenied,
	client.CodeUnauthorized:         codes.Unauthenticated,
	client.CodeTooManySandboxes:     codes.ResourceExhausted,
	client.CodeRateLimited:          codes.ResourceExhausted,
	client.CodePayloadTooLarge:      codes.ResourceExhausted,
	client.CodeInsufficientCapacity: codes.ResourceExhausted,
	client.CodeSandboxNotRunning:    codes.FailedPrecondition,
	client.CodeUnavailable:          codes.Unavailable,
	client.CodeInternal:             codes.Internal,
}

// toStatus turns a Node's error into the status the server answers: a code
// and a typed detail that fromStatus turns back into the same Go error.
// An error of no kind the contract knows keeps only its message (the node
// is trusted; the control plane logs it and shows its users a generic
// one).
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) {
		return status.Error(codes.Canceled, err.Error())
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	var (
		ae      *apierr.Error
		agent   *nodeapi.AgentError
		capErr  *nodeapi.CapacityError
		stopped *nodeapi.StoppedError
		missing *nodeapi.TemplateMissingError
	)
	code, d := codes.Unknown, &pb.ErrorDetail{Message: err.Error()}
	switch {
	case errors.As(err, &ae):
		code, d.Kind, d.Code, d.Message, d.RetryAfterSeconds = codes.Unknown, pb.ErrorDetail_KIND_API, ae.Code, ae.Message, int64(ae.RetryAfter)
		if c, ok := apiCodes[ae.Code]; ok {
			code = c
		}
	case errors.As(err, &agent):
		code, d.Kind, d.Code, d.Message = codes.InvalidArgument, pb.ErrorDetail_KIND_AGENT, agent.Code, agent.Message
		if c, ok := agentCodes[agent.Code]; ok {
			code = c
		}
	case errors.As(err, &capErr):
		code, d.Kind = codes.ResourceExhausted, pb.ErrorDetail_KIND_CAPACITY
		d.Capacity = &pb.CapacityError{Resource: capErr.Resource, Need: capErr.Need, Reserved: capErr.Reserved, Budget: capErr.Budget,
			Never: capErr.Never, Ahead: int64(capErr.Ahead), WaitedNanos: int64(capErr.Waited)}
	case errors.As(err, &stopped):
		code, d.Kind, d.SandboxId, d.OomKills = codes.FailedPrecondition, pb.ErrorDetail_KIND_SANDBOX_STOPPED, stopped.ID, stopped.OOMKills
	case errors.As(err, &missing):
		code, d.Kind, d.TemplateDigest = codes.FailedPrecondition, pb.ErrorDetail_KIND_TEMPLATE_MISSING, missing.Digest
	case errors.Is(err, nodeapi.ErrTemplateMissing):
		code, d.Kind = codes.FailedPrecondition, pb.ErrorDetail_KIND_TEMPLATE_MISSING
	case errors.Is(err, nodeapi.ErrSandboxNotFound):
		code, d.Kind = codes.NotFound, pb.ErrorDetail_KIND_SANDBOX_NOT_FOUND
	case errors.Is(err, nodeapi.ErrSnapshotNotFound):
		code, d.Kind = codes.NotFound, pb.ErrorDetail_KIND_SNAPSHOT_NOT_FOUND
	case errors.Is(err, nodeapi.ErrUnknownRuntime):
		code, d.Kind = codes.InvalidArgument, pb.ErrorDetail_KIND_UNKNOWN_RUNTIME
	case errors.Is(err, nodeapi.ErrNodeClosed):
		code, d.Kind = codes.Unavailable, pb.ErrorDetail_KIND_NODE_CLOSED
	default:
		return status.Error(codes.Unknown, err.Error())
	}
	st, derr := status.New(code, err.Error()).WithDetails(d)
	if derr != nil {
		return status.Error(codes.Internal, "grpcnode: cannot attach an error detail: "+derr.Error())
	}
	return st.Err()
}

// remoteError is a node's error that is one of the contract's sentinels:
// the node's message, and errors.Is finds the sentinel.
type remoteError struct {
	msg string
	is  error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.is }

// fromStatus turns a call's error back into the contract's: the error the
// node returned, when the status has an ErrorDetail; ctx's error when the
// call ended with it; ErrNodeUnreachable wrapped when the node could not
// be reached; else an error with the status's message.
func fromStatus(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("grpcnode %s: %w", op, ctxErr)
	}
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("grpcnode %s: %w", op, err)
	}
	for _, detail := range st.Details() {
		if d, ok := detail.(*pb.ErrorDetail); ok {
			if e := fromDetail(st.Message(), d); e != nil {
				return e
			}
		}
	}
	switch st.Code() {
	case codes.Canceled:
		return fmt.Errorf("grpcnode %s: %s: %w", op, st.Message(), context.Canceled)
	case codes.DeadlineExceeded:
		return fmt.Errorf("grpcnode %s: %s: %w", op, st.Message(), context.DeadlineExceeded)
	case codes.Unavailable:
		return fmt.Errorf("grpcnode %s: %w: %s", op, nodeapi.ErrNodeUnreachable, st.Message())
	case codes.Unauthenticated:
		return fmt.Errorf("grpcnode %s: the node refused the call: %s (check the node token and TLS settings)", op, st.Message())
	}
	return fmt.Errorf("grpcnode %s: node: %s (%s)", op, st.Message(), st.Code())
}

// fromDetail rebuilds a contract error (nil: an unknown kind).
func fromDetail(msg string, d *pb.ErrorDetail) error {
	switch d.GetKind() {
	case pb.ErrorDetail_KIND_API:
		return &apierr.Error{Code: d.GetCode(), Message: d.GetMessage(), RetryAfter: int(d.GetRetryAfterSeconds())}
	case pb.ErrorDetail_KIND_AGENT:
		return &nodeapi.AgentError{Code: d.GetCode(), Message: d.GetMessage()}
	case pb.ErrorDetail_KIND_CAPACITY:
		c := d.GetCapacity()
		return &nodeapi.CapacityError{Resource: c.GetResource(), Need: c.GetNeed(), Reserved: c.GetReserved(), Budget: c.GetBudget(),
			Never: c.GetNever(), Ahead: int(c.GetAhead()), Waited: time.Duration(c.GetWaitedNanos())}
	case pb.ErrorDetail_KIND_SANDBOX_STOPPED:
		return &nodeapi.StoppedError{ID: d.GetSandboxId(), OOMKills: d.GetOomKills()}
	case pb.ErrorDetail_KIND_TEMPLATE_MISSING:
		if d.GetTemplateDigest() != "" {
			return &nodeapi.TemplateMissingError{Digest: d.GetTemplateDigest()}
		}
		return &remoteError{msg: msg, is: nodeapi.ErrTemplateMissing}
	case pb.ErrorDetail_KIND_SANDBOX_NOT_FOUND:
		return &remoteError{msg: msg, is: nodeapi.ErrSandboxNotFound}
	case pb.ErrorDetail_KIND_SNAPSHOT_NOT_FOUND:
		return &remoteError{msg: msg, is: nodeapi.ErrSnapshotNotFound}
	case pb.ErrorDetail_KIND_UNKNOWN_RUNTIME:
		return &remoteError{msg: msg, is: nodeapi.ErrUnknownRuntime}
	case pb.ErrorDetail_KIND_NODE_CLOSED:
		return &remoteError{msg: msg, is: nodeapi.ErrNodeClosed}
	}
	return nil
}
