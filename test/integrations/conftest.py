"""Fixtures of the integration suites: a real `evalbox serve` (real runsc and namespaces, a
temporary data dir), started as the E2B suite starts its own (test/e2bcompat/conftest.py), that
each suite points its framework's real package at, the way that framework's users do.

Binaries come from $EVALBOX_BIN_DIR (default <repo>/bin, built by scripts/build.sh), templates
from $EVALBOX_TEMPLATES_DIR (default /var/cache/evalbox/templates).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from e2bcompat.conftest import Server, start_server, stop_server

__all__ = ["Server"]


@pytest.fixture(scope="session")
def keyless_server() -> Iterator[Server]:
    """A server that runs SandboxFusion requests from loopback without a key as its admin team,
    as verl needs (it posts to a bare URL)."""
    s = start_server(extra_args=("--sandbox-fusion-loopback-team", "admin"))
    yield s
    stop_server(s)


@pytest.fixture(scope="session")
def keyed_server() -> Iterator[Server]:
    """A server with default settings: every request needs an API key."""
    s = start_server()
    yield s
    stop_server(s)
