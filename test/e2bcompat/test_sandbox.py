"""The official e2b SDK (sync), unchanged, against evalbox: lifecycle, commands, files, errors."""

from __future__ import annotations

import os
import time

import httpx
import pytest
from e2b import Sandbox
from e2b.exceptions import (
    AuthenticationException,
    NotFoundException,
    RateLimitException,
    SandboxException,
)
from e2b.sandbox.commands.command_handle import CommandExitException

from .conftest import Server


def test_lifecycle(key: str, server: Server) -> None:
    sb = Sandbox.create(template="python", timeout=120, metadata={"suite": "e2b", "case": "lifecycle"})
    try:
        assert sb.sandbox_id in server.running(key)
        info = sb.get_info()
        assert info.sandbox_id == sb.sandbox_id
        assert info.metadata == {"suite": "e2b", "case": "lifecycle"}
        assert info.state.value == "running"
        ids = [s.sandbox_id for s in Sandbox.list().next_items()]
        assert sb.sandbox_id in ids
        from e2b import SandboxQuery

        found = Sandbox.list(query=SandboxQuery(metadata={"case": "lifecycle"})).next_items()
        assert [s.sandbox_id for s in found] == [sb.sandbox_id]
        assert Sandbox.list(query=SandboxQuery(metadata={"case": "none"})).next_items() == []
        before = info.end_at
        sb.set_timeout(600)
        assert sb.get_info().end_at > before
        assert sb.is_running()
        # Another process connects by id and drives the same sandbox.
        again = Sandbox.connect(sb.sandbox_id)
        assert again.commands.run("echo connected").stdout == "connected\n"
    finally:
        assert sb.kill()
    assert sb.sandbox_id not in server.running(key)
    assert not Sandbox.kill(sb.sandbox_id)
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sb.sandbox_id)
    with pytest.raises(NotFoundException):
        Sandbox.connect(sb.sandbox_id)


def test_commands(key: str) -> None:
    with Sandbox.create(template="python", timeout=120) as sb:
        out: list[str] = []
        err: list[str] = []
        r = sb.commands.run(
            "echo out; echo err >&2; python3 -c 'print(6*7)'", on_stdout=out.append, on_stderr=err.append
        )
        assert r.exit_code == 0
        assert r.stdout == "out\n42\n"
        assert r.stderr == "err\n"
        assert "".join(out) == "out\n42\n"
        assert "".join(err) == "err\n"
        r = sb.commands.run("pwd; echo $FOO", cwd="/tmp", envs={"FOO": "bar"})
        assert r.stdout == "/tmp\nbar\n"
        with pytest.raises(CommandExitException) as exc:
            sb.commands.run("echo partial; exit 3")
        assert exc.value.exit_code == 3
        assert exc.value.stdout == "partial\n"

        h = sb.commands.run("sleep 1; echo done", background=True)
        assert h.pid > 0
        assert h.wait().stdout == "done\n"

        long = sb.commands.run("echo started; sleep 600", background=True)
        pids = [p.pid for p in sb.commands.list()]
        assert long.pid in pids
        # Another handle attaches to the running process and sees its output from the start.
        joined = sb.commands.connect(long.pid)
        assert joined.pid == long.pid
        assert long.kill()
        with pytest.raises(CommandExitException):
            joined.wait()
        assert long.pid not in [p.pid for p in sb.commands.list()]
        assert not sb.commands.kill(long.pid)


def test_stdin(key: str) -> None:
    with Sandbox.create(template="python", timeout=120) as sb:
        h = sb.commands.run("while read l; do echo got $l; done; echo eof", background=True, stdin=True)
        sb.commands.send_stdin(h.pid, "one\n")
        h.send_stdin(b"two\n")
        sb.commands.stream_input(h.pid, iter(["three\n", b"four\n"]))
        sb.commands.close_stdin(h.pid)
        r = h.wait()
        assert r.stdout == "got one\ngot two\ngot three\ngot four\neof\n"
        # Without stdin=True the command reads nothing, and its stdin is not writable.
        plain = sb.commands.run("sleep 600", background=True)
        with pytest.raises(SandboxException):
            sb.commands.send_stdin(plain.pid, "x")
        plain.kill()
        # Foreground, stdin=True: closed by the caller.
        cat = sb.commands.run("cat", background=True, stdin=True)
        cat.send_stdin("abc")
        cat.close_stdin()
        assert cat.wait().stdout == "abc"


