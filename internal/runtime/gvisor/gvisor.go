// Package gvisor is the default runtime driver: every sandbox is a gVisor
// sandbox started with runsc (platform systrap), whose application kernel
// (the Sentry) stands between the sandboxed code and the host kernel.
//
// Per sandbox the driver writes an OCI bundle into the sandbox's state
// directory and runs `runsc run --detach`: the agent's stdin/stdout are pipes
// that runsc donates to the sandbox, so the host talks to the agent with no
// process of its own in between. The template root filesystem is the lower
// layer of runsc's in-sandbox overlay whose upper layer lives in sandbox
// memory and is capped at the disk limit (--overlay2=root:memory,size=…);
// the template directory is never written. cgroup limits (cpu, memory, pids)
// are applied by runsc on the host, under a per-instance parent (Config.CgroupParent).
// Destroy ends a started sandbox through that cgroup (every host process of
// it is there) instead of another runsc invocation.
//
// Network "none" gives the sandbox only a loopback interface in gVisor's
// netstack (--network=none). For "outbound" the driver creates a network
// namespace, bind-mounted at <RootDir>/netns/<id>, attaches a veth pair to
// it through package internal/runtime/network (a /30, NAT and the host
// filter rules shared with the other drivers) and brings lo up there;
// runsc joins that namespace and, with --network=sandbox, hands eth0 to
// the Sentry's netstack (which takes over its address and routes), so the
// sandboxed code never talks to the host's network stack directly.
// /etc/resolv.conf is a read-only bind mount of a file in the state dir.
//
// Inside, gVisor's own cgroup2 filesystem is mounted at /sys/fs/cgroup
// (--in-sandbox-cgroup=v2; the host's cgroups are not visible): the agent
// makes a cgroup per process below its own and kills a process tree with
// cgroup.kill, which no non-root process of the sandbox can leave.
package gvisor

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/evalbox/evalbox/internal/netrules"
	"github.com/evalbox/evalbox/internal/runtime"
	"github.com/evalbox/evalbox/internal/runtime/cgroups"
	"github.com/evalbox/evalbox/internal/runtime/network"
)

// DefaultCgroupParent is the default Config.CgroupParent.
const DefaultCgroupParent = "evalbox-gvisor"

// Config configures the driver.
type Config struct {
	// Runsc is the path of the runsc binary (built static from the pinned
	// gvisor.dev/gvisor module).
	Runsc string
	// RootDir is runsc's state root (--root); one per server data dir.
	RootDir string
	// Platform is the runsc platform (default "systrap").
	Platform string
	// CgroupParent is the cgroup under which every sandbox's cgroup lives;
	// one per evalbox instance, so that Sweep never touches another's.
	CgroupParent string
	// Network provides outbound networking (addresses, host rules). Every
	// driver of a process must share one Manager, so that no two
	// sandboxes get the same addresses. Nil: the driver makes its own,
	// with default settings and CgroupParent as its scope.
	Network *network.Manager
	Logger  *slog.Logger
}

// Runtime is the gVisor driver.
type Runtime struct {
	cfg     Config
	version string
	log     *slog.Logger
	net     *network.Links // this driver's view of cfg.Network
	// cg reads the sandboxes' cgroups (runsc creates them); made once,
	// since detecting the hierarchies reads mountinfo.
	cg *cgroups.Manager
}

