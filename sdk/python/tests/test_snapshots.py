"""Snapshots, forks, pause and resume through the sync and async clients, against the real server (gVisor)."""

from __future__ import annotations

import pytest

import evalbox
from evalbox import AsyncSandbox, Client, Sandbox

from .server import NS, Team


def test_snapshot_fork_pause_resume(team: Team) -> None:
    with Client() as client, Sandbox.create(runtime="gvisor", timeout=300, client=client) as sb:
        sb.files.write("/work/state", "prepared")
        bg = sb.commands.run("sleep 600", background=True)
        snap = sb.snapshot()
        assert (snap.sandbox_id, snap.memory, snap.runtime, snap.template) == (sb.id, True, "gvisor", "base")
        assert snap.size_bytes > 0
        assert [s.id for s in client.snapshots.list()] == [snap.id]
        assert client.snapshots.get(snap.id).size_bytes == snap.size_bytes
        with Sandbox.create(snapshot=snap.id, metadata={"from": "snap"}, client=client) as copy:
            info = copy.info()
            assert (info.snapshot, info.template, info.runtime) == (snap.id, "base", "gvisor")
            assert info.metadata == {"from": "snap"}
            assert copy.files.read_text("/work/state") == "prepared"
            assert bg.pid in [p.pid for p in copy.commands.list()]
        with pytest.raises(ValueError, match="from a snapshot"):
            Sandbox.create(snapshot=snap.id, runtime=NS, client=client)
        client.snapshots.delete(snap.id)
        with pytest.raises(evalbox.NotFoundError):
            client.snapshots.get(snap.id)

        forks = sb.fork(2, metadata={"fork": "yes"})
        try:
            assert len(forks) == 2
            for i, f in enumerate(forks):
                assert f.info().metadata == {"fork": "yes"}
                f.files.write("/work/mine", str(i))
            assert [f.files.read_text("/work/mine") for f in forks] == ["0", "1"]
            assert "mine" not in [e.name for e in sb.files.list("/work")]
        finally:
            for f in forks:
                f.kill()
        assert client.snapshots.list() == []
        with pytest.raises(ValueError, match="count"):
            sb.fork(0)

        for n in range(2):
            sb.files.write(f"/work/round{n}", str(n))
            paused = sb.pause()
            assert (paused.state, paused.paused_at is not None) == ("paused", True)
            with pytest.raises(evalbox.SandboxNotRunningError):
                sb.commands.run("true")
            resumed = sb.resume()
            assert (resumed.state, resumed.paused_at) == ("running", None)
        assert [sb.files.read_text(f"/work/round{n}") for n in range(2)] == ["0", "1"]
        with pytest.raises(evalbox.ConflictError):
            sb.resume()


def test_namespaces_files_only(team: Team) -> None:
    with Client() as client, Sandbox.create(runtime=NS, timeout=60, client=client) as sb:
        sb.files.write("/work/state", "prepared")
        snap = sb.snapshot()
        assert (snap.memory, snap.runtime) == (False, NS)
        copies = sb.fork(2)
        try:
            for n, copy in enumerate(copies):
                assert copy.files.read_text("/work/state") == "prepared"
                copy.files.write("/work/state", str(n))
            assert [c.files.read_text("/work/state") for c in copies] == ["0", "1"]
            assert sb.files.read_text("/work/state") == "prepared"
        finally:
            for copy in copies:
                copy.kill()
        client.snapshots.delete(snap.id)
        with pytest.raises(evalbox.BadRequestError, match="gvisor"):
            sb.pause()


async def test_async_snapshot_fork_pause_resume(team: Team) -> None:
    async with (
        evalbox.AsyncClient() as client,
        await AsyncSandbox.create(runtime="gvisor", timeout=300, client=client) as sb,
    ):
        await sb.files.write("/work/a", "async")
        snap = await sb.snapshot()
        assert [s.id for s in await client.snapshots.list()] == [snap.id]
        async with await AsyncSandbox.create(snapshot=snap.id, client=client) as copy:
            assert await copy.files.read_text("/work/a") == "async"
        await client.snapshots.delete(snap.id)
        forks = await sb.fork(2, keep_snapshot=True)
        try:
            assert [await f.files.read_text("/work/a") for f in forks] == ["async", "async"]
        finally:
            for f in forks:
                await f.kill()
        kept = await client.snapshots.list()
        assert len(kept) == 1
        await client.snapshots.delete(kept[0].id)
        assert (await sb.pause()).state == "paused"
        assert (await sb.resume()).state == "running"
        assert await sb.files.read_text("/work/a") == "async"
