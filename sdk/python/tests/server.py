"""Starting and stopping a real `evalbox serve` (real runsc, real namespaces, temp data dir) for the tests.

Binaries come from $EVALBOX_BIN_DIR (default <repo>/bin, built by
scripts/build.sh), templates from $EVALBOX_TEMPLATES_DIR (default
/var/cache/evalbox/templates, built by `evalbox template init`).
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
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from evalbox import Client

REPO = Path(__file__).resolve().parents[3]
BIN_DIR = Path(os.environ.get("EVALBOX_BIN_DIR") or REPO / "bin")
TEMPLATES_DIR = os.environ.get("EVALBOX_TEMPLATES_DIR") or "/var/cache/evalbox/templates"

#: Most tests use the namespaces runtime (fast); a few use gvisor (the server's default).
NS = "namespaces"

_team_seq = itertools.count()


@dataclass
class Server:
    """A running `evalbox serve`."""

    url: str
    admin_key: str
    data_dir: Path
    proc: subprocess.Popen[bytes]

    def admin(self) -> httpx.Client:
        """An HTTP client with the admin key (the SDK has no admin API)."""
        return httpx.Client(base_url=self.url + "/v1", headers={"Authorization": f"Bearer {self.admin_key}"})

    def new_team(self, max_sandboxes: int, max_concurrent_execs: int = 64) -> Team:
        """A team with its own limits and API key."""
        name = f"sdk-{os.getpid()}-{next(_team_seq)}"
        with self.admin() as c:
            r = c.post(
                "/teams",
                json={
                    "name": name,
                    "limits": {"max_sandboxes": max_sandboxes, "max_concurrent_execs": max_concurrent_execs},
                },
            )
            r.raise_for_status()
            team_id = r.json()["id"]
            r = c.post("/keys", json={"name": "sdk-test", "team_id": team_id})
            r.raise_for_status()
            return Team(id=team_id, key=r.json()["key"], url=self.url)


@dataclass
class Team:
    id: str
    key: str
    url: str

    def client(self) -> Client:
        return Client(self.url, self.key)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_server(*extra: str) -> Server:
    """Start `evalbox serve` on a free port with a temp data dir; wait for its admin key and health."""
    if os.geteuid() != 0:
        pytest.skip("needs root: sandboxes need namespaces, cgroups and mounts")
    exe = BIN_DIR / "evalbox"
    if not exe.exists():
        pytest.fail(f"{exe} missing: run scripts/build.sh first")
    data_dir = Path(tempfile.mkdtemp(prefix="evalbox-sdk-"))
    url = f"http://127.0.0.1:{_free_port()}"
    log = open(data_dir / "server.log", "wb")  # noqa: SIM115 (kept open for the server's life)
    proc = subprocess.Popen(
        [
            str(exe),
            "serve",
            "--data-dir",
            str(data_dir),
            "--listen",
            url.removeprefix("http://"),
            "--templates-dir",
            TEMPLATES_DIR,
            *extra,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    deadline = time.monotonic() + 600  # a first run may build the built-in templates
    key_file = data_dir / "admin.key"
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"evalbox serve exited with {proc.returncode}:\n{_tail(data_dir)}")
        if key_file.exists() and key_file.stat().st_size > 0:
            try:
                if httpx.get(url + "/v1/health", timeout=1).status_code == 200:
                    return Server(url=url, admin_key=key_file.read_text().strip(), data_dir=data_dir, proc=proc)
            except httpx.TransportError:
                pass
        if time.monotonic() > deadline:
            stop_server(Server(url, "", data_dir, proc))
            raise RuntimeError(f"evalbox serve did not come up:\n{_tail(data_dir)}")
        time.sleep(0.05)


def stop_server(s: Server) -> None:
    """SIGTERM (graceful: it deletes its sandboxes), then check that it left no mount, and remove the data dir."""
    s.proc.send_signal(signal.SIGTERM)
    try:
        s.proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(s.proc.pid, signal.SIGKILL)
        s.proc.wait(10)
        raise
    finally:
        leaked = _mounts_under(s.data_dir)
        for m in reversed(leaked):  # clean up all the same, innermost first
            subprocess.run(["umount", "-l", m], check=False)
        shutil.rmtree(s.data_dir, ignore_errors=True)
    assert s.proc.returncode == 0, f"evalbox serve exited with {s.proc.returncode}"
    assert not leaked, f"evalbox serve left mounts behind: {leaked}"


def _mounts_under(d: Path) -> list[str]:
    prefix = str(d) + "/"
    with open("/proc/self/mounts") as f:
        points = [line.split()[1] for line in f]
    return [p for p in points if p.startswith(prefix)]


def _tail(data_dir: Path, n: int = 30) -> str:
    try:
        return "\n".join((data_dir / "server.log").read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""
