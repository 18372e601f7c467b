// Package runtime defines the small interface every sandbox runtime driver
// implements (gvisor, namespaces; later microvm). A driver turns a Spec into
// a running, isolated sandbox whose first process is the guest agent, and
// hands back a byte stream to that agent. It knows nothing of teams, the API
// or the agent protocol.
package runtime

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/evalbox/evalbox/internal/netrules"
)

// Network modes.
const (
	NetworkNone     = "none"     // loopback only
	NetworkOutbound = "outbound" // NAT'd egress, no inbound
)

// Spec is what a driver needs to start one sandbox.
type Spec struct {
	// ID is unique among live sandboxes on this host: [a-z0-9-], ≤ 48 chars.
	// Drivers use it to name their state (cgroups, runsc container ids, …)
	// so that leftovers can be found and removed by id.
	ID string
	// RootFS is the template's root filesystem directory. Drivers must
	// never modify it: every sandbox gets a copy-on-write layer on top.
	RootFS string
	// AgentPath is the host path of the static evalbox-agent binary. The
	// driver starts it as the sandbox's first process with AgentArgs (gVisor
	// makes it visible read-only at AgentGuestPath; namespaces runs it from
	// a sealed in-memory copy, at no path in the sandbox). A driver that can
	// give the agent a cgroup per process to kill trees with says where in
	// the agent's environment (agentproto.CgroupEnv).
	AgentPath string
	AgentArgs []string
	// Env is the environment of the agent (and so the default of every
	// process it starts), as KEY=VALUE.
	Env []string
	// StateDir is a per-sandbox host directory the driver may use. It is
	// created by the caller and removed after Destroy.
	StateDir string

	// Limits. CPU in cores (e.g. 0.5, 2), memory and disk in MiB, Pids as
	// the maximum number of tasks.
	CPU      float64
	MemoryMB int
	DiskMB   int
	Pids     int

	Network  string
	Hostname string
	// Egress, for an outbound sandbox, limits its egress to these rules
	// from before its first instruction runs (a sandbox restored from a
	// checkpoint runs its processes at once: rules set after Start or
	// Restore would come too late). Nil: none. Drivers that implement
	// EgressFilter honour it.
	Egress *netrules.Rules
}

// AgentGuestPath is the agent's argv[0] in every sandbox, and where the
// gVisor driver mounts it.
const AgentGuestPath = "/.evalbox/agent"

// Sandbox is one running sandbox.
type Sandbox interface {
	// Conn is the byte stream to the guest agent (its stdin/stdout).
	Conn() io.ReadWriteCloser
	// Destroy kills every process of the sandbox and removes everything
	// the driver created for it (processes, mounts, cgroups, network
	// namespaces, state). It is idempotent and safe to call concurrently.
	Destroy(ctx context.Context) error
	// Usage reports the host resources the sandbox uses now.
	Usage(ctx context.Context) (Usage, error)
	// OOMKills reports how many of the sandbox's processes the kernel's
	// OOM killer has killed (gVisor: the Sentry itself, which ends the
	// sandbox). It is cheap: a file read.
	OOMKills() (int64, error)
}

// UpperExporter is implemented by sandboxes that can export their
// copy-on-write layer: what the sandbox changed in its root filesystem, as
// a tar archive in overlayfs format (a deleted file is a 0/0 character
// device, a directory that replaced a lower one carries the xattr
// trusted.overlay.opaque=y in a PAX record), owners as the sandbox sees
// them. Template builds capture each run step with it (gVisor), and a
// snapshot of a sandbox whose runtime cannot checkpoint is its archive
// (namespaces). Both drivers implement it.
type UpperExporter interface {
	// ExportUpper writes the archive to the file path (created or
	// truncated).
	ExportUpper(ctx context.Context, path string) error
}

// ErrUpperTooLarge is the error of an export whose files are larger than
// the sandbox's disk can hold (a sparse file, say).
var ErrUpperTooLarge = errors.New("the sandbox's files are larger than its disk (sparse files?)")

