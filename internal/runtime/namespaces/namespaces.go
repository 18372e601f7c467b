package namespaces

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/evalbox/evalbox/internal/runtime"
	"github.com/evalbox/evalbox/internal/runtime/cgroups"
	"github.com/evalbox/evalbox/internal/runtime/network"
)

// Name is the runtime's API name.
const Name = "namespaces"

// driverVersion is bumped when the sandbox environment changes in a way a
// result may depend on (mounts, capabilities, seccomp rules).
const driverVersion = "namespaces/2"

// guestIface is the name of the sandbox's network interface (outbound).
const guestIface = network.GuestIface

// DefaultCgroupParent is the default Config.CgroupParent.
const DefaultCgroupParent = "evalbox-namespaces"

// AgentLogName is the file in Spec.StateDir that receives the agent's
// stderr (and the init stage's, should it crash).
const AgentLogName = "agent.log"

// agentSpareThreads is the threads the agent keeps idle from its start
// (agent.KeepSpareThreads): its commands share the sandbox's pids limit
// with it, and a fork bomb that takes every pid left must not leave the
// agent's Go runtime without a thread.
const agentSpareThreads = 32

// Config configures the namespaces runtime. The zero value is usable.
type Config struct {
	// CgroupParent is the parent cgroup of all sandboxes (relative to the
	// hierarchy root); default "evalbox-namespaces" (each driver has its
	// own parent, so that one driver's Sweep never touches another's).
	CgroupParent string
	// Logger receives operational logs; default slog.Default().
	Logger *slog.Logger
	// InitPath is the binary a sandbox's init stage runs: one whose main
	// calls Init first (cmd/evalbox-nsinit; empty: the running binary,
	// /proc/self/exe). It is run once per sandbox start, so a small one
	// starts sandboxes faster: a binary that links more packages runs
	// more init functions before Init (evalbox's own took 9.8 ms to
	// evalbox-nsinit's fraction of one).
	InitPath string

	// Network provides outbound networking (addresses, host rules). Every
	// driver of a process must share one Manager, so that no two
	// sandboxes get the same addresses. Nil: the runtime makes its own,
	// with default settings and CgroupParent as its scope.
	Network *network.Manager
	// AgentLogLimit caps StateDir/agent.log (the agent's stderr) in bytes;
	// output beyond it is discarded. Default 8 MiB.
	AgentLogLimit int64

	// IDBase and IDBlocks are the host ids sandboxes' user namespaces map:
	// IDBlocks blocks of 65536 ids from IDBase (default DefaultIDBase and
	// DefaultIDBlocks: 0x60000000–0x6fffffff). No host user may use them.
	IDBase   uint32
	IDBlocks int
	// IDLockFile is the host-wide lock file through which the evalbox
	// servers of a host share the id blocks (default DefaultIDLockFile).
	IDLockFile string
	// MountPoint is an empty host directory that every user may search,
	// on which each sandbox's init stage mounts its disk in its own mount
	// namespace (no mount is ever visible on the host; all sandboxes use
	// the same directory). Default DefaultMountPoint.
	MountPoint string
}

// DefaultMountPoint is the default Config.MountPoint.
const DefaultMountPoint = "/run/evalbox/mnt"

// Runtime is the namespaces sandbox driver. It is safe for concurrent use.
type Runtime struct {
	parent   string // cgroup parent
	cg       *cgroups.Manager
	log      *slog.Logger
	version  string
	filter   []byte // assembled seccomp program
	netm     *network.Manager
	net      *network.Links // this driver's view of netm
	logLimit int64
	ids      *idBlocks
	agents   agentImages
	mntPoint string
	initPath string // the init stage's binary

	mu       sync.Mutex
	live     map[string]*Sandbox // started and not destroyed
	starting map[string]struct{} // ids inside Start
}

var _ runtime.Runtime = (*Runtime)(nil)

// oomScoreAdj is the OOM score adjustment of sandbox processes.
const oomScoreAdj = "800"