// New checks that runsc can run and returns the driver.
func New(cfg Config) (*Runtime, error) {
	if cfg.Platform == "" {
		cfg.Platform = "systrap"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = DefaultCgroupParent
	}
	if _, err := os.Stat(cfg.Runsc); err != nil {
		return nil, fmt.Errorf("gvisor: runsc: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(cfg.RootDir, netnsDir), 0o700); err != nil {
		return nil, fmt.Errorf("gvisor: %w", err)
	}
	if cfg.Network == nil {
		var err error
		if cfg.Network, err = network.New(network.Config{Scope: cfg.CgroupParent, Logger: cfg.Logger}); err != nil {
			return nil, fmt.Errorf("gvisor: %w", err)
		}
	}
	links, err := cfg.Network.Links(Name)
	if err != nil {
		return nil, fmt.Errorf("gvisor: %w", err)
	}
	cg, err := cgroups.New(cfg.CgroupParent)
	if err != nil {
		return nil, fmt.Errorf("gvisor: %w", err)
	}
	return &Runtime{cfg: cfg, version: runscVersion(cfg.Runsc), log: cfg.Logger, net: links, cg: cg}, nil
}

// Name is the runtime's API name.
const Name = "gvisor"

// netnsDir is the directory in RootDir holding the network namespaces of
// outbound sandboxes, one file (a bind mount) per sandbox id.
const netnsDir = "netns"

func (r *Runtime) netnsPath(id string) string { return filepath.Join(r.cfg.RootDir, netnsDir, id) }

// validID reports whether id matches ^[a-z0-9][a-z0-9-]{0,47}$ (the
// runtime.Spec contract; the id names files).
func validID(id string) bool {
	if len(id) == 0 || len(id) > 48 || id[0] == '-' {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

// runscVersion reads the gvisor module version compiled into runsc.
func runscVersion(path string) string {
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return "runsc/unknown"
	}
	if info.Main.Path == "gvisor.dev/gvisor" && info.Main.Version != "" && info.Main.Version != "(devel)" {
		return "runsc/" + info.Main.Version
	}
	for _, d := range info.Deps {
		if d.Path == "gvisor.dev/gvisor" {
			return "runsc/" + d.Version
		}
	}
	return "runsc/unknown"
}

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return Name }

// Version implements runtime.Runtime.
func (r *Runtime) Version() string { return r.version }

// HostCost implements runtime.Runtime: the pids and memory limits of the
// sandbox's host cgroup, where runsc puts the Sentry, its systrap stubs and
// the gofer.
func (r *Runtime) HostCost(spec runtime.Spec) runtime.Resources { return hostCost(spec) }

func (r *Runtime) globalArgs(network string, diskMB int) []string {
	net := "none"
	if network == runtime.NetworkOutbound {
		net = "sandbox"
	}
	args := []string{
		"--root", r.cfg.RootDir,
		"--platform=" + r.cfg.Platform,
		"--network=" + net,
		"--in-sandbox-cgroup=v2",
	}
	// Always an in-memory upper layer: without --overlay2, runsc's default
	// ("root:self") would keep its file store inside the template's
	// directory, which every sandbox of the template shares.
	if diskMB > 0 {
		args = append(args, fmt.Sprintf("--overlay2=root:memory,size=%dm", diskMB))
	} else {
		args = append(args, "--overlay2=root:memory")
	}
	return args
}

// Start implements runtime.Runtime.
func (r *Runtime) Start(ctx context.Context, spec runtime.Spec) (runtime.Sandbox, error) {
	return r.launch(ctx, spec, "")
}

// Restore implements runtime.Restorer: `runsc restore` of the checkpoint
// image in dir into a new sandbox of spec (which must have the
// checkpointed sandbox's root filesystem, limits may differ). The agent
// gets new stdin/stdout; its session goes on over them after a handover
// (agentproto.Redial). An outbound sandbox gets a new network namespace
// and link, whose address the restored netstack takes over: connections
// the checkpointed one had open are gone.
func (r *Runtime) Restore(ctx context.Context, spec runtime.Spec, dir string) (runtime.Sandbox, error) {
	if dir == "" {
		return nil, errors.New("gvisor: restore: no checkpoint directory")
	}
	return r.launch(ctx, spec, dir)
}

// launch starts a sandbox of spec: a new one, or (restore set) one
// restored from the checkpoint image in directory restore.
func (r *Runtime) launch(ctx context.Context, spec runtime.Spec, restore string) (_ runtime.Sandbox, retErr error) {
	if !validID(spec.ID) {
		return nil, fmt.Errorf("gvisor: invalid sandbox id %q", spec.ID)
	}
	switch spec.Network {
	case "", runtime.NetworkNone, runtime.NetworkOutbound:
	default:
		return nil, fmt.Errorf("gvisor: unknown network mode %q", spec.Network)
	}
	bundle := filepath.Join(spec.StateDir, "bundle")
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return nil, fmt.Errorf("gvisor: %w", err)
	}
	sb := &sandbox{r: r, id: spec.ID, stateDir: spec.StateDir}
	ran := false // once runsc has run, Destroy undoes everything
	if spec.Network == runtime.NetworkOutbound {
		nw, err := r.startNetwork(ctx, spec)
		if err != nil {
			return nil, fmt.Errorf("gvisor: outbound network: %w", err)
		}
		sb.net = nw
		defer func() {
			if retErr != nil && !ran {
				if err := r.removeNetwork(spec.ID, nw.lease); err != nil {
					r.log.Error("gvisor: remove network after failed start", "id", spec.ID, "err", err)
				}
			}
		}()
		if spec.Egress != nil {
			// In force before anything of the sandbox runs.
			if err := r.net.SetEgress(ctx, nw.lease, spec.Egress); err != nil {
				return nil, fmt.Errorf("gvisor: egress rules: %w", err)
			}
		}
	}
	cfg, err := json.Marshal(ociSpec(spec, r.cfg.CgroupParent, sb.net))
	if err != nil {
		return nil, fmt.Errorf("gvisor: spec: %w", err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), cfg, 0o600); err != nil {
		return nil, fmt.Errorf("gvisor: %w", err)
	}

	// stdin: host writes, agent reads. stdout: agent writes, host reads.
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("gvisor: %w", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, fmt.Errorf("gvisor: %w", err)
	}
	// 1 MiB pipes, not 64 KiB: a frame of the agent's (up to 1 MiB) then
	// goes through in one write instead of waiting for the host's read
	// every 64 KiB, each wait a round of wakeups in the Sentry (port URL
	// downloads gained about 15 %). Only an optimisation: past the kernel's
	// per-user pipe memory (fs.pipe-user-pages-soft, unprivileged users)
	// the pipe keeps its size.
	for _, f := range []*os.File{inW, outR} {
		if rc, err := f.SyscallConn(); err == nil { // not Fd: it makes f blocking
			_ = rc.Control(func(fd uintptr) { _, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, agentPipeSize) })
		}
	}
	agentLog, err := os.OpenFile(filepath.Join(spec.StateDir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		inR.Close()
		inW.Close()
		outR.Close()
		outW.Close()
		return nil, fmt.Errorf("gvisor: %w", err)
	}
	args := append(r.globalArgs(spec.Network, spec.DiskMB), "--log", filepath.Join(spec.StateDir, "runsc.log"))
	verb := "run"
	if restore != "" {
		verb = "restore"
		args = append(args, "restore", "--image-path", restore)
	} else {
		args = append(args, "run")
	}
	args = append(args, "--detach", "--bundle", bundle, spec.ID)
	cmd := exec.CommandContext(ctx, r.cfg.Runsc, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, agentLog
	cmd.Env = []string{}
	runErr := cmd.Run()
	ran = true
	inR.Close()
	outW.Close()
	agentLog.Close()
	sb.in, sb.out = inW, outR
	if runErr != nil {
		tail := logTail(filepath.Join(spec.StateDir, "runsc.log"))
		_ = sb.Destroy(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("gvisor: runsc %s: %w: %s", verb, runErr, tail)
	}
	sb.started = true
	// runsc applies the spec's OOM score inside the sandbox only; the host
	// processes (Sentry, gofer; stubs inherit from the Sentry) get it here.
	r.setOOMScore(spec.ID)
	return sb, nil
}

// setOOMScore makes the host OOM killer pick the sandbox's processes
// before the control plane.
func (r *Runtime) setOOMScore(id string) {
	// The sandbox's cgroup holds all of them, the gofer included.
	cg, err := r.cg.Open(id)
	if err != nil {
		return
	}
	pids, _ := cg.Procs()
	for _, pid := range pids {
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte(strconv.Itoa(oomScoreAdj)), 0); err != nil {
			r.log.Debug("oom_score_adj", "pid", pid, "err", err)
		}
	}
}

// sandboxNet is an outbound sandbox's network: its namespace (bind-mounted
// at path), its link, and its resolv.conf.
type sandboxNet struct {
	path       string
	lease      *network.Lease
	resolvConf string // host path
}

// startNetwork creates the sandbox's network namespace, attaches its link
// and writes its resolv.conf. On error nothing of it is left.
func (r *Runtime) startNetwork(ctx context.Context, spec runtime.Spec) (*sandboxNet, error) {
	n := &sandboxNet{path: r.netnsPath(spec.ID), resolvConf: filepath.Join(spec.StateDir, "resolv.conf")}
	if err := os.WriteFile(n.resolvConf, []byte(r.cfg.Network.ResolvConf()), 0o644); err != nil {
		return nil, err
	}
	ns, err := newNetns(n.path)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	n.lease, err = r.net.Attach(ctx, spec.ID, ns)
	if err != nil {
		return nil, errors.Join(err, removeNetns(n.path))
	}
	return n, nil
}

// removeNetwork removes an outbound sandbox's network namespace file and
// link, by lease (which also frees its addresses) or, with none, by id.
func (r *Runtime) removeNetwork(id string, lease *network.Lease) error {
	// The link first: it goes with the namespace, and RemoveID finds the
	// link's chains (a rules sandbox's) by it.
	var err error
	if lease != nil {
		r.net.Detach(lease)
	} else if lerr := r.net.RemoveID(id); lerr != nil {
		err = lerr
	}
	err = errors.Join(err, removeNetns(r.netnsPath(id)))
	if err != nil {
		return fmt.Errorf("gvisor: network of %s: %w", id, err)
	}
	return nil
}

// logTail returns the last lines of a runsc log, for error messages.
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 3 {
		lines = lines[len(lines)-3:]
	}
	return strings.Join(lines, " | ")
}

