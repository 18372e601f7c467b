"""The async client's connection pool (_pool.py), against the real server."""

from __future__ import annotations

import asyncio
import time

import pytest

import evalbox
from evalbox import AsyncClient, AsyncSandbox, _pool

from .server import NS, Team


def pool_of(c: AsyncClient) -> _pool._AsyncPool:
    p = c._http._transport._pool  # type: ignore[attr-defined]
    assert isinstance(p, _pool._AsyncPool)
    return p


def idle(p: _pool._AsyncPool) -> list[object]:
    return [c for stack in p._idle.values() for c in stack]


async def test_connections_are_reused_at_any_concurrency(team: Team) -> None:
    async with AsyncClient(team.url, team.key) as c:
        p = pool_of(c)
        await asyncio.gather(*(c.health() for _ in range(64)))
        first = set(map(id, idle(p)))
        assert 1 <= len(first) <= 64
        assert not p._busy
        start = time.process_time()
        for _ in range(5):
            await asyncio.gather(*(c.health() for _ in range(64)))
        per_request = (time.process_time() - start) / 320
        assert set(map(id, idle(p))) <= first  # no new connection: all were reused
        assert per_request < 0.005, f"{per_request * 1e3:.2f} ms of CPU per request"
    assert not idle(p)
    assert not p._busy


async def test_streams_errors_and_cancellation_leave_the_pool_consistent(team: Team) -> None:
    async with AsyncClient(team.url, team.key) as c, await AsyncSandbox.create(runtime=NS, client=c) as sb:
        p = pool_of(c)
        # A stream read to its end gives its connection back.
        h = await sb.commands.run("echo a; echo b", background=True)
        assert "".join([x async for x in h.stdout]) == "a\nb\n"
        assert not p._busy
        # A stream abandoned half-way closes its connection (it cannot be reused).
        h = await sb.commands.run("echo one; sleep 30", background=True)
        out = h.stdout
        assert await anext(out) == "one\n"
        await out.aclose()  # type: ignore[attr-defined]
        assert not p._busy
        await h.kill()
        # A request cancelled in flight.
        task = asyncio.create_task(sb.commands.run("sleep 30"))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not p._busy
        # An error answer.
        with pytest.raises(evalbox.NotFoundError):
            await sb.files.read("/nope")
        assert not p._busy
        assert (await sb.commands.run("echo ok")).stdout == "ok\n"