// UpperImporter is implemented by runtimes that can start a sandbox whose
// copy-on-write layer begins with an archive their sandboxes exported
// (UpperExporter): a sandbox made from a snapshot of files (namespaces).
type UpperImporter interface {
	// StartWithUpper is Start, with the files of the archive at the path
	// upperTar in the sandbox's layer before its agent runs.
	StartWithUpper(ctx context.Context, spec Spec, upperTar string) (Sandbox, error)
}

// Checkpointer is implemented by sandboxes whose memory and processes can
// be saved (gVisor): a snapshot, or a pause. The agent's session must be
// suspended first (agentproto.Client.Suspend), so that no call is in
// flight in the image.
type Checkpointer interface {
	// Checkpoint saves the sandbox into the directory dir (made by the
	// caller, empty). With leaveRunning the sandbox goes on after it;
	// without, it stops (Destroy still removes what is left of it).
	Checkpoint(ctx context.Context, dir string, leaveRunning bool) error
}

// Restorer is implemented by runtimes that can start a sandbox from a
// checkpoint (Checkpointer) of one of theirs.
type Restorer interface {
	// Restore starts a sandbox of spec from the checkpoint in dir: spec
	// has the checkpointed sandbox's RootFS, AgentPath and Network, and
	// an ID of its own. The restored agent's session is suspended: the
	// caller resumes it over Conn (agentproto.Redial). On error nothing
	// of the sandbox is left behind.
	Restore(ctx context.Context, spec Spec, dir string) (Sandbox, error)
}

// EgressFilter is implemented by sandboxes with outbound networking: their
// egress can be limited to rules (network mode "rules"), and changed while
// they run.
type EgressFilter interface {
	// SetEgress limits the sandbox's egress to r, or lifts the limit (nil).
	// New connections follow the new rules at once; open ones r denies are
	// cut. On error the previous rules stay.
	SetEgress(ctx context.Context, r *netrules.Rules) error
}

// CPUController is implemented by sandboxes whose host cgroup's CPU time
// can be read and whose CPU quota can be changed while they run (both
// drivers; gVisor's Sentry, gofer and systrap stubs run in that cgroup):
// the measure of the CPU-abuse rule, and its throttle of long-running
// sandboxes.
type CPUController interface {
	// CPUUsage is the CPU time the sandbox's host processes have used
	// since it started (cumulative).
	CPUUsage() (time.Duration, error)
	// CPULimit is the CPU quota in force, in cores (0: none).
	CPULimit() (float64, error)
	// SetCPULimit changes the CPU quota to cpu cores (> 0).
	SetCPULimit(cpu float64) error
}

// Resources is an amount of the host resources a sandbox can pin: the
// limits of its host cgroups. Zero means unlimited.
type Resources struct {
	// Pids is the most host tasks (processes and threads) it can hold.
	Pids int64
	// MemoryBytes is the most memory the host can charge to it.
	MemoryBytes int64
}

// Usage is a sandbox's host resource use.
type Usage struct {
	// MemoryBytes is the memory charged to the sandbox's cgroup.
	MemoryBytes int64
	// RSSBytes is the resident set size of its host processes (runsc
	// sandbox + gofer, or the namespaced tree).
	RSSBytes int64
}

// Runtime is a sandbox driver.
type Runtime interface {
	// Name is the runtime's API name ("gvisor", "namespaces").
	Name() string
	// Version identifies the driver build (e.g. the runsc version), recorded
	// with every sandbox so a result says what it ran on.
	Version() string
	// HostCost is the most a sandbox of spec can take of the host: the pids
	// and memory limits of its host cgroups, which must cover everything
	// the driver starts for it (gVisor: the Sentry and gofer too). The
	// node admits sandboxes against the host's capacity with it.
	HostCost(spec Spec) Resources
	// Start starts a sandbox and returns once its agent process runs. On
	// error nothing of the sandbox is left behind.
	Start(ctx context.Context, spec Spec) (Sandbox, error)
	// Sweep removes every sandbox of this driver that is still present on
	// the host (after a crash or restart) and whose id keep rejects. It
	// returns the ids it removed.
	Sweep(ctx context.Context, keep func(id string) bool) ([]string, error)
	// Leftovers lists what the driver still holds on the host for id
	// (processes, mounts, cgroups, namespaces, files): empty after Destroy.
	// Tests use it to assert that nothing leaks.
	Leftovers(id string) []string
}
