// Package cgroups manages the per-sandbox control groups of evalbox.
//
// Every sandbox gets one cgroup named by its id under a common parent
// (by default "evalbox"). On cgroup v1 hosts that is one directory in each
// of the cpu, memory, pids and freezer hierarchies; on cgroup v2 hosts it is
// one directory in the unified hierarchy, with the cpu, memory and pids
// controllers enabled in the parent's cgroup.subtree_control. The version is
// detected once by New from /proc/self/mountinfo: if the memory controller is
// mounted as a v1 hierarchy the host is treated as v1 (this includes
// "hybrid" hosts whose cgroup2 mount has no controllers), otherwise the
// cgroup2 mount is used.
//
// A Cgroup is created with its limits before the sandbox's first process
// starts, and that process is placed in it before it runs untrusted code:
// on v2 it is born inside (CLONE_INTO_CGROUP, see PrepareClone), on v1 the
// caller writes its pid with AddProc while the child still waits for the
// go-ahead. All descendants inherit the cgroup.
//
// With WithUnified, a v1 (hybrid) host's cgroup2 mount is used as well:
// every cgroup also has a directory there, with no controller, which gives
// it what v1 lacks: cgroup.kill, CLONE_INTO_CGROUP, and a subtree that can
// be delegated to the sandbox (Delegate), where its agent makes a cgroup
// per command. On v2 hosts the sandbox's one cgroup plays that part.
package cgroups

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Version is a cgroup hierarchy version.
type Version int

// Cgroup versions.
const (
	V1 Version = 1
	V2 Version = 2
)

// DefaultParent is the name of the cgroup under which sandboxes live.
const DefaultParent = "evalbox"

// cpuPeriodUs is the CFS period used for CPU quotas (the kernel default).
const cpuPeriodUs = 100000

// Controllers used on v1 hosts; each is a separate directory per cgroup.
var v1Controllers = []string{"cpu", "memory", "pids", "freezer"}

// Controllers enabled for sandboxes on v2 hosts.
var v2Controllers = []string{"cpu", "memory", "pids"}

// ErrExist is returned by Create when a cgroup with that id already exists.
var ErrExist = errors.New("cgroup already exists")

// Limits are the resource limits of one cgroup. Zero values mean no limit.
type Limits struct {
	// CPU is the CPU bandwidth in cores (0.5 = half a core).
	CPU float64
	// MemoryBytes caps memory (anonymous, page cache, tmpfs pages). Swap
	// is capped so that the cgroup gets no swap beyond it.
	MemoryBytes int64
	// Pids caps the number of tasks (processes and threads).
	Pids int
}

// Manager creates and finds sandbox cgroups under one parent.
type Manager struct {
	version Version
	// parents maps a controller name to the parent directory of the
	// sandbox cgroups in its hierarchy. On v2 every controller maps to the
	// same directory.
	parents map[string]string
	// dirs are the distinct parent directories (one on v2).
	dirs []string
	// unified is the parent directory in the cgroup2 hierarchy: dirs[0]
	// on v2; on v1 the cgroup2 mount's (WithUnified), or "".
	unified string
	// killFile is true when cgroup.kill is available in the unified
	// hierarchy (Linux ≥ 5.14).
	killFile bool
	// others are the parent's directories in the v1 hierarchies evalbox
	// sets no limits in (cpuset, devices, name=systemd, …), where runsc
	// makes cgroups too: listed and removed, never created.
	others []string
	// cpuacct is the parent's directory in a v1 host's cpuacct hierarchy
	// ("" when none is mounted): where CPUUsage reads the cgroups that
	// runsc makes there (a manager never creates them).
	cpuacct string
}

// Option configures New.
type Option func(*options)

type options struct{ unified bool }

// WithUnified makes a v1 host's manager keep each cgroup in the host's
// cgroup2 hierarchy too, when one is mounted (a "hybrid" host): no limits
// there, but cgroup.kill, CLONE_INTO_CGROUP and delegation. It has no
// effect on v2 hosts, where the one hierarchy offers all of it.
func WithUnified() Option { return func(o *options) { o.unified = true } }

