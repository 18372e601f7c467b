"""Fixtures: a real `evalbox serve` (real runsc and namespaces, a temporary data dir) that the
official E2B SDK, pinned in constraints.txt, is pointed at the way its users point it at E2B:
E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY.

Binaries come from $EVALBOX_BIN_DIR (default <repo>/bin, built by scripts/build.sh), templates
from $EVALBOX_TEMPLATES_DIR (default /var/cache/evalbox/templates).
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
BIN_DIR = Path(os.environ.get("EVALBOX_BIN_DIR") or REPO / "bin")
TEMPLATES_DIR = os.environ.get("EVALBOX_TEMPLATES_DIR") or "/var/cache/evalbox/templates"

_seq = itertools.count()


@dataclass
class Server:
    url: str
    admin_key: str
    data_dir: Path
    proc: subprocess.Popen[bytes]

    def new_team(self, max_sandboxes: int = 20) -> str:
        """A new team's API key."""
        h = {"Authorization": f"Bearer {self.admin_key}"}
        with httpx.Client(base_url=self.url + "/v1", headers=h) as c:
            r = c.post(
                "/teams",
                json={
                    "name": f"e2b-{os.getpid()}-{next(_seq)}",
                    "limits": {"max_sandboxes": max_sandboxes, "max_concurrent_execs": 64},
                },
            )
            r.raise_for_status()
            team = r.json()["id"]
            r = c.post("/keys", json={"team_id": team, "name": "e2b"})
            r.raise_for_status()
            return str(r.json()["key"])

    def running(self, key: str) -> list[str]:
        """Ids of the team's running sandboxes (through evalbox's own API)."""
        r = httpx.get(self.url + "/v1/sandboxes", headers={"Authorization": f"Bearer {key}"})
        r.raise_for_status()
        return [s["id"] for s in r.json()["sandboxes"]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(data_dir: Path | None = None, extra_args: tuple[str, ...] = ()) -> Server:
    """A new `evalbox serve` in a temporary data dir (or again on data_dir, as a restart), with
    warm pools of the test templates and extra_args. The integration suites (test/integrations)
    start theirs with it too."""
    data_dir = data_dir or Path(tempfile.mkdtemp(prefix="evalbox-e2b-"))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    args = [
        str(BIN_DIR / "evalbox"),
        "serve",
        "--data-dir",
        str(data_dir),
        "--listen",
        f"127.0.0.1:{port}",
        "--templates-dir",
        TEMPLATES_DIR,
        "--pool",
        "base:gvisor=2,python:gvisor=2",
        *extra_args,
    ]
    with open(data_dir / "serve.log", "ab") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url + "/v1/health", timeout=1).status_code == 200 and (data_dir / "admin.key").exists():
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("evalbox serve did not start: " + (data_dir / "serve.log").read_text()[-2000:])
        time.sleep(0.1)
    return Server(url=url, admin_key=(data_dir / "admin.key").read_text().strip(), data_dir=data_dir, proc=proc)


def stop_server(s: Server, keep: bool = False) -> None:
    """Stops the server (gracefully: its sandboxes are destroyed) and removes its data dir
    (unless keep: for a restart)."""
    s.proc.send_signal(signal.SIGTERM)
    try:
        s.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        s.proc.kill()
        s.proc.wait()
    if keep:
        return
    if os.environ.get("EVALBOX_KEEP_DATA_DIR"):
        print(f"kept {s.data_dir}")  # its serve.log, for a failure's post-mortem
        return
    shutil.rmtree(s.data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    s = start_server()
    yield s
    stop_server(s)


@pytest.fixture(scope="session")
def key(server: Server) -> Iterator[str]:
    """The shared team's key; E2B_* point the SDK at the server."""
    k = server.new_team(max_sandboxes=30)
    saved = {n: os.environ.get(n) for n in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY", "E2B_DOMAIN")}
    os.environ["E2B_API_URL"] = server.url
    os.environ["E2B_SANDBOX_URL"] = server.url
    os.environ["E2B_API_KEY"] = k
    os.environ["E2B_DOMAIN"] = "evalbox.invalid"  # anything unused: traffic goes to E2B_SANDBOX_URL
    yield k
    for n, v in saved.items():
        if v is None:
            os.environ.pop(n, None)
        else:
            os.environ[n] = v


@pytest.fixture(autouse=True)
def no_sandbox_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test of the shared team: none of its sandboxes may still run."""
    yield
    if "key" not in request.fixturenames:
        return
    srv: Server = request.getfixturevalue("server")
    k: str = request.getfixturevalue("key")
    left = srv.running(k)
    for sid in left:
        httpx.delete(srv.url + f"/v1/sandboxes/{sid}", headers={"Authorization": f"Bearer {k}"})
    assert not left, f"sandboxes left running: {left}"