// New returns a namespaces runtime. It needs root (CAP_SYS_ADMIN and
// friends in the initial user namespace) and a cgroup v1 or v2 host.
func New(cfg Config) (*Runtime, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("namespaces: runtime needs root")
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = DefaultCgroupParent
	}
	cg, err := cgroups.New(cfg.CgroupParent, cgroups.WithUnified())
	if err != nil {
		return nil, fmt.Errorf("namespaces: %w", err)
	}
	mnt := cmp.Or(cfg.MountPoint, DefaultMountPoint)
	if err := mountPoint(mnt); err != nil {
		return nil, fmt.Errorf("namespaces: %w", err)
	}
	ids, err := newIDBlocks(cmp.Or(cfg.IDLockFile, DefaultIDLockFile), cmp.Or(cfg.IDBase, DefaultIDBase), cmp.Or(cfg.IDBlocks, DefaultIDBlocks))
	if err != nil {
		return nil, fmt.Errorf("namespaces: %w", err)
	}
	filter, err := buildSeccomp()
	if err != nil {
		return nil, fmt.Errorf("namespaces: %w", err)
	}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return nil, fmt.Errorf("namespaces: uname: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	netm := cfg.Network
	if netm == nil {
		if netm, err = network.New(network.Config{Scope: cfg.CgroupParent, Logger: log}); err != nil {
			return nil, fmt.Errorf("namespaces: %w", err)
		}
	}
	links, err := netm.Links(Name)
	if err != nil {
		return nil, fmt.Errorf("namespaces: %w", err)
	}
	return &Runtime{
		parent:   cfg.CgroupParent,
		cg:       cg,
		log:      log,
		version:  fmt.Sprintf("%s linux/%s cgroup/v%d", driverVersion, unix.ByteSliceToString(uts.Release[:]), cg.Version()),
		filter:   filter,
		netm:     netm,
		net:      links,
		logLimit: cmp.Or(cfg.AgentLogLimit, 8<<20),
		ids:      ids,
		mntPoint: mnt,
		initPath: cmp.Or(cfg.InitPath, "/proc/self/exe"),
		live:     make(map[string]*Sandbox),
		starting: make(map[string]struct{}),
	}, nil
}

// mountPoint makes sure dir is an empty directory that every user may
// search (its parents too), as the init stages need.
func mountPoint(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("mount point %q is not absolute", dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for p := dir; ; p = filepath.Dir(p) {
		st, err := os.Stat(p)
		if err != nil {
			return err
		}
		if st.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("mount point %s: %s is not searchable by other users (mode %v), which a sandbox's unprivileged init stage needs", dir, p, st.Mode().Perm())
		}
		if p == "/" {
			return nil
		}
	}
}

// Close removes the runtime's parent cgroup once its sandboxes are gone
// (call it after destroying them all) and releases what the runtime holds.
func (r *Runtime) Close() error {
	r.agents.close()
	return errors.Join(cgroups.RemoveParent(r.parent), r.ids.close())
}

// Name returns "namespaces".
func (r *Runtime) Name() string { return Name }

// Version returns the driver version, kernel release and cgroup version,
// e.g. "namespaces/1 linux/6.1.0 cgroup/v2".
func (r *Runtime) Version() string { return r.version }

// cgroupLimits are the limits of a sandbox's cgroup. Its disk is a tmpfs
// whose pages are charged to the cgroup of the processes that write them:
// it counts inside MemoryMB.
func cgroupLimits(spec runtime.Spec) cgroups.Limits {
	return cgroups.Limits{CPU: spec.CPU, MemoryBytes: int64(spec.MemoryMB) << 20, Pids: spec.Pids}
}

// HostCost implements runtime.Runtime: the limits of the sandbox's cgroup,
// which holds every process of the sandbox (its init stage included).
func (r *Runtime) HostCost(spec runtime.Spec) runtime.Resources {
	l := cgroupLimits(spec)
	return runtime.Resources{Pids: int64(l.Pids), MemoryBytes: l.MemoryBytes}
}

