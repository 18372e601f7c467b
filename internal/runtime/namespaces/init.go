package namespaces

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	goruntime "runtime"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/evalbox/evalbox/internal/runtime"
	"github.com/evalbox/evalbox/internal/runtime/network"
)

// initArg0 is argv[0] of the re-executed binary when it must act as the
// init stage of a new sandbox.
const initArg0 = "evalbox-namespaces-init"

// initFD is the fd on which the init stage receives its config (until EOF)
// and reports a setup error. It is close-on-exec in the agent, so the host
// reads EOF without data once the agent runs.
const initFD = 3

// initConfig is what the host sends to the init stage, after the
// descriptors (initFileRoot, initFileAgent, and initFileCgroup when Cgroup
// is set).
type initConfig struct {
	AgentArgs []string `json:"agent_args"`
	Env       []string `json:"env"`
	// MountPoint is a host directory the init stage mounts the sandbox's
	// disk (a tmpfs) on, in its own mount namespace only.
	MountPoint string `json:"mount_point"`
	// Cgroup says that a delegated cgroup2 directory is passed for the
	// agent.
	Cgroup     bool   `json:"cgroup"`
	DiskMB     int    `json:"disk_mb"`
	ShmMB      int    `json:"shm_mb"`
	Hostname   string `json:"hostname"`
	Outbound   bool   `json:"outbound"`
	ResolvConf string `json:"resolv_conf,omitempty"`
	// Seccomp is the assembled BPF program (struct sock_filter array).
	Seccomp []byte `json:"seccomp"`
	// Upper says that an archive is passed (the last descriptor) that the
	// sandbox's copy-on-write layer starts with (importUpper).
	Upper bool `json:"upper"`
}

// The descriptors the host passes to the init stage, in this order.
const (
	// initFileRoot is the template root filesystem: a detached mount,
	// id-mapped into the sandbox's user namespace, read-only.
	initFileRoot = iota
	// initFileAgent is the agent binary (a sealed memfd).
	initFileAgent
	// initFileCgroup is the sandbox's cgroup2 directory, delegated to its
	// root: the agent makes a cgroup per command below it (when
	// initConfig.Cgroup is set).
	initFileCgroup
	// Then, when initConfig.Upper is set, the archive of a layer to start
	// with (read-only).
	maxInitFiles = initFileCgroup + 2
)

// The init stage's reply on initFD: on success, one zero byte carrying
// the descriptor of the sandbox's upper directory (the host exports the
// layer through it), then EOF at the agent's exec; on failure, the error
// as text.

// agentCgroupEnv tells the agent the descriptor of its delegated cgroup
// directory ("fd:N"); the agent removes it from its environment. It must
// equal agentproto.CgroupEnv (a test holds them equal: this package does
// not import the agent's).
const agentCgroupEnv = "EVALBOX_AGENT_CGROUP"

// Init runs the init stage of a sandbox when the process was started as
// one by Runtime.Start, and never returns in that case: it builds the
// sandbox's root filesystem, hardens itself and replaces itself with the
// agent (or exits with an error reported to the host). In every other
// process it returns at once, doing nothing.
//
// The binary that uses this package (cmd/evalbox, and the test binary of any
// package that starts namespaces sandboxes, from TestMain) must call Init
// first thing in main, before flag parsing, logging setup or any goroutine:
//
//	func main() {
//		namespaces.Init()
//		...
//	}
//
// Package init functions still run before it, so they should stay cheap:
// they are on the sandbox cold-start path.
func Init() {
	if len(os.Args) != 1 || os.Args[0] != initArg0 {
		return
	}
	// Capabilities, no_new_privs, seccomp and cgroup namespace are per
	// thread: set them on the thread that calls execve.
	goruntime.LockOSThread()
	err := runInit()
	msg := []byte("init stage: " + err.Error())
	for len(msg) > 0 {
		n, werr := unix.Write(initFD, msg)
		if werr != nil || n <= 0 {
			break
		}
		msg = msg[n:]
	}
	os.Exit(1)
}

