"""The transport-agnostic core, driven step by step: retries, error mapping, stream parsing.

No server and no HTTP here: an operation is a generator, so a test plays the
driver and hands it responses (the end-to-end tests run the same code
against the real server).
"""

from __future__ import annotations

import builtins
import gzip
import io
import json
import signal
import time
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

import evalbox
from evalbox import _core as core
from evalbox.errors import error_from_detail

CFG = core.Config(api_url="http://x", api_key="k", retries=3, max_retry_wait=30.0)


def answer(status: int, body: Any = None, headers: dict[str, str] | None = None) -> httpx.Response:
    """A response as the driver hands it to an operation (body read)."""
    content = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    return httpx.Response(status, content=content, headers=headers)


def err(code: str, status: int, retry_after: str | None = None) -> httpx.Response:
    h = {"Retry-After": retry_after} if retry_after is not None else None
    return answer(status, {"error": {"code": code, "message": f"{code} happened"}}, h)


def drive(
    op: core.Op[Any], responses: list[httpx.Response | Exception], *, sleep: bool = False
) -> tuple[Any, list[core.Step]]:
    """Play the driver: send the responses in order (sleeping only if asked); return the value and the steps."""
    steps: list[core.Step] = []
    value: Any = None
    pending = list(responses)
    step = op.send(None)
    while True:
        steps.append(step)
        try:
            if isinstance(step, core.Sleep):
                if sleep:
                    time.sleep(step.seconds)
                step = op.send(None)
                continue
            if isinstance(step, core.Notify):
                step.callback(step.value)
                step = op.send(None)
                continue
            r = pending.pop(0)
            step = op.throw(r) if isinstance(r, Exception) else op.send(r)
        except StopIteration as stop:
            value = stop.value
            return value, steps


SANDBOX = {
    "id": "sb-1",
    "team_id": "t",
    "template": "base",
    "runtime": "namespaces",
    "state": "running",
    "cpu": 1,
    "memory_mb": 512,
    "disk_mb": 1024,
    "network": "none",
    "metadata": {},
    "created_at": "2026-11-29T11:31:45.182245123Z",
    "expires_at": "2026-11-29T11:36:45Z",
    "from_pool": True,
}


@pytest.mark.parametrize(
    ("code", "status", "cls"),
    [
        ("bad_request", 400, evalbox.BadRequestError),
        ("unauthorized", 401, evalbox.AuthenticationError),
        ("forbidden", 403, evalbox.PermissionDeniedError),
        ("not_found", 404, evalbox.NotFoundError),
        ("timeout", 408, evalbox.CommandTimeoutError),
        ("conflict", 409, evalbox.ConflictError),
        ("sandbox_not_running", 409, evalbox.SandboxNotRunningError),
        ("payload_too_large", 413, evalbox.PayloadTooLargeError),
        ("too_many_sandboxes", 429, evalbox.TooManySandboxesError),
        ("rate_limited", 429, evalbox.RateLimitedError),
        ("output_budget_exhausted", 429, evalbox.OutputBudgetExhaustedError),
        ("internal", 500, evalbox.ServerError),
        ("unavailable", 503, evalbox.ServiceUnavailableError),
        ("insufficient_capacity", 503, evalbox.InsufficientCapacityError),
        ("no_space", 507, evalbox.NoSpaceError),
        ("storage_quota_exceeded", 413, evalbox.StorageQuotaExceededError),
        ("some_new_code", 507, evalbox.ServerError),  # a code this SDK does not know: by status
    ],
)
def test_error_mapping(code: str, status: int, cls: type[evalbox.EvalboxError]) -> None:
    e = core.error_from_response(err(code, status, "2"))
    assert type(e) is cls
    assert (e.code, e.status, e.message, e.retry_after) == (code, status, f"{code} happened", 2.0)
    assert str(e) == f"{code}: {code} happened"
    assert isinstance(e, evalbox.EvalboxError)