// validID reports whether id matches ^[a-z0-9][a-z0-9-]{0,47}$ (checked
// by hand: a package-level regexp would be compiled in every sandbox's
// init stage too).
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

func validate(spec *runtime.Spec) error {
	if !validID(spec.ID) {
		return fmt.Errorf("invalid sandbox id %q", spec.ID)
	}
	for _, p := range [][2]string{{"RootFS", spec.RootFS}, {"AgentPath", spec.AgentPath}, {"StateDir", spec.StateDir}} {
		if !filepath.IsAbs(p[1]) {
			return fmt.Errorf("%s must be an absolute path, got %q", p[0], p[1])
		}
	}
	// Overlay mount options separate with ',' and ':'.
	for _, p := range []string{spec.RootFS, spec.StateDir} {
		if strings.ContainsAny(p, ",:\\") {
			return fmt.Errorf("path %q contains one of , : \\", p)
		}
	}
	if st, err := os.Stat(spec.RootFS); err != nil || !st.IsDir() {
		return fmt.Errorf("root filesystem %q is not a directory", spec.RootFS)
	}
	if st, err := os.Stat(spec.StateDir); err != nil || !st.IsDir() {
		return fmt.Errorf("state dir %q is not a directory", spec.StateDir)
	}
	if st, err := os.Stat(spec.AgentPath); err != nil || !st.Mode().IsRegular() {
		return fmt.Errorf("agent %q is not a regular file", spec.AgentPath)
	}
	if spec.CPU < 0 || spec.MemoryMB < 0 || spec.DiskMB < 0 || spec.Pids < 0 {
		return errors.New("negative limit")
	}
	switch spec.Network {
	case "", runtime.NetworkNone, runtime.NetworkOutbound:
	default:
		return fmt.Errorf("unknown network mode %q", spec.Network)
	}
	if len(spec.Hostname) > 64 {
		return fmt.Errorf("hostname %q too long", spec.Hostname)
	}
	return nil
}

// Start starts a sandbox whose first process (PID 1 of its namespaces) is
// the agent. It returns once the agent has been exec'd; on error nothing of
// the sandbox is left behind.
func (r *Runtime) Start(ctx context.Context, spec runtime.Spec) (runtime.Sandbox, error) {
	return r.start(ctx, spec, "")
}

// StartWithUpper implements runtime.UpperImporter: the init stage writes
// the archive upperTar into the sandbox's copy-on-write layer before it
// mounts the overlay.
func (r *Runtime) StartWithUpper(ctx context.Context, spec runtime.Spec, upperTar string) (runtime.Sandbox, error) {
	if upperTar == "" {
		return nil, errors.New("namespaces: no archive to start from")
	}
	return r.start(ctx, spec, upperTar)
}

var _ runtime.UpperImporter = (*Runtime)(nil)