type sandbox struct {
	r        *Runtime
	id       string
	stateDir string
	in       *os.File
	out      *os.File
	net      *sandboxNet // nil unless outbound
	// started is set once `runsc run` succeeded: runsc has put the
	// sandbox's every host process (Sentry, gofer, systrap stubs) in its
	// cgroup, so Destroy can end it without another runsc invocation.
	started bool

	destroyOnce sync.Once
	destroyErr  error
}

type pipeConn struct {
	r *os.File
	w *os.File
}

func (c pipeConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c pipeConn) Write(p []byte) (int, error) { return c.w.Write(p) }
func (c pipeConn) Close() error {
	return errors.Join(c.w.Close(), c.r.Close())
}

func (s *sandbox) Conn() io.ReadWriteCloser { return pipeConn{r: s.out, w: s.in} }

// Destroy implements runtime.Sandbox.
func (s *sandbox) Destroy(ctx context.Context) error {
	s.destroyOnce.Do(func() {
		s.in.Close()
		s.out.Close()
		if s.started {
			s.destroyErr = s.r.kill(ctx, s.id)
		} else {
			s.destroyErr = s.r.remove(ctx, s.id)
		}
		if s.net != nil {
			s.destroyErr = errors.Join(s.destroyErr, s.r.removeNetwork(s.id, s.net.lease))
		}
	})
	return s.destroyErr
}