// runInit performs the setup and execs the agent; it only returns errors.
//
// It runs as root of the sandbox's new user namespace (host id: the first
// of the sandbox's id block), with every capability there and none on the
// host. It inherited from the host's fork thread the securebit that keeps
// capabilities across uid changes: cleared first, or a command the agent
// runs as another user would keep root's capabilities.
func runInit() error {
	cfg, files, err := readInitConfig()
	if err != nil {
		return err
	}
	if err := unix.Prctl(unix.PR_SET_SECUREBITS, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("clear securebits: %w", err)
	}
	unix.CloseOnExec(initFD)
	// Whatever else was inherited (a host fd without O_CLOEXEC) must not
	// reach the agent. Marking beats closing: the Go runtime's own fds
	// stay usable until exec.
	if err := unix.CloseRange(initFD+1, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fmt.Errorf("close_range: %w", err)
	}
	want := initFileCgroup
	if cfg.Cgroup {
		want++
	}
	if cfg.Upper {
		want++
	}
	if len(files) != want {
		return fmt.Errorf("got %d descriptors from the host, want %d", len(files), want)
	}
	upperTar := -1
	if cfg.Upper {
		upperTar = files[len(files)-1]
	}
	// The host has placed us in the sandbox cgroup before sending the
	// config: make it the root of our cgroup namespace.
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("unshare cgroup namespace: %w", err)
	}
	unix.Umask(0)
	if err := setupNetwork(cfg); err != nil {
		return err
	}
	upper, err := setupRoot(cfg, files[initFileRoot], upperTar)
	if err != nil {
		return err
	}
	if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	if err := writeEtc(cfg); err != nil {
		return err
	}
	unix.Umask(0o022)
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := harden(cfg.Seccomp); err != nil {
		return err
	}
	env := cfg.Env
	if env == nil {
		env = []string{}
	}
	if cfg.Cgroup {
		// The agent keeps this descriptor: it is how it reaches its
		// cgroup (no cgroup filesystem is mounted in the sandbox).
		cgfd := files[initFileCgroup]
		if _, err := unix.FcntlInt(uintptr(cgfd), unix.F_SETFD, 0); err != nil {
			return fmt.Errorf("cgroup descriptor: %w", err)
		}
		env = append(env[:len(env):len(env)], agentCgroupEnv+"=fd:"+strconv.Itoa(cgfd))
	}
	// The upper directory goes to the host, not to the agent (it is
	// close-on-exec here).
	if err := sendFD(initFD, upper); err != nil {
		return fmt.Errorf("send the layer's descriptor: %w", err)
	}
	argv := append([]string{runtime.AgentGuestPath}, cfg.AgentArgs...)
	// The agent runs from its memfd (through /proc, as fexecve does): no
	// host path of it is mounted in the sandbox.
	exe := "/proc/self/fd/" + strconv.Itoa(files[initFileAgent])
	if err := unix.Exec(exe, argv, env); err != nil {
		return fmt.Errorf("exec agent: %w", err)
	}
	return errors.New("exec returned")
}

// sendFD sends the zero byte of a successful reply with fd.
func sendFD(sock, fd int) error {
	for {
		err := unix.Sendmsg(sock, []byte{0}, unix.UnixRights(fd), nil, 0)
		if err != unix.EINTR {
			return err
		}
	}
}

// readInitConfig receives the host's descriptors (on the first byte) and
// then its config, until EOF.
func readInitConfig() (*initConfig, []int, error) {
	one := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(maxInitFiles*4))
	var n, oobn int
	var err error
	for {
		n, oobn, _, _, err = unix.Recvmsg(initFD, one, oob, unix.MSG_CMSG_CLOEXEC)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil || n != 1 {
		return nil, nil, fmt.Errorf("receive descriptors: %v (%d bytes)", err, n)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, nil, fmt.Errorf("receive descriptors: %v (%d messages)", err, len(msgs))
	}
	files, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(files) != int(one[0]) {
		return nil, nil, fmt.Errorf("receive descriptors: %v (%d of %d)", err, len(files), one[0])
	}
	buf := make([]byte, 0, 4096)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := unix.Read(initFD, buf[len(buf):cap(buf)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("read config: %w", err)
		}
		if n == 0 {
			break
		}
		buf = buf[:len(buf)+n]
	}
	cfg := new(initConfig)
	if err := json.Unmarshal(buf, cfg); err != nil {
		return nil, nil, fmt.Errorf("decode config: %w", err)
	}
	return cfg, files, nil
}

