// Command standin is a tiny stand-in for the evalbox agent used by the
// namespaces runtime tests. As the sandbox's first process it prints
// "READY pid=<pid>", then runs each stdin line with /bin/sh -c and writes
// the combined output followed by "__EXIT__ <code>". Invoked with a
// subcommand it probes the sandbox from inside (see sub).
package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	// As the agent (no subcommand), flags the runtime passes the agent
	// (--spare-threads) are accepted and ignored.
	if len(os.Args) > 1 && !strings.HasPrefix(os.Args[1], "--") {
		os.Exit(sub(os.Args[1], os.Args[2:]))
	}
	fmt.Fprintln(os.Stderr, "standin: started")
	// The runtime runs the agent from memory, at no path in the sandbox:
	// a copy at /usr/local/bin/standin serves the tests' subcommands.
	if err := installSelf("/usr/local/bin/standin"); err != nil {
		fmt.Fprintln(os.Stderr, "standin: install:", err)
	}
	w := bufio.NewWriter(os.Stdout)
	fmt.Fprintf(w, "READY pid=%d\n", os.Getpid())
	w.Flush()
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if n, ok := strings.CutPrefix(sc.Text(), "@stderr "); ok {
			// Write n bytes to the agent's own stderr.
			k, _ := strconv.Atoi(n)
			os.Stderr.Write(bytes.Repeat([]byte("x"), k))
			fmt.Fprintf(w, "__EXIT__ 0\n")
			w.Flush()
			continue
		}
		var buf bytes.Buffer
		cmd := exec.Command("/bin/sh", "-c", sc.Text())
		cmd.Stdout, cmd.Stderr = &buf, &buf
		code := 0
		if err := cmd.Run(); err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				ws := ee.Sys().(syscall.WaitStatus)
				if ws.Signaled() {
					code = 128 + int(ws.Signal())
				} else {
					code = ws.ExitStatus()
				}
			} else {
				fmt.Fprintf(&buf, "standin: %v\n", err)
				code = 255
			}
		}
		// PID 1 duty: reap orphans.
		for {
			pid, err := unix.Wait4(-1, nil, unix.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
		out := buf.Bytes()
		w.Write(out)
		if len(out) > 0 && out[len(out)-1] != '\n' {
			w.WriteByte('\n')
		}
		fmt.Fprintf(w, "__EXIT__ %d\n", code)
		w.Flush()
	}
}

func installSelf(dst string) error {
	b, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		return err
	}
	if err := os.MkdirAll("/usr/local/bin", 0o755); err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o755)
}

