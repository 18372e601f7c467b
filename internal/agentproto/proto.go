// Package agentproto is the one definition of the protocol between the host
// (node) and the guest agent that runs inside every sandbox.
//
// # Transport
//
// The protocol runs over any reliable byte stream (an io.ReadWriteCloser):
// the agent's stdin/stdout pipes, a unix socket, later vsock. The stream is
// multiplexed with yamux (github.com/hashicorp/yamux): the host is the yamux
// client, the agent the yamux server. Every call opens its own yamux stream,
// so a slow download never blocks an exec, and each stream has its own flow
// control.
//
// # Frames
//
// Inside a stream both sides exchange frames:
//
//	+--------+----------------------+-----------------+
//	| kind   | length (uint32, BE)  | payload         |
//	| 1 byte | 4 bytes              | length bytes    |
//	+--------+----------------------+-----------------+
//
// The host's first frame is always KindRequest with a JSON Request. The
// agent's last frame is always KindResponse with a JSON Response (whose Error
// is set when the call failed). Between them, depending on Request.Op:
//
//	OpExec     host→agent: KindStdin*, KindStdinClose, KindSignal (JSON SignalRequest)
//	           agent→host: KindStdout*, KindStderr*, then KindResponse{Exit}
//	           Closing the stream before the response kills the process tree.
//	OpStart    agent→host: KindResponse{Proc} (background process; output is
//	           kept by the agent up to the output cap)
//	OpAttach   agent→host: replays buffered output then follows it as
//	           KindStdout/KindStderr, then KindResponse{Exit} when it ends.
//	           Closing the stream detaches (the process keeps running).
//	OpWait     agent→host: KindResponse{Exit} when the process ends.
//	OpStdin    host→agent: KindStdin*, KindStdinClose, then KindEnd, for a
//	           background process started with Exec.Stdin; agent→host:
//	           KindResponse{} after the host's end (or an Error at the
//	           first write that fails: the process ended, closed its
//	           stdin, or did not read it in time).
//	OpSignal   KindResponse{} after the signal is delivered to the process group.
//	OpList     KindResponse{Procs}
//	OpWriteFile host→agent: KindData* then KindEnd; agent→host: KindResponse{File}
//	           (the agent may answer early with an Error, e.g. too large:
//	           the host then stops sending). Closing the stream before
//	           KindEnd aborts the upload; nothing is left behind.
//	OpReadFile agent→host: KindResponse{File} (stat, before any data; Error
//	           if the file cannot be opened), then KindData*, then KindEnd
//	           (or a second KindResponse with Error if reading fails midway).
//	           Closing the stream before KindEnd stops the transfer.
//	OpConnect  agent→host: KindResponse{} once it connected to Request.Port
//	           on the sandbox's loopback (Error CodeConnRefused when nothing
//	           listens there), then both ways KindData* and, when that side
//	           has no more to send, KindEnd (a half-close: the other way goes
//	           on). The agent ends with KindResponse{Error} if the
//	           connection fails midway, and closes the stream once both
//	           sides ended. Closing the stream before that aborts the
//	           connection (the agent closes it).
//	OpWatch    agent→host: KindResponse{} once Request.Path (a directory;
//	           its subdirectories too with Recursive) is watched, then one
//	           KindData frame per change (a JSON WatchEvent), and KindEnd if
//	           the directory itself goes (after its event), or
//	           KindResponse{Error} if the watch fails (CodeTooLarge: the
//	           kernel's queue overflowed, or too many directories). Closing
//	           the stream ends the watch.
//	OpSuspend  no response on the stream: the agent ends the session
//	           (its foreground execs are killed, other streams cut;
//	           background processes go on) and hands the connection over
//	           to the next one, answering with its marker (see Handover).
//	OpStat, OpListDir, OpMkdir, OpRemove, OpRename, OpPing: KindResponse only.
//
// A frame payload is at most MaxFrame bytes.
//
// # Start-up
//
// The runtime starts the agent with its flags (cmd/evalbox-agent) and, when
// it gives the agent a cgroup2 directory of its own to make a cgroup per
// process in, the environment variable CgroupEnv: "fd:N" (an inherited
// directory descriptor; namespaces) or "path:DIR" (a cgroup2 mount, in
// which the agent's own cgroup is found through /proc/self/cgroup; gVisor).
// The agent removes it from the environment its processes get.
package agentproto

import "time"

// CgroupEnv names the agent's delegated cgroup (see Start-up).
const CgroupEnv = "EVALBOX_AGENT_CGROUP"

// Frame kinds.
const (
	KindRequest    byte = 'R'
	KindResponse   byte = 'X'
	KindStdin      byte = 'I'
	KindStdinClose byte = 'C'
	KindStdout     byte = 'O'
	KindStderr     byte = 'E'
	KindSignal     byte = 'S'
	KindData       byte = 'D'
	KindEnd        byte = 'Z'
)

