"""Per-trial client overhead: create → write → run → delete, through each client path.

Starts its own `evalbox serve` (namespaces runtime, a warm pool of `base`
sandboxes, temp data dir) unless --api-url/--api-key name a running one, then
runs the same trial through:

* bare httpx (the four REST calls by hand: the floor for a Python client),
* the SDK's sync client and async client, one trial after another,
* the SDK with 16 trials at once (threads for sync, asyncio for async),
* the Go CLI, one `bin/evalbox` process per step (create, cp, exec, rm).

and prints a Markdown table: wall time per trial (p50/p99), the client's own
CPU time per trial, and throughput. The server's share is the same in every
row, so the differences between rows are client overhead.

    sudo .venv/bin/python bench/trial_overhead.py [--n 200] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from evalbox import AsyncClient, AsyncSandbox, Client, Sandbox

REPO = Path(__file__).resolve().parents[3]
BIN_DIR = Path(os.environ.get("EVALBOX_BIN_DIR") or REPO / "bin")
TEMPLATES_DIR = os.environ.get("EVALBOX_TEMPLATES_DIR") or "/var/cache/evalbox/templates"
RUNTIME = "namespaces"
SOLUTION = "def f(x):\n    return x * 2\n" * 20  # ~600 bytes, a typical completion
COMMAND = "cat /work/solution.py > /dev/null"


@dataclass
class Row:
    client: str
    mode: str
    n: int
    p50_ms: float
    p99_ms: float
    cpu_ms: float
    per_s: float
    server_cpu_ms: float | None = None


#: The pid of the server this script started (None: it watches no server's CPU).
server_pid: int | None = None


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads, and its waited-for children)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


class ServerCPU:
    """Measures the server's CPU over a block: ``with ServerCPU() as s: ...; s.per(n)``."""

    def __enter__(self) -> ServerCPU:
        self.start = None if server_pid is None else proc_cpu(server_pid)
        return self

    def __exit__(self, *exc: object) -> None:
        end = None if server_pid is None else proc_cpu(server_pid)
        self.used = None if self.start is None or end is None else end - self.start

    def per(self, n: int) -> float | None:
        return None if self.used is None else self.used / n * 1e3


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)]


def child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def measure_seq(client: str, n: int, trial: Callable[[], None], *, subprocesses: bool = False) -> Row:
    for _ in range(5):  # warm up connections and caches
        trial()
    lat: list[float] = []
    with ServerCPU() as srv:
        cpu0, ccpu0, t0 = time.process_time(), child_cpu(), time.perf_counter()
        for _ in range(n):
            s = time.perf_counter()
            trial()
            lat.append(time.perf_counter() - s)
        wall = time.perf_counter() - t0
        cpu = (time.process_time() - cpu0) + (child_cpu() - ccpu0 if subprocesses else 0.0)
    return Row(client, "sequential", n, pct(lat, 0.5) * 1e3, pct(lat, 0.99) * 1e3, cpu / n * 1e3, n / wall, srv.per(n))


def measure_threads(client: str, n: int, conc: int, trial: Callable[[], None], *, subprocesses: bool = False) -> Row:
    lat: list[float] = []
    lock = threading.Lock()

    def one(_: int) -> None:
        s = time.perf_counter()
        trial()
        with lock:
            lat.append(time.perf_counter() - s)

    with ThreadPoolExecutor(conc) as pool:
        list(pool.map(one, range(conc)))  # warm-up
        lat.clear()
        with ServerCPU() as srv:
            cpu0, ccpu0, t0 = time.process_time(), child_cpu(), time.perf_counter()
            list(pool.map(one, range(n)))
            wall = time.perf_counter() - t0
            cpu = (time.process_time() - cpu0) + (child_cpu() - ccpu0 if subprocesses else 0.0)
    p50, p99 = pct(lat, 0.5) * 1e3, pct(lat, 0.99) * 1e3
    return Row(client, f"{conc} at once (threads)", n, p50, p99, cpu / n * 1e3, n / wall, srv.per(n))


