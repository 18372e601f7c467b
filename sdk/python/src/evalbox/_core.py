"""The transport-agnostic core of the SDK, shared by the sync and async clients.

Every API operation is written once here, as a generator ("sans-I/O"): it
yields a :class:`Call` (one HTTP request to send) or a :class:`Sleep` (a pause
before a retry), receives the :class:`httpx.Response` of each call, and
returns the parsed value. The sync client (``_sync.py``) drives these
generators with :class:`httpx.Client` and :func:`time.sleep`, the async client
(``_async.py``) with :class:`httpx.AsyncClient` and :func:`asyncio.sleep`.
Request building, retries with backoff, error mapping and response parsing
therefore exist once; the clients only do I/O.

Contract between an operation and its driver:

* For a :class:`Call` the driver sends the request and sends back the
  response. A non-2xx response has its body read and is closed. A 2xx
  response of a ``stream`` call is sent back open: the operation returns it
  and the client reads and closes it. Any other 2xx response has its body
  read.
* When sending fails (network error) the driver throws an
  :class:`~evalbox.errors.APIConnectionError` into the operation.
* For a :class:`Sleep` the driver sleeps and sends back ``None``.
* For a :class:`Notify` the driver calls its callback with its value
  (awaiting the result when it is awaitable) and sends back ``None``.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import random
import secrets
import stat as stat_mod
import tarfile
import time
from collections.abc import AsyncIterable, Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import IO, Any, NamedTuple, TypeVar, cast
from urllib.parse import quote

import httpx

from .errors import (
    APIConnectionError,
    CommandTimeoutError,
    EvalboxError,
    SandboxNotRunningError,
    TemplateBuildError,
    error_from_detail,
)
from .models import (
    BalanceInfo,
    CodeContext,
    CodeResult,
    CommandResult,
    EvalRun,
    Execution,
    ExecutionError,
    FileInfo,
    ProcessInfo,
    SandboxInfo,
    SecretInfo,
    SnapshotInfo,
    TemplateBuild,
    TemplateInfo,
    UsageReport,
)

T = TypeVar("T")

DEFAULT_API_URL = "http://127.0.0.1:8700"
ENV_API_URL = "EVALBOX_API_URL"
ENV_API_KEY = "EVALBOX_API_KEY"

JSON = "application/json"
NDJSON = "application/x-ndjson"
OCTET_STREAM = "application/octet-stream"

#: Seconds to wait for the answer of an ordinary call.
DEFAULT_READ_TIMEOUT = 120.0
#: Added to a server-side wait (command timeout, long poll, slot queue) to get
#: the read timeout of that call.
TIMEOUT_MARGIN = 60.0
CONNECT_TIMEOUT = 10.0
#: Size of the chunks a file is read in for an upload, and asked for on a
#: download.
CHUNK_SIZE = 1 << 20
#: Longest wait one ``/wait`` long poll may ask the server for.
MAX_WAIT_WINDOW = 86400.0

#: What ``files.write`` takes: text (UTF-8), bytes, a binary file, or an iterable of byte chunks.
WriteData = str | bytes | bytearray | memoryview | IO[bytes] | Iterable[bytes]
PathLike = str | os.PathLike[str]

_MIN_BACKOFF = 0.1
_MAX_BACKOFF = 5.0


@dataclass(frozen=True, slots=True)
class Config:
    """Where the API is and how calls are retried."""

    api_url: str
    """Base URL without ``/v1`` and without a trailing slash."""
    api_key: str
    retries: int = 3
    """How many times an idempotent call is retried after a 429/503 answer or a network error."""
    max_retry_wait: float = 30.0
    """Longest single wait before a retry; a longer ``Retry-After`` fails the call at once."""

    @classmethod
    def resolve(
        cls, api_url: str | None = None, api_key: str | None = None, *, retries: int = 3, max_retry_wait: float = 30.0
    ) -> Config:
        """Arguments first, then ``EVALBOX_API_URL`` / ``EVALBOX_API_KEY``, then the default URL."""
        url = api_url or os.environ.get(ENV_API_URL) or DEFAULT_API_URL
        url = url.rstrip("/")
        if url.endswith("/v1"):
            url = url[: -len("/v1")]
        key = api_key if api_key is not None else os.environ.get(ENV_API_KEY, "")
        return cls(api_url=url, api_key=key, retries=max(retries, 0), max_retry_wait=max_retry_wait)

    def headers(self) -> dict[str, str]:
        """Headers of every request."""
        h = {"User-Agent": f"evalbox-python/{_version()}"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h


def _version() -> str:
    from . import __version__

    return __version__


#: Idle connections kept for reuse, and for how long (seconds).
MAX_IDLE_CONNECTIONS = 256
KEEPALIVE = 60.0


def http_limits() -> httpx.Limits:
    """Connection pool of the SDK's sync HTTP client: no cap (every sandbox of a
    large parallel run may hold a connection for a long command), many idle
    connections kept for reuse."""
    return httpx.Limits(
        max_connections=None, max_keepalive_connections=MAX_IDLE_CONNECTIONS, keepalive_expiry=KEEPALIVE
    )


def http_timeout() -> httpx.Timeout:
    """Default timeouts of the SDK's HTTP clients (each call sets its own read timeout)."""
    return httpx.Timeout(DEFAULT_READ_TIMEOUT, connect=CONNECT_TIMEOUT, pool=None)


# --- steps -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Upload:
    """A request body streamed from bytes, a binary file or an iterable of chunks."""

    source: bytes | IO[bytes] | Iterable[bytes] | AsyncIterable[bytes]
    size: int | None
    """Content-Length, or None to send the body chunked."""
    start: int | None
    """For a seekable file, the offset to seek to before each send; None otherwise."""

    @property
    def resendable(self) -> bool:
        """Whether the body can be sent again (for a retry)."""
        return isinstance(self.source, bytes) or self.start is not None


@dataclass(frozen=True, slots=True)
class Call:
    """One HTTP request for the driver to send."""

    method: str
    path: str
    """Below ``/v1``, already escaped."""
    params: tuple[tuple[str, str], ...] = ()
    json: Any = None
    """JSON body, when not None."""
    upload: Upload | None = None
    """Raw body, when not None."""
    accept: str = JSON
    stream: bool = False
    """Send a 2xx response back open, for the caller to stream."""
    retry: bool = False
    """May be sent again after a 429/503 answer or a network error."""
    read_timeout: float | None = DEFAULT_READ_TIMEOUT
    """Seconds without data from the server before the call fails; None = no limit."""
    content_type: str = OCTET_STREAM
    """The raw body's type."""

    def headers(self) -> dict[str, str]:
        """This call's own headers (besides Authorization and User-Agent)."""
        h = {"Accept": self.accept}
        if self.upload is not None:
            h["Content-Type"] = self.content_type
            if self.upload.size is not None:
                h["Content-Length"] = str(self.upload.size)
        return h

    def timeout(self) -> httpx.Timeout:
        """The httpx timeouts of this call."""
        return httpx.Timeout(connect=CONNECT_TIMEOUT, read=self.read_timeout, write=DEFAULT_READ_TIMEOUT, pool=None)


@dataclass(frozen=True, slots=True)
class Sleep:
    """A pause before a retry."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Notify:
    """A call of the caller's callback (e.g. ``on_progress``), made by the driver (and awaited when async)."""

    callback: Callable[[Any], object]
    value: Any


Step = Call | Sleep | Notify
#: An operation: yields steps, receives responses, returns a value.
Op = Generator[Step, Any, T]