// setupNetwork brings up lo in the new network namespace. With outbound
// networking the host has already moved and configured eth0; IPv6 is
// turned off on it so that only the IPv4 path with its NAT and filter
// rules exists.
func setupNetwork(cfg *initConfig) error {
	if err := network.LoopbackUp(); err != nil {
		return err
	}
	if cfg.Outbound {
		// /proc/sys/net resolves to the opener's network namespace.
		if err := writeSysctl("/proc/sys/net/ipv6/conf/"+guestIface+"/disable_ipv6", "1"); err != nil && !errors.Is(err, unix.ENOENT) {
			return err
		}
	}
	return nil
}

// setupRoot builds the sandbox's root and pivots into it. Everything
// mounted here lives only in the sandbox's mount namespace and vanishes
// with its last process. rootTree is the template (see initFileRoot).
//
// The sandbox's root has no rights over host paths, so the disk is a new
// tmpfs mounted on cfg.MountPoint (a directory anyone may search), the
// overlay names its layers relative to it (mountinfo shows no host path),
// and proc and sysfs, which a user namespace may only mount while the
// host's instances are fully visible, are made before the pivot and
// attached after it.
//
// With upperTar (an archive's descriptor, else -1) the copy-on-write layer
// starts with the archive's files. It returns a descriptor of the layer's
// directory (close-on-exec).
func setupRoot(cfg *initConfig, rootTree, upperTar int) (int, error) {
	// Nothing we mount may propagate back to the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return -1, fmt.Errorf("make / private: %w", err)
	}
	// The sandbox disk: a tmpfs of DiskMB holding the overlay's upper and
	// work directories (and the mount points of the template and of the
	// merged root).
	opts := []string{"mode", "0700"}
	if cfg.DiskMB > 0 {
		opts = append(opts, "size", strconv.Itoa(cfg.DiskMB)+"m")
	}
	disk, err := newMount("tmpfs", unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV, opts...)
	if err != nil {
		return -1, err
	}
	if err := unix.MoveMount(disk, "", unix.AT_FDCWD, cfg.MountPoint, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return -1, fmt.Errorf("attach disk on %s: %w", cfg.MountPoint, err)
	}
	if err := unix.Fchdir(disk); err != nil {
		return -1, fmt.Errorf("enter disk: %w", err)
	}
	for _, d := range []string{"lower", "upper", "work", "root"} {
		if err := unix.Mkdir(d, 0o755); err != nil {
			return -1, fmt.Errorf("mkdir %s: %w", d, err)
		}
	}
	upper, err := beneath(disk, "upper", unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return -1, fmt.Errorf("open upper: %w", err)
	}
	if upperTar >= 0 {
		f := os.NewFile(uintptr(upperTar), "upper.tar")
		err := importUpper(upper, bufio.NewReaderSize(f, 1<<20))
		f.Close()
		if err != nil {
			return -1, err
		}
	}
	if err := unix.MoveMount(rootTree, "", unix.AT_FDCWD, "lower", unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return -1, fmt.Errorf("attach template: %w", err)
	}
	// nodev/nosuid: device nodes and set-id binaries in the template are
	// inert.
	if err := unix.Mount("overlay", "root", "overlay", unix.MS_NOSUID|unix.MS_NODEV, "lowerdir=lower,upperdir=upper,workdir=work,userxattr"); err != nil {
		return -1, fmt.Errorf("mount overlay: %w", err)
	}
	proc, err := newMount("proc", unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return -1, err
	}
	sys, err := newMount("sysfs", unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return -1, err
	}
	// A user namespace may not make device nodes: the sandbox's are bind
	// mounts of the host's (detached copies, attached after the pivot).
	devs := make([]int, len(devNodes))
	for i, n := range devNodes {
		if devs[i], err = unix.OpenTree(unix.AT_FDCWD, "/dev/"+n, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC); err != nil {
			return -1, fmt.Errorf("device %s: %w", n, err)
		}
	}

	// pivot_root(".", ".") stacks the old root on top of the new one; the
	// detach removes it, so no host path stays reachable.
	if err := unix.Chdir("root"); err != nil {
		return -1, err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return -1, fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return -1, fmt.Errorf("detach old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return -1, err
	}
	// From here on every path resolves inside the sandbox root, so a
	// symlink in the template cannot point a mount or a write at the host.
	if err := attach(proc, "/proc", 0o555); err != nil {
		return -1, err
	}
	if err := limitNesting(); err != nil {
		return -1, err
	}
	if err := mountDev(cfg.ShmMB, devs); err != nil {
		return -1, err
	}
	if err := attach(sys, "/sys", 0o555); err != nil {
		return -1, err
	}
	for _, p := range sysMasked {
		if err := maskDir(p); err != nil {
			return -1, err
		}
	}
	if err := maskProc(); err != nil {
		return -1, err
	}
	return upper, nil
}

