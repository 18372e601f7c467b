"""A test suite split across sandboxes: what ``evalbox shard`` does, from Python.

:func:`shard` uploads a project to ``shards`` fresh sandboxes (one tar each), deals its test files
to them by the durations the last run recorded (longest first, each to the least loaded shard;
never an empty shard), runs the command in each with its files and a JUnit argument appended,
streams each line of output with its shard's number, merges the shards' JUnit XML and records
each file's duration for the next split. :func:`async_shard` is its twin; both share the
splitting and merging below. The sandboxes are deleted at the end, also when a shard fails or
the call is interrupted (docs/integrations/ci-workers.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import json
import os
import secrets
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from . import _core as core
from ._async import AsyncClient, AsyncSandbox
from ._sync import Client, Sandbox
from .errors import EvalboxError
from .models import CommandResult

__all__ = ["ShardReport", "async_shard", "find_test_files", "shard", "split_files"]

WORKDIR = "/work"
JUNIT = "/tmp/evalbox-shard-junit.xml"
ARCHIVE = "/tmp/evalbox-shard-project.tar"
UNPACK = ("sh", "-c", 'mkdir -p "$1" && tar -xf "$2" -C "$1" && rm -f "$2"', "sh", WORKDIR, ARCHIVE)
DEFAULT_PATTERNS = ("test_*.py", "*_test.py")
_SKIP = frozenset({".git", ".hg", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".venv", "venv"})
_SKIP |= {"node_modules", ".tox"}

OutputCallback = Callable[[int, str], object]
"""Called with a shard's number (1-based) and each line of its output."""


@dataclass(frozen=True, slots=True)
class ShardReport:
    """What a sharded run did."""

    tests: int
    failures: int
    errors: int
    skipped: int
    junit: Path
    """The merged JUnit XML report."""
    problems: list[str] = field(default_factory=list)
    """Shards that did not report cleanly: an error, a timeout, a failing command."""

    @property
    def ok(self) -> bool:
        """Every test passed and every shard reported cleanly."""
        return not self.problems and self.failures + self.errors == 0


def find_test_files(root: str | os.PathLike[str], patterns: Sequence[str] = DEFAULT_PATTERNS) -> list[str]:
    """The project's test files (names matching a pattern), slash-separated, relative, sorted."""
    out: list[str] = []
    base = Path(root)
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if d not in _SKIP]
        for name in filenames:
            p = Path(dirpath) / name
            if p.is_file() and not p.is_symlink() and any(fnmatch.fnmatchcase(name, pat) for pat in patterns):
                out.append(p.relative_to(base).as_posix())
    return sorted(out)


def split_files(files: Sequence[str], n: int, durations: Mapping[str, float]) -> list[list[str]]:
    """Deal files to n shards (never more than files): the longest first, each to the shard with
    the least time so far; a file without a recorded duration counts as their mean (or 1 s)."""
    known = [durations[f] for f in files if f in durations]
    default = max(sum(known) / len(known), 1e-3) if known else 1.0

    def cost(f: str) -> float:
        return max(durations[f], 1e-3) if f in durations else default

    shards: list[list[str]] = [[] for _ in range(min(n, len(files)))]
    load = [0.0] * len(shards)
    for f in sorted(files, key=cost, reverse=True):
        i = load.index(min(load))
        shards[i].append(f)
        load[i] += cost(f)
    return [sorted(s) for s in shards]


@dataclass
class _Shard:
    result: CommandResult | None = None
    report: bytes | None = None
    error: str = ""


def _problem(i: int, s: _Shard, timeout: float) -> str:
    """Why shard i (0-based) did not report cleanly, or ""."""
    r = s.result
    if s.error:
        return f"shard {i + 1}: {s.error}"
    if r is None:
        return f"shard {i + 1}: did not run"
    if r.status == "timed_out":
        return f"shard {i + 1}: the command ran past the timeout of {timeout:g} s"
    if r.status != "exited" or r.exit_code != 0:
        if s.report is None:
            return f"shard {i + 1}: the command ended {r.status} (exit code {r.exit_code}) without a JUnit report"
        failed = sum(int(x.get("failures", 0)) + int(x.get("errors", 0)) for x in _suites(s.report))
        if failed == 0:
            ended = f"the command ended {r.status} (exit code {r.exit_code})"
            return f"shard {i + 1}: {ended} though its report has no failure"
    return ""


def _suites(report: bytes) -> list[ET.Element]:
    root = ET.fromstring(report)
    return [root] if root.tag == "testsuite" else list(root.iter("testsuite"))