def request(cfg: Config, call: Call | Callable[[], Call], *, deadline: float | None = None) -> Op[httpx.Response]:
    """Send a call (rebuilt by ``call()`` for each attempt when it is a function).

    Returns the 2xx response. An error answer raises its
    :class:`~evalbox.errors.EvalboxError`; a call marked ``retry`` is first
    retried on 429/503 answers and network errors (up to ``cfg.retries``
    times, waiting ``Retry-After`` or an exponential backoff), never past
    ``deadline`` (a :func:`time.monotonic` value).
    """
    attempt = 0
    while True:
        c = call if isinstance(call, Call) else call()
        err: EvalboxError
        try:
            resp: httpx.Response = yield c
        except APIConnectionError as e:
            # A request that never left is safe to resend; one that may have
            # reached the server only when it is a read.
            if not (e.unsent or c.method == "GET"):
                raise
            err = e
            delay = backoff(attempt)
        else:
            if resp.is_success:
                return resp
            err = error_from_response(resp)
            if resp.status_code not in (429, 503):
                raise err
            delay = err.retry_after if err.retry_after is not None else backoff(attempt)
        if (
            not c.retry
            or attempt >= cfg.retries
            or (c.upload is not None and not c.upload.resendable)
            or delay > cfg.max_retry_wait
            or (deadline is not None and time.monotonic() + delay > deadline)
        ):
            raise err
        yield Sleep(delay)
        attempt += 1


def backoff(attempt: int) -> float:
    """Wait before retry ``attempt + 1`` without a Retry-After: exponential from 0.1 s, capped at 5 s, ±20 % jitter."""
    d = min(_MIN_BACKOFF * (1 << min(attempt, 10)), _MAX_BACKOFF)
    return d * random.uniform(0.8, 1.2)


def error_from_response(resp: httpx.Response) -> EvalboxError:
    """The exception for a non-2xx response whose body has been read."""
    retry_after = parse_retry_after(resp.headers.get("Retry-After"))
    detail: Mapping[str, Any] | None = None
    try:
        body = resp.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict) and body["error"].get("code"):
        detail = body["error"]
    else:
        # Not an evalbox error body (a proxy, or a server bug): keep what can be said.
        text = resp.text.strip()
        if len(text) > 200:
            text = text[:200] + "…"
        detail = {"code": "", "message": f"HTTP {resp.status_code}: {text or resp.reason_phrase}"}
    return error_from_detail(detail, status=resp.status_code, retry_after=retry_after)


def parse_retry_after(value: str | None) -> float | None:
    """Parse a Retry-After header (delay-seconds or an HTTP date) into seconds."""
    if not value:
        return None
    value = value.strip()
    try:
        return float(min(max(int(value), 0), 24 * 3600))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


# --- paths and bodies --------------------------------------------------------


def _seg(s: str, what: str) -> str:
    if not s:
        raise ValueError(f"empty {what}")
    return quote(s, safe="")


def sandbox_path(sandbox_id: str, suffix: str = "") -> str:
    """``/sandboxes/{id}{suffix}``."""
    return f"/sandboxes/{_seg(sandbox_id, 'sandbox id')}{suffix}"


def _check_port(port: int) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"port {port!r}: want an int from 1 to 65535")
    return port


def port_url(cfg: Config, sandbox_id: str, port: int, domain: str = "") -> str:
    """The URL of a port of a sandbox, ending with ``/``.

    The host form ``{port}-{id}.{domain}`` (with the API URL's scheme and
    port) when ``domain`` is the server's sandbox domain, else the path form
    ``…/v1/sandboxes/{id}/ports/{port}/``. Requests to it, or below it, with
    the team's API key in ``Authorization`` or the sandbox's traffic token in
    ``X-Evalbox-Traffic-Token`` reach the server listening on that port in
    the sandbox.
    """
    _check_port(port)
    if not domain:
        return f"{cfg.api_url}/v1{sandbox_path(sandbox_id)}/ports/{port}/"
    u = httpx.URL(cfg.api_url)
    host = f"{port}-{_seg(sandbox_id, 'sandbox id')}.{domain}"
    if u.port is not None:
        host += f":{u.port}"
    return f"{u.scheme}://{host}/"


TRAFFIC_TOKEN_HEADER = "X-Evalbox-Traffic-Token"
"""The header of a sandbox's traffic token on its port URLs."""


def network_body(
    network: str | None, allow: Sequence[str] | None, deny: Sequence[str] | None
) -> str | dict[str, Any] | None:
    """The ``network`` of a create or update: the mode alone, or with lists (mode ``rules`` when lists are given)."""
    if isinstance(allow, str) or isinstance(deny, str):
        raise TypeError("allow and deny are lists of entries, not one string")
    if allow is None and deny is None:
        return network or None
    return {"mode": network or "rules", "allow": list(allow or ()), "deny": list(deny or ())}


def set_network(
    cfg: Config, sandbox_id: str, *, mode: str | None, allow: Sequence[str] | None, deny: Sequence[str] | None
) -> Op[SandboxInfo]:
    """``PUT /v1/sandboxes/{id}/network``: mode ``rules`` with the lists, unless another mode is given."""
    body = network_body(mode, allow, deny)
    if body is None:
        body = {"mode": "rules", "allow": [], "deny": []}
    elif isinstance(body, str):
        body = {"mode": body}
    resp = yield from request(cfg, Call("PUT", sandbox_path(sandbox_id, "/network"), json=body, retry=True))
    return SandboxInfo.from_json(resp.json())


def set_public_ports(cfg: Config, sandbox_id: str, ports: Iterable[int]) -> Op[SandboxInfo]:
    """``PUT /v1/sandboxes/{id}/ports``: these ports public, the others private."""
    body = {"ports": [{"port": _check_port(p), "public": True} for p in ports]}
    resp = yield from request(cfg, Call("PUT", sandbox_path(sandbox_id, "/ports"), json=body, retry=True))
    return SandboxInfo.from_json(resp.json())


def rotate_traffic_token(cfg: Config, sandbox_id: str) -> Op[str]:
    """``POST /v1/sandboxes/{id}/traffic-token``: the new token."""
    resp = yield from request(cfg, Call("POST", sandbox_path(sandbox_id, "/traffic-token")))
    token: str = resp.json()["traffic_token"]
    return token


def process_path(sandbox_id: str, process_id: str, suffix: str = "") -> str:
    """``/sandboxes/{id}/processes/{pid}{suffix}``."""
    return sandbox_path(sandbox_id, f"/processes/{_seg(process_id, 'process id')}{suffix}")