func (r *Runtime) start(ctx context.Context, spec runtime.Spec, upperTar string) (_ runtime.Sandbox, retErr error) {
	if err := validate(&spec); err != nil {
		return nil, fmt.Errorf("namespaces: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// The id is reserved while starting (Sweep leaves it alone) and the
	// sandbox becomes live once started.
	r.mu.Lock()
	_, live := r.live[spec.ID]
	_, starting := r.starting[spec.ID]
	if live || starting {
		r.mu.Unlock()
		return nil, fmt.Errorf("namespaces: sandbox %s already exists", spec.ID)
	}
	r.starting[spec.ID] = struct{}{}
	r.mu.Unlock()
	s := &Sandbox{rt: r, id: spec.ID, done: make(chan struct{}), upper: -1}

	var cleanups []func()
	defer func() {
		if retErr != nil {
			for _, f := range slices.Backward(cleanups) {
				f()
			}
		}
		r.mu.Lock()
		delete(r.starting, spec.ID)
		if retErr == nil {
			r.live[spec.ID] = s
		}
		r.mu.Unlock()
	}()

	// The block of host ids goes back once every process of the sandbox
	// is gone: the cleanups below it (which kill them) run first.
	blk, err := r.ids.acquire()
	if err != nil {
		return nil, fmt.Errorf("namespaces: %w", err)
	}
	s.ids = blk
	cleanups = append(cleanups, func() { r.ids.release(blk) })

	cg, err := r.cg.Create(spec.ID, cgroupLimits(spec))
	if err != nil {
		if errors.Is(err, cgroups.ErrExist) {
			return nil, fmt.Errorf("namespaces: %w (a leftover of an earlier run? Sweep removes it)", err)
		}
		return nil, fmt.Errorf("namespaces: %w", err)
	}
	s.cg = cg
	cleanups = append(cleanups, func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := cg.KillAll(cctx); err != nil {
			r.log.Error("namespaces: kill after failed start", "id", spec.ID, "err", err)
		}
		if err := cg.Remove(cctx); err != nil {
			r.log.Error("namespaces: remove cgroup after failed start", "id", spec.ID, "err", err)
		}
	})

	// The files the sandbox gets (its ends of the pipes, the control
	// socket and the log) are closed in the host as soon as the child has
	// them, so that EOF on the host ends means the sandbox is gone.
	var childFiles []*os.File
	closeChildFiles := func() {
		for _, f := range childFiles {
			f.Close()
		}
		childFiles = nil
	}
	defer closeChildFiles()
	// The agent's stderr goes through a pipe into StateDir/agent.log, cut
	// at r.logLimit bytes so that a chatty sandbox cannot fill the host disk.
	logf, err := os.OpenFile(filepath.Join(spec.StateDir, AgentLogName), os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("namespaces: agent log: %w", err)
	}
	logR, logW, err := pipe(true)
	if err != nil {
		logf.Close()
		return nil, err
	}
	childFiles = append(childFiles, logW)
	s.logDone = make(chan struct{})
	go copyLog(logf, logR, r.logLimit, s.logDone)
	// The agent's stdin and stdout. The host ends are non-blocking (Go's
	// poller, so Close unblocks a Read); the sandbox ends stay blocking.
	inR, inW, err := pipe(false)
	if err != nil {
		return nil, err
	}
	childFiles = append(childFiles, inR)
	outR, outW, err := pipe(true)
	if err != nil {
		inW.Close()
		return nil, err
	}
	childFiles = append(childFiles, outW)
	s.conn = &conn{r: outR, w: inW}
	cleanups = append(cleanups, func() { s.conn.Close() })
	// The control socket: config to the init stage, errors back.
	socks, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("namespaces: socketpair: %w", err)
	}
	if err := unix.SetNonblock(socks[0], true); err != nil {
		unix.Close(socks[0])
		unix.Close(socks[1])
		return nil, fmt.Errorf("namespaces: socketpair: %w", err)
	}
	// Non-blocking: served by the poller, so ctx can cut the wait short.
	ctl := os.NewFile(uintptr(socks[0]), "init-control")
	defer ctl.Close()
	childCtl := os.NewFile(uintptr(socks[1]), "init-control-child")
	childFiles = append(childFiles, childCtl)

	hostID := int(blk.hostID)
	cmd := &exec.Cmd{
		Path:       r.initPath,
		Args:       []string{initArg0},
		Env:        []string{},
		Dir:        "/",
		Stdin:      inR,
		Stdout:     outW,
		Stderr:     logW,
		ExtraFiles: []*os.File{childCtl}, // fd 3 (initFD)
		SysProcAttr: &syscall.SysProcAttr{
			// The user namespace comes first (the kernel makes it the
			// owner of the others): sandbox ids 0–65535 are the block's
			// host ids, and nothing else is mapped.
			Cloneflags: unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNS | unix.CLONE_NEWNET |
				unix.CLONE_NEWIPC | unix.CLONE_NEWUTS,
			UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: hostID, Size: idBlockSize}},
			GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: hostID, Size: idBlockSize}},
			GidMappingsEnableSetgroups: true,
			// A session of its own: the sandbox has no controlling
			// terminal, so nothing in it can reach the terminal the
			// server runs on (/dev/tty gives ENXIO).
			Setsid: true,
			// The sandbox cannot outlive the host process that holds
			// its pipes.
			Pdeathsig: syscall.SIGKILL,
		},
	}
	inside, release, err := cg.PrepareClone(cmd.SysProcAttr)
	if err != nil {
		return nil, fmt.Errorf("namespaces: %w", err)
	}
	err = startOnForkThread(cmd, blk.hostID)
	release()
	closeChildFiles()
	if err != nil {
		return nil, fmt.Errorf("namespaces: start init: %w", err)
	}
	s.cmd = cmd
	s.pid = cmd.Process.Pid
	// The init stage is reaped only once every use of its pid below is
	// done: until then a dead one stays a zombie, so its pid cannot name
	// another process (the kill goes through its pidfd).
	reap := sync.OnceFunc(func() { go s.wait() })
	cleanups = append(cleanups, func() {
		_ = cmd.Process.Kill()
		reap()
		<-s.done
	})
	// The init stage waits for its config: only then does it run anything
	// of the sandbox, so joining the cgroup and setting the OOM score now
	// is in time (every process of the sandbox inherits the score: when
	// the host runs out of memory, sandboxes go before the control plane).
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", s.pid), []byte(oomScoreAdj), 0); err != nil {
		return nil, fmt.Errorf("namespaces: oom_score_adj: %w", err)
	}
	if !inside {
		if err := cg.AddProc(s.pid); err != nil {
			return nil, fmt.Errorf("namespaces: %w", err)
		}
	}
	fds, closeFDs, err := r.initFiles(&spec, s.pid, hostID, cg, upperTar)
	if err != nil {
		return nil, fmt.Errorf("namespaces: %w", err)
	}
	defer closeFDs()

	icfg := initConfig{
		// The agent shares the sandbox's pids limit with its commands.
		AgentArgs:  append(spec.AgentArgs[:len(spec.AgentArgs):len(spec.AgentArgs)], fmt.Sprintf("--spare-threads=%d", agentSpareThreads)),
		Env:        spec.Env,
		MountPoint: r.mntPoint,
		DiskMB:     spec.DiskMB,
		ShmMB:      spec.MemoryMB,
		Hostname:   cmp.Or(spec.Hostname, spec.ID),
		Seccomp:    r.filter,
		Cgroup:     cg.UnifiedPath() != "",
		Upper:      upperTar != "",
	}
	if spec.Network == runtime.NetworkOutbound {
		ns, err := netns.GetFromPid(s.pid)
		if err != nil {
			return nil, fmt.Errorf("namespaces: sandbox netns: %w", err)
		}
		lease, err := r.net.Attach(ctx, spec.ID, ns)
		ns.Close()
		if err != nil {
			return nil, fmt.Errorf("namespaces: outbound network: %w", err)
		}
		s.lease = lease
		cleanups = append(cleanups, func() { r.net.Detach(lease) })
		icfg.Outbound = true
		icfg.ResolvConf = r.netm.ResolvConf()
	}
	reap()
	if s.upper, err = r.runInit(ctx, ctl, &icfg, fds); err != nil {
		return nil, fmt.Errorf("namespaces: %w", err)
	}
	cleanups = append(cleanups, s.closeUpper)
	select {
	case <-s.done:
		return nil, fmt.Errorf("namespaces: sandbox exited during start: %v (see %s)", s.exitErr, filepath.Join(spec.StateDir, AgentLogName))
	default:
	}
	return s, nil
}

