"""Rewards for one RL step: a batch of completions, each run in its own fresh sandbox by one call.

`evalbox.execute` sends the whole batch to the server (`POST /v1/execute`),
which runs every script in a fresh sandbox, as many at a time as the team's
limits allow, and answers with one result per script, in order. Each script
is a completion plus a driver that prints what the function returns on the
inputs; the expected values stay here, where a completion cannot read them.

    export EVALBOX_API_URL=http://127.0.0.1:8700 EVALBOX_API_KEY=...
    python examples/rl_rewards.py [--runtime namespaces] [--group 8]
"""

from __future__ import annotations

import argparse
import json

import evalbox

# The task: `def running_max(xs: list[int]) -> list[int]`.
INPUTS = [[1, 3, 2, 5, 4], [], [-1, -2, -3], [7]]
EXPECTED = [[1, 3, 3, 5, 5], [], [-1, -1, -1], [7]]  # never leaves this process

# What a policy might sample for the task: right, half right, wrong, crashing, looping forever.
COMPLETIONS = [
    "def running_max(xs):\n    out, m = [], None\n    for x in xs:\n        m = x if m is None else max(m, x)\n"
    "        out.append(m)\n    return out\n",
    "def running_max(xs):\n    return [max(xs[: i + 1]) for i in range(len(xs))]\n",
    "def running_max(xs):\n    return sorted(xs)\n",
    "def running_max(xs):\n    return [max(xs[:i]) for i in range(len(xs))]\n",
    "def running_max(xs):\n    while True:\n        pass\n",
]

# Appended to each completion: one line of JSON per input (null when the call raises).
DRIVER = f"""
import json
for xs in {json.dumps(INPUTS)}:
    try:
        print(json.dumps(running_max(xs)))
    except Exception:
        print("null")
"""


def reward(r: evalbox.CommandResult) -> float:
    """The share of inputs answered right; 0 for a script that timed out or could not run."""
    if r.status != "exited":
        return 0.0
    got = [json.loads(line) for line in r.stdout.splitlines()]
    right = sum(1 for g, e in zip(got, EXPECTED, strict=False) if g == e)
    return right / len(EXPECTED)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runtime", default=None, help="gvisor or namespaces (default: the server's)")
    ap.add_argument("--group", type=int, default=4, help="samples per completion (a GRPO group)")
    ap.add_argument("--timeout", type=float, default=2.0, help="seconds per script")
    args = ap.parse_args()
    batch = [c for c in COMPLETIONS for _ in range(args.group)]
    results = evalbox.execute([c + DRIVER for c in batch], timeout=args.timeout, runtime=args.runtime)
    rewards = [reward(r) for r in results]
    for i in range(len(COMPLETIONS)):
        lo, hi = i * args.group, (i + 1) * args.group
        statuses = sorted({r.status for r in results[lo:hi]})
        print(f"completion {i}: mean reward {sum(rewards[lo:hi]) / args.group:.2f} ({', '.join(statuses)})")
    print(f"{len(batch)} scripts, mean reward {sum(rewards) / len(rewards):.2f}")


if __name__ == "__main__":
    main()