def test_error_without_evalbox_body() -> None:
    e = core.error_from_response(answer(502, b"<html>bad gateway</html>"))
    assert isinstance(e, evalbox.ServerError)
    assert (e.code, e.status) == ("internal", 502)
    assert "bad gateway" in e.message
    e = core.error_from_response(answer(404, b""))
    assert isinstance(e, evalbox.NotFoundError)
    assert e.message == "HTTP 404: Not Found"


def test_stream_error_event_has_no_status() -> None:
    e = error_from_detail({"code": "sandbox_not_running", "message": "gone"})
    assert isinstance(e, evalbox.SandboxNotRunningError)
    assert e.status is None


def test_timeout_error_is_builtin_timeout_but_does_not_shadow_it() -> None:
    assert evalbox.TimeoutError is evalbox.CommandTimeoutError
    assert issubclass(evalbox.TimeoutError, builtins.TimeoutError)
    assert "TimeoutError" not in evalbox.__all__
    ns: dict[str, Any] = {}
    exec("from evalbox import *", ns)
    assert "TimeoutError" not in ns


def test_retry_after_is_honoured() -> None:
    op = core.get_sandbox(CFG, "sb-1")
    value, steps = drive(op, [err("unavailable", 503, "2"), err("internal", 429), answer(200, SANDBOX)])
    assert value.id == "sb-1"
    assert isinstance(steps[1], core.Sleep)
    assert steps[1].seconds == 2.0
    assert isinstance(steps[3], core.Sleep)
    assert 0.08 <= steps[3].seconds <= 0.25  # no Retry-After: backoff(1) = 0.2 s ± 20 %


def test_retry_after_http_date() -> None:
    when = datetime.now(timezone.utc) + timedelta(seconds=5)
    secs = core.parse_retry_after(format_datetime(when, usegmt=True))
    assert secs is not None
    assert 3.5 < secs <= 5.0


def test_retries_give_up() -> None:
    op = core.list_sandboxes(CFG, metadata=None, state="running")
    with pytest.raises(evalbox.ServiceUnavailableError):
        drive(op, [err("unavailable", 503, "0")] * 4)  # 1 try + 3 retries
    op = core.list_sandboxes(CFG, metadata=None, state="running")
    with pytest.raises(evalbox.ServiceUnavailableError):
        drive(op, [err("unavailable", 503, "31")])  # longer than max_retry_wait


def test_calls_that_are_not_retried() -> None:
    # Commands and process starts are never retried; nor are other errors.
    for op in (
        core.run_command(CFG, "sb-1", {"cmd": "true"}),
        core.start_process(CFG, "sb-1", {"cmd": "true"}),
    ):
        with pytest.raises(evalbox.RateLimitedError):
            drive(op, [err("rate_limited", 429, "1")])
    with pytest.raises(evalbox.NotFoundError):
        drive(core.get_sandbox(CFG, "sb-1"), [err("not_found", 404)])
    # An upload from a one-shot iterator cannot be resent.
    up = core.upload_from(iter([b"a", b"b"]))
    with pytest.raises(evalbox.ServiceUnavailableError):
        drive(core.write_file(CFG, "sb-1", "/a", up, None), [err("unavailable", 503, "0")])


def test_connection_errors() -> None:
    unsent = core.connection_error(httpx.ConnectError("refused"))
    sent = core.connection_error(httpx.ReadError("reset"))
    assert unsent.unsent
    assert not sent.unsent
    assert isinstance(unsent.__cause__, httpx.ConnectError)
    # A read is retried either way; a delete only when the request never left.
    value, _ = drive(core.get_sandbox(CFG, "sb-1"), [sent, answer(200, SANDBOX)])
    assert value.id == "sb-1"
    drive(core.delete_sandbox(CFG, "sb-1"), [unsent, answer(204)])
    with pytest.raises(evalbox.APIConnectionError):
        drive(core.delete_sandbox(CFG, "sb-1"), [sent])
    with pytest.raises(evalbox.APIConnectionError):
        drive(core.run_command(CFG, "sb-1", {"cmd": "true"}), [unsent])


