"""Run a whole slice of samples through a harness inside one sandbox (batch mode).

Uploads a harness and a slice of HumanEval-style problems and samples, starts
the harness in the background, waits for it with `wait(poll_interval=…)`, and
downloads its results.jsonl. Cheaper than one sandbox per sample, with weaker
isolation between the samples of one slice (each still runs in its own
process with a timeout).

    export EVALBOX_API_URL=http://127.0.0.1:8700 EVALBOX_API_KEY=...
    python examples/harness_in_sandbox.py [--runtime namespaces] [--out results.jsonl]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile

from evalbox import Sandbox

# The harness that runs inside the sandbox: one subprocess per sample, with a
# timeout; statuses as openai/human-eval writes them.
HARNESS = r"""
import json, subprocess, sys
from concurrent.futures import ThreadPoolExecutor

problems = {p["task_id"]: p for p in map(json.loads, open(sys.argv[1]))}
samples = [json.loads(line) for line in open(sys.argv[2])]
timeout = float(sys.argv[4])

def run(i, s):
    p = problems[s["task_id"]]
    program = p["prompt"] + s["completion"] + "\n" + p["test"] + f"\ncheck({p['entry_point']})\n"
    try:
        r = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        status = "timed out"
    else:
        err = r.stderr.strip().splitlines()
        status = "passed" if r.returncode == 0 else "failed: " + (err[-1] if err else f"exit {r.returncode}")
    return {"task_id": s["task_id"], "completion_id": i, "status": status}

with ThreadPoolExecutor(2) as pool, open(sys.argv[3], "w") as out:
    for res in pool.map(run, range(len(samples)), samples):
        out.write(json.dumps(res) + "\n")
print(f"{len(samples)} samples done", file=sys.stderr)
"""

PROBLEMS = [
    {
        "task_id": "demo/0",
        "prompt": "def add(a, b):\n",
        "entry_point": "add",
        "test": "def check(f):\n    assert f(1, 2) == 3\n    assert f(-1, 1) == 0\n",
    },
    {
        "task_id": "demo/1",
        "prompt": "def is_palindrome(s):\n",
        "entry_point": "is_palindrome",
        "test": "def check(f):\n    assert f('aba')\n    assert not f('ab')\n    assert f('')\n",
    },
]
SAMPLES = [
    {"task_id": "demo/0", "completion": "    return a + b\n"},
    {"task_id": "demo/0", "completion": "    return a - b\n"},
    {"task_id": "demo/0", "completion": "    while True:\n        pass\n"},
    {"task_id": "demo/1", "completion": "    return s == s[::-1]\n"},
    {"task_id": "demo/1", "completion": "    return s[0] == s[-1]\n"},
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--template", default="python")
    ap.add_argument("--runtime", default=None, help="gvisor or namespaces (default: the server's)")
    ap.add_argument("--timeout", type=float, default=3.0, help="seconds per sample")
    ap.add_argument("--out", default=None, help="where to keep results.jsonl (default: a temp file)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        samples_path = os.path.join(tmp, "samples.jsonl")
        with open(samples_path, "w") as f:
            f.writelines(json.dumps(s) + "\n" for s in SAMPLES)
        out = args.out or os.path.join(tmp, "results.jsonl")

        with Sandbox.create(template=args.template, runtime=args.runtime, timeout=600) as sb:
            sb.files.write("/work/harness.py", HARNESS)
            sb.files.write("/work/problems.jsonl", "".join(json.dumps(p) + "\n" for p in PROBLEMS))
            sb.files.upload(samples_path, "/work/samples.jsonl")  # streamed from disk
            task = sb.commands.run(
                f"python3 /work/harness.py /work/problems.jsonl /work/samples.jsonl /work/results.jsonl {args.timeout}",
                background=True,
                tag="harness",
            )
            done = task.wait(poll_interval=1)
            if not done.ok:
                raise SystemExit(f"harness {done.status} (exit {done.exit_code}): {done.stderr}")
            sb.files.download("/work/results.jsonl", out)

        with open(out) as f:
            results = [json.loads(line) for line in f]
    passed: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    for r in results:
        total[r["task_id"]] += 1
        passed[r["task_id"]] += r["status"] == "passed"
        print(f"{r['task_id']} #{r['completion_id']}: {r['status']}")
    for task_id in sorted(total):
        print(f"{task_id}: pass@1 = {passed[task_id] / total[task_id]:.2f}")


if __name__ == "__main__":
    main()