// initFiles opens what the init stage gets as descriptors (in this
// order, see initFileRoot…): the template root filesystem as a detached
// mount id-mapped into the sandbox's user namespace, the agent binary (a
// sealed memfd), when the cgroup has a cgroup2 directory, that
// directory, delegated to the sandbox's root, in which the agent makes a
// cgroup per command, and the archive upperTar, if any. The caller closes
// them with the returned function once they are sent.
func (r *Runtime) initFiles(spec *runtime.Spec, pid, hostRoot int, cg *cgroups.Cgroup, upperTar string) ([]int, func(), error) {
	var fds []int
	closeAll := func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	userns, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("user namespace: %w", err)
	}
	defer unix.Close(userns)
	root, err := idmappedTree(spec.RootFS, userns)
	if err != nil {
		return nil, nil, err
	}
	fds = append(fds, root)
	agentFD, err := r.agents.get(spec.AgentPath)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	fds = append(fds, agentFD)
	if dir := cg.UnifiedPath(); dir != "" {
		if err := cg.Delegate(hostRoot, hostRoot); err != nil {
			closeAll()
			return nil, nil, err
		}
		cgFD, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("cgroup: %w", err)
		}
		fds = append(fds, cgFD)
	}
	if upperTar != "" {
		fd, err := unix.Open(upperTar, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("the layer to start from: %w", err)
		}
		fds = append(fds, fd)
	}
	return fds, closeAll, nil
}