def test_create_retries_only_within_its_wait_budget() -> None:
    kw: dict[str, Any] = {
        "template": "base",
        "runtime": None,
        "timeout": None,
        "cpu": None,
        "memory_mb": None,
        "disk_mb": None,
        "env": None,
        "metadata": {"a": "b"},
        "network": None,
    }
    # Without wait: sent once.
    op = core.create_sandbox(CFG, wait=None, **kw)
    call = op.send(None)
    assert isinstance(call, core.Call)
    assert call.json == {"template": "base", "metadata": {"a": "b"}}
    with pytest.raises(evalbox.TooManySandboxesError):
        op.send(err("too_many_sandboxes", 429, "1"))
    # With wait: each attempt asks the server to queue for what is left.
    op = core.create_sandbox(CFG, wait=3, **kw)
    value, steps = drive(op, [err("too_many_sandboxes", 429, "1"), answer(201, SANDBOX)], sleep=True)
    assert value.id == "sb-1"
    first, second = steps[0], steps[2]
    assert isinstance(first, core.Call)
    assert isinstance(second, core.Call)
    assert first.json["wait_seconds"] == 3
    assert second.json["wait_seconds"] == 2
    assert isinstance(steps[1], core.Sleep)
    # A Retry-After past the budget fails at once.
    op = core.create_sandbox(CFG, wait=1, **kw)
    with pytest.raises(evalbox.TooManySandboxesError):
        drive(op, [err("too_many_sandboxes", 429, "5")])


def test_wait_process_polls_until_done_or_timeout() -> None:
    result = {"stdout": "x", "stderr": "", "exit_code": 0, "status": "exited", "duration_ms": 1500}
    op = core.wait_process(CFG, "sb-1", "p1", timeout=None, poll_interval=0.5)
    value, steps = drive(op, [err("timeout", 408), err("timeout", 408), answer(200, result)])
    assert value.stdout == "x"
    assert value.duration == 1.5
    assert all(isinstance(s, core.Call) and s.params == (("timeout", "0.500"),) for s in steps)
    op = core.wait_process(CFG, "sb-1", "p1", timeout=0.05, poll_interval=10)
    first = op.send(None)
    assert isinstance(first, core.Call)
    assert float(first.params[0][1]) <= 0.05
    time.sleep(0.06)
    with pytest.raises(evalbox.CommandTimeoutError, match="still running"):
        op.send(err("timeout", 408))


def test_event_stream_across_chunks() -> None:
    lines = [
        {"type": "stdout", "data": "héllo\n"},
        {"type": "stderr", "data": "warn\n"},
        {"type": "future-event", "data": "?"},
        {"type": "stdout", "data": "bye\n"},
        {"type": "exit", "result": {"stdout": "", "stderr": "", "exit_code": 3, "status": "exited", "duration_ms": 12}},
    ]
    raw = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    s = core.EventStream()
    events: list[core.Event] = []
    for i in range(0, len(raw), 7):  # cut anywhere, also inside a UTF-8 character
        events += s.feed(raw[i : i + 7])
    events += s.end()
    assert events[:3] == [
        core.Output("stdout", "héllo\n"),
        core.Output("stderr", "warn\n"),
        core.Output("stdout", "bye\n"),
    ]
    res = events[3]
    assert isinstance(res, evalbox.CommandResult)
    assert (res.stdout, res.stderr, res.exit_code, res.duration) == ("héllo\nbye\n", "warn\n", 3, 0.012)


def test_event_stream_errors() -> None:
    s = core.EventStream()
    with pytest.raises(evalbox.SandboxNotRunningError):
        s.feed(b'{"type":"error","error":{"code":"sandbox_not_running","message":"gone"}}\n')
    s = core.EventStream()
    s.feed(b'{"type":"stdout","data":"partial"}\n')
    with pytest.raises(evalbox.APIConnectionError, match="ended before"):
        s.end()
    # The last line may come without its newline.
    s = core.EventStream()
    assert s.feed(b'{"type":"exit","result":{"status":"exited","exit_code":0}}') == []
    [res] = s.end()
    assert isinstance(res, evalbox.CommandResult)