def metadata_params(metadata: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    """``metadata.<key>=<value>`` query parameters."""
    if not metadata:
        return ()
    return tuple((f"metadata.{k}", v) for k, v in metadata.items())


def exec_body(
    cmd: str | Iterable[str],
    *,
    cwd: str | None,
    env: Mapping[str, str] | None,
    user: str | None,
    stdin: str | bytes | None,
    timeout: float | None,
    max_output_bytes: int | None,
    tag: str | None,
    keep_stdin: bool = False,
    kill_on_output_limit: bool = False,
    memory_limit_mb: int | None = None,
) -> dict[str, Any]:
    """The ``ExecRequest`` JSON: a string runs as ``/bin/sh -c cmd``, a list as argv."""
    body: dict[str, Any] = {}
    if isinstance(cmd, str):
        if not cmd:
            raise ValueError("empty command")
        body["cmd"] = cmd
    else:
        argv = list(cmd)
        if not argv:
            raise ValueError("empty argv")
        body["argv"] = argv
    if cwd:
        body["cwd"] = cwd
    if env:
        body["env"] = dict(env)
    if user:
        body["user"] = user
    if stdin is not None:
        body["stdin"] = stdin.decode() if isinstance(stdin, bytes) else stdin
    if timeout is not None:
        if timeout < 0:
            raise ValueError("timeout must be >= 0")
        body["timeout"] = timeout
    if max_output_bytes:
        body["max_output_bytes"] = max_output_bytes
    if kill_on_output_limit:
        body["kill_on_output_limit"] = True
    if memory_limit_mb is not None:
        if memory_limit_mb < 0:
            raise ValueError("memory_limit_mb must be >= 0")
        if memory_limit_mb:
            body["memory_limit_mb"] = memory_limit_mb
    if tag:
        body["tag"] = tag
    if keep_stdin:
        body["keep_stdin"] = True
    return body


def _command_read_timeout(timeout: float | None) -> float | None:
    return timeout + TIMEOUT_MARGIN if timeout else None


def signal_name(signal: str | int) -> str:
    """A signal as the API takes it: a name (``"SIGTERM"``, ``"TERM"``) or a number (``"15"``)."""
    if isinstance(signal, int):  # also signal.Signals
        return str(int(signal))
    if not signal:
        raise ValueError("empty signal")
    return signal


def file_mode(mode: int | None) -> tuple[tuple[str, str], ...]:
    """The ``mode`` query parameter (octal permission bits)."""
    if mode is None:
        return ()
    if not 0 <= mode <= 0o7777:
        raise ValueError(f"mode {mode:o} is not a permission mode")
    return (("mode", f"{mode:04o}"),)


def upload_from(data: WriteData | AsyncIterable[bytes]) -> Upload:
    """Describe a body to upload: text (UTF-8), bytes, a binary file, or an iterable of byte chunks."""
    if isinstance(data, str):
        b = data.encode()
        return Upload(b, len(b), None)
    if isinstance(data, bytes):
        return Upload(data, len(data), None)
    if isinstance(data, (bytearray, memoryview)):
        b = bytes(data)
        return Upload(b, len(b), None)
    if isinstance(data, io.TextIOBase):
        raise TypeError("open the file in binary mode ('rb') to upload it")
    if hasattr(data, "read"):
        f: IO[bytes] = data  # type: ignore[assignment]
        return Upload(f, _remaining_size(f), _tell(f))
    if isinstance(data, (Iterable, AsyncIterable)):
        return Upload(cast("Iterable[bytes] | AsyncIterable[bytes]", data), None, None)
    raise TypeError(f"cannot upload a {type(data).__name__}: give str, bytes, a binary file or an iterable of bytes")


def _tell(f: IO[bytes]) -> int | None:
    try:
        if not f.seekable():
            return None
        return f.tell()
    except (AttributeError, OSError, ValueError):
        return None


def _remaining_size(f: IO[bytes]) -> int | None:
    """Bytes left to read in f, when that can be known without reading it."""
    pos = _tell(f)
    if pos is None:
        return None
    try:
        st = os.fstat(f.fileno())
        if stat_mod.S_ISREG(st.st_mode):
            return max(st.st_size - pos, 0)
        return None
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        pass
    try:
        end = f.seek(0, io.SEEK_END)
        f.seek(pos)
        return max(end - pos, 0)
    except (OSError, ValueError):
        return None


def read_chunks(f: IO[bytes]) -> Iterator[bytes]:
    """Read a binary file in chunks (the body of a sync upload)."""
    while True:
        chunk = f.read(CHUNK_SIZE)
        if not chunk:
            return
        if not isinstance(chunk, bytes):
            raise TypeError("open the file in binary mode ('rb') to upload it")
        yield chunk


def rewind(upload: Upload) -> None:
    """Seek a file body back to its start before a (re)send."""
    if upload.start is not None and hasattr(upload.source, "seek"):
        upload.source.seek(upload.start)


# --- NDJSON streams ----------------------------------------------------------


class Output(NamedTuple):
    """A chunk of a command's output."""

    stream: str
    """``stdout`` or ``stderr``."""
    data: str


Event = Output | CommandResult


class EventStream:
    """Turns the bytes of an NDJSON ``ExecEvent`` stream into output chunks and, last, the result.

    An ``error`` event raises its :class:`~evalbox.errors.EvalboxError`; a
    stream that ends without an ``exit`` event raises
    :class:`~evalbox.errors.APIConnectionError` (it was cut off).
    """

    __slots__ = ("_buf", "_done", "_err", "_keep", "_out")

    def __init__(self, *, keep_output: bool = True) -> None:
        self._keep = keep_output
        self._buf = b""
        self._done = False
        self._out: list[str] = []
        self._err: list[str] = []

    def feed(self, chunk: bytes) -> list[Event]:
        """Add bytes of the stream; return the events they complete (nothing after the result)."""
        if self._done:
            return []
        if b"\n" not in chunk:
            self._buf += chunk
            return []
        lines = (self._buf + chunk).split(b"\n")
        self._buf = lines.pop()
        events: list[Event] = []
        for line in lines:
            ev = self._line(line)
            if ev is not None:
                events.append(ev)
                if self._done:
                    break
        return events

    def end(self) -> list[Event]:
        """The stream ended: the events of a last unterminated line, or raise if it had no result."""
        if self._done:
            return []
        ev = self._line(self._buf)
        self._buf = b""
        if not self._done:
            raise APIConnectionError("the output stream ended before the command's exit event")
        return [ev] if ev is not None else []

    def _line(self, line: bytes) -> Event | None:
        if not line.strip():
            return None
        try:
            ev = json.loads(line)
        except ValueError as e:
            raise EvalboxError(f"invalid line in the output stream: {e}", code="internal") from e
        typ = ev.get("type")
        if typ == "stdout" or typ == "stderr":
            data = ev.get("data", "")
            if self._keep:
                (self._out if typ == "stdout" else self._err).append(data)
            return Output(typ, data)
        if typ == "exit":
            res = ev.get("result")
            if not isinstance(res, dict):
                raise EvalboxError("exit event without a result", code="internal")
            self._done = True
            return CommandResult.from_json(
                res,
                stdout="".join(self._out) + res.get("stdout", ""),
                stderr="".join(self._err) + res.get("stderr", ""),
            )
        if typ == "error":
            self._done = True
            raise error_from_detail(ev.get("error"))
        return None  # newer servers may add event types


def connection_error(e: httpx.TransportError) -> APIConnectionError:
    """The SDK's error for an httpx network error (chained to it)."""
    unsent = isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout))
    err = APIConnectionError(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__, unsent=unsent)
    err.__cause__ = e
    return err


# --- operations: sandboxes ---------------------------------------------------


def health(cfg: Config) -> Op[dict[str, Any]]:
    """``GET /v1/health``."""
    resp = yield from request(cfg, Call("GET", "/health", retry=True))
    out: dict[str, Any] = resp.json()
    return out