// runInit sends the descriptors and the config to the init stage and waits
// until it execs the agent (EOF) or reports an error. It returns the
// descriptor of the sandbox's upper directory the init stage sent.
func (r *Runtime) runInit(ctx context.Context, ctl *os.File, icfg *initConfig, fds []int) (int, error) {
	b, err := json.Marshal(icfg)
	if err != nil {
		return -1, err
	}
	stop := context.AfterFunc(ctx, func() { ctl.SetDeadline(time.Now()) })
	defer stop()
	sc, err := ctl.SyscallConn()
	if err != nil {
		return -1, err
	}
	// The descriptors ride on the first byte; the config follows.
	var serr error
	if cerr := sc.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), []byte{byte(len(fds))}, unix.UnixRights(fds...), nil, 0)
		return !errors.Is(serr, unix.EAGAIN)
	}); cerr != nil || serr != nil {
		return -1, fmt.Errorf("send init descriptors: %w", errors.Join(cerr, serr))
	}
	if _, err := ctl.Write(b); err != nil {
		return -1, fmt.Errorf("send init config: %w", err)
	}
	if cerr := sc.Control(func(fd uintptr) { err = unix.Shutdown(int(fd), unix.SHUT_WR) }); cerr != nil || err != nil {
		return -1, fmt.Errorf("send init config: %w", errors.Join(cerr, err))
	}
	upper, msg, err := readInitReply(sc)
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return -1, fmt.Errorf("wait for init: %w", err)
	}
	if len(msg) > 0 || upper < 0 {
		if upper >= 0 {
			unix.Close(upper)
		}
		if len(msg) == 0 {
			msg = []byte("init stage: exited without a reply")
		}
		return -1, errors.New(string(msg))
	}
	return upper, nil
}

// readInitReply reads the init stage's reply until EOF: the descriptor it
// sent (-1 if none) and its text, without the zero byte of a success.
func readInitReply(sc syscall.RawConn) (int, []byte, error) {
	upper := -1
	var msg []byte
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4))
	for len(msg) < 64<<10 {
		var n, oobn int
		var rerr error
		if cerr := sc.Read(func(fd uintptr) bool {
			n, oobn, _, _, rerr = unix.Recvmsg(int(fd), buf, oob, unix.MSG_CMSG_CLOEXEC)
			return !errors.Is(rerr, unix.EAGAIN)
		}); cerr != nil || rerr != nil {
			if upper >= 0 {
				unix.Close(upper)
			}
			return -1, nil, errors.Join(cerr, rerr)
		}
		if oobn > 0 {
			msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
			for i := range msgs {
				got, _ := unix.ParseUnixRights(&msgs[i])
				for _, fd := range got {
					if upper < 0 {
						upper = fd
					} else {
						unix.Close(fd)
					}
				}
			}
		}
		if n == 0 {
			break
		}
		msg = append(msg, buf[:n]...)
	}
	if len(msg) > 0 && msg[0] == 0 {
		msg = msg[1:]
	}
	return upper, msg, nil
}

