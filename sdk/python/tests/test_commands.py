"""sb.commands through the sync client, against the real server."""

from __future__ import annotations

import builtins
import time

import pytest

import evalbox
from evalbox import Sandbox


def test_run_shell_and_argv(sb: Sandbox) -> None:
    r = sb.commands.run("echo out; echo err >&2; exit 3")
    assert (r.stdout, r.stderr, r.exit_code, r.status) == ("out\n", "err\n", 3, "exited")
    assert not r.ok
    assert not r.truncated
    assert r.duration >= 0
    r = sb.commands.run(["python3", "-c", "import sys; print(sys.argv[1:])", "a b", "$HOME"])
    assert r.stdout == "['a b', '$HOME']\n"
    assert r.ok


def test_run_options(sb: Sandbox) -> None:
    r = sb.commands.run("pwd; echo $A$B; id -un; cat", cwd="/tmp", env={"A": "1", "B": "2"}, user="nobody", stdin="in")
    assert r.stdout == "/tmp\n12\nnobody\nin"
    assert sb.commands.run("cat", stdin=b"bytes").stdout == "bytes"
    r = sb.commands.run("head -c 5000 /dev/zero | tr '\\0' x", max_output_bytes=1000)
    assert (len(r.stdout), r.stdout_truncated, r.truncated) == (1000, True, True)
    r = sb.commands.run("no-such-program")
    assert (r.status, r.exit_code) == ("exited", 127)
    r = sb.commands.run(["no-such-program"])
    assert r.status == "error"
    assert r.error


def test_memory_and_output_limits_kill_the_tree(sb: Sandbox) -> None:
    r = sb.commands.run("python3 -c 'x = bytearray(1 << 30)'; echo after", memory_limit_mb=64, timeout=60)
    assert (r.status, r.memory_limit_exceeded, r.output_limit_exceeded) == ("killed", True, False)
    assert r.peak_memory_bytes > 64 << 20
    assert "after" not in r.stdout
    r = sb.commands.run("yes", max_output_bytes=10_000, kill_on_output_limit=True, timeout=60)
    assert (r.status, r.output_limit_exceeded, r.stdout_truncated, len(r.stdout)) == ("killed", True, True, 10_000)
    r = sb.commands.run("echo ok", memory_limit_mb=64, max_output_bytes=10_000, kill_on_output_limit=True)
    assert (r.status, r.stdout, r.memory_limit_exceeded, r.output_limit_exceeded) == ("exited", "ok\n", False, False)
    with pytest.raises(ValueError, match="memory_limit_mb"):
        sb.commands.run("true", memory_limit_mb=-1)


def test_timeout_kills_the_tree_and_keeps_partial_output(sb: Sandbox) -> None:
    start = time.monotonic()
    r = sb.commands.run("echo started; (sleep 30 &) ; sleep 30", timeout=0.5)
    assert time.monotonic() - start < 5
    assert (r.status, r.stdout) == ("timed_out", "started\n")
    assert 0.4 < r.duration < 5
    assert "sleep" not in sb.commands.run("ps -eo comm").stdout


def test_streaming_callbacks(sb: Sandbox) -> None:
    seen: list[tuple[str, str, float]] = []
    start = time.monotonic()
    r = sb.commands.run(
        "for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.2; done; exit 4",
        on_stdout=lambda s: seen.append(("out", s, time.monotonic() - start)),
        on_stderr=lambda s: seen.append(("err", s, time.monotonic() - start)),
    )
    assert (r.exit_code, r.status) == (4, "exited")
    assert r.stdout == "out1\nout2\nout3\n"  # the result still holds the whole output
    assert r.stderr == "err1\nerr2\nerr3\n"
    assert "".join(s for k, s, _ in seen if k == "out") == r.stdout
    assert "".join(s for k, s, _ in seen if k == "err") == r.stderr
    first_out = next(t for k, _, t in seen if k == "out")
    assert first_out < 0.35, "output must arrive as it is produced, not at the end"
    # Only one callback: the other stream is still collected.
    got: list[str] = []
    r = sb.commands.run("echo a; echo b >&2", on_stderr=got.append)
    assert (got, r.stdout) == (["b\n"], "a\n")


def test_streaming_timeout_and_large_output(sb: Sandbox) -> None:
    chunks: list[str] = []
    r = sb.commands.run("echo x; sleep 10", timeout=0.3, on_stdout=chunks.append)
    assert (r.status, chunks) == ("timed_out", ["x\n"])
    n = 0

    def count(s: str) -> None:
        nonlocal n
        n += len(s)

    r = sb.commands.run("head -c 3000000 /dev/zero | tr '\\0' y", on_stdout=count)
    assert n == len(r.stdout) == 3_000_000


