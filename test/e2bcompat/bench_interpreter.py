"""The code interpreter, measured: the run_code round trip through e2b-code-interpreter and through
evalbox's SDK side by side (one sandbox each, calls alternating), and the throughput of whole
code-interpreter trials (create → run_code → kill) through e2b-code-interpreter's AsyncSandbox.

Starts its own `evalbox serve` (the conftest's; the server's default runtime, gVisor).

    .../venv-e2b-*/bin/python test/e2bcompat/bench_interpreter.py [--calls 200] [--trials 200] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from importlib.metadata import version
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "sdk" / "python" / "src"))
sys.path.insert(0, str(HERE.parent))

from e2b_code_interpreter import AsyncSandbox, Sandbox  # noqa: E402

import evalbox  # noqa: E402
from e2bcompat import conftest  # noqa: E402


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


async def trials(n: int, concurrency: int) -> tuple[float, list[float]]:
    sem = asyncio.Semaphore(concurrency)
    lat: list[float] = []

    async def one(i: int) -> None:
        async with sem:
            t = time.perf_counter()
            sb = await AsyncSandbox.create(timeout=120)
            try:
                e = await sb.run_code(f"sum(range({i}))")
                assert e.text == str(sum(range(i))), e
            finally:
                await sb.kill()
            lat.append((time.perf_counter() - t) * 1000)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return n / (time.perf_counter() - t0), lat


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=8)
    args = ap.parse_args()
    srv = conftest.start_server()
    try:
        key = srv.new_team(max_sandboxes=args.concurrency + 4)
        os.environ.update(
            E2B_API_URL=srv.url, E2B_SANDBOX_URL=srv.url, E2B_API_KEY=key, EVALBOX_API_URL=srv.url, EVALBOX_API_KEY=key
        )
        e2b_sb = Sandbox.create(timeout=600)
        native_sb = evalbox.Sandbox.create(template="code-interpreter", timeout=600)
        try:
            e2b_x: list[float] = []
            native_x: list[float] = []
            for _ in range(10):
                e2b_sb.run_code("1 + 1")
                native_sb.run_code("1 + 1")
            for _ in range(args.calls):
                calls = ((lambda: e2b_sb.run_code("1 + 1"), e2b_x), (lambda: native_sb.run_code("1 + 1"), native_x))
                for f, out in calls:
                    t = time.perf_counter()
                    f()
                    out.append((time.perf_counter() - t) * 1000)
        finally:
            e2b_sb.kill()
            native_sb.kill()
        rate, lat = asyncio.run(trials(args.trials, args.concurrency))
        print(
            f"e2b-code-interpreter {version('e2b-code-interpreter')} and evalbox's SDK, {os.cpu_count()} cores, "
            f"{time.strftime('%Y-%m-%d')}, calls={args.calls}, trials={args.trials}, concurrency={args.concurrency}\n"
        )
        print("| what | p50 ms | p99 ms | note |")
        print("|---|---|---|---|")
        for name, xs in (("e2b-code-interpreter", e2b_x), ("evalbox SDK", native_x)):
            print(f'| `run_code("1 + 1")`, {name} | {statistics.median(xs):.2f} | {pct(xs, 99):.2f} | |')
        print(
            f"| code-interpreter trial (create → run_code → kill), AsyncSandbox | {statistics.median(lat):.0f} | "
            f"{pct(lat, 99):.0f} | {rate:.2f} trials/s with {args.concurrency} at once |"
        )
    finally:
        conftest.stop_server(srv)


if __name__ == "__main__":
    main()