// newMount makes a detached mount of a new fstype instance with the given
// mount attributes and fsconfig key/value options.
func newMount(fstype string, attrs int, opts ...string) (int, error) {
	fs, err := unix.Fsopen(fstype, unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen %s: %w", fstype, err)
	}
	defer unix.Close(fs)
	for i := 0; i+1 < len(opts); i += 2 {
		if err := unix.FsconfigSetString(fs, opts[i], opts[i+1]); err != nil {
			return -1, fmt.Errorf("%s option %s=%s: %w", fstype, opts[i], opts[i+1], err)
		}
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("create %s: %w", fstype, err)
	}
	m, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, attrs)
	if err != nil {
		return -1, fmt.Errorf("fsmount %s: %w", fstype, err)
	}
	return m, nil
}

// attach attaches the detached mount fd at the directory p (made if
// missing).
func attach(fd int, p string, mode uint32) error {
	if err := mkdirIfMissing(p, mode); err != nil {
		return err
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, p, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach %s: %w", p, err)
	}
	return nil
}

// limitNesting forbids user namespaces inside the sandbox (its
// /proc/sys/user is its own namespace's; /proc/sys becomes read-only
// below). Seccomp refuses unshare and clone with CLONE_NEWUSER, but not
// clone3, whose flags are out of a filter's reach: the limit stops it.
func limitNesting() error {
	if err := writeSysctl("/proc/sys/user/max_user_namespaces", "0"); err != nil {
		return fmt.Errorf("limit user namespaces: %w", err)
	}
	return nil
}

// devNodes are the character devices of the sandbox's /dev, bound from the
// host's. /dev/tty opens the caller's controlling terminal, and no process
// of a sandbox has one (its init starts a new session): ENXIO.
var devNodes = []string{"null", "zero", "full", "random", "urandom", "tty"}

var devLinks = [][2]string{
	{"/proc/self/fd", "/dev/fd"},
	{"/proc/self/fd/0", "/dev/stdin"},
	{"/proc/self/fd/1", "/dev/stdout"},
	{"/proc/self/fd/2", "/dev/stderr"},
	{"pts/ptmx", "/dev/ptmx"},
}

func mountDev(shmMB int, devs []int) error {
	if err := mkdirIfMissing("/dev", 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", "/dev", "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=1m,nr_inodes=256"); err != nil {
		return fmt.Errorf("mount /dev: %w", err)
	}
	for i, n := range devNodes {
		p := "/dev/" + n
		if err := touch(p, 0o666); err != nil {
			return err
		}
		if err := unix.MoveMount(devs[i], "", unix.AT_FDCWD, p, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("attach %s: %w", p, err)
		}
	}
	for _, l := range devLinks {
		if err := unix.Symlink(l[0], l[1]); err != nil {
			return fmt.Errorf("symlink %s: %w", l[1], err)
		}
	}
	if err := unix.Mkdir("/dev/pts", 0o755); err != nil {
		return err
	}
	if err := unix.Mount("devpts", "/dev/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5"); err != nil {
		return fmt.Errorf("mount /dev/pts: %w", err)
	}
	if err := unix.Mkdir("/dev/shm", 0o1777); err != nil {
		return err
	}
	opts := "mode=1777"
	if shmMB > 0 {
		opts += ",size=" + strconv.Itoa(shmMB) + "m"
	}
	if err := unix.Mount("shm", "/dev/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		return fmt.Errorf("mount /dev/shm: %w", err)
	}
	return nil
}

// sysMasked are sysfs directories hidden behind an empty read-only tmpfs:
// firmware tables and the RAPL energy counters (a power side channel).
var sysMasked = []string{"/sys/firmware", "/sys/devices/virtual/powercap"}

// Paths of /proc made read-only (kernel tunables: a root process without
// CAP_SYS_ADMIN can still write many sysctls, e.g. core_pattern) or hidden.
var (
	procReadOnly   = []string{"/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs"}
	procMaskedFile = []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/latency_stats", "/proc/kmsg",
		// Kernel heap and address-space layout (also closed to the
		// sandbox's root by the user namespace: defense in depth).
		"/proc/slabinfo", "/proc/vmallocinfo", "/proc/kpagecount", "/proc/kpageflags", "/proc/kpagecgroup", "/proc/pagetypeinfo"}
	procMaskedDir = []string{"/proc/acpi", "/proc/scsi", "/proc/driver"}
)