def test_files(key: str) -> None:
    with Sandbox.create(template="python", timeout=120) as sb:
        info = sb.files.write("/work/e2b/a.txt", "hello")
        assert info.path == "/work/e2b/a.txt"
        assert info.name == "a.txt"
        assert sb.files.read("/work/e2b/a.txt") == "hello"
        assert sb.files.read("/work/e2b/a.txt", format="bytes") == bytearray(b"hello")
        assert sb.commands.run("cat /work/e2b/a.txt").stdout == "hello"
        assert sb.files.exists("/work/e2b/a.txt")
        assert not sb.files.exists("/work/e2b/nope")
        assert sb.files.make_dir("/work/e2b/sub/deeper")
        assert not sb.files.make_dir("/work/e2b/sub/deeper")
        names = sorted(e.name for e in sb.files.list("/work/e2b"))
        assert names == ["a.txt", "sub"]
        deep = sorted(e.path for e in sb.files.list("/work/e2b", depth=3))
        assert deep == ["/work/e2b/a.txt", "/work/e2b/sub", "/work/e2b/sub/deeper"]
        st = sb.files.get_info("/work/e2b/a.txt")
        assert st.size == 5
        assert st.type is not None
        assert st.type.value == "file"
        sb.files.write_files([{"path": "/work/e2b/m1", "data": "1"}, {"path": "/work/e2b/m2", "data": b"\x00\x01"}])
        assert sb.files.read("/work/e2b/m2", format="bytes") == bytearray(b"\x00\x01")
        big = os.urandom(50 << 20)
        sb.files.write("/work/big.bin", big)
        assert sb.commands.run("stat -c %s /work/big.bin").stdout.strip() == str(len(big))
        assert bytes(sb.files.read("/work/big.bin", format="bytes")) == big
        moved = sb.files.rename("/work/e2b/m1", "/work/e2b/renamed")
        assert moved.path == "/work/e2b/renamed"
        assert moved.name == "renamed"
        assert not sb.files.exists("/work/e2b/m1")
        assert sb.files.read("/work/e2b/renamed") == "1"
        sb.files.remove("/work/e2b")
        assert not sb.files.exists("/work/e2b/a.txt")
        from e2b.exceptions import FileNotFoundException

        with pytest.raises(FileNotFoundException):
            sb.files.read("/work/e2b/a.txt")


def test_errors(key: str, server: Server) -> None:
    with pytest.raises(AuthenticationException):
        Sandbox.create(template="python", api_key="eb_not_a_key")
    with pytest.raises(SandboxException):
        Sandbox.create(template="no-such-template")
    # Another team's sandbox is not found.
    other = server.new_team(max_sandboxes=2)
    with Sandbox.create(template="python", timeout=60) as sb:
        with pytest.raises(NotFoundException):
            Sandbox.connect(sb.sandbox_id, api_key=other)
        assert not Sandbox.kill(sb.sandbox_id, api_key=other)
        # envd refuses a request without the sandbox's access token.
        r = httpx.post(
            server.url + "/process.Process/List",
            json={},
            headers={"E2b-Sandbox-Id": sb.sandbox_id, "E2b-Sandbox-Port": "49983", "Connect-Protocol-Version": "1"},
        )
        assert r.status_code == 401
        assert r.json()["code"] == "unauthenticated"
        r = httpx.post(
            server.url + "/process.Process/List",
            json={},
            headers={"E2b-Sandbox-Id": sb.sandbox_id, "X-Access-Token": "ebx_forged", "Connect-Protocol-Version": "1"},
        )
        assert r.status_code == 401


def test_tokens_open_one_sandbox(key: str, server: Server) -> None:
    """A sandbox's envd token opens envd of that sandbox only; its traffic token opens its ports, never envd."""
    a = Sandbox.create(template="python", timeout=60)
    b = Sandbox.create(template="python", timeout=60)
    try:
        envd_a = a._envd_access_token
        traffic_a = a.traffic_access_token
        assert envd_a
        assert traffic_a
        assert envd_a != b._envd_access_token

        def envd(sandbox_id: str, token: str | None) -> httpx.Response:
            h = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49983", "Connect-Protocol-Version": "1"}
            if token:
                h["X-Access-Token"] = token
            return httpx.post(server.url + "/process.Process/List", json={}, headers=h)

        assert envd(a.sandbox_id, envd_a).status_code == 200
        assert envd(b.sandbox_id, envd_a).status_code == 401
        assert envd(a.sandbox_id, traffic_a).status_code == 401
        assert envd(a.sandbox_id, key).status_code == 401  # the API key is for the control plane
        # A port of b with a's traffic token: refused before it reaches b.
        a.commands.run("python3 -m http.server 8000 >/dev/null 2>&1", background=True)
        b.commands.run("python3 -m http.server 8000 >/dev/null 2>&1", background=True)

        def port(sandbox_id: str, header: str, token: str) -> httpx.Response:
            h = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "8000", header: token}
            return httpx.get(server.url + "/", headers=h)

        deadline = time.monotonic() + 30
        while port(a.sandbox_id, "E2B-Traffic-Access-Token", traffic_a).status_code != 200:
            assert time.monotonic() < deadline, "a's server did not answer"
            time.sleep(0.2)
        assert port(b.sandbox_id, "E2B-Traffic-Access-Token", traffic_a).status_code == 401
        assert port(b.sandbox_id, "X-Access-Token", envd_a).status_code == 401
        assert port(a.sandbox_id, "X-Access-Token", envd_a).status_code == 200
        assert (
            httpx.get(
                server.url + "/", headers={"E2b-Sandbox-Id": a.sandbox_id, "E2b-Sandbox-Port": "8000"}
            ).status_code
            == 401
        )
    finally:
        a.kill()
        b.kill()


def test_team_limit(server: Server) -> None:
    k = server.new_team(max_sandboxes=1)
    first = Sandbox.create(template="python", api_key=k, timeout=60)
    try:
        with pytest.raises(RateLimitException):
            Sandbox.create(template="python", api_key=k, timeout=60)
    finally:
        first.kill()
