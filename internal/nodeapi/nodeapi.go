// Package nodeapi is the contract between the control plane and a node: the
// one interface (Node) through which the control plane starts, watches and
// ends sandboxes, runs processes and moves files in them, and asks a node
// about its pools, capacity and templates. It is plain Go: io.Reader and
// io.Writer for streams, errors that keep their meaning (errors.go).
//
// Two implementations serve it: node.Local, the host's node in process (no
// serialisation: the embedded server), and grpcnode.Client, a node over
// gRPC (proto/evalbox/node/v1/node.proto, which mirrors this package rpc for
// method; grpcnode.Server serves any Node). docs/design/node-contract.md
// says why it is cut this way.
//
// Sandboxes are addressed by id, never through a handle, so that a control
// plane that restarts (or another one) can address the sandboxes a node
// runs. The package imports nothing of evalbox: the control plane imports
// it without the node's runtime drivers, and a node without the control
// plane.
package nodeapi

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"time"
)

// Node is what the control plane needs of a node. Every method is safe for
// concurrent use. A method given the id of a sandbox the node does not run
// returns an error wrapping ErrSandboxNotFound.
type Node interface {
	// Runtimes lists the runtime names the node runs, sorted. They do not
	// change while a node runs (a client may cache them).
	Runtimes(ctx context.Context) ([]string, error)
	// Capacity reports the host capacity sandboxes are admitted against.
	Capacity(ctx context.Context) (CapacityStatus, error)
	// TemplatesPresent returns the digests, of those given, whose template
	// the node holds (in their order): a sandbox of any other would fail
	// with ErrTemplateMissing.
	TemplatesPresent(ctx context.Context, digests []string) ([]string, error)
	// SetPool sets how many ready sandboxes of a spec the node keeps.
	SetPool(ctx context.Context, p PoolSpec) error
	// Pools reports every warm pool, in a stable order.
	Pools(ctx context.Context) ([]PoolStatus, error)

	// Create returns a running sandbox, its agent answering and the
	// template's ready_cmd done: claimed from the warm pool, or started
	// once host capacity is reserved (queueing up to req.Wait; not getting
	// it is a *CapacityError). On error nothing is left.
	Create(ctx context.Context, req CreateRequest) (SandboxInfo, error)
	// Destroy kills a sandbox and removes everything of it. An unknown id
	// is not an error (it is idempotent).
	Destroy(ctx context.Context, id string) error
	// Wait blocks until the sandbox ends (it died, or was destroyed) or
	// ctx is done, and says how it ended.
	Wait(ctx context.Context, id string) (End, error)

	// Exec runs a process in the foreground and returns how it ended,
	// writing its output to stdout and stderr (nil discards) as it comes;
	// stdin, if not nil, is copied to it, then its stdin is closed. When
	// ctx is done before the process ends the whole process tree is killed
	// and Exec returns ctx's error. A process that cannot start is not an
	// error: it ends with StatusError.
	Exec(ctx context.Context, id string, req ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (ExitInfo, error)
	// StartProcess starts a background process and returns at once; the
	// agent keeps its output (up to the cap) for AttachProcess. With
	// req.Stdin its stdin stays open for WriteStdin.
	StartProcess(ctx context.Context, id string, req ExecRequest) (ProcInfo, error)
	// ListProcesses lists the running processes and the recently ended
	// background ones, oldest first.
	ListProcesses(ctx context.Context, id string) ([]ProcInfo, error)
	// AttachProcess writes a background process's output so far, follows
	// it until the process ends and returns how it ended. Ending ctx
	// detaches without touching the process.
	AttachProcess(ctx context.Context, id, procID string, stdout, stderr io.Writer) (ExitInfo, error)
	// WaitProcess waits until a background process ends.
	WaitProcess(ctx context.Context, id, procID string) (ExitInfo, error)
	// SignalProcess sends sig to a background process's process group.
	SignalProcess(ctx context.Context, id, procID string, sig int) error
	// WriteStdin writes data (at most MaxStdinBytes) to the stdin of a
	// background process started with Stdin, then closes its stdin if
	// closeAfter. The agent's refusal (the process ended: not_found; it has
	// no stdin or stopped reading it: bad_request; it did not read it in
	// time: conflict) is an *AgentError.
	WriteStdin(ctx context.Context, id, procID string, data []byte, closeAfter bool) error

	// WriteFile streams r into the file at path. The file appears whole or
	// not at all: a failed, cancelled or too large upload leaves nothing.
	WriteFile(ctx context.Context, id, path string, r io.Reader, opts WriteOptions) (FileInfo, error)
	// OpenFile opens a file for reading: its info before any byte, then a
	// reader of exactly FileInfo.Size bytes for a regular file. The reader
	// must be closed; ctx governs it until then.
	OpenFile(ctx context.Context, id, path string) (FileInfo, io.ReadCloser, error)
	// Stat describes path without following a final symlink.
	Stat(ctx context.Context, id, path string) (FileInfo, error)
	// ListDir lists a directory, sorted by name.
	ListDir(ctx context.Context, id, path string) ([]FileInfo, error)
	// Mkdir creates a directory (and its parents with opts.Parents, when
	// an existing directory is not an error).
	Mkdir(ctx context.Context, id, path string, opts MkdirOptions) (FileInfo, error)
	// Remove removes a file or an empty directory, or a tree with
	// recursive. Removing "/" is refused.
	Remove(ctx context.Context, id, path string, recursive bool) error
	// Rename moves path to target (rename(2): a file or an empty
	// directory there is replaced) and describes it at target.
	Rename(ctx context.Context, id, path, target string) (FileInfo, error)
	// WatchDir watches a directory of the sandbox (with recursive, the
	// directories under it too, also those made later) and returns once
	// the watch is set up (a path that is not a directory is an
	// *AgentError not_directory). ctx governs the watch until it is
	// closed, which must be done.
	WatchDir(ctx context.Context, id, path string, recursive bool) (DirWatch, error)

	// ConnectPort connects to a TCP port on the sandbox's loopback, from
	// inside the sandbox (its agent dials it), whatever its network: how
	// the control plane reaches a server in it. Nothing listening there
	// is an *AgentError with CodeConnRefused. ctx governs the connection
	// until it is closed, which must be done.
	ConnectPort(ctx context.Context, id string, port int) (PortConn, error)
	// SetEgress replaces the egress rules of an outbound sandbox (nil:
	// none, every public destination). New connections follow them at
	// once; open ones they deny are cut. Rules that do not parse are an
	// *apierr.Error bad_request, a sandbox without network (none) one of
	// conflict; either changes nothing.
	SetEgress(ctx context.Context, id string, e *Egress) error

	// Stats samples a sandbox's host CPU use (stats.go): what the control
	// plane's CPU-abuse rule measures it by. A paused sandbox is an
	// *apierr.Error sandbox_not_running.
	Stats(ctx context.Context, id string) (SandboxStats, error)
	// Throttle changes the CPU quota of a running sandbox's host cgroup to
	// cpu cores, in (0, its shape's CPU]: the CPU-abuse rule halves a
	// long-running sandbox's. Another value is an *apierr.Error
	// bad_request. A resume restores the shape's quota.
	Throttle(ctx context.Context, id string, cpu float64) error

	// Snapshot snapshots a running sandbox into a snapshot the node keeps
	// (docs/design/snapshots.md): its files and, with SnapshotInfo.Memory,
	// its memory and processes. The sandbox goes on; calls in flight in it
	// fail with an *apierr.Error conflict, calls made meanwhile wait. A
	// runtime that cannot is an *apierr.Error bad_request; a paused
	// sandbox one of sandbox_not_running.
	Snapshot(ctx context.Context, id string) (SnapshotInfo, error)
	// DeleteSnapshot removes a snapshot of the node's. An unknown id is
	// not an error; sandboxes restored from it do not need it.
	DeleteSnapshot(ctx context.Context, snapshotID string) error
	// Pause checkpoints a running sandbox and stops it: it holds no host
	// processes, memory or capacity until Resume, and calls to it are
	// *apierr.Error sandbox_not_running meanwhile (Wait goes on waiting).
	// A sandbox whose pause failed midway is destroyed.
	Pause(ctx context.Context, id string) error
	// Resume restores a paused sandbox under its id once host capacity is
	// reserved (queueing up to wait, as Create). When the restore fails it
	// stays paused; when its agent does not answer after it, it ends.
	Resume(ctx context.Context, id string, wait time.Duration) error
}

// SnapshotInfo describes a snapshot a node holds.
type SnapshotInfo struct {
	ID string
	// Source is the sandbox it was taken of; Spec is the source's (a
	// sandbox restored from it has its template, runtime and shape).
	Source         string
	Spec           Spec
	RuntimeVersion string
	// Memory is set when it holds memory and processes, not only files.
	Memory    bool
	SizeBytes int64
	CreatedAt time.Time
}

// DirWatch is a watch of a directory (Node.WatchDir). Next returns the
// next change, io.EOF once the directory itself is gone, an *AgentError
// too_large when the changes came faster than they were read (the kernel's
// queue overflowed) or the tree has more than MaxWatchDirs directories.
type DirWatch interface {
	Next() (WatchEvent, error)
	Close() error
}

// WatchEvent is one change under a watched directory. It has
// agentproto.WatchEvent's fields (convertible).
type WatchEvent struct {
	// Type is create, write, remove, rename or chmod.
	Type string
	// Name is the path that changed, relative to the watched directory.
	Name string
}

// MaxWatchDirs is the most directories one recursive watch follows.
const MaxWatchDirs = 4096

// PortConn is a connection to a port of a sandbox (Node.ConnectPort): its
// reads are what the server in the sandbox sends, its writes go to it.
// CloseWrite half-closes it (the server reads EOF; its answer still
// comes); Close aborts what is left.
type PortConn interface {
	io.ReadWriteCloser
	CloseWrite() error
}

// Templates by digest: a node that lacks a create's template fetches it
// from the control plane, GET TemplatePath(digest) with "authorization:
// Bearer <node token>", which answers the template's export stream (its
// metadata and root filesystem as one tar; internal/template's Export) with
// its content digest in HeaderContentDigest. The node keeps it only when
// the stream hashes to CreateRequest.ContentDigest.
const HeaderContentDigest = "Evalbox-Content-Digest"

// TemplatePath is the control plane's path of the export stream of the
// template of digest.
func TemplatePath(digest string) string { return "/v1/internal/templates/" + url.PathEscape(digest) }

// Network modes of a Shape.
const (
	NetworkNone     = "none"
	NetworkOutbound = "outbound"
)

// Shape is the resources of a sandbox.
type Shape struct {
	CPU      float64
	MemoryMB int
	DiskMB   int
	Pids     int
	Network  string
}

// Spec says which sandboxes are interchangeable: a warm pool holds
// sandboxes of one Spec, and a create is served from the pool of its Spec.
type Spec struct {
	// Template is the template's digest ("sha256:…"): the node finds the
	// template's files and defaults by it, never by a name.
	Template string
	Runtime  string
	Shape    Shape
}

func (s Spec) String() string {
	return fmt.Sprintf("%s/%s/cpu=%g,mem=%d,disk=%d,pids=%d,net=%s", s.Template, s.Runtime,
		s.Shape.CPU, s.Shape.MemoryMB, s.Shape.DiskMB, s.Shape.Pids, s.Shape.Network)
}

// CreateRequest asks for a new sandbox.
type CreateRequest struct {
	Spec Spec
	// Wait is how long a start may queue for host capacity (0: not at
	// all; < 0: until ctx ends).
	Wait time.Duration
	// ContentDigest is the sha256 of the template's export stream
	// ("sha256:…", template.Registry.ContentDigest): a node that lacks
	// Spec.Template fetches it from the control plane and keeps it only
	// when the stream hashes to this. Empty: a node that lacks the
	// template does not fetch it (ErrTemplateMissing).
	ContentDigest string
	// Env is the sandbox's environment, which the node keeps with it: every
	// exec and process gets it, under the request's own Env and over the
	// template's; with Snapshot, over the environment of the snapshot's
	// source, which the snapshot keeps. The node holds it (not the control
	// plane) so that any API replica serves the sandbox alike. Never
	// logged.
	Env map[string]string
	// Secrets are environment variables with secret values: every exec
	// and process gets them over Env (under its own env). The node keeps
	// them in memory only: a snapshot keeps Env but not Secrets, and no
	// file of the node's holds them (the memory images of a paused sandbox
	// or a memory snapshot hold its processes' memory, environments
	// included). Never logged.
	Secrets map[string]string
	// Egress, when not nil, limits an outbound sandbox's traffic to these
	// rules (mode rules): applied when it is claimed, as Env is.
	Egress *Egress
	// Snapshot, when set, is a snapshot of the node's that the sandbox is
	// restored from instead of booted (never from the warm pool); Spec,
	// unless zero, must be the snapshot's (ErrSnapshotNotFound: the node
	// has none of that id).
	Snapshot string
}

// Egress is a sandbox's egress rules as the API received them: entries of
// netrules (CIDRs, domains, *.domain wildcards), a deny winning over an
// allow. The node parses them again: it trusts no caller's parse.
type Egress struct {
	Allow, Deny []string
}

// SandboxInfo describes a sandbox a node runs.
type SandboxInfo struct {
	ID             string
	Runtime        string
	RuntimeVersion string
	// StartedAt is when it was started (for a pooled one, before its claim).
	StartedAt time.Time
	// FromPool is set when Create was served from the warm pool.
	FromPool bool
	// EgressApplied is set when the create's Egress rules are in force
	// (a node that predates them leaves it unset).
	EgressApplied bool
	// Node is the id of the node that runs it, set by a fleet's router
	// (a node leaves it empty: the control plane knows its own).
	Node string
}

// End is how a sandbox ended.
type End struct {
	// Reason says why, for logs: the agent went away, or it was destroyed.
	Reason string
	// OOMKills is how many of its processes the OOM killer had killed (0
	// when unknown): the code in it ran out of memory, rather than the
	// sandbox being killed from outside.
	OOMKills int64
}

// Process statuses of ExitInfo.Status.
const (
	StatusRunning  = "running"
	StatusExited   = "exited"    // ended by itself; ExitCode is its exit code
	StatusTimedOut = "timed_out" // killed (whole tree) when its timeout passed
	StatusKilled   = "killed"    // ended by a signal
	StatusError    = "error"     // could not be started
)

// MaxStdinBytes bounds the data of one WriteStdin.
const MaxStdinBytes = 1 << 20

// ExecRequest describes a process to run. It has agentproto.ExecRequest's
// fields, in its order, so that the in-process node converts it instead of
// copying it.
type ExecRequest struct {
	// Exactly one of Argv or Shell (run as /bin/sh -c Shell).
	Argv  []string
	Shell string
	// Cwd is the working directory ("": the template's workdir).
	Cwd string
	// Env is added to the sandbox's default environment.
	Env map[string]string
	// User is a name or numeric uid ("": the template's user).
	User string
	// Stdin is set by Exec from its stdin argument; for StartProcess it
	// keeps the process's stdin open for WriteStdin.
	Stdin bool
	// TimeoutMs kills the whole process tree when it passes (0: none).
	TimeoutMs int64
	// MaxOutputBytes caps stdout and stderr, each (0: the agent's default).
	MaxOutputBytes int64
	// KillOnOutputLimit kills the tree when a stream passes
	// MaxOutputBytes (ExitInfo.OutputLimitExceeded).
	KillOnOutputLimit bool
	// MemoryLimitBytes (0: none) kills the tree when its sampled resident
	// memory passes it (ExitInfo.MemoryLimitExceeded; see
	// agentproto.ExecRequest).
	MemoryLimitBytes int64
	// Tag is a caller label shown by ListProcesses.
	Tag string
}

// ExitInfo is how a process ended.
type ExitInfo struct {
	Status string
	// ExitCode is the exit code for StatusExited, -1 otherwise.
	ExitCode int
	// Signal ended the process (StatusKilled, and StatusTimedOut).
	Signal          int
	DurationMs      int64
	StdoutTruncated bool
	StderrTruncated bool
	// OutputLimitExceeded, MemoryLimitExceeded: killed for a limit of
	// the request; PeakMemoryBytes: the largest sample (with
	// MemoryLimitBytes).
	OutputLimitExceeded bool
	MemoryLimitExceeded bool
	PeakMemoryBytes     int64
	// Error explains StatusError.
	Error string
	// OOMKills is the sandbox's count of OOM kills when the call ended (0
	// when unknown): a caller that saw it rise says why a process died.
	OOMKills int64
}

// ProcInfo describes a process of a sandbox.
type ProcInfo struct {
	ID        string
	Pid       int
	Argv      []string
	Tag       string
	StartedAt time.Time
	Running   bool
	// Exit is how it ended, once it has.
	Exit *ExitInfo
}

// FileInfo describes a path inside a sandbox. It has agentproto.FileInfo's
// fields, so that the in-process node converts it.
type FileInfo struct {
	Name string
	Path string
	// Type is "file", "dir", "symlink" or "other".
	Type string
	Size int64
	// Mode is the permission bits (0o7777).
	Mode    uint32
	ModTime time.Time
	// Target of a symlink.
	Target string
}

// WriteOptions tune WriteFile.
type WriteOptions struct {
	// Mode is the file's permission bits (0: those of the file it
	// replaces, or 0644).
	Mode uint32
	// Parents creates missing parent directories.
	Parents bool
	// MaxBytes refuses (an AgentError with CodeTooLarge) a longer upload
	// (0: no limit).
	MaxBytes int64
	// User owns the file and created parents ("": the template's user).
	User string
}

// MkdirOptions tune Mkdir.
type MkdirOptions struct {
	// Mode is the directory's permission bits (0: 0755).
	Mode    uint32
	Parents bool
	// User owns what is created ("": the template's user).
	User string
}

// PoolSpec sets a warm pool.
type PoolSpec struct {
	Spec Spec
	// TemplateName is shown in PoolStatus (operators name templates, the
	// Spec holds a digest).
	TemplateName string
	// Target is how many ready sandboxes to keep (0 stops refilling).
	Target int
}

// PoolStatus is the state of one warm pool.
type PoolStatus struct {
	Spec         Spec
	TemplateName string
	Target       int
	Ready        int
}

// Resources is an amount of host capacity.
type Resources struct {
	Pids        int64
	MemoryBytes int64
}

// CapacityStatus is a node's host capacity now.
type CapacityStatus struct {
	Budget, Reserved Resources
	// MemoryAvailable is the host's MemAvailable (bytes; -1: unknown), and
	// MemoryReserve the floor below which no sandbox starts.
	MemoryAvailable, MemoryReserve int64
	// Sandboxes is how many reservations are held; Waiting how many
	// requests queue for one.
	Sandboxes, Waiting int
}

// Free is what is left of the budget.
func (s CapacityStatus) Free() Resources {
	return Resources{Pids: max(0, s.Budget.Pids-s.Reserved.Pids), MemoryBytes: max(0, s.Budget.MemoryBytes-s.Reserved.MemoryBytes)}
}
