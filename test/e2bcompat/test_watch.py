"""files.watch_dir of the official e2b SDK, unchanged, against evalbox: the sync SDK's polled
watcher (CreateWatcher, GetWatcherEvents, RemoveWatcher) and the async SDK's stream (WatchDir),
recursive or not, on inotify in the sandbox."""

from __future__ import annotations

import asyncio
import time

import pytest
from e2b import AsyncSandbox, Sandbox
from e2b.exceptions import SandboxException
from e2b.sandbox.filesystem.watch_handle import FilesystemEvent, FilesystemEventType

C, W, R, N = (
    FilesystemEventType.CREATE,
    FilesystemEventType.WRITE,
    FilesystemEventType.REMOVE,
    FilesystemEventType.RENAME,
)


def _seen(events: list[FilesystemEvent], want: list[tuple[FilesystemEventType, str]]) -> bool:
    """Whether want appears in events, in order (others between allowed)."""
    rest = list(want)
    for e in events:
        if rest and (e.type, e.name) == rest[0]:
            rest.pop(0)
    return not rest


def test_watch_polled(key: str) -> None:
    with Sandbox.create("base", timeout=120) as sb:
        sb.files.make_dir("/w/sub")
        flat = sb.files.watch_dir("/w")
        deep = sb.files.watch_dir("/w", recursive=True)
        sb.commands.run("echo x > /w/a.txt && echo y > /w/sub/b.txt && mv /w/a.txt /w/c.txt && rm /w/sub/b.txt")
        want_deep = [(C, "a.txt"), (W, "a.txt"), (C, "sub/b.txt"), (N, "a.txt"), (C, "c.txt"), (R, "sub/b.txt")]
        got_flat: list[FilesystemEvent] = []
        got_deep: list[FilesystemEvent] = []
        deadline = time.monotonic() + 30
        while not _seen(got_deep, want_deep) and time.monotonic() < deadline:
            got_flat += flat.get_new_events()
            got_deep += deep.get_new_events()
            time.sleep(0.1)
        got_flat += flat.get_new_events()
        assert _seen(got_deep, want_deep), got_deep
        assert _seen(got_flat, [(C, "a.txt"), (N, "a.txt"), (C, "c.txt")]), got_flat
        assert not [e for e in got_flat if e.name.startswith("sub/")], got_flat
        # Events are handed out once.
        assert deep.get_new_events() == []
        flat.stop()
        deep.stop()
        with pytest.raises(SandboxException):
            flat.get_new_events()
        # Not a directory, and missing.
        with pytest.raises(SandboxException):
            sb.files.watch_dir("/w/c.txt")
        with pytest.raises(SandboxException):
            sb.files.watch_dir("/nope")


def test_watch_stream(key: str) -> None:
    async def main() -> None:
        sb = await AsyncSandbox.create("base", timeout=120)
        try:
            await sb.files.make_dir("/w")
            events: list[FilesystemEvent] = []
            h = await sb.files.watch_dir("/w", events.append, recursive=True)
            await sb.commands.run("mkdir /w/d && sleep 0.2 && echo z > /w/d/e.txt && chmod 600 /w/d/e.txt")
            want = [(C, "d"), (C, "d/e.txt"), (W, "d/e.txt"), (FilesystemEventType.CHMOD, "d/e.txt")]
            for _ in range(300):
                if _seen(events, want):
                    break
                await asyncio.sleep(0.1)
            assert _seen(events, want), events
            await h.stop()
        finally:
            await sb.kill()

    asyncio.run(main())