// Sweep kills and removes every sandbox of this driver on the host whose id
// keep rejects: its processes, cgroup and network link (a sandbox this
// Runtime started is destroyed through its handle; ids inside Start are
// skipped). It returns the ids it removed.
func (r *Runtime) Sweep(ctx context.Context, keep func(id string) bool) ([]string, error) {
	ids, err := r.cg.List()
	if err != nil {
		return nil, fmt.Errorf("namespaces: %w", err)
	}
	netIDs, err := r.net.IDs()
	if err != nil {
		return nil, fmt.Errorf("namespaces: %w", err)
	}
	for _, id := range netIDs {
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	var removed []string
	var errs []error
	for _, id := range ids {
		r.mu.Lock()
		s := r.live[id]
		_, starting := r.starting[id]
		r.mu.Unlock()
		if starting || keep(id) {
			continue
		}
		if s != nil {
			err = s.Destroy(ctx)
		} else {
			err = r.removeOrphan(ctx, id)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("sweep %s: %w", id, err))
			continue
		}
		r.log.Info("namespaces: swept sandbox", "id", id)
		removed = append(removed, id)
	}
	// The chains of rules sandboxes whose link went with their namespace.
	r.net.SweepChains(ctx)
	return removed, errors.Join(errs...)
}

// removeOrphan removes a sandbox this Runtime has no handle for.
func (r *Runtime) removeOrphan(ctx context.Context, id string) error {
	cg, err := r.cg.Open(id)
	if err != nil {
		return err
	}
	if err := cg.KillAll(ctx); err != nil {
		return err
	}
	if err := r.net.RemoveID(id); err != nil {
		return err
	}
	return cg.Remove(ctx)
}

// Leftovers lists what is left on the host of sandbox id: cgroup
// directories, processes, network links, and mounts visible in the host
// mount namespace. It is empty after Destroy.
func (r *Runtime) Leftovers(id string) []string {
	var out []string
	var pids []int
	if cg, err := r.cg.Open(id); err == nil {
		for _, p := range cg.Paths() {
			if _, err := os.Lstat(p); err == nil {
				out = append(out, "cgroup "+p)
			}
		}
		pids, _ = cg.Procs()
		for _, pid := range pids {
			out = append(out, fmt.Sprintf("process %d", pid))
		}
	}
	r.mu.Lock()
	s := r.live[id]
	r.mu.Unlock()
	if s != nil && !slices.Contains(pids, s.pid) {
		select {
		case <-s.done:
		default:
			out = append(out, fmt.Sprintf("process %d (sandbox init, not reaped)", s.pid))
		}
	}
	out = append(out, r.net.Leftovers(id)...)
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if l := sc.Text(); strings.Contains(l, "/"+id+"/") || strings.Contains(l, "/"+id+" ") {
				out = append(out, "mount "+l)
			}
		}
	}
	return out
}

// copyLog copies the agent's stderr into f until EOF, keeping at most
// limit bytes, then closes both and done.
func copyLog(f *os.File, r io.ReadCloser, limit int64, done chan<- struct{}) {
	defer close(done)
	defer r.Close()
	defer f.Close()
	n, err := io.Copy(f, io.LimitReader(r, limit))
	if err != nil || n < limit {
		return
	}
	if m, _ := io.Copy(io.Discard, r); m > 0 {
		fmt.Fprintf(f, "\n[evalbox: agent log truncated, %d bytes discarded]\n", m)
	}
}

// pipe returns a close-on-exec pipe. The host's end (the read end if
// hostReads) is non-blocking so that Go's poller serves it and Close
// unblocks pending I/O; the sandbox's end stays blocking.
func pipe(hostReads bool) (r, w *os.File, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, fmt.Errorf("namespaces: pipe: %w", err)
	}
	host := p[1]
	if hostReads {
		host = p[0]
	}
	if err := unix.SetNonblock(host, true); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return nil, nil, fmt.Errorf("namespaces: pipe: %w", err)
	}
	return os.NewFile(uintptr(p[0]), "agent-pipe-r"), os.NewFile(uintptr(p[1]), "agent-pipe-w"), nil
}
