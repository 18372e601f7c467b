# evalbox batch harness. It reads a slice (JSON on stdin: nonce, timeout,
# dir, file, user, stdout_cap, stderr_cap, sandboxed, scan, writable,
# programs [{id, source}]) and runs each program as `python3 <dir>/<file>`,
# as user (a
# uid, when the harness is root), in its own process group with its own
# timeout, like a trial's exec. It prints one JSON line per program on
# stdout: {"n", "i", "start": true} before it runs, then {"n", "i",
# "status", "exit_code", "signal", "stdout", "stdout_truncated", "stderr"
# (its tail), "ms"}. The nonce marks the harness's own lines: the programs
# never see it (stdin is read before any runs, and the harness is made
# non-dumpable so its memory cannot be read through /proc).
#
# No program may change another's verdict. Each one is written to <dir>/
# <file> (the same path as a trial's program: /.evalbox/program.py), in a
# directory only the harness may write to, so its own file is the only
# module on its path's first entry. After each program, before the
# next one starts: every process of the program's user is killed (kill(-1)
# as that user, which no fork escapes) and everything else the slice did
# not start with; every entry it made in a directory it could write to is
# removed (the writable directories come from a scan of the sandbox made
# before any program ran: "scan" asks for one, reported in a {"n", "scan":
# {"dirs", "files"}} line, "writable" passes an earlier one); the System V
# IPC objects it made are removed. A change the harness cannot undo (an
# entry the slice started with replaced, a writable file changed) ends the
# slice with exit code 3 after the program's own result: the samples left
# run again in a fresh sandbox.
import ctypes
import json
import os
import pwd
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

# Directories every sandbox has that anyone may write to (tmpfs mounts of
# the runtime included); the scan adds the template's.
STANDARD_WRITABLE = ["/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue", "/run/lock", "/run/shm", "/var/lock"]

libc = None


def load_libc():
    global libc
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except Exception:
        libc = None


def nondumpable():
    if libc is not None:
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0


def proc_status(pid):
    # (alive, uid) of a process, or None when it is gone. A zombie is alive
    # while it has more than one thread: a process whose main thread
    # exited while others run shows as "Z" too.
    try:
        with open("/proc/%d/status" % pid, "rb") as f:
            lines = f.read().split(b"\n")
    except OSError:
        return None
    state, threads, uid = b"", 1, -1
    for line in lines:
        if line.startswith(b"State:"):
            state = line.split()[1]
        elif line.startswith(b"Threads:"):
            threads = int(line.split()[1])
        elif line.startswith(b"Uid:"):
            uid = int(line.split()[1])  # the real uid (what kill(-1) matches)
    return (state not in (b"Z", b"X") or threads > 1), uid


def live_pids():
    # {pid: uid} of every live process.
    pids = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        s = proc_status(int(name))
        if s is not None and s[0]:
            pids[int(name)] = s[1]
    return pids