def test_upload_sources(tmp_path: Any) -> None:
    assert core.upload_from("é") == core.Upload("é".encode(), 2, None)
    assert core.upload_from(bytearray(b"ab")).size == 2
    p = tmp_path / "f"
    p.write_bytes(b"0123456789")
    with open(p, "rb") as f:
        f.read(4)
        up = core.upload_from(f)
        assert (up.size, up.start, up.resendable) == (6, 4, True)
    b = io.BytesIO(b"abc")
    assert core.upload_from(b).size == 3
    with open(p) as text, pytest.raises(TypeError, match="binary mode"):
        core.upload_from(text)  # type: ignore[arg-type]
    gen = core.upload_from(x for x in [b"a"])
    assert (gen.size, gen.resendable) == (None, False)
    with pytest.raises(TypeError):
        core.upload_from(42)  # type: ignore[arg-type]


def test_config_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVALBOX_API_URL", "http://h:1/v1/")
    monkeypatch.setenv("EVALBOX_API_KEY", "eb_x")
    c = core.Config.resolve()
    assert (c.api_url, c.api_key) == ("http://h:1", "eb_x")
    assert core.Config.resolve("http://o:2", "k2").api_url == "http://o:2"
    monkeypatch.delenv("EVALBOX_API_URL")
    assert core.Config.resolve().api_url == "http://127.0.0.1:8700"


def test_bad_arguments_fail_before_any_request() -> None:
    with pytest.raises(ValueError, match="empty sandbox id"):
        core.sandbox_path("")
    with pytest.raises(ValueError, match="empty command"):
        core.exec_body("", cwd=None, env=None, user=None, stdin=None, timeout=None, max_output_bytes=None, tag=None)
    with pytest.raises(ValueError, match="metadata filter"):
        core.delete_sandboxes(CFG, {}).send(None)
    with pytest.raises(ValueError, match="permission"):
        core.file_mode(0o17777)
    assert core.sandbox_path("a/b?c") == "/sandboxes/a%2Fb%3Fc"
    assert (core.signal_name(signal.SIGTERM), core.signal_name(9), core.signal_name("TERM")) == ("15", "9", "TERM")


def test_parse_time() -> None:
    from evalbox.models import parse_time

    assert parse_time("2026-11-29T11:31:45.182245123Z") == datetime(2026, 11, 29, 11, 31, 45, 182245, timezone.utc)
    assert parse_time("2026-11-29T12:31:45+01:00") == datetime(2026, 11, 29, 11, 31, 45, tzinfo=timezone.utc)


# --- execute and eval runs -----------------------------------------------------


def test_execute_chunks_by_count_and_bytes() -> None:
    base = core.execute_body(language="python", timeout=None, template=None, runtime=None)
    assert base == {"language": "python"}
    scripts = [f"print({i})" for i in range(10)]
    assert core.execute_chunks(scripts, base, max_scripts=4) == [scripts[0:4], scripts[4:8], scripts[8:10]]
    # By bytes: each chunk's body, encoded as httpx encodes it, fits; one more script would not.
    big = ["x" * 300 + 'é\n"' for _ in range(10)]
    limit = 1000
    chunks = core.execute_chunks(big, base, max_body=limit)
    assert [s for c in chunks for s in c] == big
    for c in chunks:
        assert len(httpx.Request("POST", "http://x", json={**base, "scripts": list(c)}).content) <= limit
    assert len(json.dumps({**base, "scripts": [*chunks[0], big[0]]}, ensure_ascii=False).encode()) > limit
    # A script too large on its own goes alone (the server answers 413); nothing is dropped.
    assert core.execute_chunks(["a", "b" * 2000, "c"], base, max_body=1000) == [["a"], ["b" * 2000], ["c"]]
    with pytest.raises(TypeError, match="script 1"):
        core.execute_chunks(["ok", b"bytes"], base)  # type: ignore[list-item]