// New detects the host's cgroup version and makes sure the parent cgroup
// exists (and, on v2, that the cpu, memory and pids controllers are enabled
// for its children). parent is a relative path in the hierarchy; "" means
// DefaultParent.
func New(parent string, opts ...Option) (*Manager, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if parent == "" {
		parent = DefaultParent
	}
	if err := checkRelPath(parent); err != nil {
		return nil, err
	}
	mounts, err := readCgroupMounts()
	if err != nil {
		return nil, err
	}
	if _, ok := mounts.v1["memory"]; ok {
		roots := make(map[string]string, len(v1Controllers))
		for _, c := range v1Controllers {
			mp, ok := mounts.v1[c]
			if !ok {
				return nil, fmt.Errorf("cgroups: v1 host without a %q hierarchy", c)
			}
			roots[c] = mp
		}
		unified := ""
		if o.unified {
			unified = mounts.v2
		}
		m, err := newV1(roots, unified, parent)
		if err != nil {
			return nil, err
		}
		if mp, ok := mounts.v1["cpuacct"]; ok {
			m.cpuacct = filepath.Join(mp, parent)
		}
		// The other hierarchies: runsc makes its cgroups in all of them,
		// under the same path, and a runsc killed before its delete leaves
		// them there, where only List and Remove look.
		for _, mp := range mounts.v1All {
			if !slices.Contains(slices.Collect(maps.Values(roots)), mp) {
				m.others = append(m.others, filepath.Join(mp, parent))
			}
		}
		slices.Sort(m.others)
		return m, nil
	}
	if mounts.v2 == "" {
		return nil, errors.New("cgroups: no cgroup v1 memory hierarchy and no cgroup2 mount found")
	}
	return newV2(mounts.v2, parent, v2Controllers)
}

// newV1 builds a v1 manager from controller → hierarchy mount point, and
// the cgroup2 mount point unified ("" for none).
func newV1(roots map[string]string, unified, parent string) (*Manager, error) {
	m := &Manager{version: V1, parents: make(map[string]string, len(roots))}
	for c, root := range roots {
		dir := filepath.Join(root, parent)
		m.parents[c] = dir
		if !slices.Contains(m.dirs, dir) {
			m.dirs = append(m.dirs, dir)
		}
	}
	if unified != "" {
		m.unified = filepath.Join(unified, parent)
		m.dirs = append(m.dirs, m.unified)
	}
	slices.Sort(m.dirs)
	for _, dir := range m.dirs {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("cgroups: create parent: %w", err)
		}
	}
	if m.unified != "" {
		if _, err := os.Stat(filepath.Join(m.unified, "cgroup.kill")); err == nil {
			m.killFile = true
		}
	}
	return m, nil
}

// newV2 builds a v2 manager for the hierarchy mounted at root, enabling
// controllers for the children of parent (and on the way down to it).
func newV2(root, parent string, controllers []string) (*Manager, error) {
	dir := filepath.Join(root, parent)
	if len(controllers) > 0 {
		avail, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
		if err != nil {
			return nil, fmt.Errorf("cgroups: %w", err)
		}
		have := strings.Fields(string(avail))
		for _, c := range controllers {
			if !slices.Contains(have, c) {
				return nil, fmt.Errorf("cgroups: controller %q not available in %s (cgroup.controllers: %q)", c, root, strings.TrimSpace(string(avail)))
			}
		}
	}
	// Enable the controllers in every cgroup from the root down to parent
	// (inclusive), creating the missing directories.
	enable := make([]byte, 0, 32)
	for i, c := range controllers {
		if i > 0 {
			enable = append(enable, ' ')
		}
		enable = append(enable, '+')
		enable = append(enable, c...)
	}
	cur := root
	parts := strings.Split(parent, "/")
	for i := 0; i <= len(parts); i++ {
		if i > 0 {
			cur = filepath.Join(cur, parts[i-1])
			if err := os.Mkdir(cur, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return nil, fmt.Errorf("cgroups: create parent: %w", err)
			}
		}
		if len(enable) == 0 {
			continue
		}
		if err := enableControllers(cur, controllers, enable); err != nil {
			return nil, err
		}
	}
	m := &Manager{version: V2, parents: make(map[string]string, len(v1Controllers)), dirs: []string{dir}, unified: dir}
	for _, c := range v1Controllers {
		m.parents[c] = dir
	}
	if _, err := os.Stat(filepath.Join(root, parent, "cgroup.kill")); err == nil {
		m.killFile = true
	}
	return m, nil
}

