package namespaces

import (
	"fmt"
	"unsafe"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// keepCaps is the capability bounding set of a sandbox: what the agent
// needs to run commands as other users, own and chmod their files, signal
// them, and bind low ports. Everything else (CAP_SYS_ADMIN, CAP_NET_ADMIN,
// CAP_NET_RAW, CAP_SYS_PTRACE, CAP_MKNOD, CAP_DAC_READ_SEARCH, …) is
// dropped before the agent starts and can never come back.
var keepCaps = []int{
	unix.CAP_CHOWN,
	unix.CAP_DAC_OVERRIDE,
	unix.CAP_FOWNER,
	unix.CAP_FSETID,
	unix.CAP_KILL,
	unix.CAP_SETGID,
	unix.CAP_SETUID,
	unix.CAP_SETPCAP, // lets the agent shrink its children's bounding set further
	unix.CAP_NET_BIND_SERVICE,
}

// deniedSyscalls fail with EPERM in a sandbox: mounts and namespace
// changes, kernel modules, kexec, reboot, swap, BPF, perf, keyrings,
// cross-process memory access, handle-based opens, userfaultfd, io_uring
// (a large kernel attack surface), accounting, quotas, the kernel log,
// I/O ports and clock setting. Names unknown on the build architecture
// are skipped.
var deniedSyscalls = []string{
	"mount", "umount2", "pivot_root", "chroot",
	"open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
	"setns", "unshare",
	"swapon", "swapoff", "reboot",
	"kexec_load", "kexec_file_load",
	"init_module", "finit_module", "delete_module", "create_module",
	"bpf", "perf_event_open", "fanotify_init",
	"keyctl", "add_key", "request_key",
	"ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
	"open_by_handle_at", "name_to_handle_at",
	"userfaultfd",
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	"acct", "quotactl", "quotactl_fd", "syslog",
	"iopl", "ioperm",
	"lookup_dcookie",
	"clock_settime", "clock_adjtime", "settimeofday", "stime",
	"vhangup", "uselib", "nfsservctl",
}

// deniedIoctls are ioctl(2) requests that fail with EPERM: TIOCSTI pushes
// bytes into a terminal's input queue (typed commands), TIOCLINUX reads and
// writes a virtual console. A sandbox has no controlling terminal; this
// closes any other terminal descriptor too. The kernel reads the request
// as 32 bits, so only those are compared.
var deniedIoctls = []uint32{unix.TIOCSTI, unix.TIOCLINUX}

// allowedSocketFamilies are the socket(2) and socketpair(2) domains a
// sandbox may use; any other (AF_VSOCK, which no network namespace covers,
// AF_ALG, AF_PACKET, AF_BLUETOOTH, AF_KEY, AF_XDP, …) fails with
// EAFNOSUPPORT, as on a kernel without it.
var allowedSocketFamilies = []uint32{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK}

// nsCloneFlags are the clone(2) flags that create namespaces.
const nsCloneFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWUSER |
	unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP

// allowedPersonalities are the personality(2) arguments that are allowed
// (Linux, 32-bit, UNAME26, and the query value); anything else, e.g.
// ADDR_NO_RANDOMIZE or READ_IMPLIES_EXEC, is denied.
var allowedPersonalities = []uint64{0x0, 0x8, 0x20000, 0x20008, 0xffffffff}

// buildSeccomp assembles the sandbox's seccomp program and returns it as
// raw struct sock_filter bytes, ready for SECCOMP_SET_MODE_FILTER.
//
// The program first kills the process on any syscall made through another
// ABI than the native one (e.g. int 0x80 from an x86-64 process), which
// would otherwise skip the name-based rules; x32 syscalls get ENOSYS.
func buildSeccomp() ([]byte, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	known := func(names []string) []string {
		out := make([]string, 0, len(names))
		for _, n := range names {
			if _, ok := info.SyscallNames[n]; ok {
				out = append(out, n)
			}
		}
		return out
	}
	notAllowed := make(seccomp.ArgumentConditions, 0, len(allowedPersonalities))
	for _, v := range allowedPersonalities {
		notAllowed = append(notAllowed, seccomp.Condition{Argument: 0, Operation: seccomp.NotEqual, Value: v})
	}
	policy := seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			{Action: seccomp.ActionErrno, Names: known(deniedSyscalls)},
			{Action: seccomp.ActionErrno, NamesWithCondtions: []seccomp.NameWithConditions{
				{Name: "clone", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.BitsSet, Value: nsCloneFlags}}},
				{Name: "personality", Conditions: notAllowed},
			}},
		},
	}
	// clone3 passes its flags in memory, out of the filter's reach. It is
	// allowed (the agent places each command in its own cgroup with
	// CLONE_INTO_CGROUP): every namespace flag but CLONE_NEWUSER needs a
	// capability the sandbox does not have, and its user namespace allows
	// no nested one (max_user_namespaces is 0 there, see limitNesting).
	insts, err := policy.Assemble()
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	archCheck := []bpf.Instruction{
		bpf.LoadAbsolute{Off: 4, Size: 4}, // seccomp_data.arch
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(info.ID), SkipTrue: 1},
		bpf.RetConstant{Val: uint32(seccomp.ActionKillProcess)},
	}
	argChecks, err := argumentChecks(info)
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	prefix := append(archCheck, argChecks...)
	raw, err := bpf.Assemble(append(prefix, insts...))
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	if len(raw) > 4096 {
		return nil, fmt.Errorf("seccomp: program too long (%d)", len(raw))
	}
	prog := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		prog[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	n := len(prog) * int(unsafe.Sizeof(unix.SockFilter{}))
	return append([]byte(nil), unsafe.Slice((*byte)(unsafe.Pointer(&prog[0])), n)...), nil
}

