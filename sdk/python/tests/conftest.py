"""Fixtures: a real `evalbox serve` per test session (see server.py), and a team whose key the SDK finds in the env."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from evalbox import Sandbox

from .server import NS, Server, Team, start_server, stop_server


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    """The shared server: warm pools of namespaces sandboxes; gvisor and namespaces both enabled.

    Its sandboxes have 256 pids (``--pids``): every sandbox reserves its pids
    limit from the host's, and ``test_50_concurrent_trials`` holds 50 at once
    beside the pools, more than fit with the default 1024 on a host whose
    ``kernel.pid_max`` is 32768.
    """
    s = start_server("--pool", "base:namespaces=4,python:namespaces=4", "--pids", "256")
    yield s
    stop_server(s)


@pytest.fixture(scope="session")
def tiny_server() -> Iterator[Server]:
    """A server whose host pids budget (``--host-pids``) takes one namespaces sandbox of 1024 pids."""
    s = start_server("--host-pids", "1100")
    yield s
    stop_server(s)


@pytest.fixture(scope="session")
def small_server() -> Iterator[Server]:
    """A second server whose largest upload is 1 MiB (for 413)."""
    s = start_server("--max-file-bytes", "1MiB")
    yield s
    stop_server(s)


@pytest.fixture(scope="session")
def team(server: Server) -> Iterator[Team]:
    """The team most tests use, with room for 64 sandboxes. EVALBOX_API_URL/KEY point at it."""
    t = server.new_team(max_sandboxes=64, max_concurrent_execs=64)
    saved = {k: os.environ.get(k) for k in ("EVALBOX_API_URL", "EVALBOX_API_KEY")}
    os.environ["EVALBOX_API_URL"] = t.url
    os.environ["EVALBOX_API_KEY"] = t.key
    yield t
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(autouse=True)
def no_sandbox_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """After every test that uses the shared team: none of its sandboxes may still run."""
    yield
    if "team" not in request.fixturenames:
        return
    left = Sandbox.list()
    for info in left:
        Sandbox.kill_by_id(info.id)
    assert not left, f"sandboxes left running: {[i.id for i in left]}"


@pytest.fixture
def sb(team: Team) -> Iterator[Sandbox]:
    """A namespaces sandbox of the `python` template, deleted after the test."""
    with Sandbox.create(template="python", runtime=NS, timeout=120) as s:
        yield s
