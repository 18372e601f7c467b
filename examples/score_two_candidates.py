"""Score two candidate programs for one task, each in its own fresh sandbox, in parallel.

The sandbox only runs the candidate and prints what its function returns; the
expected values stay here, in the caller's code, where the candidate cannot
read them.

    export EVALBOX_API_URL=http://127.0.0.1:8700 EVALBOX_API_KEY=...
    python examples/score_two_candidates.py [--runtime namespaces]
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor

from evalbox import Sandbox

# The task: `def sum_even_squares(xs: list[int]) -> int`.
INPUTS = [[1, 2, 3, 4], [], [-2, 5, 6], [7, 9]]
EXPECTED = [20, 0, 40, 0]  # never leaves this process

CANDIDATES = {
    "correct": "def sum_even_squares(xs):\n    return sum(x * x for x in xs if x % 2 == 0)\n",
    "buggy": "def sum_even_squares(xs):\n    return sum(x * x for x in xs if x > 0 and x % 2 == 0)\n",
}

# Appended to the candidate: call it on each input and print the results as JSON.
DRIVER = """
import json, sys
inputs = json.loads(sys.stdin.read())
print(json.dumps([sum_even_squares(x) for x in inputs]))
"""


def score(name: str, source: str, template: str, runtime: str | None) -> tuple[str, bool, str]:
    with Sandbox.create(template=template, runtime=runtime, timeout=60, metadata={"example": "two"}) as sb:
        sb.files.write("/work/candidate.py", source + DRIVER)
        r = sb.commands.run("python3 /work/candidate.py", stdin=json.dumps(INPUTS), timeout=10)
    if not r.ok:
        return name, False, f"{r.status} (exit {r.exit_code}): {r.stderr.strip()[-200:]}"
    got = json.loads(r.stdout)
    return name, got == EXPECTED, f"got {got}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--template", default="python")
    ap.add_argument("--runtime", default=None, help="gvisor or namespaces (default: the server's)")
    args = ap.parse_args()
    with ThreadPoolExecutor(max_workers=len(CANDIDATES)) as pool:
        futures = [pool.submit(score, n, s, args.template, args.runtime) for n, s in CANDIDATES.items()]
        for f in futures:
            name, passed, detail = f.result()
            print(f"{name}: {'passed' if passed else 'failed'} ({detail})")


if __name__ == "__main__":
    main()