def create_sandbox(
    cfg: Config,
    *,
    template: str,
    runtime: str | None,
    timeout: int | None,
    cpu: float | None,
    memory_mb: int | None,
    disk_mb: int | None,
    env: Mapping[str, str] | None,
    metadata: Mapping[str, str] | None,
    network: str | None,
    wait: float | None,
    allow: Sequence[str] | None = None,
    deny: Sequence[str] | None = None,
    public_ports: Iterable[int] | None = None,
    snapshot: str | None = None,
    secrets: Mapping[str, str] | None = None,
    secret_refs: Sequence[str] | None = None,
    long_running: bool = False,
    tariff: str | None = None,
) -> Op[SandboxInfo]:
    """``POST /v1/sandboxes``.

    Without ``wait`` the call is sent once: a 429 ``too_many_sandboxes`` or
    503 is raised at once (nothing was created). With ``wait`` (seconds) the
    server queues the request for a slot, and 429/503 answers are retried
    (honouring Retry-After) as long as the ``wait`` budget lasts; each attempt
    asks the server to queue for what is left of it.
    """
    body: dict[str, Any] = {}
    if snapshot:
        # The snapshot's template, runtime, shape and network.
        if runtime or cpu or memory_mb or disk_mb or network or allow or deny:
            raise ValueError("a sandbox made from a snapshot has its runtime, cpu, memory, disk and network")
        body["snapshot"] = snapshot
    elif not template:
        raise ValueError("empty template")
    else:
        body["template"] = template
    if runtime:
        body["runtime"] = runtime
    if timeout:
        body["timeout"] = int(timeout)
    if cpu:
        body["cpu"] = cpu
    if memory_mb:
        body["memory_mb"] = int(memory_mb)
    if disk_mb:
        body["disk_mb"] = int(disk_mb)
    if env:
        body["env"] = dict(env)
    if secrets:
        body["secrets"] = dict(secrets)
    if secret_refs:
        if isinstance(secret_refs, str):
            raise TypeError("secret_refs is a list of names, not a string")
        body["secret_refs"] = list(secret_refs)
    if long_running:
        body["long_running"] = True
    if tariff:
        body["tariff"] = tariff
    if metadata:
        body["metadata"] = dict(metadata)
    net = network_body(network, allow, deny)
    if net:
        body["network"] = net
    if public_ports:
        body["ports"] = [{"port": _check_port(p), "public": True} for p in public_ports]
    if not wait or wait <= 0:
        call = Call("POST", "/sandboxes", json=body)
        resp = yield from request(cfg, call)
        return SandboxInfo.from_json(resp.json())
    deadline = time.monotonic() + wait

    def attempt() -> Call:
        left = max(math.ceil(deadline - time.monotonic()), 1)
        return Call(
            "POST",
            "/sandboxes",
            json={**body, "wait_seconds": left},
            retry=True,
            read_timeout=left + TIMEOUT_MARGIN,
        )

    resp = yield from request(cfg, attempt, deadline=deadline)
    return SandboxInfo.from_json(resp.json())


def get_sandbox(cfg: Config, sandbox_id: str) -> Op[SandboxInfo]:
    """``GET /v1/sandboxes/{id}``."""
    resp = yield from request(cfg, Call("GET", sandbox_path(sandbox_id), retry=True))
    return SandboxInfo.from_json(resp.json())


def connect_sandbox(cfg: Config, sandbox_id: str) -> Op[SandboxInfo]:
    """Get a sandbox and check that it runs (else :class:`~evalbox.errors.SandboxNotRunningError`)."""
    info = yield from get_sandbox(cfg, sandbox_id)
    if info.state != "running":
        reason = f" ({info.end_reason})" if info.end_reason else ""
        raise SandboxNotRunningError(
            f"sandbox {sandbox_id} is {info.state}{reason}", code="sandbox_not_running", status=None
        )
    return info


def list_sandboxes(cfg: Config, *, metadata: Mapping[str, str] | None, state: str) -> Op[list[SandboxInfo]]:
    """``GET /v1/sandboxes?metadata.k=v&state=…``."""
    if state not in ("running", "all"):
        raise ValueError(f"state must be 'running' or 'all', not {state!r}")
    params = metadata_params(metadata)
    if state != "running":
        params += (("state", state),)
    resp = yield from request(cfg, Call("GET", "/sandboxes", params=params, retry=True))
    return [SandboxInfo.from_json(d) for d in resp.json()["sandboxes"]]


def delete_sandbox(cfg: Config, sandbox_id: str) -> Op[None]:
    """``DELETE /v1/sandboxes/{id}`` (204 also when it already ended)."""
    yield from request(cfg, Call("DELETE", sandbox_path(sandbox_id), retry=True))


def delete_sandboxes(cfg: Config, metadata: Mapping[str, str]) -> Op[list[str]]:
    """``DELETE /v1/sandboxes?metadata.k=v``: the ids deleted."""
    if not metadata:
        raise ValueError("a bulk delete needs at least one metadata filter")
    resp = yield from request(cfg, Call("DELETE", "/sandboxes", params=metadata_params(metadata), retry=True))
    return list(resp.json()["deleted"])


def snapshot_sandbox(cfg: Config, sandbox_id: str) -> Op[SnapshotInfo]:
    """``POST /v1/sandboxes/{id}/snapshots``. Never retried (a retry would take a second one)."""
    resp = yield from request(cfg, Call("POST", sandbox_path(sandbox_id, "/snapshots")))
    return SnapshotInfo.from_json(resp.json())


def fork_sandbox(
    cfg: Config,
    sandbox_id: str,
    count: int,
    *,
    timeout: int | None,
    metadata: Mapping[str, str] | None,
    keep_snapshot: bool,
    wait: float | None,
) -> Op[tuple[list[SandboxInfo], SnapshotInfo | None]]:
    """``POST /v1/sandboxes/{id}/fork``: the new sandboxes, and the snapshot when kept. Never retried."""
    if not 1 <= count <= MAX_FORK_COUNT:
        raise ValueError(f"count must be between 1 and {MAX_FORK_COUNT}, not {count}")
    body: dict[str, Any] = {"count": int(count)}
    if timeout:
        body["timeout"] = int(timeout)
    if metadata:
        body["metadata"] = dict(metadata)
    if keep_snapshot:
        body["keep_snapshot"] = True
    read_timeout: float | None = None
    if wait and wait > 0:
        body["wait_seconds"] = max(math.ceil(wait), 1)
        read_timeout = body["wait_seconds"] + TIMEOUT_MARGIN
    call = Call("POST", sandbox_path(sandbox_id, "/fork"), json=body, read_timeout=read_timeout)
    resp = yield from request(cfg, call)
    d = resp.json()
    kept = d.get("snapshot")
    return [SandboxInfo.from_json(x) for x in d["sandboxes"]], SnapshotInfo.from_json(kept) if kept else None


#: The most sandboxes one fork makes.
MAX_FORK_COUNT = 100


def pause_sandbox(cfg: Config, sandbox_id: str) -> Op[SandboxInfo]:
    """``POST /v1/sandboxes/{id}/pause``."""
    resp = yield from request(cfg, Call("POST", sandbox_path(sandbox_id, "/pause")))
    return SandboxInfo.from_json(resp.json())


def resume_sandbox(cfg: Config, sandbox_id: str, *, wait: float | None) -> Op[SandboxInfo]:
    """``POST /v1/sandboxes/{id}/resume``."""
    body: dict[str, Any] = {}
    read_timeout: float | None = None
    if wait and wait > 0:
        body["wait_seconds"] = max(math.ceil(wait), 1)
        read_timeout = body["wait_seconds"] + TIMEOUT_MARGIN
    call = Call("POST", sandbox_path(sandbox_id, "/resume"), json=body, read_timeout=read_timeout)
    resp = yield from request(cfg, call)
    return SandboxInfo.from_json(resp.json())


def usage(
    cfg: Config,
    *,
    start: datetime | None,
    end: datetime | None,
    group_by: str | None,
    team: str | None,
) -> Op[UsageReport]:
    """``GET /v1/usage``."""
    params: list[tuple[str, str]] = []
    for name, t in (("from", start), ("to", end)):
        if t is not None:
            if t.tzinfo is None:
                raise ValueError(f"{name} must be timezone-aware")
            params.append((name, t.isoformat()))
    if group_by:
        params.append(("group_by", group_by))
    if team:
        params.append(("team", team))
    resp = yield from request(cfg, Call("GET", "/usage", params=tuple(params), retry=True))
    return UsageReport.from_json(resp.json())


def balance(cfg: Config, team: str | None) -> Op[BalanceInfo]:
    """``GET /v1/balance``."""
    params = (("team", team),) if team else ()
    resp = yield from request(cfg, Call("GET", "/balance", params=params, retry=True))
    return BalanceInfo.from_json(resp.json())