def _file_of(case: ET.Element, files: Sequence[str]) -> str:
    """The test file a case came from: its file attribute, or the longest file whose module path
    its class name starts with (pytest's "tests.test_a.TestX")."""
    if f := case.get("file"):
        return f
    cls = case.get("classname", "")
    best = ""
    for f in files:
        mod = f.rsplit(".", 1)[0].replace("/", ".")
        if (cls == mod or cls.startswith(mod + ".")) and len(f) > len(best):
            best = f
    return best


def _finish(
    shards: list[_Shard], files: list[str], junit_out: Path, durations_path: Path, old: dict[str, float], timeout: float
) -> ShardReport:
    merged = ET.Element("testsuites")
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    ran: dict[str, float] = {}
    problems = []
    for i, s in enumerate(shards):
        if s.report is not None and not s.error:
            try:
                suites = _suites(s.report)
            except ET.ParseError as e:
                s.error = f"its report is not JUnit XML: {e}"
                suites = []
            for suite in suites:
                for k in counts:
                    counts[k] += int(suite.get(k, 0))
                for case in suite.iter("testcase"):
                    if f := _file_of(case, files):
                        ran[f] = ran.get(f, 0.0) + float(case.get("time", 0) or 0)
                merged.append(suite)
        if p := _problem(i, s, timeout):
            problems.append(p)
    junit_out.write_bytes(ET.tostring(merged, xml_declaration=True, encoding="utf-8"))
    durations_path.write_text(json.dumps({**old, **ran}, indent=2, sort_keys=True) + "\n")
    return ShardReport(problems=problems, junit=junit_out, **counts)


def _prepare(
    project: str | os.PathLike[str],
    patterns: Sequence[str],
    shards: int,
    durations: str | os.PathLike[str],
    junit_arg: str,
) -> tuple[list[str], list[list[str]], dict[str, float]]:
    """Check the arguments (before any sandbox is made) and split the project's test files."""
    if not 1 <= shards <= 256:
        raise ValueError(f"shards={shards}: want 1 to 256")
    if "{}" not in junit_arg:
        raise ValueError(f"junit_arg {junit_arg!r}: want {{}} where the report's path goes")
    files = find_test_files(project, patterns)
    if not files:
        raise ValueError(f"no test files in {os.fspath(project)} match {', '.join(patterns)}")
    old: dict[str, float] = {}
    with contextlib.suppress(FileNotFoundError):
        old = {str(k): float(v) for k, v in json.loads(Path(durations).read_text()).items()}
    return files, split_files(files, shards, old), old


class _Lines:
    """Splits a stream's chunks into lines for a callback (the last one flushed at the end)."""

    def __init__(self, n: int, cb: OutputCallback | None) -> None:
        self.n, self.cb, self.buf = n, cb, ""

    def __call__(self, chunk: str) -> None:
        if self.cb is None:
            return
        self.buf += chunk
        *lines, self.buf = self.buf.split("\n")
        for line in lines:
            self.cb(self.n, line)

    def flush(self) -> None:
        if self.cb is not None and self.buf:
            self.cb(self.n, self.buf)
        self.buf = ""


def _argv(argv: Sequence[str], part: Sequence[str], junit_arg: str) -> list[str]:
    return [*argv, *part, junit_arg.replace("{}", JUNIT)]


