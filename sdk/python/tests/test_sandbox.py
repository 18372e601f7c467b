"""Sandbox lifecycle through the sync client, against the real server."""

from __future__ import annotations

import threading
import time
import uuid

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

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
        # The traffic token, in place of the key; rotated, the old one stops.
        token = sb.traffic_token
        assert token.startswith("evt_")
        assert Sandbox.connect(sb.id).traffic_token == ""
        with_token = {evalbox.TRAFFIC_TOKEN_HEADER: token}
        assert httpx.get(url + "index.html", headers=with_token, timeout=30).text == "hi\n"
        assert httpx.get(url + f"index.html?evalbox_token={token}", timeout=30).text == "hi\n"
        new = sb.rotate_traffic_token()
        assert new != token
        assert sb.traffic_token == new
        assert httpx.get(url + "index.html", headers=with_token, timeout=30).status_code == 401
        assert httpx.get(url + "index.html", headers={evalbox.TRAFFIC_TOKEN_HEADER: new}, timeout=30).text == "hi\n"
        # A public port: no credentials at all.
        assert sb.set_public_ports([8000]).public_ports == (8000,)
        assert httpx.get(url + "index.html", timeout=30).text == "hi\n"
        assert sb.set_public_ports([]).public_ports == ()
        assert httpx.get(url + "index.html", timeout=30).status_code == 401
        with pytest.raises(ValueError, match="no sandbox domain"):
            sb.get_url(8000, host_form=True)
    with pytest.raises(ValueError, match="port 0"):
        sb.get_url(0)


def test_network_rules(team: Team) -> None:
    """Mode rules at create and live: the lists as the server keeps them, the
    sandbox's DNS answering only allowed names, bad entries named, none never
    opened. (What rules let through is tested against a fake internet in the
    server's e2e suite.)"""
    probe = "python3 -c \"import socket; socket.getaddrinfo('{}', 443)\""
    with Sandbox.create(template="python", runtime=NS, timeout=120, allow=["pypi.org", "*.pythonhosted.org"]) as sb:
        info = sb.network.rules()
        assert info.network == "rules"
        assert info.network_rules == evalbox.NetworkRules(allow=("pypi.org", "*.pythonhosted.org"), deny=())
        # A name the rules do not allow never resolves (it never leaves the host).
        r = sb.commands.run(probe.format("example.com"), timeout=30)
        assert r.exit_code != 0
        assert "gaierror" in r.stderr
        info = sb.network.update(allow=["example.com"], deny=["10.0.0.0/8"])
        assert info.network_rules == evalbox.NetworkRules(allow=("example.com",), deny=("10.0.0.0/8",))
        with pytest.raises(evalbox.BadRequestError, match=r'network.allow\[1\]: "300.0.0.0/8"'):
            sb.network.update(allow=["ok.org", "300.0.0.0/8"])
        assert sb.network.rules().network_rules == info.network_rules
        assert sb.network.update(mode="outbound").network_rules is None
        assert sb.network.update().network_rules == evalbox.NetworkRules(allow=(), deny=())
        with pytest.raises(TypeError):
            sb.network.update(allow="pypi.org")
    with pytest.raises(evalbox.BadRequestError, match=r"network\.deny"):
        Sandbox.create(runtime=NS, deny=["bad domain"])
    with Sandbox.create(runtime=NS, timeout=60) as none:
        assert none.info().network == "none"
        with pytest.raises(evalbox.ConflictError):
            none.network.update(allow=["pypi.org"])


# A WebSocket echo server on the standard library only (the python
# template has no websockets package): text, binary and ping frames back.
WS_ECHO = r"""
import base64, hashlib, socket, struct, threading
def exact(c, n):
    b = b""
    while len(b) < n:
        d = c.recv(n - len(b))
        if not d:
            raise EOFError
        b += d
    return b
def handle(c):
    req = b""
    while b"\r\n\r\n" not in req:
        d = c.recv(4096)
        if not d:
            return
        req += d
    key = [l.split(b":", 1)[1].strip() for l in req.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key:")][0]
    acc = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              + b"Sec-WebSocket-Accept: " + acc + b"\r\n\r\n")
    while True:
        h = exact(c, 2)
        op, n = h[0] & 15, h[1] & 127
        if n == 126:
            n = struct.unpack(">H", exact(c, 2))[0]
        elif n == 127:
            n = struct.unpack(">Q", exact(c, 8))[0]
        mask = exact(c, 4) if h[1] & 128 else bytes(4)
        data = bytes(b ^ mask[i % 4] for i, b in enumerate(exact(c, n)))
        if op == 8:
            c.sendall(b"\x88\x00")
            return
        if op == 9:
            op = 10
        hdr = bytes([128 | op])
        if len(data) < 126:
            hdr += bytes([len(data)])
        elif len(data) < 65536:
            hdr += bytes([126]) + struct.pack(">H", len(data))
        else:
            hdr += bytes([127]) + struct.pack(">Q", len(data))
        c.sendall(hdr + data)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8765))
s.listen(16)
while True:
    c, _ = s.accept()
    threading.Thread(target=handle, args=(c,), daemon=True).start()
"""


@pytest.mark.parametrize("runtime", [NS, "gvisor"])
def test_websocket_through_port_url(team: Team, runtime: str) -> None:
    """A real WebSocket client (the websockets package) through a port URL, both ways; the
    sandbox's deletion ends the open WebSocket at once instead of leaving it hanging."""
    sb = Sandbox.create(template="python", runtime=runtime, timeout=120)
    try:
        sb.files.write("/tmp/ws.py", WS_ECHO)
        sb.commands.run("python3 /tmp/ws.py", background=True)
        url = "ws" + sb.get_url(8765).removeprefix("http")
        headers = {"Authorization": f"Bearer {team.key}"}
        deadline = time.monotonic() + 30
        while True:
            try:
                ws = ws_connect(url, additional_headers=headers, open_timeout=10)
                break
            except Exception:  # the server is starting: 502 port_closed
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        with ws:
            ws.send("hello")
            assert ws.recv(timeout=30) == "hello"
            blob = bytes(range(256)) * 256  # 64 KiB, several frames of the agent's stream
            ws.send(blob)
            assert ws.recv(timeout=30) == blob
            ws.ping().wait(timeout=30)
            sb.kill()
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=30)
    finally:
        sb.kill()
