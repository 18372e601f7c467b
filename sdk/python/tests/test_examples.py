"""The examples in <repo>/examples run as a user would run them: subprocesses configured by env vars."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import httpx

from evalbox import Sandbox

from .server import NS, REPO, Server, Team

EXAMPLES = REPO / "examples"


def run_example(name: str, url: str, key: str, *args: str, timeout: float = 120) -> str:
    env = {**os.environ, "EVALBOX_API_URL": url, "EVALBOX_API_KEY": key}
    p = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert p.returncode == 0, f"{name} exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p.stdout


def test_score_two_candidates(team: Team) -> None:
    out = run_example("score_two_candidates.py", team.url, team.key, "--runtime", NS)
    assert "correct: passed (got [20, 0, 40, 0])" in out
    assert "buggy: failed" in out


def test_score_two_candidates_gvisor(team: Team) -> None:
    out = run_example("score_two_candidates.py", team.url, team.key)
    assert "correct: passed" in out
    assert "buggy: failed" in out


def test_rl_rewards(team: Team) -> None:
    out = run_example("rl_rewards.py", team.url, team.key, "--runtime", NS, "--group", "3", "--timeout", "3")
    assert out.splitlines() == [
        "completion 0: mean reward 1.00 (exited)",
        "completion 1: mean reward 1.00 (exited)",
        "completion 2: mean reward 0.50 (exited)",
        "completion 3: mean reward 0.25 (exited)",
        "completion 4: mean reward 0.00 (timed_out)",
        "15 scripts, mean reward 0.55",
    ]


def test_harness_in_sandbox(team: Team) -> None:
    out = run_example("harness_in_sandbox.py", team.url, team.key, "--runtime", NS, "--timeout", "1")
    assert out.splitlines() == [
        "demo/0 #0: passed",
        "demo/0 #1: failed: AssertionError",
        "demo/0 #2: timed out",
        "demo/1 #3: passed",
        "demo/1 #4: failed: IndexError: string index out of range",
        "demo/0: pass@1 = 0.33",
        "demo/1: pass@1 = 0.50",
    ]


def test_parallel_trials_async_sizes_its_semaphore_from_the_quota(server: Server) -> None:
    # An admin key may read its team's limits: min(max_sandboxes, max_concurrent_execs).
    with server.admin() as c:
        me = next(k for k in c.get("/keys").json()["keys"] if server.admin_key.startswith(k["prefix"]))
        team_url = f"/teams/{me['team_id']}"
        saved = c.get(team_url).json()["limits"]
        c.patch(team_url, json={"limits": {"max_sandboxes": 12, "max_concurrent_execs": 16}}).raise_for_status()
        try:
            out = run_example("parallel_trials_async.py", server.url, server.admin_key, "--runtime", NS, timeout=150)
        finally:
            c.patch(team_url, json={"limits": saved}).raise_for_status()
    assert "200 trials, concurrency 12 (the team's quota)" in out
    # Every 7th program is wrong; every 25th trial raises on purpose.
    m = re.search(r"passed (\d+), failed (\d+), raised (\d+)", out)
    assert m is not None, out
    raised = {i for i in range(200) if i % 25 == 24}
    failed = {i for i in range(200) if i % 7 == 3} - raised
    assert tuple(map(int, m.groups())) == (200 - len(raised) - len(failed), len(failed), len(raised))
    assert "no sandbox left behind" in out
    assert Sandbox.list(api_url=server.url, api_key=server.admin_key) == []


def test_parallel_trials_async_with_a_team_key(server: Server) -> None:
    t = server.new_team(max_sandboxes=3, max_concurrent_execs=4)
    args = ("--runtime", NS, "--trials", "20", "--fail-every", "4")
    out = run_example("parallel_trials_async.py", t.url, t.key, *args)
    assert "20 trials, concurrency 3 (the team's quota)" in out
    assert "raised 5" in out
    assert "no sandbox left behind" in out
    # A semaphore above the quota: the creates queue on the server (wait=) instead of failing.
    out = run_example("parallel_trials_async.py", t.url, t.key, *args, "--concurrency", "10")
    assert "20 trials, concurrency 10 (--concurrency)" in out
    assert "raised 5" in out
    assert "no sandbox left behind" in out
    with httpx.Client() as c:
        assert c.get(f"{t.url}/v1/sandboxes", headers={"Authorization": f"Bearer {t.key}"}).json() == {"sandboxes": []}
