"""The CPU-abuse rule's parts of the SDK: ``long_running=`` on create, and the
warning and throttle times of :class:`evalbox.SandboxInfo` (the rule itself:
test/e2e/abuse_test.go against a real server)."""

from __future__ import annotations

from typing import Any

from evalbox import AsyncSandbox, Sandbox
from evalbox import _core as core
from evalbox.models import SandboxInfo

from .server import NS, Team
from .test_core import CFG, SANDBOX


def _body(**kw: Any) -> Any:
    args: dict[str, Any] = {
        "template": "base",
        "runtime": None,
        "timeout": None,
        "cpu": None,
        "memory_mb": None,
        "disk_mb": None,
        "env": None,
        "metadata": None,
        "network": None,
        "wait": None,
    }
    args.update(kw)
    call = core.create_sandbox(CFG, **args).send(None)
    assert isinstance(call, core.Call)
    return call.json


def test_long_running_is_sent_only_when_set() -> None:
    assert _body(long_running=True) == {"template": "base", "long_running": True}
    assert _body() == {"template": "base"}


def test_sandbox_info_abuse_fields() -> None:
    info = SandboxInfo.from_json(SANDBOX)
    assert not info.long_running
    assert info.cpu_abuse_warned_at is None
    assert info.cpu_throttled_at is None
    d = dict(SANDBOX, long_running=True, cpu_abuse_warned_at="2026-11-29T11:32:00Z")
    d["cpu_throttled_at"] = "2026-11-29T11:33:00Z"
    info = SandboxInfo.from_json(d)
    assert info.long_running
    assert info.cpu_abuse_warned_at is not None
    assert info.cpu_abuse_warned_at.minute == 32
    assert info.cpu_throttled_at is not None
    assert info.cpu_throttled_at.minute == 33


def test_long_running_against_the_server(team: Team) -> None:
    with Sandbox.create(runtime=NS, timeout=60, long_running=True) as sb:
        info = sb.info()
        assert info.long_running
        assert info.cpu_abuse_warned_at is None
        assert info.cpu_throttled_at is None
    with Sandbox.create(runtime=NS, timeout=60) as sb:
        assert not sb.info().long_running


async def test_long_running_async(team: Team) -> None:
    sb = await AsyncSandbox.create(runtime=NS, timeout=60, long_running=True)
    try:
        assert (await sb.info()).long_running
    finally:
        await sb.kill()
