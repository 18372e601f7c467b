"""evalbox.shard against the real server: a project with a small test runner of its own (it
writes JUnit XML as pytest's --junitxml does), split across sandboxes, merged, durations
recorded and used; a failing test, a crashing shard and a timed-out shard make the report not ok;
no sandbox is left. (The CLI's `evalbox shard` runs a real pytest suite: test/e2e TestShard.)"""

from __future__ import annotations

import asyncio
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import evalbox
from evalbox.shard import OutputCallback, ShardReport, async_shard, find_test_files, shard, split_files

from .server import NS, Team

RUNNER = """
import importlib.util, sys, time, traceback
from xml.sax.saxutils import quoteattr
files = [a for a in sys.argv[1:] if not a.startswith("--junitxml=")]
out = next(a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--junitxml="))
cases, failed = [], 0
for f in files:
    spec = importlib.util.spec_from_file_location(f[:-3].replace("/", "."), f)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name in sorted(n for n in dir(mod) if n.startswith("test_")):
        t = time.monotonic()
        try:
            getattr(mod, name)()
            err = ""
        except Exception:
            err = traceback.format_exc()
            failed += 1
        cases.append((f, name, time.monotonic() - t, err))
        print(f, name, "FAILED" if err else "ok", flush=True)
with open(out, "w") as w:
    w.write('<testsuite name="runner" tests="%d" failures="%d" errors="0" skipped="0">' % (len(cases), failed))
    for f, name, d, err in cases:
        attrs = (quoteattr(f[:-3].replace("/", ".")), quoteattr(name), quoteattr(f), d)
        w.write('<testcase classname=%s name=%s file=%s time="%.3f">' % attrs)
        if err:
            w.write('<failure message="failed"/>')
        w.write("</testcase>")
    w.write("</testsuite>")
sys.exit(1 if failed else 0)
"""

ARGV = ["python3", "runner.py"]


TEST_FILE = """import time

def test_a():
    time.sleep({pause})

def test_b():
    assert True
"""


def project(root: Path, *, failing: bool = False) -> Path:
    (root / "tests").mkdir(parents=True)
    (root / "runner.py").write_text(RUNNER)
    for i in range(5):
        (root / "tests" / f"test_m{i}.py").write_text(TEST_FILE.format(pause=0.3 * i))
    if failing:
        (root / "tests" / "test_bad.py").write_text("def test_bad():\n    assert 1 == 2\n")
    (root / ".git").mkdir()
    (root / ".git" / "test_not_a_test.py").write_text("def test_x():\n    assert False\n")
    return root


def test_split_and_find(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    files = find_test_files(root)
    assert files == [f"tests/test_m{i}.py" for i in range(5)]
    parts = split_files(files, 3, {"tests/test_m4.py": 4.0, "tests/test_m3.py": 3.0})
    assert len(parts) == 3
    assert ["tests/test_m4.py"] in parts
    assert all(parts)
    assert split_files(files[:2], 8, {}) == [[files[0]], [files[1]]]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no test files"):
        shard(ARGV, project=tmp_path / "empty")
    with pytest.raises(ValueError, match="shards=0"):
        shard(ARGV, project=root, shards=0)
    # Refused before any sandbox is asked for (no server is reachable here).
    unreachable = evalbox.Client("http://127.0.0.1:9", "evk_" + "x" * 40)
    with pytest.raises(ValueError, match=r"want \{\} where"):
        shard(ARGV, project=root, junit_arg="--junitxml", client=unreachable)


def test_shard(team: Team, tmp_path: Path) -> None:
    root = project(tmp_path / "p", failing=True)
    lines: list[tuple[int, str]] = []
    with team.client() as c:

        def run(
            name: str, argv: list[str], shards: int, timeout: float = 600, on_output: OutputCallback | None = None
        ) -> ShardReport:
            return shard(
                argv, shards=shards, project=root, runtime=NS, client=c, timeout=timeout, on_output=on_output,
                junit_out=tmp_path / f"{name}.xml", durations=tmp_path / f"{name}.json",
            )  # fmt: skip

        report = run("d", ARGV, shards=3, on_output=lambda n, line: lines.append((n, line)))
        assert (report.tests, report.failures) == (11, 1), report
        assert not report.ok
        assert report.problems == []  # the failing shard exited 1 with a report that says why
        cases = {(c.get("file"), c.get("name")) for c in ET.parse(report.junit).getroot().iter("testcase")}
        assert len(cases) == 11
        assert ("tests/test_bad.py", "test_bad") in cases
        assert {n for n, _ in lines} == {1, 2, 3}
        assert any("FAILED" in line for _, line in lines)
        d = json.loads((tmp_path / "d.json").read_text())
        assert d["tests/test_m4.py"] >= 1.0
        # A passing subset, split by the recorded durations: ok.
        (root / "tests" / "test_bad.py").unlink()
        again = run("d", ARGV, shards=2)
        assert again.ok, again
        assert again.tests == 10
        # A command that fails though its report is clean, and one past its timeout: not ok.
        bad = run("bad", ["sh", "-c", 'python3 runner.py "$@"; exit 3', "sh"], shards=1)
        assert not bad.ok
        assert "though its report has no failure" in bad.problems[0]
        slow = run("slow", ["sh", "-c", "sleep 30", "sh"], shards=1, timeout=2)
        assert not slow.ok
        assert "timeout" in slow.problems[0]
        assert evalbox.Sandbox.list(client=c) == []


def test_async_shard(team: Team, tmp_path: Path) -> None:
    root = project(tmp_path / "p")

    async def main() -> ShardReport:
        async with evalbox.AsyncClient(team.url, team.key) as c:
            r = await async_shard(
                ARGV,
                shards=2,
                project=root,
                runtime=NS,
                client=c,
                junit_out=tmp_path / "j.xml",
                durations=tmp_path / "d.json",
            )
            assert await evalbox.AsyncSandbox.list(client=c) == []
            return r

    report = asyncio.run(main())
    assert report.ok, report
    assert report.tests == 10