def ancestors():
    keep, pid = {1, os.getpid()}, os.getpid()
    while pid > 1:
        try:
            with open("/proc/%d/stat" % pid, "rb") as f:
                stat_ = f.read()
            pid = int(stat_[stat_.rindex(b")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            break
        keep.add(pid)
    return keep


def as_user(uid, fn):
    # Runs fn in a child process of uid; True if it returned true.
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            code = 0 if fn() else 1
        except BaseException:
            pass
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def kill_all():
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True


def kill_user(uid):
    # kill(-1) as uid signals every process whose real or saved uid is uid
    # (but the caller), atomically with respect to fork.
    as_user(uid, kill_all)


def sweep(keep, uid):
    # Kill whatever the last program left behind (also double-forked
    # daemons, and those whose main thread exited), until nothing new is
    # alive. False if something survives.
    for _ in range(200):
        live = live_pids()
        stray = [p for p in live if p not in keep]
        # A root harness runs its programs as uid: any process of uid is
        # theirs, also one that got the pid of a kept process that exited.
        # kill(-1) as uid ends them all, and a chain that forks faster than
        # it can be killed pid by pid. (An unprivileged harness runs its
        # programs as itself: its own processes are kept.)
        mine = uid > 0 and os.geteuid() == 0 and uid in live.values()
        if not stray and not mine:
            reap()
            return True
        if mine:
            kill_user(uid)
        for pid in stray:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.001)
    return False


def reap():
    try:  # orphans reparented to the harness (when it is a subreaper or init)
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def can_write(st, uid, gid):
    if st.st_uid == uid:
        return st.st_mode & 0o200
    if st.st_gid == gid:
        return st.st_mode & 0o020
    return st.st_mode & 0o002


def scan(uid, gid):
    # Directories and regular files uid:gid may write to, but for /proc and
    # /sys (kernel interfaces, not storage).
    dirs, files = [], []
    for top, subdirs, names in os.walk("/", topdown=True):
        if top in ("/proc", "/sys"):
            subdirs[:] = []
            continue
        try:
            if can_write(os.lstat(top), uid, gid):
                dirs.append(top)
        except OSError:
            continue
        for n in names:
            p = os.path.join(top, n)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and can_write(st, uid, gid):
                files.append(p)
    return {"dirs": dirs, "files": files}


def ident(st):
    # What must not change of an entry the slice started with: the same
    # inode, mode and owner; for a non-directory its size and times too,
    # the ctime included, which no program can set back (a directory's
    # change as new entries in it is seen on its own listing when it is
    # writable, and cannot happen when it is not).
    if stat.S_ISDIR(st.st_mode):
        return (st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_gid)
    return (st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class Snapshot:
    # What the writable places held when the slice began.
    def __init__(self, dirs, files, ipc):
        self.dirs, self.self_ident = {}, {}
        for d in dirs:
            try:
                fd = open_dir(d)
            except OSError:
                continue  # absent here (or behind a symlink: not ours)
            try:
                self.self_ident[d] = ident(os.fstat(fd))
                self.dirs[d] = {n: ident(os.lstat(n, dir_fd=fd)) for n in os.listdir(fd)}
            finally:
                os.close(fd)
        self.files = {}
        for f in files:
            try:
                self.files[f] = ident(os.lstat(f))
            except OSError:
                pass
        self.ipc = IPC() if ipc else None

    def restore(self, uid):
        # Undo what a program (run as uid) did to the writable places; the
        # changes it cannot undo, as a list of strings. Called once every
        # process of the program is gone.
        problems = []
        for d, before in self.dirs.items():
            try:
                fd = open_dir(d)
            except OSError as e:
                problems.append("%s: %s" % (d, e))
                continue
            try:
                if ident(os.fstat(fd)) != self.self_ident[d]:
                    problems.append("%s replaced" % d)
                    continue
                now = os.listdir(fd)
                for n in now:
                    p = os.path.join(d, n)
                    if n not in before:
                        if not remove(n, fd):
                            problems.append("cannot remove %s" % p)
                        continue
                    try:
                        if ident(os.lstat(n, dir_fd=fd)) != before[n]:
                            problems.append("%s changed" % p)
                    except OSError as e:
                        problems.append("%s: %s" % (p, e))
                for n in before:
                    if n not in now:
                        problems.append("%s removed" % os.path.join(d, n))
            finally:
                os.close(fd)
        for f, before in self.files.items():
            try:
                if ident(os.lstat(f)) != before:
                    problems.append("%s changed" % f)
            except OSError as e:
                problems.append("%s: %s" % (f, e))
        made, known = self.ipc.new() if self.ipc else (set(), True)
        if not known:
            problems.append("the System V IPC tables are full")
        made = sorted(made)
        if made:
            # As their owner: root without CAP_IPC_OWNER may not remove
            # them (and gVisor's msgctl says it did when it did not).
            def rm():
                return all(ipc_remove(o) for o in made)

            if not (as_user(uid, rm) if uid > 0 and os.geteuid() == 0 else rm()):
                problems.append("cannot remove System V IPC objects %s" % made)
        return problems


def open_dir(path):
    # An O_PATH-free, symlink-free descriptor of the directory path: each
    # component opened below the last with O_NOFOLLOW, so that no symlink
    # (a program may have swapped one in) is followed.
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in [p for p in path.split("/") if p]:
            nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nfd
    except OSError:
        os.close(fd)
        raise
    return fd


def remove(name, dir_fd):
    # Removes the entry name of the directory dir_fd (a directory with all
    # it holds, without following any symlink; root needs no permission
    # bits for it).
    try:
        st = os.lstat(name, dir_fd=dir_fd)
        if stat.S_ISDIR(st.st_mode):
            try:
                shutil.rmtree(name, dir_fd=dir_fd)
            except TypeError:  # Python < 3.11: no dir_fd
                shutil.rmtree("/proc/self/fd/%d/%s" % (dir_fd, name))
        else:
            os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    try:
        os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return True
    return False


IPC_KINDS = ("shm", "sem", "msg")


def ipc_objects():
    # (kind, id) of every System V IPC object, from /proc/sysvipc; None
    # where the kernel has no such files (gVisor: see ipc_mark).
    objs = set()
    for kind in IPC_KINDS:
        try:
            with open("/proc/sysvipc/" + kind) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if len(fields) > 1:
                        objs.add((kind, int(fields[1])))
        except (StopIteration, ValueError):
            pass
        except OSError:
            return None
    return objs


def ipc_create(kind):
    if libc is None:
        return -1
    if kind == "shm":
        return libc.shmget(0, 4096, 0o1600)  # IPC_PRIVATE, IPC_CREAT|0600
    if kind == "sem":
        return libc.semget(0, 1, 0o1600)
    return libc.msgget(0, 0o1600)


def ipc_mark():
    # The id the next object of each kind gets, where ids are handed out
    # in order (gVisor): made and removed at once.
    marks = {}
    for kind in IPC_KINDS:
        i = ipc_create(kind)
        if i >= 0:
            ipc_remove((kind, i))
            marks[kind] = i
    return marks


class IPC:
    # The System V IPC objects the slice started with, to remove the ones
    # a program makes.
    def __init__(self):
        self.objs = ipc_objects()
        self.marks = ipc_mark() if self.objs is None else None
        if self.marks is not None and len(self.marks) != len(IPC_KINDS):
            raise OSError("cannot mark System V IPC ids")

    def new(self):
        # The objects made since the last call, and whether that is known.
        if self.objs is not None:
            return (ipc_objects() or set()) - self.objs, True
        now = ipc_mark()
        made = set()
        for kind, start in self.marks.items():
            if kind not in now:
                # No mark could be made (the table is full): what the
                # program made cannot be told apart.
                return made, False
            made.update((kind, i) for i in range(start + 1, now[kind]))
        self.marks = now
        return made, True


def ipc_remove(obj):
    # Removes an object and checks that it is gone (IPC_STAT fails with
    # EINVAL or EIDRM; a success code alone is not trusted).
    if libc is None:
        return False
    kind, ident_ = obj
    IPC_RMID, IPC_STAT = 0, 2
    buf = ctypes.create_string_buffer(512)
    if kind == "shm":
        libc.shmctl(ident_, IPC_RMID, None)
        r = libc.shmctl(ident_, IPC_STAT, buf)
    elif kind == "sem":
        libc.semctl(ident_, 0, IPC_RMID)
        r = libc.semctl(ident_, 0, IPC_STAT, buf)
    else:
        libc.msgctl(ident_, IPC_RMID, None)
        r = libc.msgctl(ident_, IPC_STAT, buf)
    return r < 0 and ctypes.get_errno() in (22, 43)  # EINVAL, EIDRM: gone


def user_env(uid):
    # The environment a trial's exec gives a program run as uid: the
    # harness's, with the user's HOME, USER and LOGNAME.
    env = dict(os.environ)
    try:
        pw = pwd.getpwuid(uid)
        env.update(HOME=pw.pw_dir, USER=pw.pw_name, LOGNAME=pw.pw_name)
    except KeyError:
        env.update(HOME="/", USER=str(uid), LOGNAME=str(uid))
    return env


def run_one(argv, cwd, env, timeout, stdout_cap, stderr_cap, keep, user):
    start = time.monotonic()
    deadline = start + timeout
    as_user = {}
    if user > 0 and os.geteuid() == 0:
        as_user = {"user": user, "group": user, "extra_groups": []}
    try:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True, cwd=cwd, env=env, **as_user)
    except Exception as e:  # OSError, or a Python without these options
        return {"status": "error", "exit_code": -1, "error": "start %s: %s" % (argv[0], e)}, True
    out, err = bytearray(), bytearray()
    truncated = False
    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ, out)
    sel.register(p.stderr, selectors.EVENT_READ, err)

    def read(key):
        # Reads once; False at the end of the pipe.
        nonlocal truncated
        data = os.read(key.fd, 65536)
        if not data:
            sel.unregister(key.fileobj)
            return False
        if key.data is out:
            room = stdout_cap - len(out)
            if len(data) > room:
                truncated = True
            if room > 0:
                out.extend(data[:room])
        else:
            err.extend(data)
            if len(err) > 2 * stderr_cap:
                del err[: len(err) - stderr_cap]
        return True

    timed_out = False
    while sel.get_map():
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        events = sel.select(min(left, 0.1))
        for key, _ in events:
            read(key)
        if not events and p.poll() is not None:
            break  # exited; what it left behind holds the pipes
    if not timed_out:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    ms = int((time.monotonic() - start) * 1000)
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except OSError:
        pass
    clean = sweep(keep, user)
    rc = p.wait()
    reap()
    # Every writer is gone: take what is left in the pipes.
    for key in list(sel.get_map().values()):
        os.set_blocking(key.fd, False)
        try:
            while read(key):
                pass
        except BlockingIOError:
            pass
    sel.close()
    p.stdout.close()
    p.stderr.close()
    res = {"stdout": out.decode("utf-8", "replace"), "stdout_truncated": truncated,
           "stderr": err[-stderr_cap:].decode("utf-8", "replace"), "ms": ms}
    if timed_out:
        res.update(status="timed_out", exit_code=-1, signal=-rc if rc < 0 else 0)
    elif rc < 0:
        res.update(status="killed", exit_code=-1, signal=-rc)
    else:
        res.update(status="exited", exit_code=rc, signal=0)
    return res, clean


def program_dir(d):
    # (d, False), made if missing, when only the harness's user may write
    # to it and no one else may swap it (its parents are the harness's or
    # root's, and writable by others only when sticky); else (a fresh
    # private directory, True).
    try:
        os.makedirs(d, 0o755, exist_ok=True)
        p = os.path.realpath(d)
        first = True
        while True:
            st = os.lstat(p)
            others = st.st_mode & 0o022
            if st.st_uid not in (0, os.geteuid()) or (others and (first or not st.st_mode & stat.S_ISVTX)):
                raise PermissionError(p)
            if p == "/":
                return d, False
            p, first = os.path.dirname(p), False
    except OSError:
        # An unprivileged harness (a template whose user is not root), or a
        # directory others may write to.
        work = tempfile.mkdtemp(prefix=".evalbox-batch-")
        os.chmod(work, 0o755)
        return work, True


def main():
    req = json.loads(sys.stdin.buffer.read())
    load_libc()
    nondumpable()
    nonce, user = req["nonce"], req["user"]
    out = sys.stdout

    def emit(line):
        line["n"] = nonce
        out.write(json.dumps(line) + "\n")
        out.flush()

    keep = ancestors() | set(live_pids())
    writable = req.get("writable")
    if req.get("scan"):
        writable = scan(user, user)
        emit({"scan": writable})
    writable = writable or {}
    # In a sandbox of its own, the harness also restores the directories
    # every sandbox lets anyone write to and the System V IPC objects (on a
    # host, in tests, these are the host's).
    sandboxed = req.get("sandboxed")
    dirs = sorted(set(writable.get("dirs") or []) | ({d for d in STANDARD_WRITABLE} if sandboxed else set()))
    work, made = program_dir(req.get("dir") or "/.evalbox")
    snap = Snapshot(dirs, writable.get("files") or [], sandboxed)
    cwd = req.get("cwd") or None
    env = user_env(user) if user > 0 else dict(os.environ)
    for k, prog in enumerate(req["programs"]):
        emit({"i": prog["id"], "start": True})
        path = os.path.join(work, req["file"])
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(prog["source"])
        res, clean = run_one(["python3", path], cwd, env, req["timeout"], req["stdout_cap"], req["stderr_cap"], keep, user)
        res["i"] = prog["id"]
        emit(res)
        problems = [] if clean else ["a process of the program survived"]
        problems += snap.restore(user)
        if problems:
            sys.stderr.write("evalbox batch harness: cannot undo what program %s did: %s\n" % (prog["id"], "; ".join(problems[:5])))
            sys.exit(3)
    os.unlink(path) if req["programs"] else None
    if made:
        shutil.rmtree(work, ignore_errors=True)


main()
