"""sb.files through the sync client, against the real server."""

from __future__ import annotations

import hashlib
import io
import os
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

import evalbox
from evalbox import Sandbox

from .server import NS, Server

MB = 1_000_000


def test_write_read_text_bytes_and_modes(sb: Sandbox) -> None:
    info = sb.files.write("/work/deep/dir/a.txt", "héllo\n")
    assert (info.name, info.path, info.type, info.size, info.mode) == (
        "a.txt",
        "/work/deep/dir/a.txt",
        "file",
        7,
        0o644,
    )
    assert sb.files.read_text("/work/deep/dir/a.txt") == "héllo\n"
    data = bytes(range(256)) * 10
    sb.files.write("/work/b.bin", data, mode=0o755)
    assert sb.files.read("/work/b.bin") == data
    assert sb.files.stat("/work/b.bin").mode == 0o755
    sb.files.write("/work/b.bin", b"replaced")  # an existing file is replaced
    assert sb.files.read("/work/b.bin") == b"replaced"
    sb.files.write("/work/empty", b"")
    assert sb.files.stat("/work/empty").size == 0
    sb.files.write("/work/mv", memoryview(b"view"))
    sb.files.write("/work/chunks", (bytes([65 + i]) * 3 for i in range(3)))  # an iterable: sent chunked
    assert sb.files.read_text("/work/chunks") == "AAABBBCCC"
    buf = io.BytesIO(b"skip:kept")
    buf.read(5)
    sb.files.write("/work/file-obj", buf)  # from the current position
    assert sb.files.read_text("/work/file-obj") == "kept"
    # What the sandbox's commands see.
    assert sb.commands.run("cat /work/deep/dir/a.txt /work/mv").stdout == "héllo\nview"


def test_list_stat_mkdir_remove(sb: Sandbox) -> None:
    d = sb.files.mkdir("/work/d")
    assert (d.type, d.is_dir, d.mode) == ("dir", True, 0o755)
    with pytest.raises(evalbox.ConflictError) as ei:
        sb.files.mkdir("/work/d")
    assert (ei.value.code, ei.value.status) == ("conflict", 409)
    sb.files.mkdir("/work/d", parents=True)  # like mkdir -p: fine
    sb.files.mkdir("/work/p/q/r", parents=True, mode=0o700)
    assert sb.files.stat("/work/p/q/r").mode == 0o700
    sb.files.write("/work/d/b", "2")
    sb.files.write("/work/d/a", "1")
    sb.commands.run("ln -s /work/d/a /work/d/link")
    entries = sb.files.list("/work/d")
    assert [(e.name, e.type) for e in entries] == [("a", "file"), ("b", "file"), ("link", "symlink")]
    assert entries[2].target == "/work/d/a"
    assert sb.files.stat("/work/d/link").type == "symlink"
    with pytest.raises(evalbox.ConflictError):
        sb.files.remove("/work/d")  # not empty
    sb.files.remove("/work/d/a")
    with pytest.raises(evalbox.NotFoundError):
        sb.files.stat("/work/d/a")
    sb.files.remove("/work/d", recursive=True)
    with pytest.raises(evalbox.NotFoundError):
        sb.files.list("/work/d")
    with pytest.raises(evalbox.NotFoundError):
        sb.files.remove("/work/d")


def test_rename(sb: Sandbox) -> None:
    sb.files.write("/work/r/a", "1")
    moved = sb.files.rename("/work/r/a", "/work/r/b")
    assert (moved.path, moved.size) == ("/work/r/b", 1)
    assert sb.files.read("/work/r/b") == b"1"
    with pytest.raises(evalbox.NotFoundError):
        sb.files.stat("/work/r/a")
    sb.files.write("/work/r/c", "2")
    assert sb.files.rename("/work/r/c", "/work/r/b").path == "/work/r/b"  # a file is replaced
    assert sb.files.read("/work/r/b") == b"2"
    sb.files.mkdir("/work/full/sub", parents=True)
    with pytest.raises(evalbox.ConflictError):
        sb.files.rename("/work/r", "/work/full")  # a directory that is not empty
    with pytest.raises(evalbox.BadRequestError):
        sb.files.rename("/work/r", "/work/r/inside")
    with pytest.raises(evalbox.NotFoundError):
        sb.files.rename("/work/nope", "/work/x")
    with pytest.raises(evalbox.BadRequestError):
        sb.files.rename("relative", "/work/x")


