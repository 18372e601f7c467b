"""sb.run_code and code contexts, sync and async, on the built-in code-interpreter template."""

from __future__ import annotations

import asyncio
import base64

import pytest

import evalbox
from evalbox import AsyncSandbox, Sandbox

from .server import NS, Team


def test_run_code(team: Team) -> None:
    with Sandbox.create(template="code-interpreter", runtime=NS, timeout=180) as sb:
        got: list[str] = []
        e = sb.run_code("x = 41\nprint('hi')\nx + 1", on_stdout=got.append)
        assert (e.text, e.stdout, e.error, e.execution_count, got) == ("42", ["hi\n"], None, 1, ["hi\n"])
        e = sb.run_code("x / 0")
        assert e.error is not None
        assert (e.error.name, e.error.value) == ("ZeroDivisionError", "division by zero")
        assert "x / 0" in e.error.traceback
        e = sb.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()")
        png = [r.png for r in e.results if r.png]
        assert len(png) == 1
        assert base64.b64decode(png[0])[:4] == b"\x89PNG"
        e = sb.run_code("import pandas as pd\npd.DataFrame({'a': [1]})")
        assert e.results[0].formats() == ["text", "html"]
        assert e.results[0].is_main_result
        assert sb.run_code("import os\nos.environ['K']", env={"K": "v"}).text == "v"

        ctx = sb.create_code_context(cwd="/tmp")
        e = sb.run_code("x", context=ctx)
        assert e.error is not None
        assert e.error.name == "NameError"
        assert ctx.id in [c.id for c in sb.list_code_contexts()]
        sb.restart_code_context(ctx)
        sb.remove_code_context(ctx)
        assert ctx.id not in [c.id for c in sb.list_code_contexts()]
        with pytest.raises(evalbox.NotFoundError):
            sb.run_code("1", context=ctx)
        with pytest.raises(ValueError, match="context or language"):
            sb.run_code("1", context="c", language="python")

        with pytest.raises(evalbox.CommandTimeoutError):
            sb.run_code("import time\ntime.sleep(60)", timeout=1)
        assert sb.run_code("x").text == "41"  # interrupted, not lost


def test_run_code_needs_the_template(team: Team) -> None:
    with Sandbox.create(template="base", runtime=NS, timeout=60) as sb, pytest.raises(evalbox.PortClosedError):
        sb.run_code("1")


async def test_async_run_code(team: Team) -> None:
    async with await AsyncSandbox.create(template="code-interpreter", runtime=NS, timeout=180) as sb:
        seen: list[str] = []

        async def on_stdout(s: str) -> None:
            await asyncio.sleep(0)
            seen.append(s)

        e = await sb.run_code("n = 6\nprint(n * 7)", on_stdout=on_stdout)
        assert (e.stdout, seen, e.error) == (["42\n"], ["42\n"], None)
        assert (await sb.run_code("n")).text == "6"
        ctx = await sb.create_code_context()
        assert [c.id for c in await sb.list_code_contexts()].count(ctx.id) == 1
        await sb.remove_code_context(ctx)