func maskProc() error {
	for _, p := range procReadOnly {
		err := unix.Mount(p, p, "", unix.MS_BIND|unix.MS_REC, "")
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return fmt.Errorf("bind %s: %w", p, err)
		}
		if err := unix.Mount(p, p, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("remount %s read-only: %w", p, err)
		}
	}
	for _, p := range procMaskedFile {
		err := unix.Mount("/dev/null", p, "", unix.MS_BIND, "")
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("mask %s: %w", p, err)
		}
	}
	for _, p := range procMaskedDir {
		if err := maskDir(p); err != nil {
			return err
		}
	}
	return nil
}

func maskDir(p string) error {
	err := unix.Mount("tmpfs", p, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,nr_inodes=1")
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("mask %s: %w", p, err)
	}
	return nil
}

// writeEtc writes the sandbox's /etc/hostname, /etc/hosts and, for
// outbound networking, /etc/resolv.conf (into the overlay).
func writeEtc(cfg *initConfig) error {
	if err := mkdirIfMissing("/etc", 0o755); err != nil {
		return err
	}
	if cfg.Hostname != "" {
		if err := writeFileAt("/etc/hostname", cfg.Hostname+"\n"); err != nil {
			return err
		}
		hosts := "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t" + cfg.Hostname + "\n"
		if err := writeFileAt("/etc/hosts", hosts); err != nil {
			return err
		}
	}
	if cfg.ResolvConf != "" {
		if err := writeFileAt("/etc/resolv.conf", cfg.ResolvConf); err != nil {
			return err
		}
	}
	return nil
}

// writeFileAt replaces the file at p (a symlink there is replaced, not
// followed).
func writeFileAt(p, content string) error {
	if err := unix.Unlink(p); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EISDIR) {
		return fmt.Errorf("replace %s: %w", p, err)
	}
	fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, []byte(content)); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	return nil
}

func writeSysctl(p, v string) error {
	fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	_, err = unix.Write(fd, []byte(v))
	return err
}

func mkdirIfMissing(p string, mode uint32) error {
	if err := unix.Mkdir(p, mode); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("mkdir %s: %w", p, err)
	}
	return nil
}

func touch(p string, mode uint32) error {
	// O_RDONLY: an existing file in the lower layer is not copied up.
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if err != nil {
		return fmt.Errorf("create %s: %w", p, err)
	}
	return unix.Close(fd)
}

// harden limits what the agent and its descendants may do: core dumps
// off, the capability bounding set cut down to keepCaps, no_new_privs, and
// the seccomp filter. All of it is per thread and survives execve.
func harden(filter []byte) error {
	if err := unix.Setgroups(nil); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{}); err != nil {
		return fmt.Errorf("rlimit core: %w", err)
	}
	last, err := lastCap()
	if err != nil {
		return err
	}
	var keep uint64
	for _, c := range keepCaps {
		keep |= 1 << c
	}
	for c := 0; c <= last; c++ {
		if keep&(1<<c) != 0 {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return fmt.Errorf("drop capability %d: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := [2]unix.CapUserData{
		{Effective: uint32(keep), Permitted: uint32(keep)},
		{Effective: uint32(keep >> 32), Permitted: uint32(keep >> 32)},
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	if len(filter) == 0 || len(filter)%int(unsafe.Sizeof(unix.SockFilter{})) != 0 {
		return errors.New("invalid seccomp program")
	}
	insts := make([]unix.SockFilter, len(filter)/int(unsafe.Sizeof(unix.SockFilter{})))
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&insts[0])), len(filter)), filter)
	prog := unix.SockFprog{Len: uint16(len(insts)), Filter: &insts[0]}
	if _, _, errno := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&prog))); errno != 0 {
		return fmt.Errorf("install seccomp filter: %w", errno)
	}
	goruntime.KeepAlive(insts)
	return nil
}

func lastCap() (int, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, fmt.Errorf("read cap_last_cap: %w", err)
	}
	n, err := strconv.Atoi(string(b[:len(b)-1]))
	if err != nil {
		return 0, fmt.Errorf("parse cap_last_cap: %w", err)
	}
	return n, nil
}