func sub(name string, args []string) int {
	switch name {
	case "hog":
		mb, _ := strconv.Atoi(args[0])
		var keep [][]byte
		for i := 0; i < mb; i++ {
			b := make([]byte, 1<<20)
			for j := 0; j < len(b); j += 4096 {
				b[j] = 1
			}
			keep = append(keep, b)
		}
		fmt.Println("survived", len(keep))
		return 0
	case "bomb":
		// Fork forever, ignoring failures.
		for {
			exec.Command(os.Args[0], "bomb").Start()
			time.Sleep(time.Millisecond)
		}
	case "sys":
		probeSyscalls()
		return 0
	case "inotify":
		// Open up to N inotify instances, say how many, and hold them.
		n, _ := strconv.Atoi(args[0])
		got := 0
		for ; got < n; got++ {
			if _, err := unix.InotifyInit1(0); err != nil {
				break
			}
		}
		fmt.Println("inotify", got)
		os.Stdout.Close()
		os.Stderr.Close()
		time.Sleep(time.Minute)
		return 0
	case "int80":
		fmt.Println("int80 returned", int80(20))
		return 0
	case "dial":
		timeout := 2 * time.Second
		if len(args) > 1 {
			ms, _ := strconv.Atoi(args[1])
			timeout = time.Duration(ms) * time.Millisecond
		}
		c, err := net.DialTimeout("tcp", args[0], timeout)
		if err != nil {
			fmt.Println("dial error:", err)
			return 1
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		fmt.Printf("dial got %q %v\n", line, err)
		return 0
	}
	fmt.Fprintln(os.Stderr, "unknown subcommand", name)
	return 2
}

func report(name string, err error) {
	if err == nil {
		fmt.Printf("%s=ok\n", name)
		return
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		fmt.Printf("%s=%s\n", name, unix.ErrnoName(errno))
		return
	}
	fmt.Printf("%s=%v\n", name, err)
}

func raw(nr uintptr, a ...uintptr) error {
	var args [6]uintptr
	copy(args[:], a)
	_, _, e := unix.Syscall6(nr, args[0], args[1], args[2], args[3], args[4], args[5])
	if e != 0 {
		return e
	}
	return nil
}

// atFDCWD is AT_FDCWD as a variable, so it converts to uintptr.
var atFDCWD = unix.AT_FDCWD

func probeSyscalls() {
	os.MkdirAll("/tmp/mnt", 0o755)
	report("mount", unix.Mount("none", "/tmp/mnt", "tmpfs", 0, ""))
	report("umount2", unix.Unmount("/proc", unix.MNT_DETACH))
	report("unshare_user", unix.Unshare(unix.CLONE_NEWUSER))
	report("unshare_net", unix.Unshare(unix.CLONE_NEWNET))
	if fd, err := unix.Open("/proc/self/ns/net", unix.O_RDONLY, 0); err == nil {
		report("setns", unix.Setns(fd, 0))
		unix.Close(fd)
	}
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER}
	report("clone_newuser", cmd.Run())
	report("fork", exec.Command("/bin/true").Run())
	// Invalid arguments: without the filter these fail with EINVAL or
	// EFAULT, so a missing rule shows without side effects.
	report("clone3", raw(unix.SYS_CLONE3, 0, 0))
	report("bpf", raw(unix.SYS_BPF, 0, 0, 0))
	report("perf_event_open", raw(unix.SYS_PERF_EVENT_OPEN, 0, 0, 0, 0, 0))
	report("io_uring_setup", raw(unix.SYS_IO_URING_SETUP, 1, 0))
	report("keyctl", raw(unix.SYS_KEYCTL, unix.KEYCTL_GET_KEYRING_ID, 0xffffffff, 0))
	report("ptrace", raw(unix.SYS_PTRACE, unix.PTRACE_ATTACH, 1, 0, 0))
	report("chroot", unix.Chroot("/tmp"))
	report("pivot_root", unix.PivotRoot("/tmp", "/tmp"))
	report("open_tree", raw(unix.SYS_OPEN_TREE, uintptr(atFDCWD), uintptr(unsafe.Pointer(&[]byte("/\x00")[0])), 0))
	report("personality_norandom", raw(unix.SYS_PERSONALITY, 0x0040000))
	report("personality_query", raw(unix.SYS_PERSONALITY, 0xffffffff))
	report("sethostname", unix.Sethostname([]byte("x")))
	report("mknod", unix.Mknod("/tmp/sda", unix.S_IFBLK|0o600, int(unix.Mkdev(8, 0))))
	report("userfaultfd", raw(unix.SYS_USERFAULTFD, 0))
	report("settimeofday", raw(unix.SYS_SETTIMEOFDAY, 0, 0))
	report("syslog", raw(unix.SYS_SYSLOG, 3, 0, 0))
	report("clone3_newuser", clone3(unix.CLONE_NEWUSER))
	// Terminals: no controlling one, and no input injection into any.
	_, err := os.OpenFile("/dev/tty", os.O_RDWR, 0)
	report("open_tty", err)
	if m, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0); err != nil {
		report("tiocsti", err)
	} else {
		c := byte('x')
		report("tiocsti", raw(unix.SYS_IOCTL, m.Fd(), unix.TIOCSTI, uintptr(unsafe.Pointer(&c))))
		// The kernel reads the request as 32 bits: junk above must not
		// slip past the filter.
		report("tiocsti_high", raw(unix.SYS_IOCTL, m.Fd(), 1<<32|unix.TIOCSTI, uintptr(unsafe.Pointer(&c))))
		report("tioclinux", raw(unix.SYS_IOCTL, m.Fd(), unix.TIOCLINUX, uintptr(unsafe.Pointer(&c))))
		report("tcgets", raw(unix.SYS_IOCTL, m.Fd(), unix.TCGETS, uintptr(unsafe.Pointer(new(unix.Termios)))))
		m.Close()
	}
	sock := func(name string, family int, typ int) {
		fd, err := unix.Socket(family, typ, 0)
		if err == nil {
			unix.Close(fd)
		}
		report(name, err)
	}
	sock("socket_unix", unix.AF_UNIX, unix.SOCK_STREAM)
	sock("socket_inet", unix.AF_INET, unix.SOCK_STREAM)
	sock("socket_inet6", unix.AF_INET6, unix.SOCK_DGRAM)
	sock("socket_netlink", unix.AF_NETLINK, unix.SOCK_RAW)
	sock("socket_vsock", unix.AF_VSOCK, unix.SOCK_STREAM)
	sock("socket_alg", unix.AF_ALG, unix.SOCK_SEQPACKET)
	sock("socket_packet", unix.AF_PACKET, unix.SOCK_RAW)
	report("socket_vsock_high", raw(unix.SYS_SOCKET, 1<<32|unix.AF_VSOCK, unix.SOCK_STREAM, 0))
	var pair [2]int32
	report("socketpair_vsock", raw(unix.SYS_SOCKETPAIR, unix.AF_VSOCK, unix.SOCK_STREAM, 0, uintptr(unsafe.Pointer(&pair))))
}

// clone3 calls clone3(2) with flags; a child, should one be made, exits at
// once.
func clone3(flags uint64) error {
	args := struct {
		flags, pidfd, childTID, parentTID, exitSignal, stack, stackSize, tls uint64
	}{flags: flags, exitSignal: uint64(unix.SIGCHLD)}
	pid, _, e := unix.RawSyscall(unix.SYS_CLONE3, uintptr(unsafe.Pointer(&args)), unsafe.Sizeof(args), 0)
	if e != 0 {
		return e
	}
	if pid == 0 {
		unix.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
	}
	var ws unix.WaitStatus
	unix.Wait4(int(pid), &ws, 0, nil)
	return nil
}