def shard(
    argv: Sequence[str],
    *,
    template: str = "python",
    shards: int = 4,
    project: str | os.PathLike[str] = ".",
    patterns: Sequence[str] = DEFAULT_PATTERNS,
    junit_out: str | os.PathLike[str] = "junit.xml",
    durations: str | os.PathLike[str] = ".evalbox-shard-durations.json",
    junit_arg: str = "--junitxml={}",
    timeout: float = 1800,
    env: Mapping[str, str] | None = None,
    runtime: str | None = None,
    client: Client | None = None,
    on_output: OutputCallback | None = None,
) -> ShardReport:
    """Run a test suite split across ``shards`` fresh sandboxes and merge their JUnit reports.

    Args:
        argv: The test command (its files and ``junit_arg`` are appended), e.g.
            ``["python3", "-m", "pytest", "-q"]``.
        template: The sandboxes' template (with the test runner installed).
        shards: How many sandboxes.
        project: The directory uploaded (its VCS, virtualenv and cache directories left out).
        patterns: Test file name patterns.
        junit_out: Where the merged report is written.
        durations: The per-file durations of the last run (read, then rewritten).
        junit_arg: The argument that makes the command write a JUnit report; ``{}`` is its path.
        timeout: Seconds each shard's command may run.
        env: The command's environment.
        runtime: ``gvisor`` or ``namespaces`` (default: the server's).
        client: The evalbox client (default: the process's).
        on_output: Called with each shard's number and every line it prints.
    """
    files, parts, old = _prepare(project, patterns, shards, durations, junit_arg)
    tar = core.context_tar(project)
    tag = {"evalbox-shard-run": secrets.token_hex(8)}
    results = [_Shard() for _ in parts]
    lock = threading.Lock()

    def locked(cb: OutputCallback | None) -> OutputCallback | None:
        if cb is None:
            return None

        def call(n: int, line: str) -> None:
            with lock:
                cb(n, line)

        return call

    out = locked(on_output)

    def one(i: int) -> None:
        res = results[i]
        try:
            with Sandbox.create(
                template=template,
                runtime=runtime,
                timeout=int(timeout) + 120,
                wait=600,
                metadata={"via": "evalbox-shard", "shard": str(i + 1), **tag},
                client=client,
            ) as sb:
                sb.files.write(ARCHIVE, tar)
                r = sb.commands.run(list(UNPACK))
                if not r.ok:
                    res.error = f"unpack the project: {r.stderr.strip()}"
                    return
                lo, le = _Lines(i + 1, out), _Lines(i + 1, out)
                res.result = sb.commands.run(
                    _argv(argv, parts[i], junit_arg), cwd=WORKDIR, env=env, timeout=timeout, on_stdout=lo, on_stderr=le
                )
                lo.flush()
                le.flush()
                with contextlib.suppress(EvalboxError):
                    res.report = sb.files.read(JUNIT)
        except EvalboxError as e:
            res.error = str(e)

    try:
        with ThreadPoolExecutor(max_workers=len(parts)) as pool:
            list(pool.map(one, range(len(parts))))
    finally:
        with contextlib.suppress(EvalboxError):
            Sandbox.kill_all(tag, client=client)
    return _finish(results, files, Path(junit_out), Path(durations), old, timeout)


async def async_shard(
    argv: Sequence[str],
    *,
    template: str = "python",
    shards: int = 4,
    project: str | os.PathLike[str] = ".",
    patterns: Sequence[str] = DEFAULT_PATTERNS,
    junit_out: str | os.PathLike[str] = "junit.xml",
    durations: str | os.PathLike[str] = ".evalbox-shard-durations.json",
    junit_arg: str = "--junitxml={}",
    timeout: float = 1800,
    env: Mapping[str, str] | None = None,
    runtime: str | None = None,
    client: AsyncClient | None = None,
    on_output: OutputCallback | None = None,
) -> ShardReport:
    """:func:`shard`, async (same arguments, an :class:`AsyncClient`)."""
    files, parts, old = _prepare(project, patterns, shards, durations, junit_arg)
    tar = await asyncio.to_thread(core.context_tar, project)
    tag = {"evalbox-shard-run": secrets.token_hex(8)}
    results = [_Shard() for _ in parts]

    async def one(i: int) -> None:
        res = results[i]
        try:
            async with await AsyncSandbox.create(
                template=template,
                runtime=runtime,
                timeout=int(timeout) + 120,
                wait=600,
                metadata={"via": "evalbox-shard", "shard": str(i + 1), **tag},
                client=client,
            ) as sb:
                await sb.files.write(ARCHIVE, tar)
                r = await sb.commands.run(list(UNPACK))
                if not r.ok:
                    res.error = f"unpack the project: {r.stderr.strip()}"
                    return
                lo, le = _Lines(i + 1, on_output), _Lines(i + 1, on_output)
                res.result = await sb.commands.run(
                    _argv(argv, parts[i], junit_arg), cwd=WORKDIR, env=env, timeout=timeout, on_stdout=lo, on_stderr=le
                )
                lo.flush()
                le.flush()
                with contextlib.suppress(EvalboxError):
                    res.report = await sb.files.read(JUNIT)
        except EvalboxError as e:
            res.error = str(e)

    try:
        await asyncio.gather(*(one(i) for i in range(len(parts))))
    finally:
        with contextlib.suppress(EvalboxError):
            await asyncio.shield(AsyncSandbox.kill_all(tag, client=client))
    return await asyncio.to_thread(_finish, results, files, Path(junit_out), Path(durations), old, timeout)