def test_execute_keeps_order_across_requests() -> None:
    base = core.execute_body(language="bash", timeout=2.5, template="base", runtime="namespaces")
    scripts = [f"echo {i}" for i in range(5)]

    def results(lo: int, hi: int) -> httpx.Response:
        rs = [
            {"stdout": f"{i}\n", "stderr": "", "exit_code": 0, "status": "exited", "duration_ms": 5}
            for i in range(lo, hi)
        ]
        return answer(200, {"results": rs})

    value, steps = drive(core.execute(CFG, scripts, base, max_scripts=2), [results(0, 2), results(2, 4), results(4, 5)])
    assert [r.stdout for r in value] == [f"{i}\n" for i in range(5)]
    calls = [s for s in steps if isinstance(s, core.Call)]
    assert [c.json["scripts"] for c in calls] == [scripts[0:2], scripts[2:4], scripts[4:5]]
    assert all(c.json["language"] == "bash" and c.json["timeout"] == 2.5 for c in calls)
    assert all(not c.retry and c.read_timeout is None for c in calls)
    with pytest.raises(evalbox.EvalboxError, match="2 scripts sent, 1 results"):
        drive(core.execute(CFG, scripts[:2], base), [results(0, 1)])
    with pytest.raises(StopIteration) as stop:  # no scripts: no request
        core.execute(CFG, [], base).send(None)
    assert stop.value.value == []
    with pytest.raises(ValueError, match="timeout"):
        core.execute_body(language="python", timeout=0, template=None, runtime=None)


def test_eval_body(tmp_path: Any) -> None:
    problem = {"task_id": "t/0", "prompt": "p", "entry_point": "f", "test": "t", "canonical_solution": None, "x": 1}
    sample = {"task_id": "t/0", "completion": "c", "solution": None, "result": "passed", "passed": True}
    none: dict[str, Any] = dict(
        k=None,
        timeout=None,
        template=None,
        runtime=None,
        concurrency=None,
        seed=None,
        mode=None,
        slice=None,
        language=None,
        compile_timeout=None,
        compile_memory_mb=None,
        compile_flags=None,
        memory_mb=None,
        output_limit_bytes=None,
        stop_on_first_failure=False,
    )
    body = core.eval_body([problem], [sample], **none)
    assert body == {
        "problems": [{"task_id": "t/0", "prompt": "p", "entry_point": "f", "test": "t"}],
        "samples": [{"task_id": "t/0", "completion": "c"}],
    }
    io_problem = {"task_id": "t/1", "prompt": "p", "entry_point": "f", "io": [{"input": [1], "output": 2}]}
    body = core.eval_body(
        [io_problem],
        [sample],
        k=5,
        timeout=1.5,
        template="py",
        runtime="gvisor",
        concurrency=4,
        seed=0,
        mode="batch",
        slice=50,
        language="cpp",
        compile_timeout=20.5,
        compile_memory_mb=2048,
        compile_flags=("-O0", "-std=c++20"),
        memory_mb=256,
        output_limit_bytes=1 << 20,
        stop_on_first_failure=True,
    )
    assert body["problems"] == [io_problem]
    assert {k: v for k, v in body.items() if k not in ("problems", "samples")} == {
        "k": [5],
        "timeout": 1.5,
        "template": "py",
        "runtime": "gvisor",
        "concurrency": 4,
        "seed": 0,
        "mode": "batch",
        "slice": 50,
        "language": "cpp",
        "compile_timeout": 20.5,
        "compile_memory_mb": 2048,
        "compile_flags": ["-O0", "-std=c++20"],
        "memory_mb": 256,
        "output_limit_bytes": 1 << 20,
        "stop_on_first_failure": True,
    }
    # Stdin/stdout problems keep their tests, checker and language; samples their language.
    judged = {
        "task_id": "t/2",
        "prompt": "",
        "tests": [{"input": "1\n", "output": "2\n"}],
        "checker": {"type": "float", "abs_tol": 1e-3},
        "language": "cpp",
        "result": "dropped",
    }
    cpp = {"task_id": "t/2", "solution": "int main() {}", "language": "c++", "passed": False}
    body = core.eval_body([judged], [cpp], **none)
    assert body["problems"] == [{k: v for k, v in judged.items() if k != "result"}]
    assert body["samples"] == [{"task_id": "t/2", "solution": "int main() {}", "language": "c++"}]
    assert core.eval_body([judged], [cpp], **{**none, "compile_flags": []})["compile_flags"] == []
    with pytest.raises(TypeError, match="compile_flags"):
        core.eval_body([judged], [cpp], **{**none, "compile_flags": "-O2"})
    # Files: .jsonl and .jsonl.gz (by content, not name), blank lines skipped.
    plain = tmp_path / "samples.jsonl"
    plain.write_text(json.dumps(sample) + "\n\n" + json.dumps({"task_id": "t/0", "solution": "s"}) + "\n")
    packed = tmp_path / "samples.data"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    want = [{"task_id": "t/0", "completion": "c"}, {"task_id": "t/0", "solution": "s"}]
    assert core.eval_records(plain, core.SAMPLE_FIELDS, "samples") == want
    assert core.eval_records(str(packed), core.SAMPLE_FIELDS, "samples") == want
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(sample) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2:"):
        core.eval_records(bad, core.SAMPLE_FIELDS, "samples")
    with pytest.raises(ValueError, match="no problems"):
        core.eval_records(iter([]), core.PROBLEM_FIELDS, "problems")
    with pytest.raises(TypeError, match=r"samples\[1\]"):
        core.eval_records([sample, "x"], core.SAMPLE_FIELDS, "samples")  # type: ignore[list-item]


