"""Pause, connect (resume), fork and snapshots of the official e2b SDK, unchanged, against evalbox (gVisor)."""

from __future__ import annotations

import pytest
from e2b import AsyncSandbox, Sandbox, SandboxQuery, SandboxState
from e2b.exceptions import SandboxException

from .conftest import Server


def test_pause_and_connect(key: str, server: Server) -> None:
    sb = Sandbox.create("base", timeout=120)
    try:
        for n in range(2):
            sb.files.write(f"/root/round{n}", str(n))
            assert sb.pause() is True
            assert sb.pause() is False  # already paused
            paused = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
            assert [s.sandbox_id for s in paused] == [sb.sandbox_id]
            assert Sandbox.list(query=SandboxQuery(state=[SandboxState.RUNNING])).next_items() == []
            assert sb.get_info().state == SandboxState.PAUSED
            # connect resumes it, as E2B's does; its changes are all there.
            again = Sandbox.connect(sb.sandbox_id, timeout=120)
            assert again.get_info().state == SandboxState.RUNNING
            assert [again.files.read(f"/root/round{i}") for i in range(n + 1)] == [str(i) for i in range(n + 1)]
            sb = again
        assert sb.commands.run("echo alive").stdout == "alive\n"
        with pytest.raises(SandboxException):
            sb.pause(mode="filesystem")
    finally:
        sb.kill()


def test_fork(key: str, server: Server) -> None:
    sb = Sandbox.create("base", timeout=120)
    forks: list[Sandbox] = []
    try:
        sb.files.write("/root/prepared", "yes")
        results = sb.fork(count=2, timeout=120)
        forks = [f for f in results if isinstance(f, Sandbox)]
        assert len(forks) == 2, results
        for i, f in enumerate(forks):
            assert f.sandbox_id != sb.sandbox_id
            assert f.files.read("/root/prepared") == "yes"
            f.files.write("/root/mine", str(i))
        assert [f.files.read("/root/mine") for f in forks] == ["0", "1"]
        assert not sb.files.exists("/root/mine")
    finally:
        for f in forks:
            f.kill()
        sb.kill()


def test_snapshots(key: str, server: Server) -> None:
    sb = Sandbox.create("base", timeout=120)
    copy = None
    try:
        sb.files.write("/root/state", "snapshotted")
        snap = sb.create_snapshot()
        assert snap.snapshot_id.startswith("snap-")
        listed = Sandbox.list_snapshots().next_items()
        assert [s.snapshot_id for s in listed] == [snap.snapshot_id]
        of_sb = Sandbox.list_snapshots(sandbox_id=sb.sandbox_id).next_items()
        assert [s.snapshot_id for s in of_sb] == [snap.snapshot_id]
        # A copy has its snapshot's network: asking for another is refused.
        with pytest.raises(SandboxException):
            Sandbox.create(snap.snapshot_id, timeout=120, allow_internet_access=False)
        copy = Sandbox.create(snap.snapshot_id, timeout=120)
        assert copy.files.read("/root/state") == "snapshotted"
        assert Sandbox.delete_snapshot(snap.snapshot_id) is True
        assert Sandbox.delete_snapshot(snap.snapshot_id) is False
        assert Sandbox.list_snapshots().next_items() == []
        # The copy goes on without its snapshot.
        assert copy.commands.run("cat /root/state").stdout == "snapshotted"
    finally:
        if copy is not None:
            copy.kill()
        sb.kill()


def test_async_pause_resume(key: str, server: Server) -> None:
    import asyncio

    async def main() -> None:
        sb = await AsyncSandbox.create("base", timeout=120)
        try:
            await sb.files.write("/root/a", "async")
            assert await sb.pause() is True
            sb = await AsyncSandbox.connect(sb.sandbox_id)
            assert await sb.files.read("/root/a") == "async"
        finally:
            await sb.kill()

    asyncio.run(main())