def test_path_errors(sb: Sandbox) -> None:
    with pytest.raises(evalbox.NotFoundError) as ei:
        sb.files.read("/work/missing")
    assert (ei.value.code, ei.value.status) == ("not_found", 404)
    with pytest.raises(evalbox.BadRequestError) as bi:
        sb.files.stat("relative/path")
    assert (bi.value.code, bi.value.status) == ("bad_request", 400)
    with pytest.raises(evalbox.BadRequestError):
        sb.files.write("/work/nul\x00byte", "x")
    with pytest.raises(ValueError, match="empty path"):
        sb.files.read("")


def test_upload_download(sb: Sandbox, tmp_path: Path) -> None:
    src = tmp_path / "run.sh"
    src.write_text("#!/bin/sh\necho uploaded\n")
    src.chmod(0o750)
    info = sb.files.upload(src, "/work/run.sh")
    assert info.mode == 0o750  # keeps the local permission bits
    assert sb.commands.run("/work/run.sh").stdout == "uploaded\n"
    assert sb.files.upload(src, "/work/other.sh", mode=0o600).mode == 0o600
    out = tmp_path / "back.sh"
    assert sb.files.download("/work/run.sh", out) == info.size
    assert out.read_bytes() == src.read_bytes()
    buf = io.BytesIO()
    sb.files.download("/work/run.sh", buf)
    assert buf.getvalue() == src.read_bytes()
    # A failed download leaves no local file.
    missing = tmp_path / "missing"
    with pytest.raises(evalbox.NotFoundError):
        sb.files.download("/work/nope", missing)
    assert not missing.exists()


def _big_file(path: Path, size: int) -> str:
    h = hashlib.sha256()
    block = os.urandom(MB)
    with open(path, "wb") as f:
        for _ in range(size // MB):
            f.write(block)
            h.update(block)
    return h.hexdigest()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(MB):
            h.update(chunk)
    return h.hexdigest()


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    p = tmp_path_factory.mktemp("big") / "100MB.bin"
    digest = _big_file(p, 100 * MB)
    yield p, digest
    p.unlink()


def test_100mb_streamed_both_ways_in_little_memory(sb: Sandbox, big: tuple[Path, str], tmp_path: Path) -> None:
    src, digest = big
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        info = sb.files.upload(src, "/tmp/big.bin")
        t1 = time.perf_counter()
        _, up_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        out = tmp_path / "back.bin"
        n = sb.files.download("/tmp/big.bin", out)
        t2 = time.perf_counter()
        _, down_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.size == n == 100 * MB
    assert _sha256(out) == digest
    assert sb.commands.run("sha256sum /tmp/big.bin").stdout.split()[0] == digest
    print(
        f"\n100 MB: upload {100 / (t1 - t0):.0f} MB/s (peak {up_peak / MB:.1f} MB traced), "
        f"download {100 / (t2 - t1):.0f} MB/s (peak {down_peak / MB:.1f} MB traced)"
    )
    # Chunks of 1 MiB are in flight, never the file.
    assert up_peak < 8 * MB
    assert down_peak < 8 * MB


def test_payload_too_large(small_server: Server) -> None:
    limit = 1 << 20
    with Sandbox.create(runtime=NS, api_url=small_server.url, api_key=small_server.admin_key) as sb:
        sb.files.write("/work/ok", b"x" * limit)
        with pytest.raises(evalbox.PayloadTooLargeError) as ei:
            sb.files.write("/work/big", b"x" * (4 * limit))  # Content-Length known
        assert (ei.value.code, ei.value.status) == ("payload_too_large", 413)
        with pytest.raises(evalbox.PayloadTooLargeError):
            sb.files.write("/work/big", (b"x" * 65536 for _ in range(64)))  # chunked: found out while streaming
        with pytest.raises(evalbox.NotFoundError):
            sb.files.stat("/work/big")  # nothing left behind
        assert sb.files.stat("/work/ok").size == limit
