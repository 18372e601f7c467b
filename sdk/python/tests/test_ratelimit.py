"""Request rate limits against a real server: RateLimitedError with the server's Retry-After, sync and async."""

from __future__ import annotations

import pytest

import evalbox
from evalbox import AsyncClient, AsyncSandbox, Client, Sandbox

from .server import Server


async def test_rate_limited_carries_retry_after(server: Server) -> None:
    t = server.new_team(max_sandboxes=1)
    # 6 requests a minute: a burst of 1, then one every 10 s.
    limits = {
        "max_sandboxes": 1,
        "max_concurrent_execs": 64,
        "max_storage_mb": 0,
        "requests_per_minute": 6,
        "creates_per_minute": 0,
    }
    with server.admin() as a:
        a.patch(f"/teams/{t.id}", json={"limits": limits}).raise_for_status()
        assert a.get(f"/teams/{t.id}").json()["limits"]["requests_per_minute"] == 6
    # A Retry-After longer than max_retry_wait is not waited for: the error comes at once.
    with Client(t.url, t.key, max_retry_wait=1) as c:
        assert Sandbox.list(client=c) == []
        with pytest.raises(evalbox.RateLimitedError) as ei:
            Sandbox.list(client=c)
    err = ei.value
    assert err.status == 429
    assert err.code == "rate_limited"
    assert err.retry_after is not None
    assert 1 <= err.retry_after <= 10
    assert "6 requests per minute" in err.message
    async with AsyncClient(t.url, t.key, max_retry_wait=1) as ac:
        with pytest.raises(evalbox.RateLimitedError) as aei:
            await AsyncSandbox.list(client=ac)
    assert aei.value.retry_after is not None
    assert 1 <= aei.value.retry_after <= 10
