package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/evalbox/evalbox/pkg/client"
)

// probeScript tries, one by one, what sandboxed code must not be able to
// do, and prints name=ok or name=<errno name> for each (as root or as the
// user it runs as). Syscalls get harmless arguments where they fail
// closed anyway, so a probe that is not refused does no damage.
const probeScript = `import ctypes, errno, os, socket, signal, fcntl, termios
libc = ctypes.CDLL(None, use_errno=True)
NR = {"unshare": 272, "mount": 165, "ptrace": 101, "bpf": 321, "io_uring_setup": 425, "keyctl": 250,
      "perf_event_open": 298, "personality": 135, "setns": 308, "init_module": 175, "kexec_load": 246,
      "open_by_handle_at": 304, "userfaultfd": 323, "reboot": 169, "swapon": 167, "acct": 163, "clock_settime": 227}
out = []
def rep(name, f):
    try:
        r = f()
        if isinstance(r, int) and r < 0:
            out.append("%s=%s" % (name, errno.errorcode.get(ctypes.get_errno(), "E?")))
        else:
            out.append(name + "=ok")
    except OSError as e:
        out.append("%s=%s" % (name, errno.errorcode.get(e.errno, "E?")))
    except Exception as e:
        out.append("%s=%s" % (name, type(e).__name__))
def sys_(name, *a):
    return lambda: libc.syscall(NR[name], *[ctypes.c_long(x) for x in a])
rep("unshare_user", sys_("unshare", 0x10000000))
rep("unshare_mount", sys_("unshare", 0x00020000))
rep("mount_tmpfs", lambda: libc.mount(b"none", b"/mnt", b"tmpfs", 0, None))
rep("ptrace_attach_1", sys_("ptrace", 16, 1, 0, 0))
rep("bpf", sys_("bpf", 0, 0, 0))
rep("io_uring_setup", sys_("io_uring_setup", 1, 0))
rep("keyctl_join", sys_("keyctl", 1, 0))
rep("perf_event_open", sys_("perf_event_open", 0, 0, -1, -1, 0))
rep("personality_norandom", sys_("personality", 0x0040000))
rep("init_module", sys_("init_module", 0, 0, 0))
rep("kexec_load", sys_("kexec_load", 0, 0, 0, 0))
rep("open_by_handle_at", sys_("open_by_handle_at", -100, 0, 0))
rep("reboot", sys_("reboot", 0, 0, 0, 0))
rep("swapon", sys_("swapon", 0, 0))
rep("clock_settime", sys_("clock_settime", 0, 0))
rep("socket_vsock", lambda: socket.socket(40, socket.SOCK_STREAM).close())
rep("socket_alg", lambda: socket.socket(38, socket.SOCK_SEQPACKET).close())
rep("socket_packet", lambda: socket.socket(17, socket.SOCK_RAW).close())
def tiocsti():
    m = os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY)
    try:
        fcntl.ioctl(m, termios.TIOCSTI, b"x")
    finally:
        os.close(m)
rep("tiocsti_pty", tiocsti)
rep("open_tty", lambda: os.close(os.open("/dev/tty", os.O_RDWR)))
def write(p, v):
    def f():
        with open(p, "w") as fh:
            fh.write(v)
    return f
rep("write_core_pattern", write("/proc/sys/kernel/core_pattern", "|/tmp/x"))
rep("write_drop_caches", write("/proc/sys/vm/drop_caches", "3"))
rep("write_sysrq_trigger", write("/proc/sysrq-trigger", "h"))
rep("write_sys_kernel", write("/sys/kernel/mm/transparent_hugepage/enabled", "never"))
rep("write_sys_uevent", write("/sys/kernel/uevent_helper", "/tmp/x"))
rep("open_agent_mem", lambda: os.close(os.open("/proc/1/mem", os.O_RDONLY)))
rep("open_agent_environ", lambda: open("/proc/1/environ").read())
def agent_fds():
    for n in os.listdir("/proc/1/fd"):
        os.close(os.open("/proc/1/fd/" + n, os.O_RDONLY))
rep("open_agent_fds", agent_fds)
rep("cgroup_escape", write("/sys/fs/cgroup/cgroup.procs", str(os.getpid())))
print(" ".join(out))
`