// agentPipeSize is the capacity of the agent's stdin and stdout pipes.
const agentPipeSize = 1 << 20

// kill ends a container runsc started: it SIGKILLs every process of the
// sandbox's cgroup (Sentry, gofer, systrap stubs; the cgroup is frozen while
// it signals, so nothing escapes by forking), removes the cgroup in every
// hierarchy and runsc's state files of the container. That is what
// `runsc delete --force` does for a sandbox of one container (its
// processes are not ours to reap: `runsc run --detach` left them to init),
// without the cost of another runsc process (~10 ms CPU) and the Sentry's
// orderly shutdown. Without the cgroup (never expected) it falls back to
// remove, which asks runsc.
func (r *Runtime) kill(ctx context.Context, id string) error {
	if !r.cg.Exists(id) {
		return r.remove(ctx, id)
	}
	cg, err := r.cg.Open(id)
	if err != nil {
		return r.remove(ctx, id)
	}
	ctx = context.WithoutCancel(ctx)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := cg.Destroy(ctx); err != nil {
		// Leave it to runsc (and, failing that, the periodic sweep).
		r.log.Warn("gvisor: kill by cgroup failed, trying runsc delete", "id", id, "err", err)
		return r.remove(ctx, id)
	}
	var errs []error
	for _, f := range r.stateFiles(id) {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("gvisor: %w", err))
		}
	}
	// runsc makes the sandbox's cgroup in every hierarchy, also in those
	// the manager does not handle (cpuacct, devices, …).
	if err := cgroups.RemoveLeaf(r.cfg.CgroupParent, id); err != nil {
		errs = append(errs, fmt.Errorf("gvisor: %w", err))
	}
	return errors.Join(errs...)
}