def test_callback_exception_stops_the_command(sb: Sandbox) -> None:
    def boom(_: str) -> None:
        raise RuntimeError("scorer bug")

    with pytest.raises(RuntimeError, match="scorer bug"):
        sb.commands.run("echo go; sleep 30", on_stdout=boom)
    # Closing the stream killed the command.
    deadline = time.monotonic() + 5
    while "sleep" in sb.commands.run("ps -eo comm").stdout:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_background_wait_list_connect(sb: Sandbox) -> None:
    h = sb.commands.run("echo begin; sleep 0.5; echo end; echo e >&2; exit 2", background=True, tag="job")
    assert h.id
    assert h.pid > 0
    assert h.sandbox_id == sb.id
    [p] = sb.commands.list()
    assert (p.id, p.pid, p.tag, p.running) == (h.id, h.pid, "job", True)
    assert p.argv == ("/bin/sh", "-c", "echo begin; sleep 0.5; echo end; echo e >&2; exit 2")
    again = sb.commands.connect(h.id)
    assert (again.id, again.pid) == (h.id, h.pid)
    start = time.monotonic()
    r = h.wait(poll_interval=0.1)  # several long polls; returns as soon as it ends
    assert 0.3 < time.monotonic() - start < 3
    assert (r.stdout, r.stderr, r.exit_code, r.status) == ("begin\nend\n", "e\n", 2, "exited")
    assert again.wait(poll_interval=5) == r  # idempotent, from another handle
    info = h.info()
    assert not info.running
    assert info.result is not None
    assert (info.result.exit_code, info.result.stdout) == (2, "")
    with pytest.raises(evalbox.NotFoundError):
        sb.commands.connect("no-such-process")


def test_background_output_iterators(sb: Sandbox) -> None:
    h = sb.commands.run(["sh", "-c", "for i in 1 2 3; do echo o$i; echo e$i >&2; sleep 0.1; done"], background=True)
    assert "".join(h.stdout) == "o1\no2\no3\n"  # follows it live to the end
    assert "".join(h.stderr) == "e1\ne2\ne3\n"  # replayed after the end
    assert h.wait().ok


def test_background_wait_timeout_and_kill(sb: Sandbox) -> None:
    h = sb.commands.run(
        "trap 'echo got TERM; exit 5' TERM; echo ready; while true; do sleep 0.05; done", background=True
    )
    assert next(iter(h.stdout)) == "ready\n"
    start = time.monotonic()
    with pytest.raises(evalbox.CommandTimeoutError) as ei:
        h.wait(timeout=0.3, poll_interval=0.1)
    assert 0.25 < time.monotonic() - start < 3
    assert isinstance(ei.value, builtins.TimeoutError)
    assert h.info().running  # a timed-out wait leaves it running
    h.kill(signal="SIGTERM")
    r = h.wait(timeout=10)
    assert (r.exit_code, r.stdout) == (5, "ready\ngot TERM\n")

    h = sb.commands.run("sleep 30 & sleep 30", background=True)
    h.kill()  # SIGKILL to the whole tree
    r = h.wait(timeout=10)
    assert (r.status, r.signal) == ("killed", 9)
    assert "sleep" not in sb.commands.run("ps -eo comm").stdout
    h.kill()  # already ended: fine


def test_background_rejects_callbacks(sb: Sandbox) -> None:
    with pytest.raises(ValueError, match="background"):
        sb.commands.run("true", background=True, on_stdout=print)  # type: ignore[call-overload]


def test_background_stdin(sb: Sandbox) -> None:
    h = sb.commands.run("while read l; do echo got $l; done; echo eof", background=True, keep_stdin=True)
    h.send_stdin("one\n")
    h.send_stdin(b"two\n", close=True)
    r = h.wait(poll_interval=0.1)
    assert (r.stdout, r.exit_code) == ("got one\ngot two\neof\n", 0)
    with pytest.raises(evalbox.NotFoundError):
        h.send_stdin("late\n")
    plain = sb.commands.run("sleep 30", background=True)
    with pytest.raises(evalbox.BadRequestError):
        plain.send_stdin("x")
    plain.kill()
    c = sb.commands.run("cat", background=True, keep_stdin=True)
    c.send_stdin("abc")
    c.close_stdin()
    assert c.wait(poll_interval=0.1).stdout == "abc"
    with pytest.raises(ValueError, match="keep_stdin"):
        sb.commands.run("cat", keep_stdin=True)  # type: ignore[call-overload]


def test_sandbox_not_running(sb: Sandbox) -> None:
    h = sb.commands.run("sleep 30", background=True)
    sb.kill()
    with pytest.raises(evalbox.SandboxNotRunningError) as ei:
        sb.commands.run("true")
    assert (ei.value.code, ei.value.status) == ("sandbox_not_running", 409)
    with pytest.raises(evalbox.SandboxNotRunningError):
        sb.files.read("/etc/hostname")
    with pytest.raises(evalbox.SandboxNotRunningError):
        h.wait()