// MaxFrame is the largest frame payload either side sends or accepts.
const MaxFrame = 1 << 20

// Operations.
const (
	OpPing      = "ping"
	OpExec      = "exec"
	OpStart     = "start"
	OpAttach    = "attach"
	OpWait      = "wait"
	OpStdin     = "stdin"
	OpSignal    = "signal"
	OpList      = "list"
	OpWriteFile = "write_file"
	OpReadFile  = "read_file"
	OpStat      = "stat"
	OpListDir   = "list_dir"
	OpMkdir     = "mkdir"
	OpRemove    = "remove"
	OpRename    = "rename"
	OpConnect   = "connect"
	OpWatch     = "watch"
	OpSuspend   = "suspend"
)

// Watch event types (WatchEvent.Type).
const (
	EventCreate = "create" // created, or moved in
	EventWrite  = "write"
	EventRemove = "remove"
	EventRename = "rename" // moved away (its new name, if watched, is a create)
	EventChmod  = "chmod"  // permissions, owner or times
)

// MaxWatchDirs is the most directories one recursive watch follows.
const MaxWatchDirs = 4096

// WatchEvent is one change OpWatch reports.
type WatchEvent struct {
	Type string `json:"type"`
	// Name is the path that changed, relative to the watched directory.
	Name string `json:"name"`
}

// Process statuses, as reported in ExitInfo.Status.
const (
	StatusRunning  = "running"
	StatusExited   = "exited"    // ended by itself; ExitCode is its exit code
	StatusTimedOut = "timed_out" // killed (whole tree) when its timeout passed
	StatusKilled   = "killed"    // ended by a signal (sent by a user or the kernel, e.g. OOM)
	StatusError    = "error"     // could not be started (no such file, bad user, ...)
)

// Error codes the agent returns in Response.Error.Code.
const (
	CodeBadRequest = "bad_request" // malformed request or path
	CodeNotFound   = "not_found"   // no such file / process
	CodeExists     = "conflict"    // path exists (mkdir without parents over a file, ...)
	CodePermission = "permission_denied"
	CodeIsDir      = "is_directory"
	CodeNotDir     = "not_directory"
	CodeNoSpace    = "no_space"  // ENOSPC / EDQUOT while writing
	CodeTooLarge   = "too_large" // upload longer than Request.MaxBytes
	// CodeConnRefused: OpConnect found nothing listening on the port.
	CodeConnRefused = "connection_refused"
	CodeInternal    = "internal"
)

// Request is the first frame of every stream.
type Request struct {
	Op string `json:"op"`

	// OpExec, OpStart.
	Exec *ExecRequest `json:"exec,omitempty"`

	// OpAttach, OpWait, OpSignal, OpStdin: the process id returned by
	// OpStart.
	ProcID string `json:"proc_id,omitempty"`
	// OpSignal: signal number (e.g. 15, 9).
	Signal int `json:"signal,omitempty"`

	// File operations. Path must be absolute and clean of NUL bytes; it is
	// cleaned (path.Clean) by the agent before use.
	Path string `json:"path,omitempty"`
	// OpRename: the new path (absolute, as Path), which it replaces if it
	// is a file or an empty directory.
	Target string `json:"target,omitempty"`
	// OpWriteFile, OpMkdir: permission bits, as chmod takes them (0o7777);
	// 0 = 0644 for new files (a replaced file keeps its bits), 0755 for dirs.
	// FileInfo.Mode reports the same bits.
	Mode uint32 `json:"mode,omitempty"`
	// OpMkdir: create parents; OpRemove: remove a directory tree;
	// OpWriteFile: create missing parent directories; OpWatch: watch the
	// subdirectories too (those created later included).
	Recursive bool `json:"recursive,omitempty"`
	// OpWriteFile: refuse (CodeTooLarge) when more than this many bytes
	// arrive; 0 = no limit.
	MaxBytes int64 `json:"max_bytes,omitempty"`
	// OpWriteFile, OpMkdir: owner of the created file and parents ("" =
	// the sandbox default user).
	User string `json:"user,omitempty"`
	// OpConnect: the TCP port on the sandbox's loopback (1 to 65535).
	Port int `json:"port,omitempty"`
	// OpSuspend: the handover's nonce (NonceSize bytes; see Handover).
	Nonce []byte `json:"nonce,omitempty"`
}