// enableControllers makes sure every controller is listed in dir's
// cgroup.subtree_control.
func enableControllers(dir string, controllers []string, enable []byte) error {
	cur, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if err != nil {
		return fmt.Errorf("cgroups: %w", err)
	}
	have := strings.Fields(string(cur))
	missing := false
	for _, c := range controllers {
		if !slices.Contains(have, c) {
			missing = true
			break
		}
	}
	if !missing {
		return nil
	}
	if err := writeFile(filepath.Join(dir, "cgroup.subtree_control"), enable); err != nil {
		if errors.Is(err, syscall.EBUSY) {
			return fmt.Errorf("cgroups: cannot enable controllers in %s: it has member processes (cgroup v2 \"no internal processes\" rule; move them to a leaf or choose another parent): %w", dir, err)
		}
		return fmt.Errorf("cgroups: enable controllers in %s: %w", dir, err)
	}
	return nil
}

// Dirs returns the parent directories of the sandbox cgroups (one per
// hierarchy on v1, one on v2).
func (m *Manager) Dirs() []string { return slices.Clone(m.dirs) }

// Version reports the cgroup version in use.
func (m *Manager) Version() Version { return m.version }

// Unified reports whether cgroups have a directory in the cgroup2
// hierarchy (v2 hosts, or v1 hosts with WithUnified and a cgroup2 mount).
func (m *Manager) Unified() bool { return m.unified != "" }

// Create creates the cgroup id with the given limits. If any step fails,
// nothing is left behind. It returns an error wrapping ErrExist when the
// cgroup already exists.
func (m *Manager) Create(id string, l Limits) (*Cgroup, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	c := m.cgroup(id)
	var made []string
	for _, dir := range c.dirs {
		if err := os.Mkdir(dir, 0o755); err != nil {
			removeDirs(made)
			if errors.Is(err, fs.ErrExist) {
				return nil, fmt.Errorf("cgroups: %s: %w", id, ErrExist)
			}
			return nil, fmt.Errorf("cgroups: create %s: %w", id, err)
		}
		made = append(made, dir)
	}
	if err := c.setLimits(l); err != nil {
		removeDirs(made)
		return nil, fmt.Errorf("cgroups: %s: %w", id, err)
	}
	return c, nil
}

// Open returns a handle on an existing cgroup (for example one left by a
// previous run). It does not check that the cgroup exists.
func (m *Manager) Open(id string) (*Cgroup, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	return m.cgroup(id), nil
}

// Exists reports whether any directory of cgroup id exists.
func (m *Manager) Exists(id string) bool {
	if checkID(id) != nil {
		return false
	}
	for _, dir := range slices.Concat(m.dirs, m.others) {
		if _, err := os.Lstat(filepath.Join(dir, id)); err == nil {
			return true
		}
	}
	return false
}

// List returns the ids of all cgroups under the parent, in any hierarchy,
// sorted.
func (m *Manager) List() ([]string, error) {
	var ids []string
	for _, dir := range slices.Concat(m.dirs, m.others) {
		ents, err := os.ReadDir(dir)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return nil, fmt.Errorf("cgroups: list: %w", err)
		}
		for _, e := range ents {
			if e.IsDir() && !slices.Contains(ids, e.Name()) {
				ids = append(ids, e.Name())
			}
		}
	}
	slices.Sort(ids)
	return ids, nil
}

func (m *Manager) cgroup(id string) *Cgroup {
	c := &Cgroup{m: m, id: id}
	for _, d := range m.dirs {
		c.dirs = append(c.dirs, filepath.Join(d, id))
	}
	for _, d := range m.others {
		c.others = append(c.others, filepath.Join(d, id))
	}
	if m.unified != "" {
		c.unified = filepath.Join(m.unified, id)
	}
	return c
}

// Cgroup is one sandbox's cgroup.
type Cgroup struct {
	m       *Manager
	id      string
	dirs    []string
	unified string // its directory in the cgroup2 hierarchy, or ""
	// others are its directories in the hierarchies of Manager.others
	// (Remove removes those that exist).
	others []string
}

// ID returns the cgroup's name.
func (c *Cgroup) ID() string { return c.id }

// Paths returns the cgroup's directories (one per hierarchy).
func (c *Cgroup) Paths() []string { return slices.Clone(c.dirs) }

