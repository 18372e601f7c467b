package nodeapi

import (
	"errors"
	"fmt"
	"time"
)

// The errors a Node returns, which keep their meaning across the boundary
// (grpcnode maps each to a gRPC status with a typed detail and back).
// Anything else is a failure of the node, for the operator's log.
var (
	// ErrSandboxNotFound: the node does not run a sandbox of that id (it
	// was destroyed, or the node restarted).
	ErrSandboxNotFound = errors.New("nodeapi: no such sandbox on this node")
	// ErrSandboxStopped is wrapped by *StoppedError.
	ErrSandboxStopped = errors.New("nodeapi: sandbox stopped")
	// ErrSnapshotNotFound: the node holds no snapshot of that id.
	ErrSnapshotNotFound = errors.New("nodeapi: no such snapshot on this node")
	// ErrTemplateMissing: the node does not hold the template of a
	// create's digest (see Node.TemplatesPresent).
	ErrTemplateMissing = errors.New("nodeapi: template_missing")
	// ErrUnknownRuntime: the node does not run the runtime asked for.
	ErrUnknownRuntime = errors.New("nodeapi: unknown runtime")
	// ErrNodeClosed: the node is shutting down.
	ErrNodeClosed = errors.New("nodeapi: node is shutting down")
	// ErrNodeUnreachable is wrapped by the errors of a remote node's
	// client when the node could not be asked or did not answer (the
	// connection failed): not a verdict on the sandbox.
	ErrNodeUnreachable = errors.New("nodeapi: node unreachable")
	// ErrNodeLost is wrapped by *NodeLostError.
	ErrNodeLost = errors.New("nodeapi: node lost")
	// ErrInsufficientCapacity is wrapped by every *CapacityError.
	ErrInsufficientCapacity = errors.New("insufficient host capacity")
)

// TemplateMissingError says which template a node lacks. It wraps
// ErrTemplateMissing.
type TemplateMissingError struct{ Digest string }

func (e *TemplateMissingError) Error() string {
	return fmt.Sprintf("nodeapi: template_missing: the node does not hold template %s", e.Digest)
}
func (e *TemplateMissingError) Unwrap() error { return ErrTemplateMissing }

// NodeLostError is the error of a call on a sandbox whose node left the
// fleet (its Lease expired, it restarted, or it stopped): the sandbox is
// gone with it. A fleet's router returns it (in-flight calls and later
// ones alike, and Wait); a node never does. It wraps ErrNodeLost, apart
// from ErrSandboxStopped: the loss is the infrastructure's doing, never the
// sandbox's code's.
type NodeLostError struct {
	NodeID string
	// Why is "its lease expired" or "it left the fleet".
	Why string
}

func (e *NodeLostError) Error() string { return fmt.Sprintf("node %s lost (%s)", e.NodeID, e.Why) }
func (e *NodeLostError) Unwrap() error { return ErrNodeLost }

// StoppedError is the error of a call whose sandbox stopped (its agent went
// away) before the call finished. It wraps ErrSandboxStopped.
type StoppedError struct {
	ID string
	// OOMKills is the sandbox's count of OOM kills when it stopped (see
	// End.OOMKills).
	OOMKills int64
}

func (e *StoppedError) Error() string {
	return fmt.Sprintf("nodeapi: sandbox %s stopped (its agent went away)", e.ID)
}
func (e *StoppedError) Unwrap() error { return ErrSandboxStopped }

// Agent error codes of AgentError.Code: those of the guest agent's
// protocol, which the in-process node passes through.
const (
	CodeBadRequest = "bad_request"
	CodeNotFound   = "not_found"
	CodeExists     = "conflict"
	CodePermission = "permission_denied"
	CodeIsDir      = "is_directory"
	CodeNotDir     = "not_directory"
	CodeNoSpace    = "no_space"
	CodeTooLarge   = "too_large"
	CodeInternal   = "internal"
	// CodeConnRefused: ConnectPort found nothing listening on the port.
	CodeConnRefused = "connection_refused"
)

// AgentError is a call the sandbox's guest agent refused or failed: a
// missing file, an existing path, an upload over its limit. Its message is
// the agent's (the sandbox's code may influence it: show it as the
// sandbox's words).
type AgentError struct {
	Code    string
	Message string
}

func (e *AgentError) Error() string { return e.Code + ": " + e.Message }

// CapacityError says which host resource a sandbox did not fit in. It
// wraps ErrInsufficientCapacity. (node.CapacityError is this type.)
type CapacityError struct {
	// Resource is "pids", "memory" (the budget of memory limits) or
	// "available memory" (MemAvailable below the reserve).
	Resource string
	// Need, Reserved and Budget are in pids or bytes; for "available
	// memory", Reserved is MemAvailable and Budget the reserve.
	Need, Reserved, Budget int64
	// Never is set when Need is more than the whole budget.
	Never bool
	// Ahead is how many earlier requests queued for capacity (a request
	// does not overtake them, even when it would fit).
	Ahead int
	// Waited is how long the request queued.
	Waited time.Duration
}

func (e *CapacityError) Unwrap() error { return ErrInsufficientCapacity }

func (e *CapacityError) Error() string {
	var msg string
	mib := func(b int64) int64 { return b >> 20 }
	switch {
	case e.Resource == "available memory":
		msg = fmt.Sprintf("the host is short of memory: %d MiB available, below its reserve of %d MiB", mib(e.Reserved), mib(e.Budget))
	case e.Never && e.Resource == "pids":
		msg = fmt.Sprintf("the sandbox's pids limit costs %d host pids, more than the node's whole budget of %d", e.Need, e.Budget)
	case e.Never:
		msg = fmt.Sprintf("the sandbox's memory limit is %d MiB, more than the node's whole memory budget of %d MiB", mib(e.Need), mib(e.Budget))
	case e.Resource == "pids":
		msg = fmt.Sprintf("not enough host pids: the sandbox needs %d, and %d of the node's %d are reserved by its sandboxes (%d free)",
			e.Need, e.Reserved, e.Budget, max(0, e.Budget-e.Reserved))
	default:
		msg = fmt.Sprintf("not enough host memory: the sandbox needs %d MiB, and %d of the node's %d MiB are reserved by its sandboxes (%d MiB free)",
			mib(e.Need), mib(e.Reserved), mib(e.Budget), mib(max(0, e.Budget-e.Reserved)))
	}
	if e.Ahead > 0 {
		msg += fmt.Sprintf("; %d earlier requests queue for capacity ahead of it", e.Ahead)
	}
	if e.Waited > 0 {
		msg += fmt.Sprintf(" (waited %s)", e.Waited.Round(time.Millisecond))
	}
	return msg
}