// remove force-deletes a container: runsc kills the sandbox and gofer,
// removes its cgroup and state.
func (r *Runtime) remove(ctx context.Context, id string) error {
	ctx = context.WithoutCancel(ctx)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		out, err := exec.CommandContext(ctx, r.cfg.Runsc, "--root", r.cfg.RootDir, "delete", "--force", id).CombinedOutput()
		if err == nil || bytes.Contains(out, []byte("does not exist")) || bytes.Contains(out, []byte("not found")) {
			lastErr = nil
			break
		}
		lastErr = fmt.Errorf("gvisor: runsc delete %s: %w: %s", id, err, bytes.TrimSpace(out))
		time.Sleep(50 * time.Millisecond)
	}
	// runsc already killed the processes; if it left the cgroup, what is
	// in it (sandbox, gofer, stubs) is killed below with it.
	// A `runsc run` killed midway (the server died during a start) leaves
	// its lock and control socket, which `runsc delete` does not know.
	for _, f := range r.stateFiles(id) {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) && lastErr == nil {
			lastErr = fmt.Errorf("gvisor: %w", err)
		}
	}
	if cg, err := r.cg.Open(id); err == nil {
		if err := cg.Destroy(ctx); err != nil && lastErr == nil {
			lastErr = fmt.Errorf("gvisor: %w", err)
		}
	}
	// runsc makes the sandbox's cgroup in every hierarchy; a failed start
	// can leave the ones the manager above does not handle.
	if err := cgroups.RemoveLeaf(r.cfg.CgroupParent, id); err != nil && lastErr == nil {
		lastErr = fmt.Errorf("gvisor: %w", err)
	}
	return lastErr
}

// ExportUpper implements runtime.UpperExporter: `runsc tar rootfs-upper`
// serializes the sandbox's in-memory overlay upper layer (a tmpfs in
// overlayfs format; xattrs travel as PAX records).
func (s *sandbox) ExportUpper(ctx context.Context, path string) error {
	out, err := exec.CommandContext(ctx, s.r.cfg.Runsc, "--root", s.r.cfg.RootDir,
		"--log", filepath.Join(s.stateDir, "runsc-tar.log"), "tar", "rootfs-upper", "--file", path, s.id).CombinedOutput()
	if err != nil {
		return fmt.Errorf("gvisor: runsc tar rootfs-upper %s: %w: %s", s.id, err, bytes.TrimSpace(out))
	}
	return nil
}

var _ runtime.UpperExporter = (*sandbox)(nil)

