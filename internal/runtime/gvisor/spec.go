package gvisor

import (
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/internal/runtime"
)

// cpuPeriod is the CFS period used to express fractional cores.
const cpuPeriod = 100_000

// sentryOverheadMB is added to the memory cgroup limit for the Sentry and
// gofer themselves, on top of what the sandbox may use for its processes and
// its in-memory overlay (the disk).
// One constant with the fleet's placement: nodeapi.HostCost.
const sentryOverheadMB = nodeapi.GVisorSentryMemoryMB

// oomScoreAdj is the OOM score adjustment of sandbox processes.
var oomScoreAdj = 800

// agentCgroupEnv tells the agent where its cgroup is; it must equal
// agentproto.CgroupEnv (a test holds them equal).
const agentCgroupEnv = "EVALBOX_AGENT_CGROUP"

// capabilities granted to the agent (root inside the sandbox). They are
// capabilities of the gVisor kernel, not of the host. The agent keeps
// CAP_SYS_RESOURCE for itself (agent.AgentOnlyCaps): it exempts the agent
// from RLIMIT_NPROC, which a fork bomb run as root would otherwise exhaust
// for the agent's threads too; CAP_SETPCAP lets it take that capability out
// of its bounding set, so that no command gains it.
var capabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_RESOURCE",
}

// ociSpec builds the OCI runtime spec runsc starts the sandbox from. With
// nw (outbound) runsc joins its network namespace, and its resolv.conf is
// mounted read-only at /etc/resolv.conf.
func ociSpec(s runtime.Spec, cgroupParent string, nw *sandboxNet) *specs.Spec {
	args := append([]string{runtime.AgentGuestPath}, s.AgentArgs...)
	memLimit := memoryLimit(s)
	swap := memLimit
	pids := int64(s.Pids)
	shares := uint64(1024)
	sp := &specs.Spec{
		Version:  specs.Version,
		Hostname: s.Hostname,
		Root:     &specs.Root{Path: s.RootFS, Readonly: false},
		Process: &specs.Process{
			// When the host runs out of memory, sandboxes go before the
			// control plane.
			OOMScoreAdj: &oomScoreAdj,
			Args:        args,
			Env:         append(s.Env[:len(s.Env):len(s.Env)], agentCgroupEnv+"=path:/sys/fs/cgroup"),
			Cwd:         "/",
			User:        specs.User{UID: 0, GID: 0},
			Capabilities: &specs.LinuxCapabilities{
				Bounding: capabilities, Effective: capabilities, Permitted: capabilities,
			},
			Rlimits: rlimits(s.Pids),
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: runtime.AgentGuestPath, Type: "bind", Source: s.AgentPath, Options: []string{"rbind", "ro"}},
			// gVisor's own cgroup2 filesystem (--in-sandbox-cgroup=v2):
			// the agent makes a cgroup per process below its own, and
			// kills a tree through it. Only root inside may write there.
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: "/" + cgroupParent + "/" + s.ID,
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
			},
			Resources: &specs.LinuxResources{
				Memory: &specs.LinuxMemory{Limit: &memLimit, Swap: &swap},
				CPU:    &specs.LinuxCPU{Shares: &shares},
			},
		},
	}
	if nw != nil {
		for i := range sp.Linux.Namespaces {
			if sp.Linux.Namespaces[i].Type == specs.NetworkNamespace {
				sp.Linux.Namespaces[i].Path = nw.path
			}
		}
		sp.Mounts = append(sp.Mounts, specs.Mount{Destination: "/etc/resolv.conf", Type: "bind", Source: nw.resolvConf, Options: []string{"rbind", "ro"}})
	}
	if s.Pids > 0 {
		sp.Linux.Resources.Pids = &specs.LinuxPids{Limit: hostPids(pids)}
	}
	if s.CPU > 0 {
		quota := int64(s.CPU * cpuPeriod)
		period := uint64(cpuPeriod)
		sp.Linux.Resources.CPU.Quota = &quota
		sp.Linux.Resources.CPU.Period = &period
	}
	return sp
}

// rlimits are the sandbox's resource limits inside gVisor. The Sentry
// enforces RLIMIT_NPROC (also for root), and it is where a fork bomb must
// meet its limit: fork then fails with EAGAIN inside the sandbox, as on
// Linux, and the sandbox lives on. Each guest task costs the host more
// than one task (systrap's stub processes and threads: a Python fork bomb
// of 512 guest tasks took more than 1,280 host tasks), so the guest gets a
// quarter of the sandbox's Pids, and the host limit (hostPids) is Pids plus
// room for the Sentry's threads: were the host limit met first, it would
// kill the Sentry and lose the sandbox.
func rlimits(pids int) []specs.POSIXRlimit {
	rl := []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 65536, Soft: 65536}}
	if n := uint64(guestTasks(pids)); n > 0 {
		rl = append(rl, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: n, Soft: n})
	}
	return rl
}

// guestTasks is the RLIMIT_NPROC (tasks per user: processes and threads)
// of a sandbox whose Pids is pids.
func guestTasks(pids int) int {
	return pids / 4
}

// sentryTasks is the host tasks a Sentry and gofer need besides those of
// the guest's tasks (their own threads).
// One constant with the fleet's placement: nodeapi.HostCost.
const sentryTasks = nodeapi.GVisorSentryTasks

// memoryLimit is the memory cgroup limit of a sandbox: its processes, its
// disk (the in-memory overlay) and the Sentry and gofer themselves.
func memoryLimit(s runtime.Spec) int64 {
	return int64(s.MemoryMB+s.DiskMB+sentryOverheadMB) << 20
}

// hostCost is what a sandbox of s can take of the host: the limits ociSpec
// gives its cgroup (a test holds them equal).
func hostCost(s runtime.Spec) runtime.Resources {
	c := runtime.Resources{MemoryBytes: memoryLimit(s)}
	if s.Pids > 0 {
		c.Pids = hostPids(int64(s.Pids))
	}
	return c
}

// hostPids is the host pids limit of a sandbox: its Pids and the Sentry's
// own. It bounds what a sandbox can take of the host's pid space (pid_max
// is often 32768), so a runaway Sentry cannot starve the host.
func hostPids(pids int64) int64 {
	return pids + sentryTasks
}
