package namespaces

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// Every sandbox runs in a user namespace of its own, mapped onto a block of
// idBlockSize unprivileged host ids that no other sandbox (of any evalbox
// server on the host) holds at the same time. Root in the sandbox is the
// block's first host id: the kernel's per-user limits (inotify instances
// and watches, queued signals, mqueue bytes, RLIMIT_NPROC, locked memory),
// signal permissions and file ownership are those of ids no host user and
// no other sandbox has. The user namespace is owned by that same host id
// (not by root), so the limits counted up the namespace hierarchy are
// charged to it and never to host root.

// idBlockSize is the number of ids a sandbox maps: 0–65535, as a Debian
// system expects (nobody is 65534).
const idBlockSize = 65536

// Defaults of Config.IDBase and Config.IDBlocks: 4096 blocks from
// 0x60000000 up to 0x6fffffff, inside the range systemd leaves to container
// managers (524288–1879048191), below 2^31 (some software treats uids as
// signed).
const (
	DefaultIDBase   = 0x60000000
	DefaultIDBlocks = 4096
)

// DefaultIDLockFile is the default Config.IDLockFile.
const DefaultIDLockFile = "/run/evalbox/userns.lock"

// idBlocks hands out blocks of host ids. A block in use is locked (an OFD
// byte-range lock on byte i of a host-wide lock file), so that two evalbox
// servers on one host never map the same ids; the kernel drops the locks
// of a process that dies. Within the process the used table decides (OFD
// locks of one open file never conflict with each other).
type idBlocks struct {
	base  uint32
	count int
	lock  *os.File

	mu   sync.Mutex
	used []bool
	next int // where the search for a free block starts (round robin)
}

func newIDBlocks(lockPath string, base uint32, count int) (*idBlocks, error) {
	if count <= 0 || uint64(base)+uint64(count)*idBlockSize > 1<<31 {
		return nil, fmt.Errorf("id blocks: %d blocks of %d ids from %d do not fit below 2^31", count, idBlockSize, base)
	}
	if err := os.MkdirAll(filepath.Dir(lockPath), 0o755); err != nil {
		return nil, fmt.Errorf("id blocks: %w", err)
	}
	f, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("id blocks: %w", err)
	}
	return &idBlocks{base: base, count: count, lock: f, used: make([]bool, count)}, nil
}

// idBlock is one acquired block.
type idBlock struct {
	index  int
	hostID uint32 // the host id of sandbox id 0
}

// errNoIDBlock is returned when every block is in use.
var errNoIDBlock = errors.New("every user-namespace id block is in use (Config.IDBlocks)")

// acquire takes a free block.
func (b *idBlocks) acquire() (idBlock, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for n := 0; n < b.count; n++ {
		i := (b.next + n) % b.count
		if b.used[i] {
			continue
		}
		err := unix.FcntlFlock(b.lock.Fd(), unix.F_OFD_SETLK, &unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: int64(i), Len: 1})
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
			continue // another server holds it
		}
		if err != nil {
			return idBlock{}, fmt.Errorf("id blocks: lock %d: %w", i, err)
		}
		b.used[i] = true
		b.next = i + 1
		return idBlock{index: i, hostID: b.base + uint32(i)*idBlockSize}, nil
	}
	return idBlock{}, errNoIDBlock
}

// release returns a block. Its ids must be unused: every process of the
// sandbox is gone.
func (b *idBlocks) release(blk idBlock) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if blk.index < 0 || blk.index >= b.count || !b.used[blk.index] {
		return
	}
	_ = unix.FcntlFlock(b.lock.Fd(), unix.F_OFD_SETLK, &unix.Flock_t{Type: unix.F_UNLCK, Whence: 0, Start: int64(blk.index), Len: 1})
	b.used[blk.index] = false
}

func (b *idBlocks) close() error { return b.lock.Close() }

// forkRequests are served by one goroutine locked to its OS thread for
// the life of the process. Sandboxes are started there for two reasons:
// their parent-death signal fires when the *thread* that forked them
// exits (Go ends a thread when a goroutine exits while locked to it), and
// the thread changes its own credentials around the clone (see
// cloneAsOwner), which must never leak to a thread that runs other
// goroutines.
var (
	forkOnce     sync.Once
	forkRequests chan forkRequest
)

type forkRequest struct {
	cmd   *exec.Cmd
	owner uint32 // host uid and gid that owns the new user namespace
	done  chan error
}

// startOnForkThread starts cmd, whose SysProcAttr creates a user namespace,
// so that the namespace is owned by host id owner.
func startOnForkThread(cmd *exec.Cmd, owner uint32) error {
	forkOnce.Do(func() {
		forkRequests = make(chan forkRequest)
		go func() {
			goruntime.LockOSThread() // never unlocked: the thread must live on
			for req := range forkRequests {
				req.done <- cloneAsOwner(req.cmd, req.owner)
			}
		}()
	})
	done := make(chan error, 1)
	forkRequests <- forkRequest{cmd: cmd, owner: owner, done: done}
	return <-done
}

