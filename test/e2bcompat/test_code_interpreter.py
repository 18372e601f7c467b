"""The official e2b-code-interpreter SDK, unchanged, against evalbox's `code-interpreter` template
(its default template alias, code-interpreter-v1): stateful kernels, results, errors, contexts,
timeouts; and an open-r1-style code reward, trials in parallel through AsyncSandbox."""

from __future__ import annotations

import asyncio
import base64
import time

import pytest
from e2b.exceptions import TimeoutException
from e2b_code_interpreter import AsyncSandbox, Sandbox


def test_run_code(key: str) -> None:
    with Sandbox.create(timeout=180) as sb:
        e = sb.run_code("x = 41\nprint('hi')\nx + 1")
        assert (e.text, e.logs.stdout, e.error, e.execution_count) == ("42", ["hi\n"], None, 1)
        assert sb.run_code("x").text == "41"  # state is kept between calls
        seen: list[str] = []
        e = sb.run_code(
            "import sys\nprint('out')\nprint('err', file=sys.stderr)",
            on_stdout=lambda m: seen.append(m.line),
            on_stderr=lambda m: seen.append("E" + m.line),
        )
        assert e.logs.stdout == ["out\n"]
        assert e.logs.stderr == ["err\n"]
        assert sorted(seen) == ["Eerr\n", "out\n"]

        e = sb.run_code("def f():\n    return 1 / 0\nf()")
        assert e.error is not None
        assert (e.error.name, e.error.value) == ("ZeroDivisionError", "division by zero")
        assert "return 1 / 0" in e.error.traceback
        assert "\x1b[" not in e.error.traceback

        e = sb.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
        figs = [r for r in e.results if r.png]
        assert len(figs) == 1
        assert not figs[0].is_main_result
        assert base64.b64decode(figs[0].png)[:8] == b"\x89PNG\r\n\x1a\n"

        e = sb.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
        main = [r for r in e.results if r.is_main_result]
        assert len(main) == 1
        assert main[0].html
        assert "<table" in main[0].html
        assert main[0].text

        e = sb.run_code("import os\nstr(os.environ.get('TRIAL'))", envs={"TRIAL": "7"})
        assert e.text == "7"
        assert sb.run_code("str(os.environ.get('TRIAL'))").text == "None"  # per execution only


def test_contexts_and_timeout(key: str) -> None:
    with Sandbox.create(timeout=180) as sb:
        sb.run_code("shared = 1")
        ctx = sb.create_code_context(cwd="/tmp")
        assert ctx.language == "python"
        assert ctx.cwd == "/tmp"
        e = sb.run_code("shared", context=ctx)
        assert e.error is not None
        assert e.error.name == "NameError"
        assert sb.run_code("import os; os.getcwd()", context=ctx).text == "/tmp"
        sb.run_code("mine = 2", context=ctx)
        assert ctx.id in [c.id for c in sb.list_code_contexts()]
        sb.restart_code_context(ctx)
        e = sb.run_code("mine", context=ctx)
        assert e.error is not None
        assert e.error.name == "NameError"
        sb.remove_code_context(ctx)
        assert ctx.id not in [c.id for c in sb.list_code_contexts()]

        t = time.monotonic()
        with pytest.raises(TimeoutException):
            sb.run_code("import time\ntime.sleep(120)", timeout=2)
        assert time.monotonic() - t < 60
        # The kernel was interrupted, not lost: its state is still there.
        assert sb.run_code("shared + 1").text == "2"


SOLUTIONS = {
    "add": ("def solve(a, b):\n    return a + b\n", True),
    "wrong": ("def solve(a, b):\n    return a - b\n", False),
    "crash": ("def solve(a, b):\n    raise ValueError('no')\n", False),
    "loop": ("def solve(a, b):\n    while True:\n        pass\n", False),
}
TEST = "assert solve(2, 3) == 5 and solve(-1, 1) == 0\n'passed'"


async def _reward(code: str) -> float:
    """The reward of one completion, as open-r1's e2b code reward computes it: run the code and its
    tests in a fresh sandbox, 1.0 when they pass."""
    sb = await AsyncSandbox.create(timeout=120)
    try:
        try:
            e = await sb.run_code(code + "\n" + TEST, timeout=10)
        except TimeoutException:
            return 0.0
        except Exception as ex:
            raise AssertionError(f"{code!r}: {ex!r}") from ex
        return 1.0 if e.error is None and e.text == "passed" else 0.0
    finally:
        await sb.kill()


def test_code_reward_trials(key: str) -> None:
    async def main() -> list[float]:
        return await asyncio.gather(*(_reward(code) for code, _ in SOLUTIONS.values()))

    rewards = asyncio.run(main())
    assert rewards == [1.0 if ok else 0.0 for _, ok in SOLUTIONS.values()]
