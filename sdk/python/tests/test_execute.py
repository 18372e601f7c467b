"""evalbox.execute (POST /v1/execute) against the real server: batches of scripts, each in its own fresh sandbox."""

from __future__ import annotations

import pytest

import evalbox
from evalbox import AsyncClient, Client
from evalbox import _core as core

from .server import NS, Server, Team

#: (script, status, exit_code, stdout): a pass, a failing exit, an exception, a timeout, output on both streams.
CASES = [
    ("print('ok')", "exited", 0, "ok\n"),
    ("import sys; sys.exit(3)", "exited", 3, ""),
    ("raise ValueError('boom')", "exited", 1, ""),
    ("import time\nprint('before', flush=True)\ntime.sleep(30)", "timed_out", None, "before\n"),
    ("import sys; print('out'); print('err', file=sys.stderr)", "exited", 0, "out\n"),
]


def check_cases(results: list[evalbox.CommandResult]) -> None:
    assert len(results) == len(CASES)
    for r, (_, status, code, stdout) in zip(results, CASES, strict=True):
        assert r.status == status, r
        if code is not None:
            assert r.exit_code == code, r
        assert r.stdout == stdout, r
    assert "ValueError: boom" in results[2].stderr
    assert results[4].stderr == "err\n"
    assert 3.0 <= results[3].duration < 15


def test_execute_statuses_in_order(team: Team) -> None:
    results = evalbox.execute([c[0] for c in CASES], timeout=3, runtime=NS)
    check_cases(results)


def test_execute_many_keeps_order(team: Team) -> None:
    scripts = [f"print({i} * {i})" for i in range(40)]
    results = evalbox.execute(scripts, timeout=10, runtime=NS)
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(40)]
    assert all(r.ok for r in results)


def test_execute_chunks_keep_order(team: Team) -> None:
    """A batch beyond the per-request cap goes as consecutive requests; the results keep the scripts' order."""
    scripts = [f"echo {i}; exit {i % 3}" for i in range(8)]
    base = core.execute_body(language="bash", timeout=10, template=None, runtime=NS)
    with Client() as c:
        results = c._run(core.execute(c._cfg, scripts, base, max_scripts=3))
    assert [(r.stdout, r.exit_code) for r in results] == [(f"{i}\n", i % 3) for i in range(8)]


def test_execute_bash_and_template(team: Team) -> None:
    [r] = evalbox.execute(["echo $BASH_VERSION | cut -c1; ls /usr/bin/python3"], language="bash", runtime=NS)
    assert (r.status, r.exit_code) == ("exited", 2)  # the base template has no python3
    [r] = evalbox.execute(["ls /usr/bin/python3"], language="bash", template="python", runtime=NS)
    assert (r.status, r.exit_code, r.stdout) == ("exited", 0, "/usr/bin/python3\n")


def test_execute_errors(server: Server, team: Team) -> None:
    with pytest.raises(evalbox.BadRequestError):
        evalbox.execute(["print(1)"], timeout=601, runtime=NS)
    with pytest.raises(evalbox.BadRequestError):
        evalbox.execute(["print(1)"], runtime="bogus")
    with pytest.raises(evalbox.NotFoundError):
        evalbox.execute(["print(1)"], template="no-such-template", runtime=NS)
    with pytest.raises(evalbox.AuthenticationError):
        evalbox.execute(["print(1)"], api_url=server.url, api_key="eb_nope")
    with pytest.raises(ValueError, match="language"):
        evalbox.execute(["print(1)"], language="ruby")
    with pytest.raises(TypeError, match="not one script"):
        evalbox.execute("print(1)")
    assert evalbox.execute([]) == []


async def test_async_execute(team: Team) -> None:
    results = await evalbox.async_execute([c[0] for c in CASES], timeout=3, runtime=NS)
    check_cases(results)
    async with AsyncClient(team.url, team.key) as c:
        results = await c.execute([f"print({i})" for i in range(10)], runtime=NS)
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(10)]
        with pytest.raises(evalbox.BadRequestError):
            await c.execute(["print(1)"], timeout=601, runtime=NS)


def test_languages_are_the_specs() -> None:
    """``LANGUAGES`` is ``ExecuteRequest.language``'s enum in api/openapi.yaml."""
    import re
    from pathlib import Path

    spec = (Path(__file__).parents[3] / "api" / "openapi.yaml").read_text()
    schema = spec[spec.index("\n    ExecuteRequest:\n") :]
    m = re.search(r"\n        language:\n          type: string\n          enum: \[([^\]]*)\]", schema)
    assert m is not None
    assert tuple(x.strip() for x in m.group(1).split(",")) == core.LANGUAGES


def test_execute_compiled_languages(team: Team) -> None:
    """C++ compiles then runs, in one sandbox; a script that does not compile is the compiler's result."""
    ok = '#include <iostream>\nint main() { std::cout << 6 * 7 << "\\n"; }\n'
    bad = "int main() { return undefined_name; }\n"
    good, broken = evalbox.execute([ok, bad], language="c++", timeout=10, runtime=NS)
    assert (good.status, good.exit_code, good.stdout) == ("exited", 0, "42\n"), good
    assert broken.exit_code != 0, broken
    assert "undefined_name" in broken.stderr, broken
    assert "compile error" in (broken.error or ""), broken
    with pytest.raises(ValueError, match="language must be one of"):
        core.execute_body(language="cobol", timeout=None, template=None, runtime=None)