// cloneAsOwner starts cmd with this thread's effective ids set to owner.
// The kernel makes the euid of the process that creates a user namespace
// its owner; the limits of the sandbox's users are counted against the
// owner in the parent namespace. SECBIT_NO_SETUID_FIXUP keeps the thread's
// capabilities across the id change (it still needs CAP_SETUID to write
// the child's uid_map and CAP_SYS_ADMIN for the other namespaces), and the
// saved ids stay 0 so that the thread can become root again. Only this
// thread's credentials change (raw syscalls, not Go's all-threads
// wrappers); it must be locked to the calling goroutine. The child clears
// the securebits it inherits before it runs anything of the sandbox.
func cloneAsOwner(cmd *exec.Cmd, owner uint32) error {
	bits, _, errno := unix.RawSyscall(unix.SYS_PRCTL, unix.PR_GET_SECUREBITS, 0, 0)
	if errno != 0 {
		return fmt.Errorf("namespaces: get securebits: %w", errno)
	}
	if _, _, errno := unix.RawSyscall(unix.SYS_PRCTL, unix.PR_SET_SECUREBITS, bits|secbitNoSetuidFixup, 0); errno != 0 {
		return fmt.Errorf("namespaces: set securebits: %w", errno)
	}
	restore := func() {
		_, _, e1 := unix.RawSyscall(unix.SYS_SETRESUID, 0, 0, 0)
		_, _, e2 := unix.RawSyscall(unix.SYS_SETRESGID, 0, 0, 0)
		_, _, e3 := unix.RawSyscall(unix.SYS_PRCTL, unix.PR_SET_SECUREBITS, bits, 0)
		if e1 != 0 || e2 != 0 || e3 != 0 {
			// The fork thread would go on with another identity: no
			// sandbox could start safely any more.
			panic(fmt.Sprintf("namespaces: restore the fork thread's credentials: %v %v %v", e1, e2, e3))
		}
	}
	if _, _, errno := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(owner), uintptr(owner), 0); errno != 0 {
		restore()
		return fmt.Errorf("namespaces: setresgid %d: %w", owner, errno)
	}
	if _, _, errno := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(owner), uintptr(owner), 0); errno != 0 {
		restore()
		return fmt.Errorf("namespaces: setresuid %d: %w", owner, errno)
	}
	err := cmd.Start()
	restore()
	return err
}

// idmappedTree returns a detached, read-only, nosuid, nodev copy of the
// mount of path whose ids are shifted into the user namespace usernsFD: a
// file of host uid 0 appears owned by the namespace's root. The template
// directory is never written.
func idmappedTree(path string, usernsFD int) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("open_tree %s: %w", path, err)
	}
	attr := unix.MountAttr{
		Attr_set:  unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
		Userns_fd: uint64(usernsFD),
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("id-mapped mount of %s: %w (the template's filesystem must support id-mapped mounts)", path, err)
	}
	return fd, nil
}

// agentImages keeps one sealed in-memory copy (memfd) of each agent binary,
// shared by every sandbox: the init stage executes it from that descriptor,
// so that no host path of the agent is mounted into (and shown by
// /proc/self/mountinfo in) any sandbox, and the sandbox cannot change it.
type agentImages struct {
	mu     sync.Mutex
	images map[string]agentImage
}

type agentImage struct {
	f           *os.File
	size, mtime int64
	ino, dev    uint64
}

// get returns a new descriptor (close-on-exec; the caller closes it) of the
// memfd of the agent at path, made anew when the file changed. It is
// duplicated under the lock: a concurrent get that replaces the image
// closes only its own descriptor.
func (a *agentImages) get(path string) (int, error) {
	f, err := a.image(path)
	if err != nil {
		return -1, err
	}
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	a.mu.Unlock()
	if err != nil {
		return -1, fmt.Errorf("agent: %w", err)
	}
	return fd, nil
}

// image returns the memfd of the agent at path with a.mu held (on success;
// the caller unlocks).
func (a *agentImages) image(path string) (*os.File, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil, fmt.Errorf("agent %s: %w", path, err)
	}
	a.mu.Lock()
	if img, ok := a.images[path]; ok && img.size == st.Size && img.mtime == st.Mtim.Nano() && img.ino == st.Ino && img.dev == st.Dev {
		return img.f, nil
	}
	f, err := memfdCopy(path)
	if err != nil {
		a.mu.Unlock()
		return nil, err
	}
	if old, ok := a.images[path]; ok {
		// Sandboxes being started hold their own duplicate (SCM_RIGHTS).
		old.f.Close()
	}
	if a.images == nil {
		a.images = make(map[string]agentImage)
	}
	a.images[path] = agentImage{f: f, size: st.Size, mtime: st.Mtim.Nano(), ino: st.Ino, dev: st.Dev}
	return f, nil
}

func (a *agentImages) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, img := range a.images {
		img.f.Close()
	}
	a.images = nil
}

// secbitNoSetuidFixup is SECBIT_NO_SETUID_FIXUP (linux/securebits.h).
const secbitNoSetuidFixup = 1 << 2

// mfdExec is MFD_EXEC (Linux ≥ 6.3): an executable memfd, said explicitly.
const mfdExec = 0x10

// memfdCopy copies the file at path into a sealed, executable memfd.
func memfdCopy(path string) (*os.File, error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	defer src.Close()
	fd, err := unix.MemfdCreate("evalbox-agent", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|mfdExec)
	if errors.Is(err, unix.EINVAL) {
		fd, err = unix.MemfdCreate("evalbox-agent", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	}
	if errors.Is(err, unix.EACCES) {
		return nil, fmt.Errorf("agent: memfd_create: %w (vm.memfd_noexec is 2: the namespaces runtime runs the agent from an executable memfd; set it to 0 or 1)", err)
	}
	if err != nil {
		return nil, fmt.Errorf("agent: memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "evalbox-agent")
	if _, err := f.ReadFrom(src); err != nil {
		f.Close()
		return nil, fmt.Errorf("agent: copy into memfd: %w", err)
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_SEAL|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE); err != nil {
		f.Close()
		return nil, fmt.Errorf("agent: seal memfd: %w", err)
	}
	return f, nil
}
