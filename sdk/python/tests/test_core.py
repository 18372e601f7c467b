"""The transport-agnostic core, driven step by step: retries, error mapping, stream parsing.

No server and no HTTP here: an operation is a generator, so a test plays the
driver and hands it responses (the end-to-end tests run the same code
against the real server).
"""

from __future__ import annotations

import builtins
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
        ("internal", 500, evalbox.ServerError),
        ("unavailable", 503, evalbox.ServiceUnavailableError),
        ("no_space", 507, evalbox.NoSpaceError),
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
