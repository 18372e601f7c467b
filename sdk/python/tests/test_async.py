"""AsyncSandbox against the real server: the same surface as the sync client, and concurrency."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import subprocess
import sys
import time
import tracemalloc
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import evalbox
from evalbox import AsyncClient, AsyncSandbox, Sandbox

from .server import NS, Server, Team


async def test_lifecycle(team: Team) -> None:
    run = uuid.uuid4().hex[:8]
    sb = await AsyncSandbox.create(runtime=NS, timeout=60, metadata={"run": run}, env={"K": "v"})
    try:
        info = await sb.info()
        assert (info.id, info.runtime, info.state, info.env_keys) == (sb.id, NS, "running", ("K",))
        assert [i.id for i in await AsyncSandbox.list(metadata={"run": run})] == [sb.id]
        other = await AsyncSandbox.connect(sb.id)
        assert (await other.commands.run("echo $K")).stdout == "v\n"
        assert (await sb.set_timeout(300)).expires_at > info.expires_at
        assert repr(sb).startswith("AsyncSandbox(")
    finally:
        await sb.kill()
    assert (await sb.info()).state == "deleted"
    b = await AsyncSandbox.create(runtime=NS, metadata={"run": run})
    await AsyncSandbox.kill_by_id(b.id)
    c = await AsyncSandbox.create(runtime=NS, metadata={"run": run})
    assert await AsyncSandbox.kill_all({"run": run}) == [c.id]
    assert await AsyncSandbox.list(metadata={"run": run}) == []
    assert len(await AsyncSandbox.list(metadata={"run": run}, state="all")) == 3
    with pytest.raises(evalbox.NotFoundError):
        await AsyncSandbox.connect("sb-doesnotexist")
    with pytest.raises(evalbox.SandboxNotRunningError):
        await AsyncSandbox.connect(sb.id)


async def test_network_and_ports(team: Team) -> None:
    """The async twins of sb.network, the traffic token and public ports."""
    async with await AsyncSandbox.create(runtime=NS, timeout=60, allow=["pypi.org"], public_ports=[8000]) as sb:
        info = await sb.network.rules()
        assert (info.network, info.network_rules, info.public_ports) == (
            "rules",
            evalbox.NetworkRules(allow=("pypi.org",), deny=()),
            (8000,),
        )
        info = await sb.network.update(["example.com"], ["*.example.com"])
        assert info.network_rules == evalbox.NetworkRules(allow=("example.com",), deny=("*.example.com",))
        with pytest.raises(evalbox.BadRequestError):
            await sb.network.update(allow=["*"])
        assert (await sb.network.update(mode="outbound")).network == "outbound"
        token = sb.traffic_token
        assert token
        assert await sb.rotate_traffic_token() != token
        assert (await sb.set_public_ports([])).public_ports == ()
        assert sb.get_url(8000).endswith(f"/v1/sandboxes/{sb.id}/ports/8000/")


async def test_gvisor(team: Team) -> None:
    async with await AsyncSandbox.create() as sb:
        assert (await sb.info()).runtime == "gvisor"
        out: list[str] = []
        r = await sb.commands.run("echo a; sleep 0.1; echo b", on_stdout=out.append)
        assert (out, r.stdout) == (["a\n", "b\n"], "a\nb\n")
        r = await sb.commands.run(
            "yes", max_output_bytes=4096, kill_on_output_limit=True, memory_limit_mb=512, timeout=60
        )
        assert (r.status, r.output_limit_exceeded, len(r.stdout)) == ("killed", True, 4096)


async def test_context_manager_deletes_on_exception_and_cancellation(team: Team) -> None:
    ids: list[str] = []

    async def failing_trial() -> None:
        async with await AsyncSandbox.create(runtime=NS) as sb:
            ids.append(sb.id)
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await failing_trial()

    started = asyncio.Event()

    async def trial() -> None:
        async with await AsyncSandbox.create(runtime=NS) as sb:
            ids.append(sb.id)
            started.set()
            await sb.commands.run("sleep 30")

    task = asyncio.create_task(trial())
    await started.wait()
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(ids) == 2
    for sid in ids:
        with pytest.raises(evalbox.SandboxNotRunningError):
            await AsyncSandbox.connect(sid)


async def test_files(team: Team, tmp_path: Path) -> None:
    async with await AsyncSandbox.create(template="python", runtime=NS) as sb:
        info = await sb.files.write("/work/a/b.txt", "héllo", mode=0o600)
        assert (info.size, info.mode) == (6, 0o600)
        assert await sb.files.read_text("/work/a/b.txt") == "héllo"
        assert await sb.files.read("/work/a/b.txt") == "héllo".encode()

        async def chunks() -> AsyncIterator[bytes]:
            for i in range(3):
                await asyncio.sleep(0)
                yield str(i).encode() * 2

        await sb.files.write("/work/a/async-iter", chunks())
        await sb.files.write("/work/a/sync-iter", iter([b"s", b"y"]))
        await sb.files.write("/work/a/file-obj", io.BytesIO(b"fileobj"))
        assert await sb.files.read("/work/a/async-iter") == b"001122"
        assert await sb.files.read("/work/a/sync-iter") == b"sy"
        assert [e.name for e in await sb.files.list("/work/a")] == ["async-iter", "b.txt", "file-obj", "sync-iter"]
        assert (await sb.files.stat("/work/a")).is_dir
        await sb.files.mkdir("/work/x/y", parents=True)
        with pytest.raises(evalbox.ConflictError):
            await sb.files.mkdir("/work/x/y")
        with pytest.raises(evalbox.ConflictError):
            await sb.files.remove("/work/x")
        await sb.files.remove("/work/x", recursive=True)
        with pytest.raises(evalbox.NotFoundError):
            await sb.files.stat("/work/x")

        local = tmp_path / "script.py"
        local.write_text("print('from upload')\n")
        await sb.files.upload(local, "/work/script.py")
        assert (await sb.commands.run("python3 /work/script.py")).stdout == "from upload\n"
        back = tmp_path / "back.py"
        assert await sb.files.download("/work/script.py", back) == local.stat().st_size
        assert back.read_bytes() == local.read_bytes()
        buf = io.BytesIO()
        await sb.files.download("/work/script.py", buf)
        assert buf.getvalue() == local.read_bytes()
        with pytest.raises(evalbox.NotFoundError):
            await sb.files.download("/work/none", tmp_path / "none")
        assert not (tmp_path / "none").exists()
        moved = await sb.files.rename("/work/script.py", "/work/moved.py")
        assert moved.path == "/work/moved.py"
        with pytest.raises(evalbox.NotFoundError):
            await sb.files.stat("/work/script.py")


def _random_file(path: Path, mib: int) -> str:
    block = os.urandom(1 << 20)
    h = hashlib.sha256()
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(block)
            h.update(block)
    return h.hexdigest()


async def test_large_transfer_streams(team: Team, tmp_path: Path) -> None:
    src = tmp_path / "50MB.bin"
    digest = await asyncio.to_thread(_random_file, src, 50)
    async with await AsyncSandbox.create(runtime=NS) as sb:
        tracemalloc.start()
        try:
            await sb.files.upload(src, "/tmp/big")
            back = tmp_path / "back.bin"
            await sb.files.download("/tmp/big", back)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert (await sb.commands.run("sha256sum /tmp/big")).stdout.split()[0] == digest
        assert back.stat().st_size == 50 << 20
        assert peak < 8 << 20


async def test_commands(team: Team) -> None:
    async with await AsyncSandbox.create(template="python", runtime=NS) as sb:
        r = await sb.commands.run(["sh", "-c", "cat; echo err >&2; exit 1"], stdin="in", cwd="/tmp")
        assert (r.stdout, r.stderr, r.exit_code, r.status) == ("in", "err\n", 1, "exited")
        r = await sb.commands.run("sleep 5", timeout=0.2)
        assert r.status == "timed_out"

        got: list[str] = []

        async def on_err(s: str) -> None:  # a coroutine callback
            await asyncio.sleep(0)
            got.append("E" + s)

        r = await sb.commands.run("echo 1; echo 2 >&2", on_stdout=got.append, on_stderr=on_err)
        assert sorted(got) == ["1\n", "E2\n"]
        assert (r.stdout, r.stderr) == ("1\n", "2\n")

        h = await sb.commands.run("echo a; sleep 0.3; echo b >&2", background=True, tag="t")
        assert [p.id for p in await sb.commands.list()] == [h.id]
        assert "".join([c async for c in h.stdout]) == "a\n"
        assert "".join([c async for c in h.stderr]) == "b\n"
        r = await h.wait(poll_interval=0.1)
        assert (r.stdout, r.stderr) == ("a\n", "b\n")
        assert not (await h.info()).running

        h = await sb.commands.run("trap 'exit 9' TERM; while true; do sleep 0.05; done", background=True)
        with pytest.raises(evalbox.CommandTimeoutError):
            await h.wait(timeout=0.2, poll_interval=0.05)
        other = await sb.commands.connect(h.id)
        await other.kill("TERM")
        assert (await h.wait()).exit_code == 9
        h = await sb.commands.run("sleep 30", background=True)
        await h.kill()
        assert (await h.wait()).status == "killed"

        h = await sb.commands.run("cat; echo eof", background=True, keep_stdin=True)
        await h.send_stdin("x")
        await h.send_stdin(b"y\n", close=True)
        assert (await h.wait(poll_interval=0.1)).stdout == "xy\neof\n"
        with pytest.raises(evalbox.NotFoundError):
            await h.send_stdin("late")
        h = await sb.commands.run("cat", background=True, keep_stdin=True)
        await h.close_stdin()
        assert (await h.wait(poll_interval=0.1)).stdout == ""


async def test_errors(server: Server, team: Team) -> None:
    with pytest.raises(evalbox.AuthenticationError):
        await AsyncSandbox.list(api_url=server.url, api_key="eb_nope")
    with pytest.raises(evalbox.BadRequestError):
        await AsyncSandbox.create(runtime="bogus")
    sb = await AsyncSandbox.create(runtime=NS)
    await sb.kill()
    with pytest.raises(evalbox.SandboxNotRunningError):
        await sb.commands.run("true")
    t = server.new_team(max_sandboxes=1)
    async with AsyncClient(t.url, t.key) as c, await AsyncSandbox.create(runtime=NS, client=c):
        assert (await c.health())["status"] == "ok"
        with pytest.raises(evalbox.TooManySandboxesError):
            await AsyncSandbox.create(runtime=NS, client=c)


async def test_50_concurrent_trials(team: Team) -> None:
    """The trial loop, 50 at once: create → write → run → score → delete, some trials raising."""
    run = uuid.uuid4().hex[:8]

    async def trial(i: int) -> bool:
        async with await AsyncSandbox.create(template="python", runtime=NS, metadata={"run": run}) as sb:
            await sb.files.write("/work/solution.py", f"print({i} * 2)\n")
            if i % 10 == 9:
                raise RuntimeError(f"trial {i} raised")
            r = await sb.commands.run("python3 /work/solution.py", timeout=20)
            return r.stdout == f"{i * 2}\n"

    start = time.monotonic()
    results = await asyncio.gather(*(trial(i) for i in range(50)), return_exceptions=True)
    wall = time.monotonic() - start
    assert sum(r is True for r in results) == 45
    assert sum(isinstance(r, RuntimeError) for r in results) == 5
    assert await AsyncSandbox.list(metadata={"run": run}) == []
    assert len(await AsyncSandbox.list(metadata={"run": run}, state="all")) == 50
    print(f"\n50 concurrent trials in {wall:.2f}s")


def test_sync_and_async_share_one_server_view(team: Team) -> None:
    """A sandbox made by one client is usable from the other."""

    async def make() -> str:
        sb = await AsyncSandbox.create(runtime=NS)
        await sb.files.write("/work/from-async", "x")
        return sb.id

    sid = asyncio.run(make())
    with Sandbox.connect(sid) as sb:
        assert sb.files.read_text("/work/from-async") == "x"


_LOOPS_SCRIPT = """
import asyncio, gc, sys
from evalbox import AsyncSandbox, _async

async def main():
    await AsyncSandbox.list()
    await AsyncSandbox.list(api_url=sys.argv[1], api_key=sys.argv[2])  # a second default client on this loop
    return [c._http for c in _async._defaults[asyncio.get_running_loop()].clients.values()]

https = []
for _ in range(3):
    https += asyncio.run(main())
gc.collect()
assert len(https) == 6 and all(h.is_closed for h in https), https
assert not _async._defaults, _async._defaults
print("ok")
"""


def test_default_clients_closed_with_their_loop(server: Server, team: Team) -> None:
    """The per-loop default clients are closed when asyncio.run ends their loop: no unclosed transport or
    socket (ResourceWarning is an error here, and so is anything printed), and no loop is kept."""
    other = server.new_team(max_sandboxes=1)
    p = subprocess.run(
        [sys.executable, "-W", "error", "-c", _LOOPS_SCRIPT, other.url, other.key],
        env={**os.environ, "EVALBOX_API_URL": team.url, "EVALBOX_API_KEY": team.key},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (p.returncode, p.stdout, p.stderr) == (0, "ok\n", "")