// Checkpoint implements runtime.Checkpointer: `runsc checkpoint` writes
// the sandbox's memory, processes and in-memory root filesystem layer to
// dir (checkpoint.img, pages_meta.img, pages.img). Without leaveRunning
// the sandbox is stopped after it (its host processes exit) and must
// still be destroyed; with it, it goes on.
func (s *sandbox) Checkpoint(ctx context.Context, dir string, leaveRunning bool) error {
	args := []string{"--root", s.r.cfg.RootDir, "--log", filepath.Join(s.stateDir, "runsc-checkpoint.log"),
		"checkpoint", "--image-path", dir, "--exclude-committed-zero-pages"}
	if leaveRunning {
		args = append(args, "--leave-running")
	}
	out, err := exec.CommandContext(ctx, s.r.cfg.Runsc, append(args, s.id)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("gvisor: runsc checkpoint %s: %w: %s", s.id, err, bytes.TrimSpace(out))
	}
	return nil
}

var (
	_ runtime.Checkpointer = (*sandbox)(nil)
	_ runtime.Restorer     = (*Runtime)(nil)
)

// stateFiles lists the files runsc keeps in its root for container id:
// <id>_sandbox:<id>.{state,lock} and the control socket runsc-<id>.sock.
func (r *Runtime) stateFiles(id string) []string {
	files, _ := filepath.Glob(filepath.Join(r.cfg.RootDir, id+"_sandbox:"+id+".*"))
	sock := filepath.Join(r.cfg.RootDir, "runsc-"+id+".sock")
	if _, err := os.Lstat(sock); err == nil {
		files = append(files, sock)
	}
	return files
}

// OOMKills implements runtime.Sandbox.
func (s *sandbox) OOMKills() (int64, error) {
	cg, err := s.r.cg.Open(s.id)
	if err != nil {
		return 0, fmt.Errorf("gvisor: %w", err)
	}
	return cg.OOMKills()
}

// CPUUsage implements runtime.CPUController: runsc's cgroup of the
// sandbox holds the Sentry, the gofer and the systrap stubs, which run
// every instruction of the sandbox's processes.
func (s *sandbox) CPUUsage() (time.Duration, error) {
	cg, err := s.r.cg.Open(s.id)
	if err != nil {
		return 0, fmt.Errorf("gvisor: %w", err)
	}
	return cg.CPUUsage()
}

// CPULimit implements runtime.CPUController.
func (s *sandbox) CPULimit() (float64, error) {
	cg, err := s.r.cg.Open(s.id)
	if err != nil {
		return 0, fmt.Errorf("gvisor: %w", err)
	}
	return cg.CPULimit()
}

// SetCPULimit implements runtime.CPUController: the quota runsc wrote in
// the sandbox's cgroup at its start, changed in place.
func (s *sandbox) SetCPULimit(cpu float64) error {
	cg, err := s.r.cg.Open(s.id)
	if err != nil {
		return fmt.Errorf("gvisor: %w", err)
	}
	return cg.SetCPULimit(cpu)
}

// Usage implements runtime.Sandbox.
func (s *sandbox) Usage(ctx context.Context) (runtime.Usage, error) {
	var u runtime.Usage
	if cg, err := s.r.cg.Open(s.id); err == nil {
		u.MemoryBytes, _ = cg.MemoryUsage()
	}
	for _, pid := range s.r.pidsOf(s.id) {
		u.RSSBytes += rssOf(pid)
	}
	return u, nil
}

// pidsOf lists host processes that belong to container id: runsc's sandbox
// and gofer processes carry the container id and our --root in argv.
func (r *Runtime) pidsOf(id string) []int {
	var pids []int
	for _, c := range r.runscCmds() {
		if slices.ContainsFunc(c.args, func(a string) bool {
			return a == id || strings.HasSuffix(a, "="+id) || strings.HasSuffix(a, "/"+id)
		}) {
			pids = append(pids, c.pid)
		}
	}
	return pids
}

// runscCmd is a runsc process (CLI, sandbox or gofer) and its argv.
type runscCmd struct {
	pid  int
	args []string
}

