package namespaces

import (
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

// initConfig is what the host sends to the init stage.
type initConfig struct {
	RootFS    string   `json:"rootfs"`
	AgentPath string   `json:"agent_path"`
	AgentArgs []string `json:"agent_args"`
	Env       []string `json:"env"`
	// Scratch is a host directory the init stage mounts the sandbox's
	// tmpfs on, in its own mount namespace only.
	Scratch    string `json:"scratch"`
	DiskMB     int    `json:"disk_mb"`
	ShmMB      int    `json:"shm_mb"`
	Hostname   string `json:"hostname"`
	Outbound   bool   `json:"outbound"`
	ResolvConf string `json:"resolv_conf,omitempty"`
	// Seccomp is the assembled BPF program (struct sock_filter array).
	Seccomp []byte `json:"seccomp"`
}

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
func runInit() error {
	cfg, err := readInitConfig()
	if err != nil {
		return err
	}
	unix.CloseOnExec(initFD)
	// Whatever else was inherited (a host fd without O_CLOEXEC) must not
	// reach the agent. Marking beats closing: the Go runtime's own fds
	// stay usable until exec.
	if err := unix.CloseRange(initFD+1, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fmt.Errorf("close_range: %w", err)
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
	if err := setupRoot(cfg); err != nil {
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
	argv := append([]string{runtime.AgentGuestPath}, cfg.AgentArgs...)
	env := cfg.Env
	if env == nil {
		env = []string{}
	}
	if err := unix.Exec(runtime.AgentGuestPath, argv, env); err != nil {
		return fmt.Errorf("exec agent: %w", err)
	}
	return errors.New("exec returned")
}

func readInitConfig() (*initConfig, error) {
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
			return nil, fmt.Errorf("read config: %w", err)
		}
		if n == 0 {
			break
		}
		buf = buf[:len(buf)+n]
	}
	cfg := new(initConfig)
	if err := json.Unmarshal(buf, cfg); err != nil {
		return nil, fmt.Errorf("decode config: %w", err)
	}
	return cfg, nil
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
// with its last process.
func setupRoot(cfg *initConfig) error {
	// Nothing we mount may propagate back to the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	// The sandbox disk: a tmpfs of DiskMB holding the overlay's upper and
	// work directories (and the mount point of the merged root).
	opts := "mode=0700"
	if cfg.DiskMB > 0 {
		opts += ",size=" + strconv.Itoa(cfg.DiskMB) + "m"
	}
	s := cfg.Scratch
	if err := unix.Mount("tmpfs", s, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount disk tmpfs: %w", err)
	}
	for _, d := range []string{s + "/upper", s + "/work", s + "/root"} {
		if err := unix.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("mkdir %s: %w", d, err)
		}
	}
	root := s + "/root"
	ovl := "lowerdir=" + cfg.RootFS + ",upperdir=" + s + "/upper,workdir=" + s + "/work"
	// nodev/nosuid: device nodes and set-id binaries in the template are
	// inert.
	if err := unix.Mount("overlay", root, "overlay", unix.MS_NOSUID|unix.MS_NODEV, ovl); err != nil {
		return fmt.Errorf("mount overlay: %w", err)
	}
	// A detached read-only bind of the agent binary, attached after the
	// pivot so that no host path is resolved inside the new root.
	agentTree, err := unix.OpenTree(unix.AT_FDCWD, cfg.AgentPath, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("open agent: %w", err)
	}
	defer unix.Close(agentTree)
	if err := unix.MountSetattr(agentTree, "", unix.AT_EMPTY_PATH, &unix.MountAttr{
		Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
	}); err != nil {
		return fmt.Errorf("make agent read-only: %w", err)
	}

	// pivot_root(".", ".") stacks the old root on top of the new one; the
	// detach removes it, so no host path stays reachable.
	if err := unix.Chdir(root); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	// From here on every path resolves inside the sandbox root, so a
	// symlink in the template cannot point a mount or a write at the host.
	if err := mountProc(); err != nil {
		return err
	}
	if err := mountDev(cfg.ShmMB); err != nil {
		return err
	}
	if err := mountSys(); err != nil {
		return err
	}
	if err := maskProc(); err != nil {
		return err
	}
	if err := mkdirIfMissing("/.evalbox", 0o755); err != nil {
		return err
	}
	if err := touch(runtime.AgentGuestPath, 0o755); err != nil {
		return err
	}
	if err := unix.MoveMount(agentTree, "", unix.AT_FDCWD, runtime.AgentGuestPath, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach agent: %w", err)
	}
	return nil
}

func mountProc() error {
	if err := mkdirIfMissing("/proc", 0o555); err != nil {
		return err
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	return nil
}

// devNodes are the character devices of the sandbox's /dev.
var devNodes = []struct {
	name         string
	major, minor uint32
}{
	{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0},
}

var devLinks = [][2]string{
	{"/proc/self/fd", "/dev/fd"},
	{"/proc/self/fd/0", "/dev/stdin"},
	{"/proc/self/fd/1", "/dev/stdout"},
	{"/proc/self/fd/2", "/dev/stderr"},
	{"pts/ptmx", "/dev/ptmx"},
}

func mountDev(shmMB int) error {
	if err := mkdirIfMissing("/dev", 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", "/dev", "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=1m,nr_inodes=256"); err != nil {
		return fmt.Errorf("mount /dev: %w", err)
	}
	for _, n := range devNodes {
		if err := unix.Mknod("/dev/"+n.name, unix.S_IFCHR|0o666, int(unix.Mkdev(n.major, n.minor))); err != nil {
			return fmt.Errorf("mknod /dev/%s: %w", n.name, err)
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

func mountSys() error {
	if err := mkdirIfMissing("/sys", 0o555); err != nil {
		return err
	}
	if err := unix.Mount("sysfs", "/sys", "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /sys: %w", err)
	}
	for _, p := range sysMasked {
		if err := maskDir(p); err != nil {
			return err
		}
	}
	return nil
}

// Paths of /proc made read-only (kernel tunables: a root process without
// CAP_SYS_ADMIN can still write many sysctls, e.g. core_pattern) or hidden.
var (
	procReadOnly   = []string{"/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs"}
	procMaskedFile = []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/latency_stats", "/proc/kmsg"}
	procMaskedDir  = []string{"/proc/acpi", "/proc/scsi", "/proc/driver"}
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