RUN = {
    "id": "ev_1",
    "team_id": "t",
    "state": "running",
    "created_at": "2026-11-29T11:31:45Z",
    "k": [1],
    "timeout": 3,
    "template": "python",
    "runtime": "",
    "concurrency": 2,
    "seed": 0,
    "tasks": 1,
    "samples": 2,
    "done": 0,
    "counts": {},
}


def test_eval_run_parsing_before_and_after_modes() -> None:
    old = evalbox.EvalRun.from_json(RUN)
    assert (old.mode, old.slice, old.summary, old.pass_at_k, old.running) == (None, None, None, {}, True)
    summary = {
        "pass_at_k": {"pass@1": 0.5},
        "counts": {"passed": 1, "failed": 1},
        "template_digest": "sha256:x",
        "runtime": "gvisor",
        "runtime_version": "v",
        "duration_ms": 1500,
        "trials_per_second": 2.0,
        "retries": 1,
        "phases": {"run": {"p50_ms": 10, "p99_ms": 20, "mean_ms": 12}},
        "a_field_of_a_newer_server": True,
    }
    new = evalbox.EvalRun.from_json(
        {
            **RUN,
            "state": "succeeded",
            "mode": "batch",
            "slice": 100,
            "done": 2,
            "summary": summary,
            "finished_at": RUN["created_at"],
        }
    )
    assert (new.mode, new.slice, new.running, new.pass_at_k) == ("batch", 100, False, {"pass@1": 0.5})
    assert new.summary is not None
    assert (new.summary.duration, new.summary.retries) == (1.5, 1)
    assert new.summary.phases["run"] == evalbox.PhaseStats(p50=0.01, p99=0.02, mean=0.012)
    assert evalbox.EvalRun.from_json({**RUN, "mode": "trial"}).slice is None
    assert (old.language, evalbox.EvalRun.from_json({**RUN, "language": "cpp"}).language) == ("", "cpp")


#: An ``EvalResult`` as servers before stdin/stdout judging send it.
RESULT = {
    "task_id": "t/0",
    "completion_id": 3,
    "status": "failed",
    "detail": "AssertionError",
    "duration_ms": 250,
    "passed": False,
    "result": "failed: AssertionError",
}


