"""The official e2b SDK's AsyncSandbox, unchanged, against evalbox: trials in parallel."""

from __future__ import annotations

import asyncio

import pytest
from e2b import AsyncSandbox
from e2b.exceptions import NotFoundException
from e2b.sandbox.commands.command_handle import CommandExitException


async def _trial(i: int) -> tuple[int, str]:
    sb = await AsyncSandbox.create(template="python", timeout=120)
    try:
        await sb.files.write(f"/work/t{i}.py", f"print({i} * {i})")
        r = await sb.commands.run(f"python3 /work/t{i}.py")
        return i, r.stdout
    finally:
        await sb.kill()


def test_async_trials(key: str) -> None:
    async def main() -> list[tuple[int, str]]:
        return await asyncio.gather(*(_trial(i) for i in range(8)))

    for i, out in asyncio.run(main()):
        assert out == f"{i * i}\n"


def test_async_commands_and_files(key: str) -> None:
    async def main() -> None:
        sb = await AsyncSandbox.create(template="python", timeout=120)
        try:
            seen: list[str] = []
            r = await sb.commands.run("echo a; echo b >&2", on_stdout=seen.append, on_stderr=seen.append)
            assert (r.stdout, r.stderr) == ("a\n", "b\n")
            assert sorted(seen) == ["a\n", "b\n"]
            with pytest.raises(CommandExitException) as exc:
                await sb.commands.run("exit 7")
            assert exc.value.exit_code == 7
            h = await sb.commands.run("sleep 600", background=True)
            assert h.pid in [p.pid for p in await sb.commands.list()]
            assert await h.kill()
            await sb.files.write("/work/x", b"\x01\x02")
            assert await sb.files.read("/work/x", format="bytes") == bytearray(b"\x01\x02")
            assert [e.name for e in await sb.files.list("/work") if e.name == "x"] == ["x"]
            info = await sb.get_info()
            assert info.sandbox_id == sb.sandbox_id
            again = await AsyncSandbox.connect(sb.sandbox_id)
            assert (await again.commands.run("echo again")).stdout == "again\n"
        finally:
            assert await sb.kill()
        with pytest.raises(NotFoundException):
            await AsyncSandbox.get_info(sb.sandbox_id)

    asyncio.run(main())
