"""Secrets through the sync and async clients, against the real server: given at create or stored, by name only."""

from __future__ import annotations

import secrets as _random

import pytest

import evalbox
from evalbox import AsyncClient, AsyncSandbox, Client, Sandbox

from .server import NS, Server, Team


def _canary() -> str:
    return "evbx-sdk-" + _random.token_hex(12)


def test_secrets_sync(server: Server, team: Team) -> None:
    given, stored = _canary(), _canary()
    with Client() as client:
        info = client.secrets.set("STORED_KEY", stored)
        assert info.name == "STORED_KEY"
        assert [s.name for s in client.secrets.list()] == ["STORED_KEY"]
        try:
            # Claimed from the namespaces pool: the secrets reach a warm sandbox too.
            with Sandbox.create(
                runtime=NS,
                env={"PLAIN": "p"},
                secrets={"GIVEN_KEY": given},
                secret_refs=["STORED_KEY"],
                client=client,
            ) as sb:
                assert sb.info().secret_names == ("GIVEN_KEY", "STORED_KEY")
                assert sb.info().env_keys == ("PLAIN",)
                r = sb.commands.run('printf "%s|%s|%s" "$GIVEN_KEY" "$STORED_KEY" "$PLAIN"')
                assert r.stdout == f"{given}|{stored}|p"
                assert given not in repr(sb.info())
            with pytest.raises(evalbox.BadRequestError, match="both env and secrets"):
                Sandbox.create(runtime=NS, env={"A": "x"}, secrets={"A": given}, client=client)
            with pytest.raises(evalbox.NotFoundError):
                Sandbox.create(runtime=NS, secret_refs=["NO_SUCH_SECRET"], client=client)
            with pytest.raises(TypeError):
                Sandbox.create(runtime=NS, secret_refs="STORED_KEY", client=client)
            # Another team cannot name the team's secret.
            other = server.new_team(max_sandboxes=2)
            with Client(other.url, other.key) as oc:
                assert oc.secrets.list() == []
                with pytest.raises(evalbox.NotFoundError):
                    Sandbox.create(runtime=NS, secret_refs=["STORED_KEY"], client=oc)
        finally:
            client.secrets.delete("STORED_KEY")
        assert client.secrets.list() == []
        with pytest.raises(evalbox.NotFoundError):
            client.secrets.delete("STORED_KEY")
        with pytest.raises(evalbox.BadRequestError):
            client.secrets.set("not-a-name", "v")


async def test_secrets_async(team: Team) -> None:
    given, stored = _canary(), _canary()
    async with AsyncClient() as client:
        await client.secrets.set("ASYNC_KEY", stored)
        try:
            async with await AsyncSandbox.create(
                runtime=NS, secrets={"GIVEN_KEY": given}, secret_refs=["ASYNC_KEY"], client=client
            ) as sb:
                assert (await sb.info()).secret_names == ("ASYNC_KEY", "GIVEN_KEY")
                r = await sb.commands.run('printf "%s|%s" "$GIVEN_KEY" "$ASYNC_KEY"')
                assert r.stdout == f"{given}|{stored}"
            assert [s.name for s in await client.secrets.list()] == ["ASYNC_KEY"]
        finally:
            await client.secrets.delete("ASYNC_KEY")