def test_eval_result_parsing_before_and_after_judging() -> None:
    old = evalbox.EvalResult.from_json(RESULT)
    assert (old.status, old.duration, old.language, old.compile) == ("failed", 0.25, "", None)
    assert (old.tests_passed, old.tests_total, old.tests) == (0, 0, ())
    new = evalbox.EvalResult.from_json(
        {
            **RESULT,
            "status": "wrong_answer",
            "language": "cpp",
            "compile": {"ok": True, "output": "warning: x", "duration_ms": 1200},
            "tests_passed": 1,
            "tests_total": 3,
            "tests": [
                {"status": "passed", "duration_ms": 5, "exit_code": 0, "peak_memory_bytes": 1 << 20},
                {
                    "status": "runtime_error",
                    "detail": "killed by signal 11",
                    "duration_ms": 7,
                    "exit_code": -1,
                    "signal": 11,
                },
                {"status": "not_run", "duration_ms": 0, "exit_code": 0, "a_field_of_a_newer_server": 1},
            ],
        }
    )
    assert (new.status, new.language, new.tests_passed, new.tests_total) == ("wrong_answer", "cpp", 1, 3)
    assert new.compile == evalbox.EvalCompile(ok=True, duration=1.2, output="warning: x")
    assert new.tests == (
        evalbox.EvalTestResult(status="passed", duration=0.005, exit_code=0, peak_memory_bytes=1 << 20),
        evalbox.EvalTestResult(
            status="runtime_error", duration=0.007, exit_code=-1, detail="killed by signal 11", signal=11
        ),
        evalbox.EvalTestResult(status="not_run", duration=0.0, exit_code=0),
    )
    assert [t.passed for t in new.tests] == [True, False, False]
    failed = evalbox.EvalResult.from_json(
        {**RESULT, "status": "compile_error", "compile": {"ok": False, "duration_ms": 9}}
    )
    assert failed.compile == evalbox.EvalCompile(ok=False, duration=0.009)


def test_wait_eval_reports_each_change_once() -> None:
    seen: list[evalbox.EvalRun] = []
    progress = [
        {**RUN},
        {**RUN, "done": 1, "counts": {"passed": 1}},
        {**RUN, "done": 1, "counts": {"passed": 1}},
        {**RUN, "state": "succeeded", "done": 2, "counts": {"passed": 1, "failed": 1}},
    ]
    first = evalbox.EvalRun.from_json(RUN)
    op = core.wait_eval(CFG, "ev_1", timeout=None, poll_interval=0.5, on_progress=seen.append, first=first)
    value, steps = drive(op, [answer(200, d) for d in progress])
    assert [(r.state, r.done) for r in seen] == [("running", 0), ("running", 1), ("succeeded", 2)]
    assert value == seen[-1]
    assert [type(s).__name__ for s in steps].count("Sleep") == 4
    assert all(s.seconds == 0.5 for s in steps if isinstance(s, core.Sleep))
    # A deadline: the run is still running when it passes.
    op = core.wait_eval(CFG, "ev_1", timeout=0.05, poll_interval=0.02, on_progress=None)
    with pytest.raises(evalbox.TimeoutError, match="ev_1 is still running"):
        drive(op, [answer(200, RUN)] * 10, sleep=True)
    with pytest.raises(ValueError, match="poll_interval"):
        drive(core.wait_eval(CFG, "ev_1", timeout=None, poll_interval=0, on_progress=None), [])


def test_json_lines_across_chunks() -> None:
    lines = core.JSONLines()
    assert lines.feed(b'{"a": 1}\n{"b"') == [{"a": 1}]
    assert lines.feed(b": 2}") == []
    assert lines.feed(b"\n\n") == [{"b": 2}]
    assert lines.feed(b'{"c": 3}') == []
    assert lines.end() == [{"c": 3}]
    assert lines.end() == []
    with pytest.raises(evalbox.EvalboxError, match="invalid line"):
        lines.feed(b"nope\n")


def test_template_parsing() -> None:
    t = evalbox.TemplateInfo.from_json(
        {
            "name": "mine",
            "digest": "sha256:d",
            "size_bytes": 10,
            "built_at": "2026-11-29T11:31:45Z",
            "cpu": 1,
            "memory_mb": 512,
            "disk_mb": 1024,
            "workdir": "/work",
            "user": "root",
            "source": "build",
            "env": {"A": "1"},
            "ready_cmd": "true",
            "from": "sha256:base",
            "layers": ["sha256:l1"],
            "build_id": "b1",
        }
    )
    assert (t.from_, t.layers, t.env, t.cmd, t.build_id, t.ready_cmd) == (
        "sha256:base",
        ("sha256:l1",),
        {"A": "1"},
        (),
        "b1",
        "true",
    )