// dir returns the cgroup's directory in the hierarchy of controller ctrl.
func (c *Cgroup) dir(ctrl string) string { return filepath.Join(c.m.parents[ctrl], c.id) }

func (c *Cgroup) setLimits(l Limits) error {
	v2 := c.m.version == V2
	if l.CPU > 0 {
		quota := int64(l.CPU * cpuPeriodUs)
		quota = max(quota, 1000)
		if v2 {
			if err := writeFile(filepath.Join(c.dir("cpu"), "cpu.max"), fmt.Appendf(nil, "%d %d", quota, cpuPeriodUs)); err != nil {
				return err
			}
		} else {
			if err := writeFile(filepath.Join(c.dir("cpu"), "cpu.cfs_period_us"), strconv.AppendInt(nil, cpuPeriodUs, 10)); err != nil {
				return err
			}
			if err := writeFile(filepath.Join(c.dir("cpu"), "cpu.cfs_quota_us"), strconv.AppendInt(nil, quota, 10)); err != nil {
				return err
			}
		}
	}
	if l.MemoryBytes > 0 {
		mem := strconv.AppendInt(nil, l.MemoryBytes, 10)
		if v2 {
			if err := writeFile(filepath.Join(c.dir("memory"), "memory.max"), mem); err != nil {
				return err
			}
			// memory.swap.max is swap on top of memory.max: none.
			if err := writeOptional(filepath.Join(c.dir("memory"), "memory.swap.max"), []byte("0")); err != nil {
				return err
			}
		} else {
			if err := writeFile(filepath.Join(c.dir("memory"), "memory.limit_in_bytes"), mem); err != nil {
				return err
			}
			// memsw is memory+swap: equal to the memory limit means no swap.
			if err := writeOptional(filepath.Join(c.dir("memory"), "memory.memsw.limit_in_bytes"), mem); err != nil {
				return err
			}
		}
	}
	if l.Pids > 0 {
		if err := writeFile(filepath.Join(c.dir("pids"), "pids.max"), strconv.AppendInt(nil, int64(l.Pids), 10)); err != nil {
			return err
		}
	}
	return nil
}

// PrepareClone arranges for the process started with attr to be born inside
// the cgroup's cgroup2 directory when it has one (CLONE_INTO_CGROUP). It
// reports whether that placed the process in all of the cgroup (v2 hosts);
// if not, the caller must call AddProc with the new pid before the process
// runs untrusted code. The returned function releases what PrepareClone
// opened; call it after the process started.
func (c *Cgroup) PrepareClone(attr *syscall.SysProcAttr) (inside bool, release func(), err error) {
	if c.unified == "" {
		return false, func() {}, nil
	}
	fd, err := unix.Open(c.unified, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, nil, fmt.Errorf("cgroups: open %s: %w", c.id, err)
	}
	attr.UseCgroupFD = true
	attr.CgroupFD = fd
	return c.m.version == V2, func() { unix.Close(fd) }, nil
}

// Delegate gives the cgroup's cgroup2 directory to the host ids uid and
// gid (a sandbox's root in its user namespace): its owner may create and
// remove cgroups below it and move processes between them (cgroup.procs),
// but not change the limits, whose files stay root's. It fails when the
// cgroup has no cgroup2 directory.
func (c *Cgroup) Delegate(uid, gid int) error {
	if c.unified == "" {
		return fmt.Errorf("cgroups: %s: no cgroup2 hierarchy to delegate", c.id)
	}
	for _, p := range []string{c.unified, filepath.Join(c.unified, "cgroup.procs")} {
		if err := os.Lchown(p, uid, gid); err != nil {
			return fmt.Errorf("cgroups: delegate %s: %w", c.id, err)
		}
	}
	return nil
}

// UnifiedPath is the cgroup's directory in the cgroup2 hierarchy ("" when
// it has none).
func (c *Cgroup) UnifiedPath() string { return c.unified }

// AddProc moves the process pid (all its threads) into the cgroup.
func (c *Cgroup) AddProc(pid int) error {
	b := strconv.AppendInt(nil, int64(pid), 10)
	for _, dir := range c.dirs {
		if err := writeFile(filepath.Join(dir, "cgroup.procs"), b); err != nil {
			return fmt.Errorf("cgroups: add %d to %s: %w", pid, c.id, err)
		}
	}
	return nil
}

