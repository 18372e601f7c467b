package nodeapi

// The host cost of a sandbox: the limits of its host cgroups, which a node
// admits against its capacity (node.Capacity) and a fleet's placement
// subtracts from a node's free capacity before the node answers. The runtime
// drivers compute their cgroup limits from these constants, so that what
// placement expects and what a node reserves are one formula (the gVisor
// driver's test holds its cgroup limits equal to HostCost).
const (
	// GVisorSentryTasks is the host tasks a gVisor Sentry and gofer need
	// besides those of the guest's tasks (their own threads).
	GVisorSentryTasks = 256
	// GVisorSentryMemoryMB is added to a gVisor sandbox's memory cgroup
	// limit for the Sentry and gofer themselves, on top of its processes'
	// memory and its in-memory overlay (the disk).
	GVisorSentryMemoryMB = 96
)

// Runtime names, as nodes report them in Runtimes.
const (
	RuntimeGVisor     = "gvisor"
	RuntimeNamespaces = "namespaces"
)

// HostCost is what a sandbox of shape takes of a node's host capacity on
// runtime: gVisor's cgroup holds the Sentry, the gofer and the in-memory
// overlay besides the guest's processes; a namespaces sandbox's cgroup
// holds its processes, its disk tmpfs counted inside its memory. An unknown
// runtime costs what a namespaces sandbox does.
func HostCost(runtime string, s Shape) Resources {
	if runtime == RuntimeGVisor {
		c := Resources{MemoryBytes: int64(s.MemoryMB+s.DiskMB+GVisorSentryMemoryMB) << 20}
		if s.Pids > 0 {
			c.Pids = int64(s.Pids) + GVisorSentryTasks
		}
		return c
	}
	return Resources{Pids: int64(s.Pids), MemoryBytes: int64(s.MemoryMB) << 20}
}
