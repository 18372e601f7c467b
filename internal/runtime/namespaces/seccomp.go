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
			// clone3 passes its flags in memory, out of the filter's
			// reach: ENOSYS makes libc fall back to clone.
			{Action: seccomp.ActionErrno | seccomp.Action(unix.ENOSYS), Names: known([]string{"clone3"})},
		},
	}
	insts, err := policy.Assemble()
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	archCheck := []bpf.Instruction{
		bpf.LoadAbsolute{Off: 4, Size: 4}, // seccomp_data.arch
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(info.ID), SkipTrue: 1},
		bpf.RetConstant{Val: uint32(seccomp.ActionKillProcess)},
	}
	raw, err := bpf.Assemble(append(archCheck, insts...))
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