// TestHostileCorpus: the kernel interfaces sandboxed code must not reach,
// probed as root and as nobody, on both runtimes (issue 9's matrix:
// user namespaces, mount, ptrace, bpf, io_uring, keyrings, perf,
// personality, module loading, kexec, …; AF_VSOCK and other socket
// families; terminal injection; writes to /proc/sys, /sys and
// /proc/sysrq-trigger; the agent's memory, environment and descriptors;
// leaving the command's cgroup). On namespaces each is refused by seccomp,
// a missing capability, a read-only mount or the user namespace; on gVisor
// the Sentry refuses or contains it. Each probe ends with a clear status,
// the host's tunables are unchanged, and a neighbour sandbox is unharmed.
func TestHostileCorpus(t *testing.T) {
	hostBefore := hostTunables(t)
	c := defaultTeam(t)
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			neighbour := mustCreate(t, c, client.CreateSandboxRequest{Runtime: rt})
			sb := mustCreate(t, c, client.CreateSandboxRequest{Template: "python", Runtime: rt})
			for _, user := range []string{"root", "nobody"} {
				r := mustExec(t, c, sb.ID, client.ExecRequest{Argv: []string{"python3", "-c", probeScript}, User: user, Timeout: 60})
				if r.Status != client.StatusExited || r.ExitCode != 0 {
					t.Fatalf("%s: probes did not complete: %+v", user, r)
				}
				got := map[string]string{}
				for _, kv := range strings.Fields(r.Stdout) {
					k, v, _ := strings.Cut(kv, "=")
					got[k] = v
				}
				t.Logf("%s as %s: %s", rt, user, strings.TrimSpace(r.Stdout))
				for name, v := range got {
					if v == "ok" && !allowedOK(rt, user, name) {
						t.Errorf("%s as %s: %s succeeded", rt, user, name)
					}
				}
				if rt == client.RuntimeNamespaces {
					for name, want := range namespacesRefusals {
						if got[name] != want {
							t.Errorf("namespaces as %s: %s = %q, want %s", user, name, got[name], want)
						}
					}
				}
				// The agent is still there and serves.
				if r := mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "echo alive"}); r.Stdout != "alive\n" {
					t.Fatalf("after the probes as %s: %+v", user, r)
				}
			}
			if r := mustExec(t, c, neighbour.ID, client.ExecRequest{Cmd: "echo fine"}); r.Stdout != "fine\n" {
				t.Fatalf("neighbour after the probes: %+v", r)
			}
			// A set-user-ID root binary does not make nobody root.
			mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "cp /usr/bin/id /tmp/suid-id && chmod 4755 /tmp/suid-id"})
			if r := mustExec(t, c, sb.ID, client.ExecRequest{User: "nobody", Cmd: "/tmp/suid-id -u; /tmp/suid-id -ru"}); r.Stdout != "65534\n65534\n" {
				t.Errorf("%s: a set-user-ID binary raised nobody: %q", rt, r.Stdout)
			}
		})
	}
	if after := hostTunables(t); after != hostBefore {
		t.Fatalf("host tunables changed:\nbefore %s\nafter  %s", hostBefore, after)
	}
}

// namespacesRefusals are the statuses the namespaces tier must give, the
// same for root and nobody in the sandbox.
var namespacesRefusals = map[string]string{
	"unshare_user": "EPERM", "unshare_mount": "EPERM", "mount_tmpfs": "EPERM", "ptrace_attach_1": "EPERM",
	"bpf": "EPERM", "io_uring_setup": "EPERM", "keyctl_join": "EPERM", "perf_event_open": "EPERM",
	"personality_norandom": "EPERM", "init_module": "EPERM", "kexec_load": "EPERM", "open_by_handle_at": "EPERM",
	"reboot": "EPERM", "swapon": "EPERM", "clock_settime": "EPERM",
	"socket_vsock": "EAFNOSUPPORT", "socket_alg": "EAFNOSUPPORT", "socket_packet": "EAFNOSUPPORT",
	"tiocsti_pty": "EPERM", "open_tty": "ENXIO", "cgroup_escape": "ENOENT",
}

// allowedOK lists the probes that may succeed, because what they do stays
// inside the sandbox, on gVisor only: its keyrings and user namespaces are
// the Sentry's own (the host kernel never sees them), and in a user
// namespace of its own a process may make a mount namespace and mount a
// tmpfs there, seen by nobody else; TIOCSTI on a pty the sandbox itself
// made reaches its own terminal, which no host process reads. Root inside
// gVisor may also leave its command's cgroup (gVisor's cgroupfs lets root
// write cgroup.procs, as root there may kill the agent): a daemon of a
// root command may outlive that command's timeout. Not so for any other
// user, nor on namespaces.
func allowedOK(rt, user, probe string) bool {
	if rt != client.RuntimeGVisor {
		return false
	}
	switch probe {
	case "keyctl_join", "unshare_user", "unshare_mount", "mount_tmpfs", "tiocsti_pty":
		return true
	case "cgroup_escape":
		return user == "root"
	}
	return false
}

