"""The E2B path against the native one, side by side on one server: create → first command → kill,
and the round trip of a command in a running sandbox, through the official e2b SDK and through
evalbox's Python SDK (sdk/python, imported from the tree). The e2b SDK runs every command as
`/bin/bash -l -c CMD` (a login shell); the native path runs the same argv, so that the rows compare
the two servers' paths, and a last row shows what `sh -c` costs natively.

Starts its own `evalbox serve` (the conftest's), then alternates the two paths trial by trial, so
that the machine's noise falls on both. Both create sandboxes of the `python` template with
network `outbound` (E2B's default), on the server's default runtime unless --runtime.

    .../venv-e2b-*/bin/python test/e2bcompat/bench_path.py [--n 50] [--execs 300]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "sdk" / "python" / "src"))
sys.path.insert(0, str(HERE.parent))

from e2b import Sandbox as E2BSandbox  # noqa: E402

import evalbox  # noqa: E402
from e2bcompat import conftest  # noqa: E402


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def row(name: str, a: list[float], b: list[float]) -> str:
    ma, mb = statistics.median(a), statistics.median(b)
    return f"| {name} | {ma:.2f} | {pct(a, 99):.2f} | {mb:.2f} | {pct(b, 99):.2f} | {ma / mb:.2f}x |"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=50, help="create → command → kill trials per path")
    ap.add_argument("--execs", type=int, default=300, help="command round trips per path")
    ap.add_argument("--runtime", default="", help="runtime of the native path (default: the server's, as E2B's)")
    args = ap.parse_args()

    srv = conftest.start_server()
    try:
        key = srv.new_team(max_sandboxes=8)
        os.environ.update(
            E2B_API_URL=srv.url, E2B_SANDBOX_URL=srv.url, E2B_API_KEY=key, EVALBOX_API_URL=srv.url, EVALBOX_API_KEY=key
        )
        native_kw: dict[str, Any] = {"template": "python", "network": "outbound"}
        if args.runtime:
            native_kw["runtime"] = args.runtime

        def e2b_trial() -> None:
            sb = E2BSandbox.create(template="python", timeout=60)
            sb.commands.run("true")
            sb.kill()

        login = ["/bin/bash", "-l", "-c", "true"]  # what e2b's commands.run("true") runs

        def native_trial() -> None:
            sb = evalbox.Sandbox.create(timeout=60, **native_kw)
            sb.commands.run(login)
            sb.kill()

        e2b_t, native_t = [], []
        for _ in range(2):  # warm both
            e2b_trial()
            native_trial()
        for _ in range(args.n):
            for f, out in ((e2b_trial, e2b_t), (native_trial, native_t)):
                t = time.perf_counter()
                f()
                out.append((time.perf_counter() - t) * 1000)

        e2b_sb = E2BSandbox.create(template="python", timeout=300)
        native_sb = evalbox.Sandbox.create(timeout=300, **native_kw)
        try:
            e2b_x, native_x, native_sh = [], [], []
            for _ in range(10):
                e2b_sb.commands.run("true")
                native_sb.commands.run(login)
            for _ in range(args.execs):
                for f, out in (
                    (lambda: e2b_sb.commands.run("true"), e2b_x),
                    (lambda: native_sb.commands.run(login), native_x),
                    (lambda: native_sb.commands.run("true"), native_sh),
                ):
                    t = time.perf_counter()
                    f()
                    out.append((time.perf_counter() - t) * 1000)
        finally:
            e2b_sb.kill()
            native_sb.kill()

        from importlib.metadata import version

        print(
            f"e2b {version('e2b')} against evalbox's SDK, "
            f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}, n={args.n}, execs={args.execs}\n"
        )
        print("| what | E2B path p50 ms | p99 | evalbox SDK p50 ms | p99 | E2B / evalbox (p50) |")
        print("|---|---|---|---|---|---|")
        print(row("create → first command → kill", e2b_t, native_t))
        print(row("command round trip (`true`)", e2b_x, native_x))
        sh50, sh99 = statistics.median(native_sh), pct(native_sh, 99)
        print(f"| native `sh -c true` round trip, for scale | | | {sh50:.2f} | {sh99:.2f} | |")
    finally:
        conftest.stop_server(srv)


if __name__ == "__main__":
    main()