// ExecRequest describes a process to run.
type ExecRequest struct {
	// Exactly one of Argv or Shell. Shell runs as /bin/sh -c Shell.
	Argv  []string `json:"argv,omitempty"`
	Shell string   `json:"shell,omitempty"`
	// Working directory ("" = the sandbox default workdir; a relative one
	// is taken relative to it).
	Cwd string `json:"cwd,omitempty"`
	// Extra environment on top of the sandbox's default environment.
	Env map[string]string `json:"env,omitempty"`
	// User name or numeric uid ("" = the sandbox default user).
	User string `json:"user,omitempty"`
	// Stdin: the process's stdin is a pipe: OpExec's KindStdin frames,
	// or (OpStart) OpStdin's. Without it the process reads /dev/null.
	Stdin bool `json:"stdin,omitempty"`
	// Timeout in milliseconds; 0 = none. At the timeout the whole process
	// tree (including double-forked daemons started by it) is killed and the
	// status is StatusTimedOut, with the output produced so far.
	TimeoutMs int64 `json:"timeout_ms,omitempty"`
	// Per-stream output cap in bytes (stdout and stderr each); output past it
	// is dropped (still drained) and the Truncated flag set. 0 = agent default.
	MaxOutputBytes int64 `json:"max_output_bytes,omitempty"`
	// KillOnOutputLimit kills the process tree as soon as either stream
	// passes MaxOutputBytes (ExitInfo.OutputLimitExceeded) instead of
	// draining the rest: a judge's output limit.
	KillOnOutputLimit bool `json:"kill_on_output_limit,omitempty"`
	// MemoryLimitBytes (0: none) bounds the resident memory of the
	// process tree: the agent samples it (every MemoryPollInterval; the
	// members of the process's cgroup, or the process alone without one)
	// and kills the tree when it passes the limit
	// (ExitInfo.MemoryLimitExceeded). A sampled bound: a tree that grows
	// fast may pass it by what it allocates in one interval, and memory
	// that is not resident in a process (tmpfs files) is not counted; the
	// sandbox's own memory limit stays the hard bound.
	MemoryLimitBytes int64 `json:"memory_limit_bytes,omitempty"`
	// Tag is an optional caller label shown in OpList.
	Tag string `json:"tag,omitempty"`
}

// MemoryPollInterval is how often the agent samples the memory of a
// process tree with ExecRequest.MemoryLimitBytes.
const MemoryPollInterval = 5 * time.Millisecond

// SignalRequest is the payload of a KindSignal frame during OpExec.
type SignalRequest struct {
	Signal int `json:"signal"`
}

// ExitInfo is how a process ended.
type ExitInfo struct {
	Status string `json:"status"`
	// ExitCode is the exit code for StatusExited, -1 otherwise.
	ExitCode int `json:"exit_code"`
	// Signal is the signal that ended the process (StatusKilled, and
	// StatusTimedOut when the kill ended it).
	Signal          int   `json:"signal,omitempty"`
	DurationMs      int64 `json:"duration_ms"`
	StdoutTruncated bool  `json:"stdout_truncated,omitempty"`
	StderrTruncated bool  `json:"stderr_truncated,omitempty"`
	// OutputLimitExceeded: the tree was killed for passing the output
	// cap (ExecRequest.KillOnOutputLimit); MemoryLimitExceeded: for
	// passing ExecRequest.MemoryLimitBytes. Status is then StatusKilled.
	OutputLimitExceeded bool `json:"output_limit_exceeded,omitempty"`
	MemoryLimitExceeded bool `json:"memory_limit_exceeded,omitempty"`
	// PeakMemoryBytes is the largest resident memory the samples saw
	// (only with ExecRequest.MemoryLimitBytes).
	PeakMemoryBytes int64 `json:"peak_memory_bytes,omitempty"`
	// Error explains StatusError (e.g. "exec: \"nope\": executable file not found").
	Error string `json:"error,omitempty"`
}

// ProcInfo describes a process known to the agent (background or foreground).
type ProcInfo struct {
	ID        string    `json:"id"`
	Pid       int       `json:"pid"`
	Argv      []string  `json:"argv"`
	Tag       string    `json:"tag,omitempty"`
	StartedAt time.Time `json:"started_at"`
	Running   bool      `json:"running"`
	Exit      *ExitInfo `json:"exit,omitempty"`
}

// FileInfo describes a path inside the sandbox.
type FileInfo struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"`
	Type    string    `json:"type"` // "file", "dir", "symlink", "other"
	Size    int64     `json:"size"`
	Mode    uint32    `json:"mode"` // permission bits (0o7777)
	ModTime time.Time `json:"mod_time"`
	// Target of a symlink.
	Target string `json:"target,omitempty"`
}

// Error is a failed call.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Response is the last frame of every stream (for OpReadFile, also the first
// one from the agent, followed by data).
type Response struct {
	Error *Error     `json:"error,omitempty"`
	Exit  *ExitInfo  `json:"exit,omitempty"`
	Proc  *ProcInfo  `json:"proc,omitempty"`
	Procs []ProcInfo `json:"procs,omitempty"`
	File  *FileInfo  `json:"file,omitempty"`
	Files []FileInfo `json:"files,omitempty"`
	// Bytes written by OpWriteFile.
	Written int64 `json:"written,omitempty"`
}