// Procs returns the pids (in the caller's pid namespace) of the processes
// in the cgroup, also those in cgroups below it (which only a delegated
// cgroup2 directory has: on v1 hosts the freezer cgroup holds them all).
func (c *Cgroup) Procs() ([]int, error) {
	if c.m.version == V2 {
		return readPidsTree(c.dirs[0])
	}
	return readPids(filepath.Join(c.dir("freezer"), "cgroup.procs"))
}

// MemoryUsage returns the memory charged to the cgroup, in bytes.
func (c *Cgroup) MemoryUsage() (int64, error) {
	name := "memory.usage_in_bytes"
	if c.m.version == V2 {
		name = "memory.current"
	}
	b, err := os.ReadFile(filepath.Join(c.dir("memory"), name))
	if err != nil {
		return 0, fmt.Errorf("cgroups: %w", err)
	}
	n, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cgroups: parse %s: %w", name, err)
	}
	return n, nil
}

// OOMKills returns how many processes the kernel's OOM killer has killed in
// the cgroup (v1: memory.oom_control, v2: memory.events; 0 on kernels
// that do not count them).
func (c *Cgroup) OOMKills() (int64, error) {
	name := "memory.oom_control"
	if c.m.version == V2 {
		name = "memory.events"
	}
	b, err := os.ReadFile(filepath.Join(c.dir("memory"), name))
	if err != nil {
		return 0, fmt.Errorf("cgroups: %w", err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("cgroups: parse %s: %w", name, err)
			}
			return n, nil
		}
	}
	return 0, nil
}

// ErrNoCPUAccounting is CPUUsage's error on a v1 host where the cgroup has
// neither a cpuacct directory nor a cgroup2 one.
var ErrNoCPUAccounting = errors.New("cgroups: no CPU accounting for the cgroup (no cpuacct hierarchy nor cgroup2 directory)")

// CPUUsage returns the CPU time used by the cgroup's tasks, those of the
// cgroups below it included, since the cgroup was made: cgroup v2's
// cpu.stat usage_usec; on v1 cpuacct.usage where the cgroup has a cpuacct
// directory (runsc makes one), else the usage_usec of its cgroup2
// directory (WithUnified: cgroup2 counts CPU time without any controller).
func (c *Cgroup) CPUUsage() (time.Duration, error) {
	if c.m.version == V1 && c.m.cpuacct != "" {
		b, err := os.ReadFile(filepath.Join(c.m.cpuacct, c.id, "cpuacct.usage"))
		if err == nil {
			n, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("cgroups: parse cpuacct.usage of %s: %w", c.id, err)
			}
			return time.Duration(n), nil
		}
		if !errors.Is(err, fs.ErrNotExist) || c.unified == "" {
			return 0, fmt.Errorf("cgroups: %w", err)
		}
	}
	dir := c.unified
	if c.m.version == V2 {
		dir = c.dirs[0]
	}
	if dir == "" {
		return 0, ErrNoCPUAccounting
	}
	b, err := os.ReadFile(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		return 0, fmt.Errorf("cgroups: %w", err)
	}
	return parseUsageUsec(b)
}

// parseUsageUsec reads usage_usec of a cgroup2 cpu.stat.
func parseUsageUsec(b []byte) (time.Duration, error) {
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("cgroups: parse cpu.stat: %w", err)
			}
			return time.Duration(n) * time.Microsecond, nil
		}
	}
	return 0, errors.New("cgroups: cpu.stat has no usage_usec")
}

// CPULimit returns the cgroup's CPU bandwidth limit in cores (0: none):
// cpu.max on v2, cpu.cfs_quota_us over cpu.cfs_period_us on v1.
func (c *Cgroup) CPULimit() (float64, error) {
	dir := c.dir("cpu")
	if c.m.version == V2 {
		b, err := os.ReadFile(filepath.Join(dir, "cpu.max"))
		if err != nil {
			return 0, fmt.Errorf("cgroups: %w", err)
		}
		return parseCPUMax(b)
	}
	quota, err := readCgroupInt(filepath.Join(dir, "cpu.cfs_quota_us"))
	if err != nil {
		return 0, err
	}
	period, err := readCgroupInt(filepath.Join(dir, "cpu.cfs_period_us"))
	if err != nil {
		return 0, err
	}
	if quota <= 0 || period <= 0 {
		return 0, nil // -1: no limit
	}
	return float64(quota) / float64(period), nil
}