def _secret_path(name: str) -> str:
    if not name:
        raise ValueError("empty secret name")
    return "/secrets/" + quote(name, safe="")


def put_secret(cfg: Config, name: str, value: str) -> Op[SecretInfo]:
    """``PUT /v1/secrets/{name}``."""
    resp = yield from request(cfg, Call("PUT", _secret_path(name), json={"value": value}, retry=True))
    return SecretInfo.from_json(resp.json())


def list_secrets(cfg: Config) -> Op[list[SecretInfo]]:
    """``GET /v1/secrets``."""
    resp = yield from request(cfg, Call("GET", "/secrets", retry=True))
    return [SecretInfo.from_json(d) for d in resp.json()["secrets"]]


def delete_secret(cfg: Config, name: str) -> Op[None]:
    """``DELETE /v1/secrets/{name}``."""
    yield from request(cfg, Call("DELETE", _secret_path(name), retry=True))


def list_snapshots(cfg: Config) -> Op[list[SnapshotInfo]]:
    """``GET /v1/snapshots``."""
    resp = yield from request(cfg, Call("GET", "/snapshots", retry=True))
    return [SnapshotInfo.from_json(d) for d in resp.json()["snapshots"]]


def get_snapshot(cfg: Config, snapshot_id: str) -> Op[SnapshotInfo]:
    """``GET /v1/snapshots/{id}``."""
    resp = yield from request(cfg, Call("GET", "/snapshots/" + quote(snapshot_id, safe=""), retry=True))
    return SnapshotInfo.from_json(resp.json())


def delete_snapshot(cfg: Config, snapshot_id: str) -> Op[None]:
    """``DELETE /v1/snapshots/{id}``."""
    yield from request(cfg, Call("DELETE", "/snapshots/" + quote(snapshot_id, safe=""), retry=True))


def set_timeout(cfg: Config, sandbox_id: str, seconds: int) -> Op[SandboxInfo]:
    """``POST /v1/sandboxes/{id}/timeout``."""
    if seconds < 1:
        raise ValueError("timeout must be >= 1 second")
    call = Call("POST", sandbox_path(sandbox_id, "/timeout"), json={"timeout": int(seconds)}, retry=True)
    resp = yield from request(cfg, call)
    return SandboxInfo.from_json(resp.json())


# --- operations: commands ----------------------------------------------------


def run_command(cfg: Config, sandbox_id: str, body: Mapping[str, Any]) -> Op[CommandResult]:
    """``POST …/exec``, buffered. Never retried (not idempotent)."""
    call = Call(
        "POST", sandbox_path(sandbox_id, "/exec"), json=body, read_timeout=_command_read_timeout(body.get("timeout"))
    )
    resp = yield from request(cfg, call)
    return CommandResult.from_json(resp.json())


def stream_command(cfg: Config, sandbox_id: str, body: Mapping[str, Any]) -> Op[httpx.Response]:
    """``POST …/exec`` with ``Accept: application/x-ndjson``: the open stream of events."""
    call = Call("POST", sandbox_path(sandbox_id, "/exec"), json=body, accept=NDJSON, stream=True, read_timeout=None)
    return (yield from request(cfg, call))


def start_process(cfg: Config, sandbox_id: str, body: Mapping[str, Any]) -> Op[ProcessInfo]:
    """``POST …/processes``. Never retried."""
    resp = yield from request(cfg, Call("POST", sandbox_path(sandbox_id, "/processes"), json=body))
    return ProcessInfo.from_json(resp.json())


def list_processes(cfg: Config, sandbox_id: str) -> Op[list[ProcessInfo]]:
    """``GET …/processes``."""
    resp = yield from request(cfg, Call("GET", sandbox_path(sandbox_id, "/processes"), retry=True))
    return [ProcessInfo.from_json(d) for d in resp.json()["processes"]]


def get_process(cfg: Config, sandbox_id: str, process_id: str) -> Op[ProcessInfo]:
    """``GET …/processes/{pid}``."""
    resp = yield from request(cfg, Call("GET", process_path(sandbox_id, process_id), retry=True))
    return ProcessInfo.from_json(resp.json())


def wait_process(
    cfg: Config, sandbox_id: str, process_id: str, *, timeout: float | None, poll_interval: float
) -> Op[CommandResult]:
    """Wait for a background command with ``POST …/wait?timeout=…`` long polls.

    Each poll is held by the server up to ``poll_interval`` seconds and
    answers as soon as the command ends. Raises
    :class:`~evalbox.errors.CommandTimeoutError` when ``timeout`` passes first.
    """
    if poll_interval <= 0:
        raise ValueError("poll_interval must be > 0")
    deadline = None if timeout is None else time.monotonic() + timeout
    path = process_path(sandbox_id, process_id, "/wait")
    while True:
        window = min(poll_interval, MAX_WAIT_WINDOW)
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CommandTimeoutError(f"command {process_id} is still running after {timeout:g}s", code="timeout")
            window = min(window, left)
        call = Call(
            "POST",
            path,
            params=(("timeout", f"{max(window, 0.001):.3f}"),),
            retry=True,
            read_timeout=window + TIMEOUT_MARGIN,
        )
        try:
            resp = yield from request(cfg, call)
        except CommandTimeoutError:
            continue  # 408: still running after this poll
        return CommandResult.from_json(resp.json())


def stream_process(cfg: Config, sandbox_id: str, process_id: str) -> Op[httpx.Response]:
    """``GET …/processes/{pid}/stream``: the open stream of events (output so far, then live)."""
    call = Call(
        "GET",
        process_path(sandbox_id, process_id, "/stream"),
        accept=NDJSON,
        stream=True,
        retry=True,
        read_timeout=None,
    )
    return (yield from request(cfg, call))


def signal_process(cfg: Config, sandbox_id: str, process_id: str, signal: str | int) -> Op[None]:
    """``POST …/processes/{pid}/signal``. Never retried."""
    call = Call("POST", process_path(sandbox_id, process_id, "/signal"), json={"signal": signal_name(signal)})
    yield from request(cfg, call)


