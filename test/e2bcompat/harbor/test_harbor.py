"""Harbor's E2B environment (`harbor run -e e2b`, pinned in harbor/constraints.txt), unchanged,
against a real `evalbox serve`: Harbor builds the task's Dockerfile through the template API
(the name harbor-<hash>, a tag per CPU/memory variant, sandboxes from name:<build ID>), runs the
agent and the verifier in gVisor sandboxes, and reads the reward back.

scripts/test.sh runs this in its own venv (Harbor needs Python >= 3.12), apart from the rest of
test/e2bcompat (`pytest harbor`); the fixtures come from ../conftest.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ..conftest import Server, start_server, stop_server

TASK = Path(__file__).parent / "hello-task"
HARBOR = Path(sys.executable).parent / "harbor"
TAG = "c1-m1024-r5"  # Harbor's tag for task.toml's cpus = 1, memory_mb = 1024 (recipe r5)


@pytest.fixture
def harbor_server() -> Iterator[Server]:
    """A server of this test's own, which it restarts."""
    s = start_server()
    yield s
    stop_server(s)


def _env(server: Server, key: str) -> dict[str, str]:
    # Nothing leaves the machine: no telemetry, LiteLLM's bundled price map.
    return os.environ | {
        "E2B_API_URL": server.url,
        "E2B_SANDBOX_URL": server.url,
        "E2B_API_KEY": key,
        "E2B_DOMAIN": "evalbox.invalid",
        "HARBOR_TELEMETRY": "0",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "NO_COLOR": "1",
    }


def _run(server: Server, key: str, jobs: Path, name: str, agent: str, *extra: str) -> list[dict[str, Any]]:
    """One `harbor run` of the task: its trials' results."""
    args = [str(HARBOR), "run", "-p", str(TASK), "-e", "e2b", "-a", agent, "-o", str(jobs), "--job-name", name]
    r = subprocess.run(
        [*args, "-y", "-q", *extra],
        capture_output=True,
        text=True,
        timeout=900,
        env=_env(server, key),
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    results = [json.loads(p.read_text()) for p in sorted((jobs / name).glob("*/result.json"))]
    assert results, (sorted((jobs / name).iterdir()), r.stdout[-4000:])
    for res in results:
        assert res.get("exception_info") is None, (res["trial_name"], res["exception_info"])
    return results


def _rewards(results: list[dict[str, Any]]) -> list[float]:
    return [float(res["verifier_result"]["rewards"]["reward"]) for res in results]


def _harbor_tags(server: Server, key: str) -> dict[str, str]:
    """The team's harbor-* templates' tags (evalbox's own API): name:tag → build id."""
    h = {"Authorization": f"Bearer {key}"}
    out: dict[str, str] = {}
    for t in httpx.get(server.url + "/v1/templates", headers=h).json()["templates"]:
        if t["name"].startswith("harbor-") and ":" in t["name"]:
            out[t["name"]] = t["build_id"]
    return out


def test_harbor_jobs(harbor_server: Server, tmp_path: Path) -> None:
    server = harbor_server
    key = server.new_team(max_sandboxes=8)
    jobs = tmp_path / "jobs"

    # The oracle solves the task: reward 1, from the template Harbor built here.
    assert _rewards(_run(server, key, jobs, "oracle", "oracle")) == [1.0]
    tags = _harbor_tags(server, key)
    assert len(tags) == 1, tags
    assert next(iter(tags)).endswith(":" + TAG), tags
    ((ref, build),) = tags.items()
    name = ref.split(":")[0]
    with httpx.Client(base_url=server.url, headers={"X-API-KEY": key}) as e2b:
        # What the E2B SDK sees: the tag, its build as a UUID, and the build ready.
        listed = e2b.get(f"/templates/{name}/tags").json()
        assert [t["tag"] for t in listed] == [TAG], listed
        status = e2b.get(f"/templates/{name}/builds/{listed[0]['buildID']}/status").json()
        assert status["status"] == "ready", status

    # The agent that does nothing gets 0, from the same build.
    assert _rewards(_run(server, key, jobs, "nop", "nop")) == [0.0]
    assert _harbor_tags(server, key) == tags

    # After a restart the tag is still there: nothing is built again.
    stop_server(server, keep=True)
    server = start_server(server.data_dir)
    try:
        assert _rewards(_run(server, key, jobs, "after-restart", "oracle")) == [1.0]
        assert _harbor_tags(server, key) == tags
        # The build's status, by the UUID the SDK was given before the restart.
        status = httpx.get(
            f"{server.url}/templates/{name}/builds/{listed[0]['buildID']}/status", headers={"X-API-KEY": key}
        ).json()
        assert status["status"] == "ready", status

        # Two trials at once with --force-build: one new build for the job,
        # both trials from it, the tag moved to it.
        results = _run(server, key, jobs, "forced", "oracle", "--force-build", "-k", "2", "-n", "2")
        assert _rewards(results) == [1.0, 1.0]
        moved = _harbor_tags(server, key)
        assert list(moved) == [ref], moved
        assert moved[ref] != build, (moved, build)
        assert server.running(key) == []
    finally:
        harbor_server.proc = server.proc  # the fixture stops the restarted one