// parseCPUMax reads a cgroup2 cpu.max ("max 100000" or "50000 100000").
func parseCPUMax(b []byte) (float64, error) {
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, fmt.Errorf("cgroups: parse cpu.max %q", b)
	}
	if f[0] == "max" {
		return 0, nil
	}
	quota, err1 := strconv.ParseInt(f[0], 10, 64)
	period, err2 := strconv.ParseInt(f[1], 10, 64)
	if err1 != nil || err2 != nil || period <= 0 {
		return 0, fmt.Errorf("cgroups: parse cpu.max %q", b)
	}
	return float64(quota) / float64(period), nil
}

func readCgroupInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("cgroups: %w", err)
	}
	n, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cgroups: parse %s: %w", path, err)
	}
	return n, nil
}

// SetCPULimit changes the cgroup's CPU bandwidth limit to cpu cores (> 0)
// while its tasks run: the CPU-abuse rule's throttle.
func (c *Cgroup) SetCPULimit(cpu float64) error {
	if cpu <= 0 {
		return fmt.Errorf("cgroups: %s: CPU limit %g is not positive", c.id, cpu)
	}
	if err := c.setLimits(Limits{CPU: cpu}); err != nil {
		return fmt.Errorf("cgroups: %s: %w", c.id, err)
	}
	return nil
}

// KillAll SIGKILLs every process in the cgroup, including ones forked while
// it runs, and returns once the cgroup has no live process or ctx is done.
// A cgroup that does not exist is empty.
func (c *Cgroup) KillAll(ctx context.Context) error {
	if c.m.killFile {
		// cgroup.kill kills the whole subtree, forks included.
		err := writeFile(filepath.Join(c.unified, "cgroup.kill"), []byte("1"))
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("cgroups: kill %s: %w", c.id, err)
		}
		return c.waitEmpty(ctx)
	}
	// Freeze so that nothing forks while we signal, kill every member,
	// thaw so the signals are delivered, and repeat until empty.
	for b := newBackoff(); ; {
		pids, err := c.Procs()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("cgroups: kill %s: %w", c.id, err)
		}
		if len(pids) == 0 {
			return nil
		}
		if err := c.freeze(ctx, true); err != nil {
			return err
		}
		pids, err = c.Procs()
		if err == nil {
			for _, pid := range pids {
				// ESRCH: already gone.
				_ = unix.Kill(pid, unix.SIGKILL)
			}
		}
		if terr := c.freeze(ctx, false); terr != nil {
			return terr
		}
		if err != nil {
			return fmt.Errorf("cgroups: kill %s: %w", c.id, err)
		}
		if err := b.wait(ctx); err != nil {
			return fmt.Errorf("cgroups: kill %s: %w", c.id, err)
		}
	}
}

// Freeze stops every process of the cgroup until Thaw (waiting, up to a
// short bound, for the freeze to complete).
func (c *Cgroup) Freeze(ctx context.Context) error { return c.freeze(ctx, true) }

// Thaw lets the processes Freeze stopped run again.
func (c *Cgroup) Thaw() error { return c.freeze(context.Background(), false) }

// freeze freezes (or thaws) the cgroup. When freezing it waits, up to a
// short bound, for the freeze to complete; tasks stuck in uninterruptible
// sleep may keep it from completing, and the caller kills them anyway.
func (c *Cgroup) freeze(ctx context.Context, on bool) error {
	var file, want string
	var val []byte
	if c.m.version == V2 {
		file, want = filepath.Join(c.dirs[0], "cgroup.freeze"), "frozen 1"
		val = []byte("0")
		if on {
			val = []byte("1")
		}
	} else {
		file, want = filepath.Join(c.dir("freezer"), "freezer.state"), "FROZEN"
		val = []byte("THAWED")
		if on {
			val = []byte("FROZEN")
		}
	}
	if err := writeFile(file, val); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("cgroups: freeze %s: %w", c.id, err)
	}
	if !on {
		return nil
	}
	state := file
	if c.m.version == V2 {
		state = filepath.Join(c.dirs[0], "cgroup.events")
	}
	b := newBackoff()
	for i := 0; i < 40; i++ {
		s, err := os.ReadFile(state)
		if err != nil || bytes.Contains(s, []byte(want)) {
			return nil
		}
		if err := b.wait(ctx); err != nil {
			return fmt.Errorf("cgroups: freeze %s: %w", c.id, err)
		}
	}
	return nil
}

