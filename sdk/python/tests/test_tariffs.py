"""Tariffs through the sync and async clients, against the real server: the shape they give and what they refuse."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest

import evalbox
from evalbox import AsyncClient, AsyncSandbox, Client, Sandbox

from .server import NS, Team


def test_tariff_sync(team: Team) -> None:
    with Sandbox.create(runtime=NS, tariff="small") as sb:
        info = sb.info()
        assert (info.tariff, info.cpu, info.memory_mb, info.disk_mb) == ("small", 1.0, 512, 2048)
    with Sandbox.create(runtime=NS) as sb:
        assert sb.info().tariff == "standard"
    with pytest.raises(evalbox.BadRequestError, match="above tariff small"):
        Sandbox.create(runtime=NS, tariff="small", cpu=2)
    with pytest.raises(evalbox.BadRequestError, match="does not exist"):
        Sandbox.create(runtime=NS, tariff="no-such-tariff")


async def test_tariff_async(team: Team) -> None:
    async with await AsyncSandbox.create(runtime=NS, tariff="small", memory_mb=256) as sb:
        info = await sb.info()
        assert (info.tariff, info.memory_mb) == ("small", 256)


def test_usage_and_balance_sync(team: Team) -> None:
    start = datetime.now(timezone.utc) - timedelta(seconds=5)
    with Client() as client:
        with Sandbox.create(runtime=NS, tariff="small", client=client) as sb:
            sid = sb.id
        report = client.usage(start=start, group_by="sandbox")
        line = next(g for g in report.groups if g.key == sid)
        # Billed at least the server's minimum (60 s), at small's prices.
        assert line.billed_seconds >= 60
        assert line.cost > Decimal(0)
        assert report.total.sandboxes >= 1
        bal = client.balance()
        assert bal.team_id == team.id
        assert bal.billing is False
        with pytest.raises(ValueError, match="timezone-aware"):
            client.usage(start=datetime.now())
        with pytest.raises(evalbox.PermissionDeniedError):
            client.usage(team="all")


async def test_usage_async(team: Team) -> None:
    async with AsyncClient() as client:
        report = await client.usage(group_by="tariff")
        assert report.group_by == "tariff"
        assert (await client.balance()).team_id == team.id
