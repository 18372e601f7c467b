"""OpenEnv (openenv 0.10.0 from PyPI, pinned in constraints.txt) on evalbox: an env server made here
(env/server/app.py, `create_app`) in a template built from env/Dockerfile with openenv's wheels
installed offline, started by `evalbox.integrations.openenv.EvalboxProvider`, and driven by the real
`GenericEnvClient` over the proxied WebSocket: reset, step, state, close; the provider= path with a
public port; a client without the traffic token refused; no sandbox left.

The wheels come from $EVALBOX_OPENENV_WHEELS (scripts/test.sh downloads them, Python 3.11's)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from openenv.core.generic_client import GenericEnvClient

import evalbox
from evalbox.integrations.openenv import EvalboxProvider

from ..conftest import Server

ENV = Path(__file__).parent / "env"
TEMPLATE = "openenv-echo"


@pytest.fixture(scope="module")
def client(keyed_server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[evalbox.Client]:
    key = keyed_server.new_team(max_sandboxes=4)
    ctx = tmp_path_factory.mktemp("openenv-context")
    shutil.copytree(ENV, ctx, dirs_exist_ok=True)
    shutil.copytree(os.environ["EVALBOX_OPENENV_WHEELS"], ctx / "wheels")
    with evalbox.Client(keyed_server.url, key) as c:
        c.templates.build(TEMPLATE, dockerfile=(ENV / "Dockerfile").read_text(), context_dir=ctx, timeout=600)
        yield c
        assert evalbox.Sandbox.list(client=c) == []


def test_reset_step_state(client: evalbox.Client) -> None:
    provider = EvalboxProvider(template=TEMPLATE, runtime="namespaces", client=client)
    url = provider.start_container()
    try:
        provider.wait_for_ready(url, timeout_s=60)
        with GenericEnvClient(base_url=url, headers=provider.headers).sync() as env:
            first = env.reset()
            assert first.observation["echoed_message"] == "ready"
            r = env.step({"message": "hello"})
            assert (r.observation["echoed_message"], r.observation["message_length"]) == ("hello", 5)
            assert r.reward == pytest.approx(0.5)
            assert not r.done
            assert env.state()["step_count"] == 1
            assert env.step({"message": "bye"}).done
        # Without the traffic token the port URL is closed.
        with pytest.raises(Exception, match=r"401"), GenericEnvClient(base_url=url).sync() as env:
            env.reset()
    finally:
        provider.stop_container()
    assert provider.sandbox is None


def test_provider_path_with_a_public_port(client: evalbox.Client) -> None:
    """EnvClient(provider=...) starts the container itself and passes no headers: a public port."""
    env = GenericEnvClient(
        provider=EvalboxProvider(template=TEMPLATE, runtime="namespaces", public=True, client=client)
    )
    with env.sync() as s:
        s.reset()
        assert s.step({"message": "hi"}).observation["echoed_message"] == "hi"
    assert evalbox.Sandbox.list(client=client) == []


def test_bad_template(client: evalbox.Client) -> None:
    with pytest.raises(RuntimeError, match="could not start"):
        EvalboxProvider(template="no-such-template", client=client).start_container()
    with pytest.raises(ValueError, match="no template"):
        EvalboxProvider(client=client).start_container()