// waitEmpty waits until the cgroup has no process (the cgroup2 directory
// says so in cgroup.events for its whole subtree; on v1 the freezer
// cgroup has every process).
func (c *Cgroup) waitEmpty(ctx context.Context) error {
	for b := newBackoff(); ; {
		if c.m.version == V2 {
			ev, err := os.ReadFile(filepath.Join(c.unified, "cgroup.events"))
			if errors.Is(err, fs.ErrNotExist) || (err == nil && bytes.Contains(ev, []byte("populated 0"))) {
				return nil
			}
		}
		pids, err := c.Procs()
		if errors.Is(err, fs.ErrNotExist) || (err == nil && len(pids) == 0) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("cgroups: %s: %w", c.id, err)
		}
		if err := b.wait(ctx); err != nil {
			return fmt.Errorf("cgroups: %s still has %d processes: %w", c.id, len(pids), err)
		}
	}
}

// Remove removes the cgroup's directories (and in the cgroup2 hierarchy
// the cgroups a delegate made below it), retrying while exiting tasks
// drain. The cgroup must have no live process (see KillAll). Removing a
// cgroup that does not exist succeeds.
func (c *Cgroup) Remove(ctx context.Context) error {
	if c.unified != "" {
		if err := removeChildren(ctx, c.unified); err != nil {
			return err
		}
	}
	for i, dir := range slices.Concat(c.dirs, c.others) {
		for b := newBackoff(); ; {
			err := unix.Rmdir(dir)
			if err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			if !errors.Is(err, unix.EBUSY) {
				if i >= len(c.dirs) {
					break // a hierarchy evalbox does not manage: its leftovers are runsc's, and best effort
				}
				return fmt.Errorf("cgroups: remove %s: %w", dir, err)
			}
			if werr := b.wait(ctx); werr != nil {
				return fmt.Errorf("cgroups: remove %s: %w (%w)", dir, err, werr)
			}
		}
	}
	return nil
}

// Destroy kills every process in the cgroup (KillAll) and removes it
// (Remove).
func (c *Cgroup) Destroy(ctx context.Context) error {
	if err := c.KillAll(ctx); err != nil {
		return err
	}
	return c.Remove(ctx)
}

// backoff is an exponential sleep from 50µs to 10ms, bounded by a context.
type backoff struct{ d time.Duration }

func newBackoff() backoff { return backoff{d: 50 * time.Microsecond} }

func (b *backoff) wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t := time.NewTimer(b.d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	}
	b.d = min(2*b.d, 10*time.Millisecond)
	return nil
}

// removeChildren removes the cgroups below dir, deepest first.
func removeChildren(ctx context.Context, dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cgroups: %w", err)
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		child := filepath.Join(dir, e.Name())
		if err := removeChildren(ctx, child); err != nil {
			return err
		}
		for b := newBackoff(); ; {
			err := unix.Rmdir(child)
			if err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			if !errors.Is(err, unix.EBUSY) {
				return fmt.Errorf("cgroups: remove %s: %w", child, err)
			}
			if werr := b.wait(ctx); werr != nil {
				return fmt.Errorf("cgroups: remove %s: %w (%w)", child, err, werr)
			}
		}
	}
	return nil
}

func removeDirs(dirs []string) {
	for _, d := range dirs {
		_ = unix.Rmdir(d)
	}
}

// writeFile writes b to an existing cgroup file in a single write.
func writeFile(path string, b []byte) error {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, b); err != nil {
		return &fs.PathError{Op: "write", Path: path, Err: err}
	}
	return nil
}