// seccomp_data offsets (linux/seccomp.h): nr, arch, instruction pointer,
// then six 64-bit arguments; the low half of an argument comes first on
// little-endian machines.
const (
	offNr   = 0
	offArgs = 16
)

// argLow is the offset of the low 32 bits of argument i.
func argLow(i uint32) uint32 { return offArgs + 8*i }

// argumentChecks are the rules that compare only the low 32 bits of an
// argument (the kernel reads an int or unsigned int there, so a filter
// that compared all 64 would let a value with junk in the high half
// through): the ioctl requests and the socket families. They run after the
// architecture check and fall through to the rest of the program.
func argumentChecks(info *arch.Info) ([]bpf.Instruction, error) {
	if !littleEndian() {
		return nil, fmt.Errorf("argument checks assume a little-endian machine")
	}
	nr := func(name string) (uint32, error) {
		n, ok := info.SyscallNames[name]
		if !ok {
			return 0, fmt.Errorf("no syscall %s on %s", name, info.Name)
		}
		return uint32(n), nil
	}
	ioctl, err := nr("ioctl")
	if err != nil {
		return nil, err
	}
	eperm := uint32(seccomp.ActionErrno) | uint32(unix.EPERM)
	eafnosupport := uint32(seccomp.ActionErrno) | uint32(unix.EAFNOSUPPORT)

	var prog []bpf.Instruction
	// ioctl: deny the listed requests.
	block := []bpf.Instruction{bpf.LoadAbsolute{Off: argLow(1), Size: 4}}
	for _, req := range deniedIoctls {
		block = append(block, bpf.JumpIf{Cond: bpf.JumpEqual, Val: req, SkipFalse: 1}, bpf.RetConstant{Val: eperm})
	}
	prog = append(prog, bpf.LoadAbsolute{Off: offNr, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: ioctl, SkipFalse: uint8(len(block))})
	prog = append(prog, block...)
	// socket, socketpair: allow the listed families only.
	for _, name := range []string{"socket", "socketpair"} {
		n, err := nr(name)
		if err != nil {
			return nil, err
		}
		k := len(allowedSocketFamilies)
		block := []bpf.Instruction{bpf.LoadAbsolute{Off: argLow(0), Size: 4}}
		for i, fam := range allowedSocketFamilies {
			// An allowed family jumps past the rest of the block.
			block = append(block, bpf.JumpIf{Cond: bpf.JumpEqual, Val: fam, SkipTrue: uint8(k - i)})
		}
		block = append(block, bpf.RetConstant{Val: eafnosupport})
		prog = append(prog, bpf.LoadAbsolute{Off: offNr, Size: 4},
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: n, SkipFalse: uint8(len(block))})
		prog = append(prog, block...)
	}
	return prog, nil
}

func littleEndian() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}
