# evalbox batch harness. It reads a slice (JSON on stdin: nonce, timeout,
# path, user, stdout_cap, stderr_cap, programs [{id, source}]) and runs
# each program as `python3 <path>`, as user (a uid, when the harness is
# root), in its own process group with its own timeout, like a trial's
# exec: at the end (or the timeout) the group and every process the
# program left behind are killed. It prints one JSON line per program on
# stdout: {"n", "i", "start": true} before it runs, then {"n", "i",
# "status", "exit_code", "signal", "stdout", "stdout_truncated", "stderr"
# (its tail), "ms"}. The nonce marks the harness's own lines: the programs
# never see it (stdin is read before any runs, and the harness is made
# non-dumpable so its memory cannot be read through /proc).
import json
import os
import selectors
import signal
import subprocess
import sys
import time


def nondumpable():
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except Exception:
        pass


def live_pids():
    pids = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                stat = f.read()
        except OSError:
            continue
        if stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] != b"Z":
            pids.add(int(name))
    return pids


def ancestors():
    keep, pid = {1, os.getpid()}, os.getpid()
    while pid > 1:
        try:
            with open("/proc/%d/stat" % pid, "rb") as f:
                stat = f.read()
            pid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            break
        keep.add(pid)
    return keep


def sweep(keep):
    # Kill whatever the last program left behind (also double-forked
    # daemons), until nothing new is alive.
    for _ in range(100):
        stray = live_pids() - keep
        if not stray:
            return
        for pid in stray:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.001)


def run_one(argv, timeout, stdout_cap, stderr_cap, keep, user):
    start = time.monotonic()
    deadline = start + timeout
    as_user = {}
    if user > 0 and os.geteuid() == 0:
        as_user = {"user": user, "group": user, "extra_groups": []}
    try:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True, **as_user)
    except Exception as e:  # OSError, or a Python without these options
        return {"status": "error", "exit_code": -1, "error": "start %s: %s" % (argv[0], e)}
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
    sweep(keep)
    rc = p.wait()
    try:  # orphans reparented to the harness (when it is a subreaper or init)
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass
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
    return res


def main():
    req = json.loads(sys.stdin.buffer.read())
    nondumpable()
    nonce, path = req["nonce"], req["path"]
    keep = ancestors() | live_pids()
    out = sys.stdout

    def emit(line):
        line["n"] = nonce
        out.write(json.dumps(line) + "\n")
        out.flush()

    for prog in req["programs"]:
        emit({"i": prog["id"], "start": True})
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(prog["source"])
        res = run_one(["python3", path], req["timeout"], req["stdout_cap"], req["stderr_cap"], keep, req["user"])
        res["i"] = prog["id"]
        emit(res)


main()
