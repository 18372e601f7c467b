"""Many trials with asyncio: one fresh sandbox per trial, as many at once as the team's quota allows.

Each trial writes a program into its sandbox, runs it and scores its output
against an expected value kept here. Some trials raise on purpose (a scorer
bug, say): their sandboxes are deleted all the same, by `async with`. At the
end the script checks that no sandbox of the run is left.

    export EVALBOX_API_URL=http://127.0.0.1:8700 EVALBOX_API_KEY=...
    python examples/parallel_trials_async.py [--trials 200] [--concurrency N] [--runtime namespaces]

Without --concurrency the semaphore is sized from the team's quota,
min(max_sandboxes, max_concurrent_execs), read from the REST API (default 8
when the key may not read it). Creates also pass `wait=`, so a semaphore larger
than the quota makes trials queue on the server rather than fail.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid

import httpx

from evalbox import AsyncSandbox

DEFAULT_CONCURRENCY = 8


class ScorerCrashed(Exception):
    """Stands for any bug in a trial's own code."""


def program(i: int) -> str:
    # Every 7th "model output" is wrong by one.
    value = f"{i} * {i} + 1" if i % 7 == 3 else f"{i} * {i}"
    return f"print({value})\n"


async def trial(i: int, sem: asyncio.Semaphore, args: argparse.Namespace, run_id: str) -> bool:
    async with (
        sem,
        await AsyncSandbox.create(
            template=args.template,
            runtime=args.runtime,
            timeout=300,
            metadata={"run": run_id, "trial": str(i)},
            wait=120,  # queue on the server if the team's slots are taken
        ) as sb,
    ):
        await sb.files.write("/work/solution.py", program(i))
        if args.fail_every and i % args.fail_every == args.fail_every - 1:
            raise ScorerCrashed(f"trial {i}")
        r = await sb.commands.run("python3 /work/solution.py", timeout=10)
        return r.ok and r.stdout.strip() == str(i * i)  # the expected value never enters the sandbox


async def quota_concurrency() -> int | None:
    """min(max_sandboxes, max_concurrent_execs) of the caller's team, or None when the key may not read it.

    The SDK has no teams API, so this asks the REST API directly: the caller's
    key record (found by its prefix in GET /v1/keys) names its team, and
    GET /v1/teams/{id} its limits.
    """
    url = os.environ.get("EVALBOX_API_URL", "http://127.0.0.1:8700").rstrip("/")
    key = os.environ.get("EVALBOX_API_KEY", "")
    async with httpx.AsyncClient(base_url=url + "/v1", headers={"Authorization": f"Bearer {key}"}) as c:
        r = await c.get("/keys")
        if r.status_code != 200:
            return None
        mine = [k for k in r.json()["keys"] if key.startswith(k["prefix"])]
        if len(mine) != 1:
            return None
        r = await c.get(f"/teams/{mine[0]['team_id']}")
        if r.status_code != 200:
            return None
        limits = r.json()["limits"]
        return int(min(limits["max_sandboxes"], limits["max_concurrent_execs"]))


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=None, help="default: from the team's quota")
    ap.add_argument("--template", default="python")
    ap.add_argument("--runtime", default=None, help="gvisor or namespaces (default: the server's)")
    ap.add_argument("--fail-every", type=int, default=25, help="every Nth trial raises (0: none)")
    args = ap.parse_args()

    concurrency = args.concurrency
    source = "--concurrency"
    if concurrency is None:
        concurrency = await quota_concurrency()
        source = "the team's quota"
        if concurrency is None:
            concurrency, source = DEFAULT_CONCURRENCY, "default (the key may not read its quota)"
    print(f"{args.trials} trials, concurrency {concurrency} ({source})")

    run_id = uuid.uuid4().hex[:12]
    sem = asyncio.Semaphore(concurrency)
    start = time.perf_counter()
    outcomes = await asyncio.gather(*(trial(i, sem, args, run_id) for i in range(args.trials)), return_exceptions=True)
    wall = time.perf_counter() - start

    passed = sum(o is True for o in outcomes)
    failed = sum(o is False for o in outcomes)
    crashed = [o for o in outcomes if isinstance(o, BaseException)]
    print(f"passed {passed}, failed {failed}, raised {len(crashed)} in {wall:.1f}s")
    unexpected = [o for o in crashed if not isinstance(o, ScorerCrashed)]
    for e in unexpected[:5]:
        print(f"  unexpected error: {type(e).__name__}: {e}", file=sys.stderr)

    left = await AsyncSandbox.list(metadata={"run": run_id})
    if left:
        print(f"{len(left)} sandboxes left behind; deleting them", file=sys.stderr)
        await AsyncSandbox.kill_all({"run": run_id})
        return 1
    print("no sandbox left behind")
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