def write_stdin(cfg: Config, sandbox_id: str, process_id: str, data: str | bytes, close: bool) -> Op[None]:
    """``POST …/processes/{pid}/stdin``: ``data`` to the command's stdin (then closed if ``close``). Never retried."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    params = (("close", "true"),) if close else ()
    path = process_path(sandbox_id, process_id, "/stdin")
    call = Call("POST", path, params=params, upload=Upload(raw, len(raw), None))
    yield from request(cfg, call)


def kill_process(cfg: Config, sandbox_id: str, process_id: str) -> Op[None]:
    """``DELETE …/processes/{pid}``: SIGKILL the command and its whole tree."""
    yield from request(cfg, Call("DELETE", process_path(sandbox_id, process_id), retry=True))


# --- operations: the code interpreter ----------------------------------------

#: The port of the code interpreter's server in a ``code-interpreter`` sandbox.
INTERPRETER_PORT = 49999


def _interpreter_path(sandbox_id: str, suffix: str) -> str:
    return sandbox_path(sandbox_id, f"/ports/{INTERPRETER_PORT}{suffix}")


def code_body(code: str, *, context: str | None, language: str | None, env: Mapping[str, str] | None) -> dict[str, Any]:
    """The body of ``POST /execute``."""
    if context is not None and language is not None:
        raise ValueError("give context or language, not both")
    body: dict[str, Any] = {"code": code}
    if context is not None:
        body["context_id"] = context
    if language is not None:
        body["language"] = language
    if env:
        body["env_vars"] = dict(env)
    return body


def run_code(cfg: Config, sandbox_id: str, body: Mapping[str, Any], timeout: float | None) -> Op[httpx.Response]:
    """``POST …/ports/49999/execute``: the open NDJSON stream of a code execution. Never retried."""
    call = Call(
        "POST",
        _interpreter_path(sandbox_id, "/execute"),
        json=dict(body),
        accept=NDJSON,
        stream=True,
        # The server sends a keepalive line every 5 s while the cell runs.
        read_timeout=None if timeout is None else timeout + 10,
    )
    return (yield from request(cfg, call))


def create_code_context(cfg: Config, sandbox_id: str, *, cwd: str | None, language: str | None) -> Op[CodeContext]:
    """``POST …/ports/49999/contexts``: a new kernel."""
    body: dict[str, Any] = {}
    if cwd is not None:
        body["cwd"] = cwd
    if language is not None:
        body["language"] = language
    resp = yield from request(cfg, Call("POST", _interpreter_path(sandbox_id, "/contexts"), json=body))
    return CodeContext.from_json(resp.json())


def list_code_contexts(cfg: Config, sandbox_id: str) -> Op[list[CodeContext]]:
    """``GET …/ports/49999/contexts``."""
    resp = yield from request(cfg, Call("GET", _interpreter_path(sandbox_id, "/contexts"), retry=True))
    return [CodeContext.from_json(d) for d in resp.json()]


def code_context_call(cfg: Config, sandbox_id: str, context: str, action: str) -> Op[None]:
    """``DELETE …/contexts/{id}`` (action ``remove``) or ``POST …/contexts/{id}/restart``."""
    path = _interpreter_path(sandbox_id, "/contexts/" + quote(context, safe=""))
    call = Call("DELETE", path) if action == "remove" else Call("POST", path + "/restart", json={})
    yield from request(cfg, call)


class CodeStream:
    """Turns the bytes of an ``/execute`` NDJSON stream into its items, and builds the :class:`Execution`.

    ``feed`` returns ``("stdout" | "stderr", str)``, ``("result", CodeResult)`` and
    ``("error", ExecutionError)`` items, for the callbacks; a stream cut before its
    ``end_of_execution`` line raises :class:`~evalbox.errors.APIConnectionError` at ``end``.
    """

    __slots__ = ("_buf", "_done", "execution")

    def __init__(self) -> None:
        self._buf = b""
        self._done = False
        self.execution = Execution()

    def feed(self, chunk: bytes) -> list[tuple[str, Any]]:
        lines = (self._buf + chunk).split(b"\n")
        self._buf = lines.pop()
        items: list[tuple[str, Any]] = []
        for line in lines:
            item = self._line(line)
            if item is not None:
                items.append(item)
        return items

    def end(self) -> Execution:
        if self._buf.strip():
            self._line(self._buf)
        if not self._done:
            raise APIConnectionError("the code execution's stream ended before its end")
        return self.execution

    def _line(self, line: bytes) -> tuple[str, Any] | None:
        if not line.strip() or self._done:
            return None
        d = json.loads(line)
        t = d.get("type")
        ex = self.execution
        if t in ("stdout", "stderr"):
            text = str(d.get("text", ""))
            (ex.stdout if t == "stdout" else ex.stderr).append(text)
            return (t, text)
        if t == "result":
            r = CodeResult.from_json(d)
            ex.results.append(r)
            return ("result", r)
        if t == "error":
            err = ExecutionError(str(d.get("name", "")), str(d.get("value", "")), str(d.get("traceback", "")))
            ex.error = err
            return ("error", err)
        if t == "number_of_executions":
            ex.execution_count = int(d["execution_count"])
        elif t == "end_of_execution":
            self._done = True
        return None


# --- operations: files -------------------------------------------------------


def _path_param(path: str) -> tuple[tuple[str, str], ...]:
    if not path:
        raise ValueError("empty path")
    return (("path", path),)


def write_file(cfg: Config, sandbox_id: str, path: str, upload: Upload, mode: int | None) -> Op[FileInfo]:
    """``PUT …/files?path=&mode=`` with the raw body, streamed. Retried only when the body can be resent."""
    call = Call(
        "PUT",
        sandbox_path(sandbox_id, "/files"),
        params=_path_param(path) + file_mode(mode),
        upload=upload,
        retry=True,
    )
    resp = yield from request(cfg, call)
    return FileInfo.from_json(resp.json())


def read_file(cfg: Config, sandbox_id: str, path: str, *, stream: bool) -> Op[httpx.Response]:
    """``GET …/files?path=``: the response (open when ``stream``)."""
    call = Call(
        "GET",
        sandbox_path(sandbox_id, "/files"),
        params=_path_param(path),
        accept=OCTET_STREAM,
        stream=stream,
        retry=True,
    )
    return (yield from request(cfg, call))


def stat_file(cfg: Config, sandbox_id: str, path: str) -> Op[FileInfo]:
    """``GET …/files/stat?path=``."""
    resp = yield from request(
        cfg, Call("GET", sandbox_path(sandbox_id, "/files/stat"), params=_path_param(path), retry=True)
    )
    return FileInfo.from_json(resp.json())


def list_files(cfg: Config, sandbox_id: str, path: str) -> Op[list[FileInfo]]:
    """``GET …/files/list?path=``."""
    resp = yield from request(
        cfg, Call("GET", sandbox_path(sandbox_id, "/files/list"), params=_path_param(path), retry=True)
    )
    return [FileInfo.from_json(d) for d in resp.json()["files"]]


def mkdir(cfg: Config, sandbox_id: str, path: str, *, parents: bool, mode: int | None) -> Op[FileInfo]:
    """``POST …/files/mkdir``."""
    body: dict[str, Any] = {"path": path}
    if parents:
        body["parents"] = True
    if mode is not None:
        body["mode"] = file_mode(mode)[0][1]
    resp = yield from request(cfg, Call("POST", sandbox_path(sandbox_id, "/files/mkdir"), json=body, retry=True))
    return FileInfo.from_json(resp.json())


def rename_file(cfg: Config, sandbox_id: str, path: str, target: str) -> Op[FileInfo]:
    """``POST …/files/rename``. Never retried (a second move would find nothing to move)."""
    if not path or not target:
        raise ValueError("empty path")
    call = Call("POST", sandbox_path(sandbox_id, "/files/rename"), json={"path": path, "target": target})
    resp = yield from request(cfg, call)
    return FileInfo.from_json(resp.json())


def remove_file(cfg: Config, sandbox_id: str, path: str, *, recursive: bool) -> Op[None]:
    """``DELETE …/files?path=&recursive=``."""
    params = _path_param(path)
    if recursive:
        params += (("recursive", "true"),)
    yield from request(cfg, Call("DELETE", sandbox_path(sandbox_id, "/files"), params=params, retry=True))


# --- operations: templates ---------------------------------------------------


def list_templates(cfg: Config) -> Op[list[TemplateInfo]]:
    """``GET /v1/templates``: the built-ins and the team's own templates."""
    resp = yield from request(cfg, Call("GET", "/templates", retry=True))
    return [TemplateInfo.from_json(d) for d in resp.json()["templates"]]


def get_template(cfg: Config, name: str) -> Op[TemplateInfo]:
    """``GET /v1/templates/{name}``."""
    resp = yield from request(cfg, Call("GET", f"/templates/{_seg(name, 'template name')}", retry=True))
    return TemplateInfo.from_json(resp.json())


#: Directories a build context upload leaves out.
_CONTEXT_SKIP = frozenset(
    {".git", "__pycache__", ".venv", "node_modules", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
)


def context_tar(context_dir: PathLike) -> bytes:
    """The build context, a directory, as an uncompressed tar (its VCS, virtualenv and cache
    directories left out; symlinks kept as links)."""
    root = os.fspath(context_dir)
    if not os.path.isdir(root):
        raise ValueError(f"build context {root!r} is not a directory")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in _CONTEXT_SKIP)
            for name in [*dirnames, *sorted(filenames)]:
                full = os.path.join(dirpath, name)
                tf.add(full, arcname=os.path.relpath(full, root), recursive=False)
    return buf.getvalue()


