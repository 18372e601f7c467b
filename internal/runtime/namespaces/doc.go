// Package namespaces is evalbox's fast sandbox runtime: Linux namespaces,
// cgroups, capabilities and seccomp around the host kernel, with no
// hypervisor or user-space kernel in between. It is the weaker isolation
// tier; use gvisor where untrusted code could target the kernel.
//
// # What a sandbox is
//
// Start re-executes the current binary (/proc/self/exe) in a new user
// namespace and, owned by it, new PID, mount, network, IPC and UTS
// namespaces, in a session of its own (no controlling terminal), born in
// (v2) or moved before it runs anything into (v1) a per-sandbox cgroup with
// the Spec's CPU, memory (no extra swap) and pids limits.
//
// The user namespace maps sandbox ids 0–65535 onto a block of 65536 host
// ids that no host user and no other sandbox holds (Config.IDBase,
// IDBlocks; blocks are locked host-wide, so several evalbox servers share
// them safely), and it is owned by the block's first id, not by host root.
// Sandbox root is that unprivileged host id: the kernel's per-user limits
// (inotify instances and watches, pending signals, mqueue bytes,
// RLIMIT_NPROC), signal permissions and file ownership are the sandbox's
// own, shared with neither the host nor another sandbox; host files owned
// by host users are "other" to it, and its capabilities count only for
// what its own namespaces own. The host's fork thread takes the block's
// ids for the clone (cloneAsOwner), which is what makes the block the
// namespace's owner.
//
// That "init stage" (see Init) receives the template as a detached mount
// id-mapped into the sandbox's namespace, the agent binary (a sealed
// memfd), the sandbox's cgroup2 directory (delegated to the sandbox's root)
// and its config on fd 3, and, inside its own mount namespace:
//
//   - makes the whole mount tree private, so nothing propagates to the host;
//   - mounts a tmpfs of Spec.DiskMB on Config.MountPoint (in the sandbox's
//     namespace only) and an overlayfs with lower = the id-mapped template
//     (never written; its files appear owned by the sandbox's root), upper
//     and work on that tmpfs, mounted nodev,nosuid, its layers named
//     relative to the tmpfs (no host path in /proc/self/mountinfo); a full
//     tmpfs is the disk limit (ENOSPC);
//   - makes a proc and a sysfs instance while the host's are still visible
//     (a user namespace may mount them only then), and detached copies of
//     the host's null, zero, full, random, urandom and tty devices (it may
//     not make device nodes);
//   - pivots into the overlay and detaches the old root: no host path is
//     reachable;
//   - attaches /proc (the new PID namespace; /proc/sys, sysrq-trigger and
//     other tunables read-only, kcore, keys, timer_list, slabinfo,
//     vmallocinfo, kpage* and similar masked; max_user_namespaces 0 in the
//     sandbox's namespace), a small /dev tmpfs (the device copies, a
//     private devpts, /dev/shm, the fd symlinks), /sys read-only
//     (firmware and powercap masked);
//   - sets the hostname (Spec.Hostname, default the id), writes
//     /etc/hostname, /etc/hosts (replacing the template's) and, for
//     outbound networking, /etc/resolv.conf; brings lo up;
//   - clears the securebits it inherited, drops from the capability
//     bounding set everything but CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL,
//     SETGID, SETUID, SETPCAP and NET_BIND_SERVICE (capabilities of its own
//     user namespace only), clears the inheritable and ambient sets, sets
//     supplementary groups to none, RLIMIT_CORE to 0, no_new_privs, and a
//     seccomp filter (EPERM for mount and the new mount API, pivot_root,
//     chroot, setns, unshare, clone with namespace flags, module loading,
//     kexec, reboot, swap, bpf, perf_event_open, keyrings, ptrace and
//     process_vm_*, *_by_handle_at, userfaultfd, io_uring, acct, quotactl,
//     syslog, iopl/ioperm, clock setting, non-default personality, and the
//     TIOCSTI and TIOCLINUX ioctls; EAFNOSUPPORT for socket families other
//     than unix, inet, inet6 and netlink (AF_VSOCK, which no network
//     namespace covers, AF_ALG, AF_PACKET, …); these argument checks compare
//     the 32 bits the kernel reads; the process is killed for any syscall
//     made through a non-native ABI such as int 0x80; clone3 is allowed: its
//     flags are out of a filter's reach, but every namespace flag needs a
//     capability the sandbox lacks, and CLONE_NEWUSER meets the nesting
//     limit);
//   - marks every inherited fd but 0-2 (and the cgroup directory, which the
//     agent keeps: agentproto.CgroupEnv) close-on-exec, and executes the
//     agent from its memfd as PID 1 of the sandbox with Spec.AgentArgs and
//     Spec.Env, stdin and stdout being pipes to the host (Sandbox.Conn),
//     stderr a pipe the host copies into StateDir/agent.log up to
//     Config.AgentLogLimit. The agent appears at no path in the sandbox.
//
// The agent runs as the sandbox's root with the reduced capabilities
// above; as PID 1 it must reap orphaned processes. It makes a cgroup per
// process below the delegated directory (in the cgroup2 hierarchy; on a v1
// host the hybrid cgroup2 mount, which carries no controllers), so that a
// timeout or a kill takes every process of a command, whatever it did to
// leave its session or change its user; the sandbox has no cgroup
// filesystem mounted, so nothing in it can move out. When it exits, the kernel kills
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
//   - Root in the sandbox is an unprivileged host id, but the kernel code
//     a user namespace unlocks (what its root may do to the namespaces it
//     owns: mounts of tmpfs, proc, sysfs, devpts, overlayfs, network
//     configuration of its own netns) is reachable from inside, within the
//     capability bounding set above. Templates must not contain sockets or
//     files that lead back to the host.
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
// available), with a cgroup2 mount for the per-command cgroups (on v1
// hosts the hybrid one; without it the agent falls back to a weaker tree
// kill), overlayfs, Linux ≥ 5.19 (id-mapped mounts under an overlayfs
// mounted in a user namespace, the new mount API, close_range,
// CLONE_INTO_CGROUP, cgroup.kill from 5.14), a template filesystem that
// supports id-mapped mounts (ext4, xfs, btrfs, tmpfs ≥ 6.3, …), and for
// outbound networking the iptables and iptables-restore commands with
// conntrack, MASQUERADE and REJECT support.
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