// runscCmds lists the runsc processes, but this one, whose --root is the
// driver's.
func (r *Runtime) runscCmds() []runscCmd {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var out []runscCmd
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(cmdline) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if !strings.HasSuffix(args[0], "runsc") && !strings.Contains(args[0], "runsc-") {
			continue
		}
		for i, a := range args {
			if a == "--root="+r.cfg.RootDir || (a == "--root" && i+1 < len(args) && args[i+1] == r.cfg.RootDir) {
				out = append(out, runscCmd{pid: pid, args: args})
				break
			}
		}
	}
	return out
}

func rssOf(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb * 1024
		}
	}
	return 0
}

// Sweep implements runtime.Runtime: it force-deletes every container in
// runsc's root that keep rejects, any cgroup left under CgroupParent, and
// the network namespace files and links of outbound sandboxes.
//
// First it ends the runsc processes of its root that are no container's
// of keep's and not this process's commands: those of a server on this
// data dir that died (killed, crashed) with commands in flight. A `runsc
// run` orphaned so goes on creating its container, state files and
// cgroups after its server is gone; ended before the sweep looks, it
// cannot make one after it (else that container would stay until the next
// sweep).
func (r *Runtime) Sweep(ctx context.Context, keep func(id string) bool) ([]string, error) {
	var removed []string
	var errs []error
	if err := r.endStrays(ctx, keep); err != nil {
		errs = append(errs, err)
	}
	ids := map[string]bool{}
	out, err := exec.CommandContext(ctx, r.cfg.Runsc, "--root", r.cfg.RootDir, "list", "--quiet").Output()
	if err == nil {
		for _, id := range strings.Fields(string(out)) {
			ids[id] = true
		}
	}
	if cgIDs, err := r.cg.List(); err == nil {
		for _, id := range cgIDs {
			ids[id] = true
		}
	}
	// Containers whose start was cut short: their state files.
	if entries, err := os.ReadDir(r.cfg.RootDir); err == nil {
		for _, e := range entries {
			name := e.Name()
			if id, ok := strings.CutPrefix(name, "runsc-"); ok && strings.HasSuffix(id, ".sock") {
				if id = strings.TrimSuffix(id, ".sock"); validID(id) {
					ids[id] = true
				}
			} else if id, _, ok := strings.Cut(name, "_sandbox:"); ok && validID(id) {
				ids[id] = true
			}
		}
	}
	// Outbound sandboxes: network namespace files and links.
	if entries, err := os.ReadDir(filepath.Join(r.cfg.RootDir, netnsDir)); err == nil {
		for _, e := range entries {
			ids[e.Name()] = true
		}
	}
	linkIDs, err := r.net.IDs()
	if err != nil {
		errs = append(errs, fmt.Errorf("gvisor: %w", err))
	}
	for _, id := range linkIDs {
		ids[id] = true
	}
	for id := range ids {
		if keep(id) {
			continue
		}
		if err := errors.Join(r.remove(ctx, id), r.removeNetwork(id, nil)); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, id)
	}
	r.net.SweepChains(ctx)
	return removed, errors.Join(errs...)
}

// runscProc is a runsc process of the driver's root.
type runscProc struct {
	pid, ppid int
	// id is the container it serves: its last argument, the container id
	// of run, boot, gofer, delete, tar and the other commands; "" when
	// that is not an id (list).
	id string
}

// runscProcs lists the processes of runsc (CLI, sandbox, gofer) whose
// --root is the driver's, with their parents and container ids.
func (r *Runtime) runscProcs() []runscProc {
	var out []runscProc
	for _, c := range r.runscCmds() {
		p := runscProc{pid: c.pid, ppid: ppidOf(c.pid)}
		if last := c.args[len(c.args)-1]; validID(last) {
			p.id = last
		}
		out = append(out, p)
	}
	return out
}

func ppidOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ppid …; comm may hold spaces and parentheses.
	if i := bytes.LastIndexByte(b, ')'); i > 0 {
		if f := strings.Fields(string(b[i+1:])); len(f) >= 2 {
			ppid, _ := strconv.Atoi(f[1])
			return ppid
		}
	}
	return 0
}