def build_template_body(
    name: str,
    *,
    spec: Mapping[str, Any] | None,
    dockerfile: str | None,
    build_args: Mapping[str, str] | None,
    tags: Sequence[str] | None,
    context: bytes | None,
) -> tuple[bytes, str]:
    """The body of ``POST /v1/templates`` and its content type: the JSON request, or with a
    context a multipart body of the request and the context tar."""
    if (spec is None) == (dockerfile is None):
        raise ValueError("give spec or dockerfile (one of them)")
    req: dict[str, Any] = {"name": name}
    if spec is not None:
        req["spec"] = dict(spec)
    if dockerfile is not None:
        req["dockerfile"] = dockerfile
        if build_args:
            req["build_args"] = dict(build_args)
    elif build_args:
        raise ValueError("build_args are for a dockerfile")
    if tags:
        req["tags"] = list(tags)
    payload = json.dumps(req).encode()
    if context is None:
        return payload, JSON
    boundary = "evalbox-" + secrets.token_hex(16)
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="request"\r\nContent-Type: {JSON}\r\n\r\n'.encode(),
        payload,
        f'\r\n--{boundary}\r\nContent-Disposition: form-data; name="context"; filename="context.tar"\r\n'
        f"Content-Type: application/x-tar\r\n\r\n".encode(),
        context,
        f"\r\n--{boundary}--\r\n".encode(),
    ]
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


def build_template(cfg: Config, body: bytes, content_type: str) -> Op[TemplateBuild]:
    """``POST /v1/templates``: the queued build. Not retried (a build is not idempotent)."""
    call = Call("POST", "/templates", upload=Upload(body, len(body), None), content_type=content_type)
    resp = yield from request(cfg, call)
    return TemplateBuild.from_json(resp.json())


def wait_build(cfg: Config, build: TemplateBuild, timeout: float | None) -> Op[TemplateBuild]:
    """Poll ``GET /v1/templates/{name}/builds/{id}`` until the build ends (a failed one raises
    :class:`~evalbox.errors.TemplateBuildError`)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    path = f"/templates/{_seg(build.template, 'template name')}/builds/{_seg(build.id, 'build id')}"
    pause = 0.2
    while not build.done:
        if deadline is not None and time.monotonic() >= deadline:
            raise EvalboxError(f"build {build.id} of {build.template} did not end within {timeout} s", code="timeout")
        yield Sleep(pause)
        pause = min(pause * 1.5, 2.0)
        resp = yield from request(cfg, Call("GET", path, retry=True))
        build = TemplateBuild.from_json(resp.json())
    if build.state == "failed":
        raise TemplateBuildError(build)
    return build


# --- operations: execute -----------------------------------------------------

#: Most scripts, and largest JSON body, that one ``POST /v1/execute`` takes (the server's caps).
MAX_EXECUTE_SCRIPTS = 4096
MAX_EXECUTE_BODY = 4 << 20
#: The languages of ``POST /v1/execute`` and eval runs, by name or alias (``ExecuteRequest.language``
#: in ``api/openapi.yaml``; docs/languages.md): compiled ones compile first, in the same sandbox.
LANGUAGES = (
    "python", "python3", "py", "c", "cpp", "c++", "cxx", "cc", "java", "nodejs", "javascript", "js", "node",
    "typescript", "ts", "go", "golang", "rust", "rs", "bash", "sh", "shell",
)  # fmt: skip


def execute_body(*, language: str, timeout: float | None, template: str | None, runtime: str | None) -> dict[str, Any]:
    """The ``ExecuteRequest`` JSON without its scripts."""
    if language not in LANGUAGES:
        raise ValueError(f"language must be one of {', '.join(LANGUAGES)}; not {language!r}")
    body: dict[str, Any] = {"language": language}
    if timeout is not None:
        if timeout <= 0:
            raise ValueError("timeout must be > 0")
        body["timeout"] = timeout
    if template:
        body["template"] = template
    if runtime:
        body["runtime"] = runtime
    return body


def _json_size(v: Any) -> int:
    """Bytes of ``v`` in JSON as httpx encodes a body (compact, UTF-8)."""
    return len(json.dumps(v, ensure_ascii=False, separators=(",", ":")).encode())


def execute_chunks(
    scripts: Sequence[str],
    base: Mapping[str, Any],
    *,
    max_scripts: int = MAX_EXECUTE_SCRIPTS,
    max_body: int = MAX_EXECUTE_BODY,
) -> list[Sequence[str]]:
    """Split scripts, in order, into the fewest consecutive requests within the server's caps.

    A script too large for a request on its own gets one to itself (the
    server answers 413 ``payload_too_large``).
    """
    overhead = _json_size({**base, "scripts": []})
    chunks: list[Sequence[str]] = []
    start, size = 0, overhead
    for i, s in enumerate(scripts):
        if not isinstance(s, str):
            raise TypeError(f"script {i} is a {type(s).__name__}, not a str")
        n = _json_size(s) + (1 if i > start else 0)  # the comma
        if i > start and (i - start >= max_scripts or size + n > max_body):
            chunks.append(scripts[start:i])
            start, size, n = i, overhead, n - 1
        size += n
    if start < len(scripts):
        chunks.append(scripts[start:])
    return chunks


def execute(
    cfg: Config,
    scripts: Iterable[str],
    base: Mapping[str, Any],
    *,
    max_scripts: int = MAX_EXECUTE_SCRIPTS,
    max_body: int = MAX_EXECUTE_BODY,
) -> Op[list[CommandResult]]:
    """``POST /v1/execute``: each script in its own fresh sandbox; one result per script, in order.

    A batch beyond the server's caps (scripts or bytes per request) is sent
    as consecutive requests. Never retried (not idempotent). The answer
    comes once every script of a request ended, so the call has no read
    timeout.
    """
    if isinstance(scripts, (str, bytes)):
        raise TypeError("scripts is a list of scripts, not one script")
    results: list[CommandResult] = []
    for chunk in execute_chunks(list(scripts), base, max_scripts=max_scripts, max_body=max_body):
        call = Call("POST", "/execute", json={**base, "scripts": list(chunk)}, read_timeout=None)
        resp = yield from request(cfg, call)
        got = resp.json()["results"]
        if len(got) != len(chunk):
            raise EvalboxError(f"{len(chunk)} scripts sent, {len(got)} results answered", code="internal")
        results.extend(CommandResult.from_json(r) for r in got)
    return results


# --- operations: eval runs ---------------------------------------------------

#: Fields of a problem and of a sample that are sent; others (e.g. the ``result`` of a scored
#: sample file) are dropped, as the CLI does. A problem is checked by its ``test`` (assert mode),
#: its ``io`` cases (I/O mode: ``entry_point(*input)`` in Python) or its ``tests`` (stdin/stdout:
#: ``[{input, output}]``, judged by its ``checker``); ``language`` is a name or alias of
#: docs/languages.md.
PROBLEM_FIELDS = (
    "task_id",
    "prompt",
    "entry_point",
    "canonical_solution",
    "test",
    "io",
    "tests",
    "checker",
    "language",
)
SAMPLE_FIELDS = ("task_id", "completion", "solution", "language")

#: Problems or samples: a path to a ``.jsonl`` / ``.jsonl.gz`` file, or the records.
EvalInput = str | os.PathLike[str] | Iterable[Mapping[str, Any]]


def read_jsonl(path: PathLike) -> Iterator[dict[str, Any]]:
    """The records of a JSON Lines file, gzip-compressed or not (by its magic bytes); blank lines skipped."""
    with open(path, "rb") as raw:
        gz = raw.peek(2)[:2] == b"\x1f\x8b"
        f: io.BufferedIOBase = gzip.GzipFile(fileobj=raw) if gz else raw
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{os.fspath(path)}:{n}: {e}") from e
            if not isinstance(rec, dict):
                raise ValueError(f"{os.fspath(path)}:{n}: not a JSON object")
            yield rec


def eval_records(src: EvalInput, fields: tuple[str, ...], what: str) -> list[dict[str, Any]]:
    """Problems or samples as the API takes them: only ``fields``, and no null values."""
    if isinstance(src, (str, os.PathLike)):
        items: Iterable[Mapping[str, Any]] = read_jsonl(src)
    elif isinstance(src, Mapping):
        raise TypeError(f"{what}: give a list of records (or a path), not one record")
    else:
        items = src
    out: list[dict[str, Any]] = []
    for i, d in enumerate(items):
        if not isinstance(d, Mapping):
            raise TypeError(f"{what}[{i}] is a {type(d).__name__}, not a mapping")
        out.append({k: d[k] for k in fields if d.get(k) is not None})
    if not out:
        raise ValueError(f"no {what}")
    return out


def eval_body(
    problems: EvalInput,
    samples: EvalInput,
    *,
    k: int | Sequence[int] | None,
    timeout: float | None,
    template: str | None,
    runtime: str | None,
    concurrency: int | None,
    seed: int | None,
    mode: str | None,
    slice: int | None,  # noqa: A002 (the API's name)
    language: str | None,
    compile_timeout: float | None,
    compile_memory_mb: int | None,
    compile_flags: Sequence[str] | None,
    memory_mb: int | None,
    output_limit_bytes: int | None,
    stop_on_first_failure: bool,
) -> dict[str, Any]:
    """The ``CreateEvalRequest`` JSON (reads the files it is given).

    Unset settings (None, and ``stop_on_first_failure`` False) are left out,
    so a server older than a setting takes a request that does not use it.
    """
    if isinstance(compile_flags, str):
        raise TypeError("compile_flags: give a list of flags, not one string")
    body: dict[str, Any] = {
        "problems": eval_records(problems, PROBLEM_FIELDS, "problems"),
        "samples": eval_records(samples, SAMPLE_FIELDS, "samples"),
    }
    if k is not None:
        body["k"] = [int(k)] if isinstance(k, int) else [int(x) for x in k]
    if timeout is not None:
        body["timeout"] = timeout
    if template:
        body["template"] = template
    if runtime:
        body["runtime"] = runtime
    if concurrency is not None:
        body["concurrency"] = int(concurrency)
    if seed is not None:
        body["seed"] = int(seed)
    if mode is not None:
        body["mode"] = mode
    if slice is not None:
        body["slice"] = int(slice)
    if language:
        body["language"] = language
    if compile_timeout is not None:
        body["compile_timeout"] = compile_timeout
    if compile_memory_mb is not None:
        body["compile_memory_mb"] = int(compile_memory_mb)
    if compile_flags is not None:
        body["compile_flags"] = [str(f) for f in compile_flags]
    if memory_mb is not None:
        body["memory_mb"] = int(memory_mb)
    if output_limit_bytes is not None:
        body["output_limit_bytes"] = int(output_limit_bytes)
    if stop_on_first_failure:
        body["stop_on_first_failure"] = True
    return body


#: An eval run, or its id.
RunRef = str | EvalRun


def eval_run_id(run: RunRef) -> str:
    """The id of an eval run given as a run or an id."""
    return run.id if isinstance(run, EvalRun) else run


def eval_path(run_id: str, suffix: str = "") -> str:
    """``/evals/{id}{suffix}``."""
    return f"/evals/{_seg(run_id, 'eval run id')}{suffix}"


def create_eval(cfg: Config, body: Mapping[str, Any]) -> Op[EvalRun]:
    """``POST /v1/evals``. Never retried (a resend would start a second run)."""
    resp = yield from request(cfg, Call("POST", "/evals", json=body))
    return EvalRun.from_json(resp.json())


def get_eval(cfg: Config, run_id: str) -> Op[EvalRun]:
    """``GET /v1/evals/{id}``."""
    resp = yield from request(cfg, Call("GET", eval_path(run_id), retry=True))
    return EvalRun.from_json(resp.json())


def list_evals(cfg: Config) -> Op[list[EvalRun]]:
    """``GET /v1/evals``: the team's runs, newest first."""
    resp = yield from request(cfg, Call("GET", "/evals", retry=True))
    return [EvalRun.from_json(d) for d in resp.json()["runs"]]