// hostTunables reads host settings the corpus tries to change.
func hostTunables(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, p := range []string{"/proc/sys/kernel/core_pattern", "/proc/sys/kernel/hostname", "/sys/kernel/mm/transparent_hugepage/enabled", "/proc/sys/vm/overcommit_memory"} {
		v, _ := os.ReadFile(p)
		fmt.Fprintf(&b, "%s=%q ", p, strings.TrimSpace(string(v)))
	}
	return b.String()
}

// TestNoHostPaths: a sandbox learns no host path from its mount table (the
// server's data dir, the templates dir, the agent binary's path, the host's
// root device), and cannot read the kernel's heap and address-space layout
// (/proc/slabinfo, /proc/vmallocinfo), on either runtime.
func TestNoHostPaths(t *testing.T) {
	c := defaultTeam(t)
	hostRoot := ""
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, l := range strings.Split(string(mi), "\n") {
			pre, post, ok := strings.Cut(l, " - ")
			pf, sf := strings.Fields(pre), strings.Fields(post)
			if ok && len(pf) >= 5 && pf[4] == "/" && len(sf) >= 2 && strings.HasPrefix(sf[1], "/dev/") {
				hostRoot = sf[1]
			}
		}
	}
	for _, rt := range runtimes {
		sb := mustCreate(t, c, client.CreateSandboxRequest{Runtime: rt})
		r := mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "cat /proc/self/mountinfo /proc/mounts"})
		for _, p := range []string{srv.dataDir, templatesDir, binDir, hostRoot} {
			if p != "" && strings.Contains(r.Stdout, p) {
				t.Errorf("%s: the mount table shows the host path %s:\n%s", rt, p, r.Stdout)
			}
		}
		for _, f := range []string{"/proc/slabinfo", "/proc/vmallocinfo"} {
			for _, user := range []string{"root", "nobody"} {
				r := mustExec(t, c, sb.ID, client.ExecRequest{User: user, Cmd: "head -c 100 " + f + " 2>/dev/null | wc -c"})
				if strings.TrimSpace(r.Stdout) != "0" {
					t.Errorf("%s as %s: %s readable", rt, user, f)
				}
			}
		}
	}
}

// TestSandboxUserLimits: a namespaces sandbox's root is not host root: when
// it takes all the inotify instances a user may have (128 by default), host
// root and another sandbox still have theirs (before: sandbox root was host
// root, which then got EMFILE).
func TestSandboxUserLimits(t *testing.T) {
	c := defaultTeam(t)
	a := mustCreate(t, c, client.CreateSandboxRequest{Template: "python", Runtime: client.RuntimeNamespaces})
	b := mustCreate(t, c, client.CreateSandboxRequest{Template: "python", Runtime: client.RuntimeNamespaces})
	hold := `import os, sys, time
fds = []
try:
    while len(fds) < 100000:
        fds.append(os.inotify_init() if hasattr(os, "inotify_init") else __import__("ctypes").CDLL(None).inotify_init())
        if fds[-1] < 0:
            fds.pop()
            break
except OSError:
    pass
print(len(fds), flush=True)
sys.stdout.close()
time.sleep(60)
`
	p, err := c.StartProcess(ctxT(t, time.Minute), a.ID, client.ExecRequest{Argv: []string{"python3", "-c", hold}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	held := mustExec(t, c, a.ID, client.ExecRequest{Cmd: "ls -l /proc/[0-9]*/fd 2>/dev/null | grep -c anon_inode:inotify"})
	t.Logf("sandbox a holds %s inotify instances", strings.TrimSpace(held.Stdout))
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Fatalf("host root cannot make an inotify instance while a sandbox holds its all: %v", err)
	}
	unix.Close(fd)
	r := mustExec(t, c, b.ID, client.ExecRequest{Argv: []string{"python3", "-c", "import ctypes; libc = ctypes.CDLL(None); print(sum(1 for _ in range(16) if libc.inotify_init() >= 0))"}})
	if strings.TrimSpace(r.Stdout) != "16" {
		t.Fatalf("another sandbox after the first took its allowance: %+v", r)
	}
	_ = c.KillProcess(ctxT(t, time.Minute), a.ID, p.ID)
}