// endStrays SIGKILLs the runsc processes of the driver's root that serve
// no container keep accepts and are not this process's own commands, and
// waits (up to 10 s) for them to be gone.
func (r *Runtime) endStrays(ctx context.Context, keep func(id string) bool) error {
	self := os.Getpid()
	var pidfds []int
	defer func() {
		for _, fd := range pidfds {
			unix.Close(fd)
		}
	}()
	for _, p := range r.runscProcs() {
		if p.ppid == self || (p.id != "" && keep(p.id)) {
			continue
		}
		// Through a pidfd, so that a pid reused meanwhile is not hit.
		fd, err := unix.PidfdOpen(p.pid, 0)
		if err != nil {
			continue // gone
		}
		if !slices.ContainsFunc(r.runscProcs(), func(q runscProc) bool { return q == p }) {
			unix.Close(fd)
			continue // exited and its pid reused before the pidfd
		}
		r.log.Warn("gvisor: ending a runsc process of no live sandbox (a previous server's?)", "pid", p.pid, "sandbox", p.id)
		if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
			unix.Close(fd)
			return fmt.Errorf("gvisor: kill runsc process %d: %w", p.pid, err)
		}
		pidfds = append(pidfds, fd)
	}
	// A pidfd polls readable once its process has exited.
	deadline := time.Now().Add(10 * time.Second)
	for _, fd := range pidfds {
		for {
			n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 50)
			if n > 0 || (err != nil && !errors.Is(err, unix.EINTR)) {
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return errors.New("gvisor: runsc processes of a previous server did not end")
			}
		}
	}
	return nil
}

// Leftovers implements runtime.Runtime.
func (r *Runtime) Leftovers(id string) []string {
	var left []string
	for _, pid := range r.pidsOf(id) {
		left = append(left, fmt.Sprintf("process %d", pid))
	}
	if _, err := os.Stat(filepath.Join(r.cfg.RootDir, id)); err == nil {
		left = append(left, "runsc state "+filepath.Join(r.cfg.RootDir, id))
	}
	if entries, _ := filepath.Glob(filepath.Join(r.cfg.RootDir, "*"+id+"*")); len(entries) > 0 {
		for _, e := range entries {
			left = append(left, "runsc state "+e)
		}
	}
	if r.cg.Exists(id) {
		left = append(left, "cgroup "+r.cfg.CgroupParent+"/"+id)
	}
	if _, err := os.Lstat(r.netnsPath(id)); err == nil {
		left = append(left, "netns file "+r.netnsPath(id))
	}
	left = append(left, r.net.Leftovers(id)...)
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(mi), "\n") {
			if strings.Contains(line, id) {
				left = append(left, "mount "+line)
			}
		}
	}
	return left
}

// Close releases what the driver keeps for all its sandboxes: the parent
// cgroup, the (empty) directory of outbound sandboxes' network namespaces,
// and the shared empty network namespace runsc bind-mounts in its root for
// --network=none. Call it after every sandbox is destroyed.
func (r *Runtime) Close() error {
	err := cgroups.RemoveParent(r.cfg.CgroupParent)
	if rerr := os.Remove(filepath.Join(r.cfg.RootDir, netnsDir)); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, fmt.Errorf("gvisor: %w", rerr))
	}
	p := filepath.Join(r.cfg.RootDir, "null-netns")
	if _, serr := os.Stat(p); serr != nil {
		return err
	}
	// runsc does not serialise creating it: concurrent starts stack bind
	// mounts on the same path. Unmount until none is left.
	for syscall.Unmount(p, syscall.MNT_DETACH) == nil {
	}
	if rerr := os.Remove(p); rerr != nil {
		err = errors.Join(err, fmt.Errorf("gvisor: %w", rerr))
	}
	return err
}

// SetEgress limits an outbound sandbox's egress (runtime.EgressFilter).
func (s *sandbox) SetEgress(ctx context.Context, r *netrules.Rules) error {
	if s.net == nil {
		return fmt.Errorf("gvisor: sandbox %s has no network", s.id)
	}
	return s.r.net.SetEgress(ctx, s.net.lease, r)
}