def cancel_eval(cfg: Config, run_id: str) -> Op[EvalRun]:
    """``POST /v1/evals/{id}/cancel`` (idempotent: cancelling an ended run changes nothing)."""
    resp = yield from request(cfg, Call("POST", eval_path(run_id, "/cancel"), retry=True))
    return EvalRun.from_json(resp.json())


def delete_eval(cfg: Config, run_id: str) -> Op[None]:
    """``DELETE /v1/evals/{id}``: remove an ended run (input, results, summary); a running one is a conflict."""
    yield from request(cfg, Call("DELETE", eval_path(run_id), retry=True))


def wait_eval(
    cfg: Config,
    run_id: str,
    *,
    timeout: float | None,
    poll_interval: float,
    on_progress: Callable[[EvalRun], object] | None,
    first: EvalRun | None = None,
) -> Op[EvalRun]:
    """Poll ``GET /v1/evals/{id}`` every ``poll_interval`` seconds until the run ended; return it.

    ``on_progress(run)`` is called with the first run seen and then whenever
    its state or counts change (the last call is with the ended run).
    ``first`` is a run already known (no request for it). Raises
    :class:`~evalbox.errors.CommandTimeoutError` when ``timeout`` passes
    first; the run goes on.
    """
    if poll_interval <= 0:
        raise ValueError("poll_interval must be > 0")
    deadline = None if timeout is None else time.monotonic() + timeout
    seen: tuple[Any, ...] | None = None
    run = first
    while True:
        if run is None:
            run = yield from get_eval(cfg, run_id)
        progress = (run.state, run.done, sorted(run.counts.items()))
        if on_progress is not None and progress != seen:
            seen = progress
            yield Notify(on_progress, run)
        if not run.running:
            return run
        delay = poll_interval
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CommandTimeoutError(
                    f"eval run {run_id} is still running after {timeout:g}s ({run.done}/{run.samples} done)",
                    code="timeout",
                )
            delay = min(delay, left)
        yield Sleep(delay)
        run = None


def eval_results(cfg: Config, run_id: str) -> Op[httpx.Response]:
    """``GET /v1/evals/{id}/results``: the open NDJSON stream of ``EvalResult`` lines."""
    call = Call("GET", eval_path(run_id, "/results"), accept=NDJSON, stream=True, retry=True)
    return (yield from request(cfg, call))


class JSONLines:
    """Turns the bytes of an NDJSON stream into its JSON objects."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[Any]:
        """Add bytes of the stream; return the objects of the lines they complete."""
        if b"\n" not in chunk:
            self._buf += chunk
            return []
        lines = (self._buf + chunk).split(b"\n")
        self._buf = lines.pop()
        return [self._parse(line) for line in lines if line.strip()]

    def end(self) -> list[Any]:
        """The stream ended: the object of a last unterminated line, if any."""
        line, self._buf = self._buf, b""
        return [self._parse(line)] if line.strip() else []

    @staticmethod
    def _parse(line: bytes) -> Any:
        try:
            return json.loads(line)
        except ValueError as e:
            raise EvalboxError(f"invalid line in the stream: {e}", code="internal") from e
