"""Template builds through the SDK against the real server: a Dockerfile with a build context,
sync and async, a failed step raised as TemplateBuildError, a refused Dockerfile as
BadRequestError naming its line."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import evalbox
from evalbox import AsyncClient, BadRequestError, ConflictError, Sandbox, TemplateBuildError

from .server import NS, Team

DOCKERFILE = """FROM python
ARG WHO=world
ENV GREETING=hello
WORKDIR /task
COPY data/ ./data/
RUN echo "$GREETING $WHO" > hello.txt
"""


def test_build_dockerfile(team: Team, tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "in.txt").write_text("given\n")
    with team.client() as c:
        b = c.templates.build(
            "sdk-dockerfile:v1", dockerfile=DOCKERFILE, build_args={"WHO": "sdk"}, context_dir=tmp_path, timeout=600
        )
        assert b.state == "succeeded"
        assert b.digest
        info = c.templates.get("sdk-dockerfile:v1")
        assert (info.workdir, info.env["GREETING"]) == ("/task", "hello")
        with Sandbox.create(template="sdk-dockerfile:v1", runtime=NS, client=c) as sb:
            r = sb.commands.run("cat hello.txt data/in.txt")
            assert r.stdout == "hello sdk\ngiven\n"
        with pytest.raises(TemplateBuildError, match="exit") as e:
            c.templates.build("sdk-dockerfile-bad", dockerfile="FROM python\nRUN exit 3\n", timeout=600)
        assert e.value.build.failed_step == 1
        with pytest.raises(BadRequestError, match="line 2"):
            c.templates.build("sdk-dockerfile-bad", dockerfile="FROM python\nVOLUME /x\n")
        with pytest.raises(ValueError, match="spec or dockerfile"):
            c.templates.build("x")


def test_build_spec_async(team: Team) -> None:
    spec = {"from": "base", "steps": [{"run": "sleep 2 && echo hi > /hi"}]}  # long enough to be queued or running

    async def main() -> evalbox.TemplateBuild:
        async with AsyncClient(team.url, team.key) as c:
            queued = await c.templates.build("sdk-spec-async", spec=spec, wait=False)
            assert queued.state in ("queued", "running")
            # One build of a name at a time: the queued one's is a conflict.
            with pytest.raises(ConflictError):
                await c.templates.build("sdk-spec-async", spec=spec)
            return await c.templates.build("sdk-spec-async-2", spec=spec)

    b = asyncio.run(main())
    assert b.state == "succeeded"
    assert b.steps == 1
