// Package namespaces is evalbox's fast sandbox runtime: Linux namespaces,
// cgroups, capabilities and seccomp around the host kernel, with no
// hypervisor or user-space kernel in between. It is the weaker isolation
// tier; use gvisor where untrusted code could target the kernel.
//
// # What a sandbox is
//
// Start re-executes the current binary (/proc/self/exe) in new PID, mount,
// network, IPC and UTS namespaces, born in (v2) or moved before it runs
// anything into (v1) a per-sandbox cgroup with the Spec's CPU, memory
// (no extra swap) and pids limits. That "init stage" (see Init) receives
// its config on fd 3 and, inside its own mount namespace:
//
//   - makes the whole mount tree private, so nothing propagates to the host;
//   - mounts a tmpfs of Spec.DiskMB on Spec.StateDir (in the sandbox's
//     namespace only) and an overlayfs with lower = Spec.RootFS (never
//     written), upper/work on that tmpfs, mounted nodev,nosuid; a full
//     tmpfs is the disk limit (ENOSPC);
//   - pivots into the overlay and detaches the old root: no host path is
//     reachable;
//   - mounts /proc (the new PID namespace; /proc/sys, sysrq-trigger and
//     other tunables read-only, kcore, keys, timer_list and similar masked),
//     a small /dev tmpfs (null, zero, full, random, urandom, tty, a private
//     devpts, /dev/shm, the fd symlinks), /sys read-only (firmware and
//     powercap masked), and the agent binary read-only at
//     runtime.AgentGuestPath;
//   - sets the hostname (Spec.Hostname, default the id), writes
//     /etc/hostname, /etc/hosts (replacing the template's) and, for
//     outbound networking, /etc/resolv.conf; brings lo up;
//   - drops from the capability bounding set everything but CHOWN,
//     DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID, SETUID, SETPCAP and
//     NET_BIND_SERVICE, clears the inheritable and ambient sets, sets
//     supplementary groups to none, RLIMIT_CORE to 0, no_new_privs, and a
//     seccomp filter (EPERM for mount and the new mount API, pivot_root,
//     chroot, setns, unshare, clone with namespace flags, module loading,
//     kexec, reboot, swap, bpf, perf_event_open, keyrings, ptrace and
//     process_vm_*, *_by_handle_at, userfaultfd, io_uring, acct, quotactl,
//     syslog, iopl/ioperm, clock setting, non-default personality, …;
//     ENOSYS for clone3; the process is killed for any syscall made through
//     a non-native ABI such as int 0x80);
//   - marks every inherited fd but 0-2 close-on-exec, and execs the agent
//     as PID 1 of the sandbox with Spec.AgentArgs and Spec.Env, stdin and
//     stdout being pipes to the host (Sandbox.Conn), stderr a pipe the host
//     copies into StateDir/agent.log up to Config.AgentLogLimit.
//
// The agent runs as root (uid 0) with the reduced capabilities above; as
// PID 1 it must reap orphaned processes. When it exits, the kernel kills
// every other process of the sandbox; Sandbox.Done is then closed and
// Conn reads return EOF. The sandbox is also killed if the host process
// dies (parent-death signal), since nobody could talk to it any more.
//
// Network "none" leaves the sandbox with only lo. "outbound" adds a veth
// pair from package internal/runtime/network (Config.Network, shared with
// the other drivers of the process): a /30 from its pool, NAT through the
// host, and host-wide iptables chains (installed once, matching every evb+
// interface) that refuse traffic to the host itself, between sandboxes and
// to private, link-local, … ranges and the host's own subnets except DNS
// to the configured resolvers, and drop connections into sandboxes and
// spoofed sources. It sets net.ipv4.ip_forward=1 on the host; the chains
// stay in place when the runtime stops. IPv6 is off on the link. The init
// stage writes /etc/resolv.conf into the sandbox's overlay.
//
// # What it does NOT protect against
//
//   - Kernel vulnerabilities. Sandboxed code talks to the host kernel
//     directly; seccomp removes some rarely needed attack surface (io_uring,
//     bpf, perf, keyrings, user namespaces, the mount API) but hundreds of
//     syscalls, the network stack, filesystems and drivers remain. A kernel
//     exploit is a host compromise.
//   - There is no user namespace: root in the sandbox is uid 0 on the host
//     kernel, with a reduced but real capability set (DAC_OVERRIDE, CHOWN,
//     FOWNER, SETUID, …). Anything reachable from inside that trusts uid 0
//     rather than capabilities is exposed; mount and PID namespaces, the
//     pivot and the /proc masks are what keep host files and processes out
//     of reach. Templates must not contain sockets or files that lead back
//     to the host.
//   - Side channels: shared CPU caches, SMT siblings, page-cache timing,
//     and global kernel information in /proc and /sys (meminfo, loadavg,
//     cpuinfo, uptime, …), which show the host, not the sandbox.
//   - Resource exhaustion beyond the cgroup limits: kernel memory outside
//     the memory cgroup, inodes, conntrack entries, entropy, and disk I/O
//     bandwidth (no io limits) are shared. The disk tmpfs is RAM charged to
//     the sandbox's memory cgroup, so disk writes and memory share
//     MemoryMB; with swap off a sandbox whose files fill MemoryMB gets
//     ENOMEM or OOM kills before ENOSPC.
//   - Denial of service on the host network stack from outbound sandboxes
//     (rate limits are not set).
//
// # How the evalbox binary must use it
//
// The binary that constructs a Runtime must call Init first thing in main
// (and the test binary of any package that starts namespaces sandboxes,
// from TestMain), because Start re-executes that same binary:
//
//	func main() {
//		namespaces.Init() // returns at once unless this process is a sandbox's init stage
//		...
//	}
//
// Start needs root in the initial user namespace, cgroup v1 (cpu, memory,
// pids and freezer hierarchies) or v2 (cpu, memory and pids controllers
// available), overlayfs, Linux ≥ 5.12 (open_tree/mount_setattr,
// close_range; CLONE_INTO_CGROUP on v2), and for outbound networking the
// iptables and iptables-restore commands with conntrack, MASQUERADE and
// REJECT support.
//
// Cold start cost, measured on the development host (2 vCPUs, Linux 6.18,
// cgroup v1, test binary): Start ≈ 5 ms, of which ≈ 2.5 ms are the re-executed binary's
// start-up (Go runtime and package init functions) before Init runs, and
// ≈ 1.5 ms the mounts, pivot and hardening. On cgroup v1 moving the init
// process into the sandbox cgroups waits for an RCU grace period (several
// ms under load) unless the kernel has the per-threadgroup lock enabled
// (cgroup mount option favordynmods, Linux ≥ 6.18); cgroup v2 avoids the
// move altogether (CLONE_INTO_CGROUP).
package namespaces
