"""Sandbox lifecycle through the sync client, against the real server."""

from __future__ import annotations

import threading
import time
import uuid

import httpx
import pytest

import evalbox
from evalbox import Client, Sandbox

from .server import NS, Server, Team


def test_create_info_kill(team: Team) -> None:
    sb = Sandbox.create(
        template="base",
        runtime=NS,
        timeout=60,
        cpu=0.5,
        memory_mb=256,
        env={"SECRET": "s3cret"},
        metadata={"test": "create"},
    )
    try:
        info = sb.info()
        assert (info.id, info.team_id, info.template, info.runtime, info.state) == (
            sb.id,
            team.id,
            "base",
            NS,
            "running",
        )
        assert (info.cpu, info.memory_mb, info.network) == (0.5, 256, "none")
        assert info.metadata == {"test": "create"}
        assert info.env_keys == ("SECRET",)
        assert 55 <= (info.expires_at - info.created_at).total_seconds() <= 61
        assert sb.commands.run("echo $SECRET").stdout == "s3cret\n"
        assert repr(sb).startswith(f"Sandbox(id='{sb.id}'")
    finally:
        sb.kill()
    info = sb.info()
    assert info.state == "deleted"
    assert info.ended_at is not None
    sb.kill()  # idempotent


def test_gvisor_is_the_default_runtime(team: Team) -> None:
    with Sandbox.create() as sb:
        info = sb.info()
        assert (info.template, info.runtime) == ("base", "gvisor")
        r = sb.commands.run(["sh", "-c", "echo out; echo err >&2; exit 7"])
        assert (r.stdout, r.stderr, r.exit_code, r.status) == ("out\n", "err\n", 7, "exited")
        sb.files.write("/work/x.txt", "gvisor")
        assert sb.files.read_text("/work/x.txt") == "gvisor"


def test_context_manager_deletes_on_exception(team: Team) -> None:
    run = uuid.uuid4().hex[:8]

    def trial() -> None:
        with Sandbox.create(runtime=NS, metadata={"run": run}) as sb:
            sb.files.write("/work/solution.py", "print(1)")
            raise RuntimeError("trial failed")

    with pytest.raises(RuntimeError, match="trial failed"):
        trial()
    [info] = Sandbox.list(metadata={"run": run}, state="all")
    assert (info.state, info.end_reason != "") == ("deleted", True)
    with pytest.raises(evalbox.SandboxNotRunningError):
        Sandbox.connect(info.id)


def test_connect(team: Team) -> None:
    with Sandbox.create(runtime=NS) as sb:
        sb.files.write("/work/state", "kept")
        other = Sandbox.connect(sb.id)
        assert other.id == sb.id
        assert other.files.read_text("/work/state") == "kept"
    with pytest.raises(evalbox.NotFoundError):
        Sandbox.connect("sb-doesnotexist")


def test_list_by_metadata_and_kill(team: Team) -> None:
    run = uuid.uuid4().hex[:8]
    a = Sandbox.create(runtime=NS, metadata={"run": run, "k": "a"})
    b = Sandbox.create(runtime=NS, metadata={"run": run, "k": "b"})
    try:
        assert {i.id for i in Sandbox.list(metadata={"run": run})} == {a.id, b.id}
        assert [i.id for i in Sandbox.list(metadata={"run": run, "k": "b"})] == [b.id]
        assert Sandbox.list(metadata={"run": "other"}) == []
        Sandbox.kill_by_id(a.id)
        assert [i.id for i in Sandbox.list(metadata={"run": run})] == [b.id]
        assert {i.id for i in Sandbox.list(metadata={"run": run}, state="all")} == {a.id, b.id}
        with pytest.raises(evalbox.NotFoundError):
            Sandbox.kill_by_id("sb-doesnotexist")
    finally:
        assert Sandbox.kill_all({"run": run}) == [b.id]
    assert Sandbox.kill_all({"run": run}) == []


def test_set_timeout(team: Team) -> None:
    with Sandbox.create(runtime=NS, timeout=30) as sb:
        before = sb.info().expires_at
        info = sb.set_timeout(600)
        assert info.expires_at > before
        assert sb.info().expires_at == info.expires_at
        assert (info.expires_at - info.created_at).total_seconds() > 590
        with pytest.raises(ValueError, match=">= 1"):
            sb.set_timeout(0)


def test_ttl_expiry(team: Team) -> None:
    sb = Sandbox.create(runtime=NS, timeout=1)
    deadline = time.monotonic() + 10
    while sb.info().state == "running":
        assert time.monotonic() < deadline, "the sandbox did not expire"
        time.sleep(0.1)
    assert sb.info().state == "expired"
    with pytest.raises(evalbox.SandboxNotRunningError):
        sb.commands.run("true")


