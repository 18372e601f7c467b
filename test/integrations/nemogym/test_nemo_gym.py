"""NeMo Gym's sandbox API (nemo-gym 0.4.0 from PyPI, pinned in constraints.txt) on evalbox, as its
users drive it: the provider found by its entry point ``evalbox`` (group
``nemo_gym.sandbox_providers``), ``AsyncSandbox({"evalbox": {...}}, spec)`` and the sync ``Sandbox``:
start, exec, upload, download, status, stop, and a port's endpoint."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from nemo_gym.sandbox import AsyncSandbox, Sandbox, SandboxSpec, SandboxStatus
from nemo_gym.sandbox.providers import SandboxCreateError
from nemo_gym.sandbox.providers.registry import create_provider, list_providers

from ..conftest import Server


@pytest.fixture(scope="module")
def config(keyed_server: Server) -> dict[str, dict[str, object]]:
    key = keyed_server.new_team(max_sandboxes=6)
    return {
        "evalbox": {
            "api_url": keyed_server.url,
            "api_key": key,
            "runtime": "namespaces",
            "images": {"python:3.11-slim": "python"},
        }
    }


def running(s: Server, key: str) -> list[str]:
    r = httpx.get(s.url + "/v1/sandboxes", headers={"Authorization": f"Bearer {key}"})
    r.raise_for_status()
    return [str(x["id"]) for x in r.json()["sandboxes"]]


def test_entry_point() -> None:
    assert "evalbox" in list_providers()


def test_async_sandbox(keyed_server: Server, config: dict[str, dict[str, object]], tmp_path: Path) -> None:
    key = str(config["evalbox"]["api_key"])
    local = tmp_path / "in.txt"
    local.write_text("uploaded\n")

    async def main() -> None:
        spec = SandboxSpec(
            image="python:3.11-slim",
            ttl_s=300,
            workdir="/work/task",
            env={"TASK": "t1"},
            files={"/work/task/given.txt": "from the spec\n"},
            metadata={"episode": "e1"},
            resources={"cpu": 1, "memory_mib": 512, "disk_gib": 1},
        )
        async with AsyncSandbox(config, spec) as sb:
            await sb.start()
            assert await sb.status() == SandboxStatus.RUNNING
            r = await sb.exec("pwd; echo $TASK; cat given.txt; python3 -c 'print(6 * 7)'")
            assert r.return_code == 0, r
            assert r.stdout == "/work/task\nt1\nfrom the spec\n42\n"
            r = await sb.exec("echo oops >&2; exit 3")
            assert (r.return_code, r.stderr) == (3, "oops\n")
            r = await sb.exec("sleep 30", timeout_s=1)
            assert (r.return_code, r.error_type) == (124, "timeout")
            r = await sb.exec("id -un", user="nobody")
            assert r.stdout == "nobody\n"
            await sb.upload(local, "/work/task/sub/in.txt")
            r = await sb.exec("cat sub/in.txt > out.txt && echo more >> out.txt")
            assert r.return_code == 0
            await sb.download("/work/task/out.txt", tmp_path / "got" / "out.txt")
            assert (tmp_path / "got" / "out.txt").read_text() == "uploaded\nmore\n"
            assert len(running(keyed_server, key)) == 1
        assert await sb.status() == SandboxStatus.STOPPED

    asyncio.run(main())
    assert running(keyed_server, key) == []


def test_sync_sandbox_and_endpoint(keyed_server: Server, config: dict[str, dict[str, object]]) -> None:
    key = str(config["evalbox"]["api_key"])
    spec = SandboxSpec(
        image="python",
        entrypoint=["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1"],
        workdir="/srv",
        files={"/srv/hello.txt": "hi from the sandbox\n"},
    )
    with Sandbox(config, spec) as sb:
        sb.start()
        probe = "python3 -c 'import urllib.request as u; u.urlopen(\"http://127.0.0.1:8000/\")'"
        r = sb.exec(f"for i in $(seq 50); do {probe} 2>/dev/null && break; sleep 0.1; done; echo up")
        assert r.stdout.endswith("up\n")
        provider = sb._async_sandbox._provider
        handle = sb._async_sandbox._handle
        url, headers = provider.endpoint(handle, 8000)
        resp = httpx.get(url + "hello.txt", headers=headers)
        assert resp.status_code == 200
        assert resp.text == "hi from the sandbox\n"
        assert httpx.get(url + "hello.txt").status_code == 401  # a port URL needs its token
    assert running(keyed_server, key) == []


def test_bad_specs(config: dict[str, dict[str, object]], keyed_server: Server) -> None:
    key = str(config["evalbox"]["api_key"])

    async def start(spec: SandboxSpec) -> None:
        async with AsyncSandbox(config, spec) as sb:
            await sb.start()

    for spec, match in [
        (SandboxSpec(image="docker.io/library/ubuntu:24.04"), "no evalbox template"),
        (SandboxSpec(image="no-such-template"), "could not create"),
        (SandboxSpec(image="python", resources={"gpu": 1}), "no GPUs"),
    ]:
        with pytest.raises(SandboxCreateError, match=match):
            asyncio.run(start(spec))
    assert running(keyed_server, key) == []
    with pytest.raises(ValueError, match="Unknown sandbox resource keys"):
        SandboxSpec(resources={"tpu": 1})
    assert create_provider({"evalbox": {"template": "python"}}).name == "evalbox"


def test_cancelled_creates_leave_nothing(config: dict[str, dict[str, object]], keyed_server: Server) -> None:
    """A create cancelled at any moment (an episode's timeout, a shutdown) leaves no sandbox: the
    server ends one whose creator left, and the provider deletes one whose answer it dropped by
    the create's tag. A fractional ttl_s rounds up."""
    key = str(config["evalbox"]["api_key"])
    provider = create_provider(config)

    async def main() -> None:
        for delay in (0.0, 0.02, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6):
            task = asyncio.create_task(provider.create(SandboxSpec(image="python", ttl_s=299.5)))
            await asyncio.sleep(delay)
            task.cancel()
            try:
                handle = await task
            except asyncio.CancelledError:
                continue
            # It finished first: a whole TTL, rounded up.
            info = await handle.raw.info()
            assert (info.expires_at - info.created_at).total_seconds() == 300
            await provider.close(handle)
        await provider.aclose()

    asyncio.run(main())
    for _ in range(100):
        if not running(keyed_server, key):
            break
        time.sleep(0.1)
    assert running(keyed_server, key) == []
