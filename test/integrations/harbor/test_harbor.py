"""Harbor's own `harbor run` (harbor 0.26.0 from PyPI, pinned in constraints.txt) with evalbox's
native environment, `-e evalbox.integrations.harbor:EvalboxEnvironment`, against a real
`evalbox serve`: the task's environment/Dockerfile built on the server by evalbox's Dockerfile
front end, the oracle and nop agents, the verifier's reward read back; a task whose solution is
wrong gets 0; a task with a docker_image and no Dockerfile starts from that template; no sandbox
is left behind."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from harbor.models.task.config import NetworkMode, NetworkPolicy

from evalbox.integrations.harbor import EvalboxEnvironment

from ..conftest import Server

TASK = Path(__file__).resolve().parents[2] / "e2bcompat" / "harbor" / "hello-task"
HARBOR = Path(sys.executable).parent / "harbor"
ENV = "evalbox.integrations.harbor:EvalboxEnvironment"


def _run(server: Server, key: str, task: Path, jobs: Path, name: str, agent: str, *extra: str) -> list[dict[str, Any]]:
    """One `harbor run` of task: its trials' results."""
    env = os.environ | {
        "EVALBOX_API_URL": server.url,
        "EVALBOX_API_KEY": key,
        # Nothing leaves the machine: no telemetry, LiteLLM's bundled price map.
        "HARBOR_TELEMETRY": "0",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "NO_COLOR": "1",
    }
    args = [str(HARBOR), "run", "-p", str(task), "-e", ENV, "-a", agent, "-o", str(jobs), "--job-name", name]
    args += ["-y", "-q"]
    r = subprocess.run([*args, *extra], capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    results = [json.loads(p.read_text()) for p in sorted((jobs / name).glob("*/result.json"))]
    assert results, (sorted((jobs / name).iterdir()), r.stdout[-4000:])
    for res in results:
        assert res.get("exception_info") is None, (res["trial_name"], res["exception_info"])
    return results


def _rewards(results: list[dict[str, Any]]) -> list[float]:
    return [float(res["verifier_result"]["rewards"]["reward"]) for res in results]


def _get(server: Server, key: str, path: str) -> Any:
    r = httpx.get(server.url + path, headers={"Authorization": f"Bearer {key}"})
    r.raise_for_status()
    return r.json()


def test_harbor_native(keyed_server: Server, tmp_path: Path) -> None:
    server = keyed_server
    key = server.new_team(max_sandboxes=6)
    jobs = tmp_path / "jobs"

    # The oracle solves the task: reward 1, in a sandbox of the template built from its Dockerfile.
    assert _rewards(_run(server, key, TASK, jobs, "oracle", "oracle")) == [1.0]
    built = [t for t in _get(server, key, "/v1/templates")["templates"] if t["name"].startswith("harbor-")]
    assert len(built) == 1, built
    assert (built[0]["workdir"], built[0]["env"].get("TASK_MODE")) == ("/app", "eval"), built[0]

    # The agent that does nothing gets 0, from the same template (nothing built again).
    assert _rewards(_run(server, key, TASK, jobs, "nop", "nop")) == [0.0]
    again = [t for t in _get(server, key, "/v1/templates")["templates"] if t["name"].startswith("harbor-")]
    assert [t["build_id"] for t in again] == [built[0]["build_id"]]

    # A task whose solution is wrong: 0.
    wrong = tmp_path / "wrong-task"
    shutil.copytree(TASK, wrong)
    (wrong / "solution" / "solve.sh").write_text('#!/bin/bash\necho "not it" > /app/answer.txt\n')
    assert _rewards(_run(server, key, wrong, jobs, "wrong", "oracle")) == [0.0]

    # A task with a docker_image and no Dockerfile: the template of that name, its environment/
    # files uploaded to the workdir, as Harbor does for a prebuilt image.
    image = tmp_path / "image-task"
    shutil.copytree(TASK, image)
    (image / "environment" / "Dockerfile").unlink()
    prebuilt = '[environment]\ndocker_image = "python"\nworkdir = "/app"\n'
    toml = (image / "task.toml").read_text().replace("[environment]\n", prebuilt)
    (image / "task.toml").write_text(toml)
    (image / "solution" / "solve.sh").write_text('#!/bin/bash\necho "$(cat /app/data.txt) solved" > /app/answer.txt\n')
    (image / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        '[ "$(cat /app/answer.txt)" = "hello solved" ] && r=1 || r=0\n'
        "echo $r > /logs/verifier/reward.txt\n"
    )
    assert _rewards(_run(server, key, image, jobs, "image", "oracle")) == [1.0]

    # Every trial's sandbox is gone.
    assert _get(server, key, "/v1/sandboxes")["sandboxes"] == []


def test_network_policies() -> None:
    """Harbor's network policies as evalbox's egress: none; outbound; rules with the allow list
    (IPs as CIDRs); and for a task whose phases switch modes, a rules sandbox that allows nothing
    in place of none (a sandbox of network none cannot change mode live)."""
    env = EvalboxEnvironment.__new__(EvalboxEnvironment)  # the policy mapping needs no task
    env._network_policy = NetworkPolicy(network_mode=NetworkMode.NO_NETWORK)
    env._phase_network_policies = []
    assert env._network(env.network_policy) == {"network": "none"}
    assert env._network(NetworkPolicy(network_mode=NetworkMode.PUBLIC)) == {"network": "outbound"}
    hosts = ["pypi.org", "*.example.com", "10.1.2.3", "2001:db8::1"]
    allowlist = NetworkPolicy(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=hosts)
    assert env._network(allowlist) == {
        "network": "rules",
        "allow": ["pypi.org", "*.example.com", "10.1.2.3/32", "2001:db8::1/128"],
    }
    env._phase_network_policies = [NetworkPolicy(network_mode=NetworkMode.PUBLIC)]
    assert env._network(env.network_policy) == {"network": "rules", "allow": []}