def bench(url: str, key: str, n: int, conc: int) -> list[Row]:
    rows: list[Row] = []
    headers = {"Authorization": f"Bearer {key}"}

    # Bare httpx: the same four calls without the SDK.
    with httpx.Client(base_url=url + "/v1", headers=headers) as h:

        def raw_trial() -> None:
            r = h.post("/sandboxes", json={"template": "base", "runtime": RUNTIME})
            r.raise_for_status()
            sid = r.json()["id"]
            h.put(f"/sandboxes/{sid}/files", params={"path": "/work/solution.py"}, content=SOLUTION).raise_for_status()
            h.post(f"/sandboxes/{sid}/exec", json={"cmd": COMMAND}).raise_for_status()
            h.delete(f"/sandboxes/{sid}").raise_for_status()

        rows.append(measure_seq("bare httpx", n, raw_trial))

    # The SDK, sync.
    with Client(url, key) as c:

        def sdk_trial() -> None:
            with Sandbox.create(runtime=RUNTIME, client=c) as sb:
                sb.files.write("/work/solution.py", SOLUTION)
                sb.commands.run(COMMAND)

        rows.append(measure_seq("SDK sync", n, sdk_trial))
        rows.append(measure_threads("SDK sync", n * 2, conc, sdk_trial))

    # The SDK, async.
    async def async_rows() -> list[Row]:
        out: list[Row] = []
        async with AsyncClient(url, key) as c:

            async def trial() -> float:
                s = time.perf_counter()
                async with await AsyncSandbox.create(runtime=RUNTIME, client=c) as sb:
                    await sb.files.write("/work/solution.py", SOLUTION)
                    await sb.commands.run(COMMAND)
                return time.perf_counter() - s

            async def measure(mode: str, m: int, conc: int) -> Row:
                sem = asyncio.Semaphore(conc)

                async def limited() -> float:
                    async with sem:
                        return await trial()

                with ServerCPU() as srv:
                    cpu0, t0 = time.process_time(), time.perf_counter()
                    lat = list(await asyncio.gather(*(limited() for _ in range(m))))
                    wall = time.perf_counter() - t0
                    cpu = time.process_time() - cpu0
                p50, p99 = pct(lat, 0.5) * 1e3, pct(lat, 0.99) * 1e3
                return Row("SDK async", mode, m, p50, p99, cpu / m * 1e3, m / wall, srv.per(m))

            for _ in range(5):
                await trial()
            out.append(await measure("sequential", n, 1))
            out.append(await measure(f"{conc} at once (asyncio)", n * 2, conc))
        return out

    rows += asyncio.run(async_rows())

    # The Go CLI: one process per step, as a shell script would drive it.
    exe = str(BIN_DIR / "evalbox")
    env = {**os.environ, "EVALBOX_API_URL": url, "EVALBOX_API_KEY": key}
    with tempfile.NamedTemporaryFile("w", suffix=".py") as sol:
        sol.write(SOLUTION)
        sol.flush()

        def cli(*args: str) -> str:
            return subprocess.run([exe, *args], env=env, check=True, capture_output=True, text=True).stdout

        def cli_trial() -> None:
            sid = cli("sandbox", "create", "--runtime", RUNTIME).strip()
            try:
                cli("sandbox", "cp", sol.name, f"{sid}:/work/solution.py")
                cli("sandbox", "exec", sid, "--cmd", COMMAND)
            finally:
                cli("sandbox", "rm", sid)

        rows.append(measure_seq("Go CLI (bin/evalbox)", max(n // 2, 10), cli_trial, subprocesses=True))
        rows.append(measure_threads("Go CLI (bin/evalbox)", n, conc, cli_trial, subprocesses=True))
    return rows


def table(rows: list[Row]) -> str:
    lines = [
        "| client | trials | n | p50 ms/trial | p99 ms/trial | client CPU ms/trial | server CPU ms/trial | trials/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        srv = "" if r.server_cpu_ms is None else f"{r.server_cpu_ms:.2f}"
        cells = [
            r.client,
            r.mode,
            str(r.n),
            f"{r.p50_ms:.2f}",
            f"{r.p99_ms:.2f}",
            f"{r.cpu_ms:.2f}",
            srv,
            f"{r.per_s:.0f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def start_server(pool: int) -> tuple[subprocess.Popen[bytes], str, str, Path]:
    data = Path(tempfile.mkdtemp(prefix="evalbox-bench-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    log = open(data / "server.log", "wb")  # noqa: SIM115 (the server's, closed below)
    proc = subprocess.Popen(
        [
            str(BIN_DIR / "evalbox"),
            "serve",
            "--data-dir",
            str(data),
            "--listen",
            f"127.0.0.1:{port}",
            "--templates-dir",
            TEMPLATES_DIR,
            "--runtimes",
            RUNTIME,
            "--pool",
            f"base:{RUNTIME}={pool}",
            "--log-level",
            "warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"evalbox serve exited: {(data / 'server.log').read_text()[-2000:]}")
        key = data / "admin.key"
        if key.exists() and key.stat().st_size:
            try:
                if httpx.get(url + "/v1/health", timeout=1).status_code == 200:
                    return proc, url, key.read_text().strip(), data
            except httpx.TransportError:
                pass
        time.sleep(0.05)
    proc.kill()
    sys.exit("evalbox serve did not come up")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200, help="trials per sequential row")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--api-url", default=None, help="use this server instead of starting one")
    ap.add_argument("--api-key", default=None)
    args = ap.parse_args()

    proc = None
    data: Path | None = None
    if args.api_url:
        url, key = args.api_url, args.api_key or os.environ.get("EVALBOX_API_KEY", "")
    else:
        proc, url, key, data = start_server(pool=args.concurrency)
        global server_pid
        server_pid = proc.pid
    try:
        rows = bench(url, key, args.n, args.concurrency)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        if data is not None:
            shutil.rmtree(data, ignore_errors=True)
    print(f"\ncreate → write ({len(SOLUTION)} B) → run `{COMMAND}` → delete; runtime {RUNTIME}, warm pool\n")
    print(table(rows))


if __name__ == "__main__":
    main()