// writeOptional is writeFile that ignores a missing file.
func writeOptional(path string, b []byte) error {
	if err := writeFile(path, b); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

func readPids(path string) ([]int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var pids []int
	for line := range bytes.FieldsSeq(b) {
		pid, err := strconv.Atoi(string(line))
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", path, err)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// readPidsTree reads the pids of the cgroup2 directory dir and of every
// cgroup below it.
func readPidsTree(dir string) ([]int, error) {
	pids, err := readPids(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return pids, nil // removed meanwhile
	}
	for _, e := range ents {
		if e.IsDir() {
			more, err := readPidsTree(filepath.Join(dir, e.Name()))
			if err == nil {
				pids = append(pids, more...)
			}
		}
	}
	return pids, nil
}

func checkID(id string) error {
	if id == "" || id == "." || id == ".." || strings.ContainsAny(id, "/\x00") || len(id) > 128 {
		return fmt.Errorf("cgroups: invalid id %q", id)
	}
	return nil
}

func checkRelPath(p string) error {
	if filepath.IsAbs(p) || filepath.Clean(p) != p || p == "." || strings.HasPrefix(p, "..") {
		return fmt.Errorf("cgroups: invalid parent %q (want a clean relative path)", p)
	}
	return nil
}

// cgroupMounts are the cgroup hierarchies visible in our mount namespace.
type cgroupMounts struct {
	v1 map[string]string // controller → mount point
	v2 string            // the cgroup2 mount point (prefers /sys/fs/cgroup)
	// v1All are the mount points of every v1 hierarchy (cpuset, devices,
	// name=systemd, … as well as the managed controllers').
	v1All []string
}

func readCgroupMounts() (cgroupMounts, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return cgroupMounts{}, fmt.Errorf("cgroups: %w", err)
	}
	defer f.Close()
	return parseMountinfo(f)
}

func parseMountinfo(r io.Reader) (cgroupMounts, error) {
	m := cgroupMounts{v1: map[string]string{}}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		// 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		pf, sf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(sf) < 3 {
			continue
		}
		mp := unescapeMount(pf[4])
		switch sf[0] {
		case "cgroup":
			if !slices.Contains(m.v1All, mp) {
				m.v1All = append(m.v1All, mp)
			}
			for opt := range strings.SplitSeq(sf[2], ",") {
				if slices.Contains(v1Controllers, opt) || opt == "cpuacct" {
					if _, dup := m.v1[opt]; !dup {
						m.v1[opt] = mp
					}
				}
			}
		case "cgroup2":
			if m.v2 == "" || mp == "/sys/fs/cgroup" {
				m.v2 = mp
			}
		}
	}
	if err := sc.Err(); err != nil {
		return cgroupMounts{}, fmt.Errorf("cgroups: read mountinfo: %w", err)
	}
	return m, nil
}

// unescapeMount decodes the octal escapes (\040 etc.) of mountinfo paths.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// RemoveParent removes parent from every cgroup hierarchy of the host (v1
// hierarchies of any controller, and cgroup2), with the empty sandbox
// cgroups still in it; it fails where one still has tasks.
func RemoveParent(parent string) error {
	if err := checkRelPath(parent); err != nil {
		return err
	}
	return eachHierarchy(func(mount string) error {
		dir := filepath.Join(mount, parent)
		// Sandbox cgroups some runtime left without processes in
		// hierarchies it does not manage (runsc creates one in every
		// controller) go first.
		children, _ := os.ReadDir(dir)
		for _, c := range children {
			if c.IsDir() {
				_ = unix.Rmdir(filepath.Join(dir, c.Name()))
			}
		}
		return rmdirIfExists(dir)
	})
}

// RemoveLeaf removes the empty cgroup parent/id from every hierarchy of the
// host, also those no Manager handles (runsc creates one in each).
func RemoveLeaf(parent, id string) error {
	if err := checkRelPath(parent); err != nil {
		return err
	}
	if err := checkID(id); err != nil {
		return err
	}
	return eachHierarchy(func(mount string) error {
		return rmdirIfExists(filepath.Join(mount, parent, id))
	})
}

func rmdirIfExists(dir string) error {
	if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("cgroups: remove %s: %w", dir, err)
	}
	return nil
}

// eachHierarchy calls fn with the mount point of every cgroup hierarchy
// (cgroup v1 of any controller, and cgroup2) and joins the errors.
func eachHierarchy(fn func(mount string) error) error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("cgroups: %w", err)
	}
	var errs []error
	for _, line := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		pf, sf := strings.Fields(pre), strings.Fields(post)
		if !ok || len(pf) < 5 || len(sf) < 1 || (sf[0] != "cgroup" && sf[0] != "cgroup2") {
			continue
		}
		if err := fn(unescapeMount(pf[4])); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
