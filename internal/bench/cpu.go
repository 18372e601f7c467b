package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/evalbox/evalbox/internal/instance"
)

// cpuacctRoot is the cgroup v1 cpuacct hierarchy.
const cpuacctRoot = "/sys/fs/cgroup/cpuacct"

// cpuMeter measures the CPU time of this process and its descendants (the
// unsandboxed harness's python processes, the server, namespaces
// sandboxes) through a cpuacct cgroup of its own, plus that of the
// server's gVisor sandboxes, which runsc moves into cpuacct cgroups under
// the server's gVisor cgroup parent. The kernel charges a cgroup's usage to
// its ancestors as it happens, so the parents keep the usage of sandboxes
// already deleted. Without cgroup v1 cpuacct (or without the rights to
// make a cgroup) it measures nothing and says so.
type cpuMeter struct {
	own     string   // our cgroup; "" when not available
	origin  string   // the cgroup we came from
	parents []string // the servers' gVisor cgroup parents
}

// newCPUMeter moves this process into a new cpuacct cgroup; every process
// it starts afterwards is counted.
func newCPUMeter() (*cpuMeter, error) {
	m := &cpuMeter{}
	if _, err := os.Stat(filepath.Join(cpuacctRoot, "cpuacct.usage")); err != nil {
		return m, nil
	}
	origin, err := selfCgroup("cpuacct")
	if err != nil {
		return m, nil
	}
	dir := filepath.Join(cpuacctRoot, fmt.Sprintf("evalbox-bench-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return m, fmt.Errorf("cpu meter: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
		_ = os.Remove(dir)
		return m, fmt.Errorf("cpu meter: %w", err)
	}
	m.own, m.origin = dir, filepath.Join(cpuacctRoot, origin)
	return m, nil
}

// watchServer adds the gVisor cgroup parent of the server on dataDir.
func (m *cpuMeter) watchServer(dataDir string) {
	m.parents = append(m.parents, filepath.Join(cpuacctRoot, instance.GVisorCgroupParent(instance.ID(dataDir))))
}

// usage returns the CPU time counted so far, and false when nothing is
// measured.
func (m *cpuMeter) usage() (time.Duration, bool) {
	if m.own == "" {
		return 0, false
	}
	return cgroupUsage(m.own) + m.gvisorUsage(), true
}

// gvisorUsage returns the CPU time of the servers' gVisor sandboxes (runsc
// sandbox and gofer processes) so far.
func (m *cpuMeter) gvisorUsage() time.Duration {
	var total time.Duration
	for _, dir := range m.parents {
		total += cgroupUsage(dir)
	}
	return total
}

// cgroupUsage returns a cpuacct cgroup's usage (0 for a cgroup not made
// yet: nothing ran there).
func cgroupUsage(dir string) time.Duration {
	b, err := os.ReadFile(filepath.Join(dir, "cpuacct.usage"))
	if err != nil {
		return 0
	}
	ns, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return time.Duration(ns)
}

// procCPU returns the CPU time of process pid itself (all its threads) and
// of its children it has waited for (e.g. the server's runsc commands).
func procCPU(pid int) (self, children time.Duration) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0
	}
	// Fields after the command name (which may hold spaces) in parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return 0, 0
	}
	tick := func(s string) time.Duration {
		n, _ := strconv.ParseInt(s, 10, 64)
		return time.Duration(n) * (time.Second / 100) // USER_HZ
	}
	// utime, stime, cutime, cstime are fields 14–17 of stat (11–14 here).
	return tick(f[11]) + tick(f[12]), tick(f[13]) + tick(f[14])
}

// close moves this process back and removes its cgroup (the processes it
// started must have ended).
func (m *cpuMeter) close() {
	if m.own == "" {
		return
	}
	_ = os.WriteFile(filepath.Join(m.origin, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0)
	_ = os.Remove(m.own)
}

// machineCPU returns the CPU time every core of the machine spent busy
// (everything but idle and iowait) from /proc/stat.
func machineCPU() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var ticks int64
	for i, v := range f[1:] {
		if i == 3 || i == 4 || i >= 8 { // idle, iowait; guest time is in user already
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		ticks += n
	}
	return time.Duration(ticks) * (time.Second / 100) // USER_HZ
}

// selfCgroup returns this process's cgroup path in a v1 hierarchy.
func selfCgroup(controller string) (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && parts[1] != "" {
			for _, c := range strings.Split(parts[1], ",") {
				if c == controller {
					return parts[2], nil
				}
			}
		}
	}
	return "", fmt.Errorf("no %s cgroup", controller)
}