def test_explicit_client_and_config_arguments(server: Server, team: Team) -> None:
    with Client(team.url, team.key) as c:
        assert c.health()["status"] == "ok"
        with Sandbox.create(runtime=NS, client=c) as sb:
            assert [i.id for i in Sandbox.list(client=c)] == [sb.id]
            assert Sandbox.list(api_url=server.url, api_key=team.key)[0].id == sb.id
    with pytest.raises(TypeError):
        Sandbox.list(client=c, api_key="x")


def test_too_many_sandboxes_and_wait(server: Server) -> None:
    t = server.new_team(max_sandboxes=1)
    c = t.client()
    first = Sandbox.create(runtime=NS, client=c)
    try:
        with pytest.raises(evalbox.TooManySandboxesError) as ei:
            Sandbox.create(runtime=NS, client=c)
        assert (ei.value.code, ei.value.status, ei.value.retry_after) == ("too_many_sandboxes", 429, 1.0)
        # Waiting, the server queues the request until the deadline...
        start = time.monotonic()
        with pytest.raises(evalbox.TooManySandboxesError):
            Sandbox.create(runtime=NS, client=c, wait=1)
        assert 0.9 < time.monotonic() - start < 5
        # ... or until a slot frees up.
        threading.Timer(0.5, first.kill).start()
        with Sandbox.create(runtime=NS, client=c, wait=10) as second:
            assert second.info().state == "running"
    finally:
        first.kill()
        c.close()


def test_insufficient_capacity_and_wait(tiny_server: Server) -> None:
    t = tiny_server.new_team(max_sandboxes=5)
    c = t.client()
    first = Sandbox.create(runtime=NS, client=c)
    try:
        # The team is below its limit, but the host has no room.
        with pytest.raises(evalbox.InsufficientCapacityError) as ei:
            Sandbox.create(runtime=NS, client=c)
        assert (ei.value.code, ei.value.status, ei.value.retry_after) == ("insufficient_capacity", 503, 1.0)
        assert isinstance(ei.value, evalbox.ServiceUnavailableError)
        assert "not enough host pids" in ei.value.message
        # Waiting, the request gets in once the first sandbox is gone.
        threading.Timer(0.5, first.kill).start()
        with Sandbox.create(runtime=NS, client=c, wait=10) as second:
            assert second.info().state == "running"
    finally:
        first.kill()
        c.close()


def test_authentication_error(server: Server) -> None:
    with pytest.raises(evalbox.AuthenticationError) as ei:
        Sandbox.list(api_url=server.url, api_key="eb_wrong")
    assert (ei.value.code, ei.value.status) == ("unauthorized", 401)
    with pytest.raises(evalbox.AuthenticationError):
        Sandbox.create(api_url=server.url, api_key="")


def test_bad_request_and_unknown_template(team: Team) -> None:
    with pytest.raises(evalbox.BadRequestError) as ei:
        Sandbox.create(runtime="vm")
    assert ei.value.status == 400
    with pytest.raises(evalbox.NotFoundError):
        Sandbox.create(template="no-such-template", runtime=NS)


def test_connection_error() -> None:
    with pytest.raises(evalbox.APIConnectionError) as ei:
        Sandbox.list(api_url="http://127.0.0.1:1", api_key="x")
    assert ei.value.code == "connection"
    assert ei.value.unsent


def test_get_url(team: Team) -> None:
    """A server in the sandbox, reached through its port URL with the team's key."""
    with Sandbox.create(template="python", runtime=NS, timeout=120) as sb:
        url = sb.get_url(8000)
        assert url.endswith(f"/v1/sandboxes/{sb.id}/ports/8000/")
        headers = {"Authorization": f"Bearer {team.key}"}
        # Nothing listens yet: evalbox's own 502, marked as its own.
        r = httpx.get(url, headers=headers, timeout=30)
        assert r.status_code == 502
        assert r.headers["Evalbox-Error"] == "port_closed"
        with pytest.raises(evalbox.PortClosedError):
            raise evalbox.errors.error_from_detail(r.json()["error"], status=r.status_code)
        sb.commands.run("mkdir -p /tmp/www && echo hi > /tmp/www/index.html")
        sb.commands.run("cd /tmp/www && python3 -m http.server 8000 --bind 127.0.0.1", background=True)
        deadline = time.monotonic() + 30
        while True:
            r = httpx.get(url + "index.html", headers=headers, timeout=30)
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert (r.status_code, r.text) == (200, "hi\n")
        assert "Evalbox-Error" not in r.headers
        assert httpx.get(url + "index.html", timeout=30).status_code == 401
    with pytest.raises(ValueError, match="port 0"):
        sb.get_url(0)
