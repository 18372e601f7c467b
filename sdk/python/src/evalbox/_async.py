"""The asynchronous client: :class:`AsyncSandbox`, its files and commands.

The same surface as :mod:`evalbox._sync`, whose docstrings document each
method; every method drives the same operation of :mod:`evalbox._core` with
:class:`httpx.AsyncClient`. This module only does the I/O.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import inspect
import logging
import os
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from datetime import datetime
from types import TracebackType
from typing import IO, Any, Literal, TypeVar, overload

import httpx

from . import _core as core
from . import _pool
from .errors import CommandTimeoutError, EvalboxError
from .models import (
    BalanceInfo,
    CodeContext,
    CodeResult,
    CommandResult,
    EvalResult,
    EvalRun,
    Execution,
    FileInfo,
    ProcessInfo,
    SandboxInfo,
    SecretInfo,
    SnapshotInfo,
    TemplateBuild,
    TemplateInfo,
    UsageReport,
)

__all__ = [
    "AsyncClient",
    "AsyncCommandHandle",
    "AsyncCommands",
    "AsyncEvals",
    "AsyncFiles",
    "AsyncSandbox",
    "AsyncSecrets",
    "AsyncSnapshots",
    "AsyncTemplates",
    "async_evals",
    "async_execute",
    "async_templates",
]

T = TypeVar("T")
_log = logging.getLogger("evalbox")

#: What :meth:`AsyncFiles.write` takes: also an async iterable of byte chunks.
AsyncWriteData = core.WriteData | AsyncIterable[bytes]
#: An output callback may be a plain function or a coroutine function.
AsyncOutputCallback = Callable[[str], Awaitable[object] | object]


class AsyncClient:
    """The async twin of :class:`evalbox.Client` (one per event loop).

    Without ``client=`` the SDK uses a default client per (event loop, URL,
    key), closed when its loop shuts down (``asyncio.run`` and
    ``asyncio.Runner`` do that, through ``loop.shutdown_asyncgens()``). Close
    a client you made with :meth:`aclose` or ``async with``.

    Its default HTTP client uses a connection pool whose cost per request does
    not grow with the number of requests in flight (see ``_pool.py``); it
    ignores proxy environment variables. Pass ``http_client`` to use another.
    """

    def __init__(
        self,
        api_url: str | None = None,
        api_key: str | None = None,
        *,
        retries: int = 3,
        max_retry_wait: float = 30.0,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self._cfg = core.Config.resolve(api_url, api_key, retries=retries, max_retry_wait=max_retry_wait)
        self._base = self._cfg.api_url + "/v1"
        self._headers = self._cfg.headers()
        self._own_http = http_client is None
        self._http = (
            http_client
            if http_client is not None
            else httpx.AsyncClient(
                transport=_pool.async_transport(max_idle=core.MAX_IDLE_CONNECTIONS, keepalive_expiry=core.KEEPALIVE),
                timeout=core.http_timeout(),
            )
        )

    @property
    def api_url(self) -> str:
        """The API's base URL (without ``/v1``)."""
        return self._cfg.api_url

    async def aclose(self) -> None:
        """Close the connection pool (unless it was given as ``http_client``)."""
        if self._own_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def health(self) -> dict[str, Any]:
        """``GET /v1/health``: ``{"status", "version", "runtimes"}``."""
        return await self._run(core.health(self._cfg))

    async def usage(
        self,
        *,
        start: datetime | None = None,
        end: datetime | None = None,
        group_by: str | None = None,
        team: str | None = None,
    ) -> UsageReport:
        """The team's metered usage in ``[start, end)`` (default the last 30 days), grouped by
        ``tariff`` (default), ``sandbox``, ``template``, ``day`` or ``eval_run``; ``team`` (another
        team's id or ``"all"``) needs an admin key."""
        return await self._run(core.usage(self._cfg, start=start, end=end, group_by=group_by, team=team))

    async def balance(self, *, team: str | None = None) -> BalanceInfo:
        """The team's prepaid balance (``team``: another team's, with an admin key)."""
        return await self._run(core.balance(self._cfg, team))

    async def execute(
        self,
        scripts: Iterable[str],
        *,
        timeout: float | None = None,
        language: str = "python",
        template: str | None = None,
        runtime: str | None = None,
    ) -> builtins.list[CommandResult]:
        """Run each script in its own fresh sandbox; one result per script, in order. See :func:`evalbox.execute`."""
        base = core.execute_body(language=language, timeout=timeout, template=template, runtime=runtime)
        return await self._run(core.execute(self._cfg, scripts, base))

    @property
    def evals(self) -> AsyncEvals:
        """This client's eval runs (like :data:`evalbox.async_evals`)."""
        return AsyncEvals(self)

    @property
    def snapshots(self) -> AsyncSnapshots:
        """This client's snapshots."""
        return AsyncSnapshots(self)

    @property
    def secrets(self) -> AsyncSecrets:
        """This client's team's stored secrets."""
        return AsyncSecrets(self)

    @property
    def templates(self) -> AsyncTemplates:
        """This client's templates (like :data:`evalbox.async_templates`)."""
        return AsyncTemplates(self)

    # --- the driver ---

    async def _run(self, op: core.Op[T]) -> T:
        """Drive an operation of :mod:`evalbox._core` to its value."""
        value: Any = None
        error: EvalboxError | None = None
        try:
            while True:
                try:
                    step = op.send(value) if error is None else op.throw(error)
                except StopIteration as stop:
                    result: T = stop.value
                    return result
                value = error = None
                if isinstance(step, core.Sleep):
                    await asyncio.sleep(step.seconds)
                    continue
                if isinstance(step, core.Notify):
                    r = step.callback(step.value)
                    if inspect.isawaitable(r):
                        await r
                    continue
                try:
                    value = await self._send(step)
                except httpx.TransportError as e:
                    error = core.connection_error(e)
        finally:
            op.close()

    async def _send(self, call: core.Call) -> httpx.Response:
        content: bytes | AsyncIterator[bytes] | None = None
        if call.upload is not None:
            core.rewind(call.upload)
            src = call.upload.source
            if isinstance(src, bytes):
                content = src
            elif hasattr(src, "read"):
                content = _read_chunks(src)  # type: ignore[arg-type]
            elif isinstance(src, AsyncIterable):
                content = aiter(src)
            else:
                content = _aiter(src)
        req = self._http.build_request(
            call.method,
            self._base + call.path,
            params=call.params,
            json=call.json,
            content=content,
            headers={**self._headers, **call.headers()},
            timeout=call.timeout(),
        )
        resp = await self._http.send(req, stream=True)
        if not (call.stream and resp.is_success):
            try:
                await resp.aread()
            finally:
                await resp.aclose()
        return resp

    async def _events(self, resp: httpx.Response, *, keep_output: bool) -> AsyncGenerator[core.Event, None]:
        """The events of an open NDJSON stream, the result last; reads it to its end and closes it."""
        stream = core.EventStream(keep_output=keep_output)
        try:
            async for chunk in resp.aiter_bytes():
                for ev in stream.feed(chunk):
                    yield ev
            for ev in stream.end():
                yield ev
        except httpx.TransportError as e:
            raise core.connection_error(e) from e
        finally:
            await resp.aclose()


async def _read_chunks(f: IO[bytes]) -> AsyncIterator[bytes]:
    """Read a binary file in chunks, off the event loop (the body of an async upload)."""
    while True:
        chunk = await asyncio.to_thread(f.read, core.CHUNK_SIZE)
        if not chunk:
            return
        if not isinstance(chunk, bytes):
            raise TypeError("open the file in binary mode ('rb') to upload it")
        yield chunk


def _open_wb(path: core.PathLike) -> IO[bytes]:
    return open(path, "wb")


async def _aiter(chunks: Iterable[bytes]) -> AsyncIterator[bytes]:
    for c in chunks:
        yield c


class _LoopClients:
    """The default clients of one event loop, closed when the loop shuts down.

    The loop closes its async generators at shutdown (``shutdown_asyncgens``,
    which ``asyncio.run`` and ``asyncio.Runner`` call before closing the
    loop): :attr:`closer`, started on the loop and kept suspended at its
    ``yield``, closes the clients from its ``finally`` there, inside the loop,
    and forgets them. A loop closed without that shutdown leaves its clients
    to the garbage collector (its entry is dropped when the next loop starts
    one).
    """

    __slots__ = ("clients", "closer", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.clients: dict[tuple[str, str], AsyncClient] = {}
        self.closer = self._close_at_shutdown()
        # Start it up to its yield, synchronously: its first step registers it
        # with the running loop (the loop's firstiter hook), and it awaits nothing.
        with contextlib.suppress(StopIteration):
            self.closer.asend(None).send(None)

    async def _close_at_shutdown(self) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            if _defaults.get(self.loop) is self:
                del _defaults[self.loop]
            clients = list(self.clients.values())
            self.clients.clear()
            for c in clients:
                await c.aclose()


#: By event loop. An entry (whose clients hold the loop) goes when its loop shuts
#: down, or is dropped when its loop was closed without a shutdown.
_defaults: dict[asyncio.AbstractEventLoop, _LoopClients] = {}


def _client(client: AsyncClient | None, api_url: str | None, api_key: str | None) -> AsyncClient:
    """The given client, or the running event loop's default one for (URL, key)."""
    if client is not None:
        if api_url is not None or api_key is not None:
            raise TypeError("pass either client= or api_url=/api_key=, not both")
        return client
    cfg = core.Config.resolve(api_url, api_key)
    loop = asyncio.get_running_loop()
    per_loop = _defaults.get(loop)
    if per_loop is None:
        for old in [lc for lp, lc in _defaults.items() if lp.is_closed()]:
            del _defaults[old.loop]
        per_loop = _defaults[loop] = _LoopClients(loop)
    key = (cfg.api_url, cfg.api_key)
    c = per_loop.clients.get(key)
    if c is None:
        c = per_loop.clients[key] = AsyncClient(cfg.api_url, cfg.api_key)
    return c


async def async_execute(
    scripts: Iterable[str],
    *,
    timeout: float | None = None,
    language: str = "python",
    template: str | None = None,
    runtime: str | None = None,
    api_url: str | None = None,
    api_key: str | None = None,
    client: AsyncClient | None = None,
) -> builtins.list[CommandResult]:
    """Run each script in its own fresh sandbox; one result per script, in order. See :func:`evalbox.execute`."""
    return await _client(client, api_url, api_key).execute(
        scripts, timeout=timeout, language=language, template=template, runtime=runtime
    )


#: ``on_progress`` of an async run: a plain function or a coroutine function.
AsyncProgressCallback = Callable[[EvalRun], Awaitable[object] | object]
RunRef = core.RunRef


class AsyncEvals:
    """Server-side eval runs, async: :data:`evalbox.async_evals` or ``client.evals``. See :class:`evalbox.Evals`."""

    def __init__(self, client: AsyncClient | None = None) -> None:
        self._c = client

    def _client(self) -> AsyncClient:
        return _client(self._c, None, None)

    async def run(
        self,
        problems: core.EvalInput,
        samples: core.EvalInput,
        *,
        k: int | Sequence[int] | None = None,
        timeout: float | None = None,
        template: str | None = None,
        runtime: str | None = None,
        concurrency: int | None = None,
        seed: int | None = None,
        mode: Literal["trial", "batch"] | None = None,
        slice: int | None = None,  # noqa: A002 (the API's name)
        language: str | None = None,
        compile_timeout: float | None = None,
        compile_memory_mb: int | None = None,
        compile_flags: Sequence[str] | None = None,
        memory_mb: int | None = None,
        output_limit_bytes: int | None = None,
        stop_on_first_failure: bool = False,
        on_progress: AsyncProgressCallback | None = None,
        poll_interval: float = 1.0,
    ) -> EvalRun:
        """Start an eval run and wait for it to end. See :meth:`evalbox.Evals.run`.

        ``on_progress`` may be a coroutine function. Cancelling the wait leaves the run going.
        """
        created = await self.create(
            problems,
            samples,
            k=k,
            timeout=timeout,
            template=template,
            runtime=runtime,
            concurrency=concurrency,
            seed=seed,
            mode=mode,
            slice=slice,
            language=language,
            compile_timeout=compile_timeout,
            compile_memory_mb=compile_memory_mb,
            compile_flags=compile_flags,
            memory_mb=memory_mb,
            output_limit_bytes=output_limit_bytes,
            stop_on_first_failure=stop_on_first_failure,
        )
        c = self._client()
        return await c._run(
            core.wait_eval(
                c._cfg, created.id, timeout=None, poll_interval=poll_interval, on_progress=on_progress, first=created
            )
        )

    async def create(
        self,
        problems: core.EvalInput,
        samples: core.EvalInput,
        *,
        k: int | Sequence[int] | None = None,
        timeout: float | None = None,
        template: str | None = None,
        runtime: str | None = None,
        concurrency: int | None = None,
        seed: int | None = None,
        mode: Literal["trial", "batch"] | None = None,
        slice: int | None = None,  # noqa: A002 (the API's name)
        language: str | None = None,
        compile_timeout: float | None = None,
        compile_memory_mb: int | None = None,
        compile_flags: Sequence[str] | None = None,
        memory_mb: int | None = None,
        output_limit_bytes: int | None = None,
        stop_on_first_failure: bool = False,
    ) -> EvalRun:
        """Start an eval run and return it at once. See :meth:`evalbox.Evals.create` (files are read off the loop)."""
        body = await asyncio.to_thread(
            core.eval_body,
            problems,
            samples,
            k=k,
            timeout=timeout,
            template=template,
            runtime=runtime,
            concurrency=concurrency,
            seed=seed,
            mode=mode,
            slice=slice,
            language=language,
            compile_timeout=compile_timeout,
            compile_memory_mb=compile_memory_mb,
            compile_flags=compile_flags,
            memory_mb=memory_mb,
            output_limit_bytes=output_limit_bytes,
            stop_on_first_failure=stop_on_first_failure,
        )
        c = self._client()
        return await c._run(core.create_eval(c._cfg, body))

    async def get(self, run: RunRef) -> EvalRun:
        """A run's progress now (and its summary once it ended)."""
        c = self._client()
        return await c._run(core.get_eval(c._cfg, core.eval_run_id(run)))

    async def list(self) -> builtins.list[EvalRun]:
        """The team's runs, newest first."""
        c = self._client()
        return await c._run(core.list_evals(c._cfg))

    async def cancel(self, run: RunRef) -> EvalRun:
        """Stop a running run; finished results stay."""
        c = self._client()
        return await c._run(core.cancel_eval(c._cfg, core.eval_run_id(run)))

    async def delete(self, run: RunRef) -> None:
        """Delete a run that has ended (input, results, summary); a running one raises ConflictError."""
        c = self._client()
        await c._run(core.delete_eval(c._cfg, core.eval_run_id(run)))

    async def wait(
        self,
        run: RunRef,
        *,
        timeout: float | None = None,
        poll_interval: float = 1.0,
        on_progress: AsyncProgressCallback | None = None,
    ) -> EvalRun:
        """Wait for a run to end and return it. See :meth:`evalbox.Evals.wait`."""
        c = self._client()
        return await c._run(
            core.wait_eval(
                c._cfg, core.eval_run_id(run), timeout=timeout, poll_interval=poll_interval, on_progress=on_progress
            )
        )

    async def results(self, run: RunRef) -> AsyncIterator[EvalResult]:
        """The run's finished verdicts in the samples' order, streamed (``async for``)."""
        c = self._client()
        resp = await c._run(core.eval_results(c._cfg, core.eval_run_id(run)))
        lines = core.JSONLines()
        try:
            async for chunk in resp.aiter_bytes():
                for d in lines.feed(chunk):
                    yield EvalResult.from_json(d)
            for d in lines.end():
                yield EvalResult.from_json(d)
        except httpx.TransportError as e:
            raise core.connection_error(e) from e
        finally:
            await resp.aclose()


class AsyncSnapshots:
    """The team's snapshots (``client.snapshots``); take one with :meth:`AsyncSandbox.snapshot`."""

    def __init__(self, client: AsyncClient | None = None) -> None:
        self._c = client

    async def list(self) -> builtins.list[SnapshotInfo]:
        """The team's snapshots, newest first."""
        c = _client(self._c, None, None)
        return await c._run(core.list_snapshots(c._cfg))

    async def get(self, snapshot_id: str) -> SnapshotInfo:
        """A snapshot by id (:class:`~evalbox.NotFoundError` if the team has none of that id)."""
        c = _client(self._c, None, None)
        return await c._run(core.get_snapshot(c._cfg, snapshot_id))

    async def delete(self, snapshot_id: str) -> None:
        """Delete a snapshot; sandboxes made from it go on."""
        c = _client(self._c, None, None)
        await c._run(core.delete_snapshot(c._cfg, snapshot_id))


class AsyncSecrets:
    """The team's stored secrets (``client.secrets``): sandboxes get them by name, ``secret_refs=[name]``.

    A value is sealed at rest by the server and can never be read back: the
    API returns names only.
    """

    def __init__(self, client: AsyncClient | None = None) -> None:
        self._c = client

    async def set(self, name: str, value: str) -> SecretInfo:
        """Store the secret ``name`` (an environment variable name), or replace its value."""
        c = _client(self._c, None, None)
        return await c._run(core.put_secret(c._cfg, name, value))

    async def list(self) -> builtins.list[SecretInfo]:
        """The team's secrets by name (no values)."""
        c = _client(self._c, None, None)
        return await c._run(core.list_secrets(c._cfg))

    async def delete(self, name: str) -> None:
        """Delete a secret; sandboxes that have it keep it until they end."""
        c = _client(self._c, None, None)
        await c._run(core.delete_secret(c._cfg, name))


class AsyncTemplates:
    """The templates, async: :data:`evalbox.async_templates` or ``client.templates``."""

    def __init__(self, client: AsyncClient | None = None) -> None:
        self._c = client

    async def list(self) -> builtins.list[TemplateInfo]:
        """The built-ins and the team's own templates."""
        c = _client(self._c, None, None)
        return await c._run(core.list_templates(c._cfg))

    async def get(self, name: str) -> TemplateInfo:
        """A template by name."""
        c = _client(self._c, None, None)
        return await c._run(core.get_template(c._cfg, name))

    async def build(
        self,
        name: str,
        *,
        spec: Mapping[str, Any] | None = None,
        dockerfile: str | None = None,
        build_args: Mapping[str, str] | None = None,
        context_dir: core.PathLike | None = None,
        tags: Sequence[str] | None = None,
        wait: bool = True,
        timeout: float | None = 3600,
    ) -> TemplateBuild:
        """Build a template. See :meth:`evalbox.Templates.build`."""
        c = _client(self._c, None, None)
        tag = None
        if ":" in name:
            name, tag = name.split(":", 1)
        body, ctype = core.build_template_body(
            name,
            spec=spec,
            dockerfile=dockerfile,
            build_args=build_args,
            tags=[tag, *(tags or ())] if tag else tags,
            context=core.context_tar(context_dir) if context_dir is not None else None,
        )
        build = await c._run(core.build_template(c._cfg, body, ctype))
        if not wait:
            return build
        return await c._run(core.wait_build(c._cfg, build, timeout))


#: Eval runs with the running loop's default client.
async_evals = AsyncEvals()
#: Templates with the running loop's default client.
async_templates = AsyncTemplates()


class AsyncSandbox:
    """A running sandbox, async: ``sb = await AsyncSandbox.create(...)``.

    ``async with await AsyncSandbox.create(...) as sb:`` deletes it on exit,
    also when the block raises or is cancelled. See :class:`evalbox.Sandbox`.
    """

    id: str
    files: AsyncFiles
    commands: AsyncCommands
    network: AsyncNetwork
    """The sandbox's network rules. See :class:`evalbox.Network`."""
    traffic_token: str
    """Opens the sandbox's port URLs. See :attr:`evalbox.Sandbox.traffic_token`."""

    def __init__(self, info: SandboxInfo, client: AsyncClient) -> None:
        self.id = info.id
        self._client = client
        self._created = info
        self.files = AsyncFiles(self.id, client)
        self.commands = AsyncCommands(self.id, client)
        self.network = AsyncNetwork(self.id, client)
        self.traffic_token = info.traffic_token

    def __repr__(self) -> str:
        return f"AsyncSandbox(id={self.id!r}, template={self._created.template!r}, runtime={self._created.runtime!r})"

    @classmethod
    async def create(
        cls,
        template: str | None = None,
        *,
        runtime: str | None = None,
        timeout: int | None = None,
        cpu: float | None = None,
        memory_mb: int | None = None,
        disk_mb: int | None = None,
        env: Mapping[str, str] | None = None,
        secrets: Mapping[str, str] | None = None,
        secret_refs: Sequence[str] | None = None,
        metadata: Mapping[str, str] | None = None,
        network: str | None = None,
        allow: Sequence[str] | None = None,
        deny: Sequence[str] | None = None,
        public_ports: Iterable[int] | None = None,
        wait: float | None = None,
        snapshot: str | None = None,
        long_running: bool = False,
        tariff: str | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
        client: AsyncClient | None = None,
    ) -> AsyncSandbox:
        """Create a sandbox and return once it runs. See :meth:`evalbox.Sandbox.create`."""
        c = _client(client, api_url, api_key)
        info = await c._run(
            core.create_sandbox(
                c._cfg,
                template=template or ("" if snapshot else "base"),
                runtime=runtime,
                timeout=timeout,
                cpu=cpu,
                memory_mb=memory_mb,
                disk_mb=disk_mb,
                env=env,
                metadata=metadata,
                network=network,
                wait=wait,
                allow=allow,
                deny=deny,
                public_ports=public_ports,
                snapshot=snapshot,
                secrets=secrets,
                secret_refs=secret_refs,
                long_running=long_running,
                tariff=tariff,
            )
        )
        return cls(info, c)

    @classmethod
    async def connect(
        cls,
        sandbox_id: str,
        *,
        api_url: str | None = None,
        api_key: str | None = None,
        client: AsyncClient | None = None,
    ) -> AsyncSandbox:
        """Attach to a running sandbox by id. See :meth:`evalbox.Sandbox.connect`."""
        c = _client(client, api_url, api_key)
        return cls(await c._run(core.connect_sandbox(c._cfg, sandbox_id)), c)

    @staticmethod
    async def list(
        *,
        metadata: Mapping[str, str] | None = None,
        state: Literal["running", "all"] = "running",
        api_url: str | None = None,
        api_key: str | None = None,
        client: AsyncClient | None = None,
    ) -> builtins.list[SandboxInfo]:
        """The team's sandboxes. See :meth:`evalbox.Sandbox.list`."""
        c = _client(client, api_url, api_key)
        return await c._run(core.list_sandboxes(c._cfg, metadata=metadata, state=state))

    @staticmethod
    async def kill_by_id(
        sandbox_id: str,
        *,
        api_url: str | None = None,
        api_key: str | None = None,
        client: AsyncClient | None = None,
    ) -> None:
        """Delete a sandbox by id. See :meth:`evalbox.Sandbox.kill_by_id`."""
        c = _client(client, api_url, api_key)
        await c._run(core.delete_sandbox(c._cfg, sandbox_id))

    @staticmethod
    async def kill_all(
        metadata: Mapping[str, str],
        *,
        api_url: str | None = None,
        api_key: str | None = None,
        client: AsyncClient | None = None,
    ) -> builtins.list[str]:
        """Delete every running sandbox whose metadata matches. See :meth:`evalbox.Sandbox.kill_all`."""
        c = _client(client, api_url, api_key)
        return await c._run(core.delete_sandboxes(c._cfg, metadata))

    async def kill(self) -> None:
        """Delete the sandbox. Idempotent."""
        await self._client._run(core.delete_sandbox(self._client._cfg, self.id))

    async def info(self) -> SandboxInfo:
        """The sandbox as the server sees it now."""
        return await self._client._run(core.get_sandbox(self._client._cfg, self.id))

    async def run_code(
        self,
        code: str,
        *,
        context: CodeContext | str | None = None,
        language: str | None = None,
        env: Mapping[str, str] | None = None,
        on_stdout: Callable[[str], object] | None = None,
        on_stderr: Callable[[str], object] | None = None,
        on_result: Callable[[CodeResult], object] | None = None,
        timeout: float | None = None,
    ) -> Execution:
        """Run Python code in the sandbox's code interpreter. See :meth:`evalbox.Sandbox.run_code`.

        Callbacks may be coroutine functions.
        """
        ctx = context.id if isinstance(context, CodeContext) else context
        body = core.code_body(code, context=ctx, language=language, env=env)
        resp = await self._client._run(core.run_code(self._client._cfg, self.id, body, timeout))
        stream = core.CodeStream()
        callbacks: dict[str, Callable[[Any], object] | None] = {
            "stdout": on_stdout,
            "stderr": on_stderr,
            "result": on_result,
            "error": None,
        }
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        try:
            async for chunk in resp.aiter_bytes():
                for kind, value in stream.feed(chunk):
                    cb = callbacks[kind]
                    if cb is not None:
                        r = cb(value)
                        if inspect.isawaitable(r):
                            await r
                if deadline is not None and loop.time() > deadline:
                    raise CommandTimeoutError(f"the code ran past its timeout of {timeout:g}s", code="timeout")
            return stream.end()
        except httpx.TransportError as e:
            raise core.connection_error(e) from e
        finally:
            await resp.aclose()  # a cut stream interrupts the cell

    async def create_code_context(self, *, cwd: str | None = None, language: str | None = None) -> CodeContext:
        """A new kernel of the code interpreter. See :meth:`evalbox.Sandbox.create_code_context`."""
        cfg = self._client._cfg
        return await self._client._run(core.create_code_context(cfg, self.id, cwd=cwd, language=language))

    async def list_code_contexts(self) -> builtins.list[CodeContext]:
        """The code interpreter's kernels."""
        return await self._client._run(core.list_code_contexts(self._client._cfg, self.id))

    async def restart_code_context(self, context: CodeContext | str) -> None:
        """Restart a kernel: its state is gone."""
        cid = context.id if isinstance(context, CodeContext) else context
        await self._client._run(core.code_context_call(self._client._cfg, self.id, cid, "restart"))

    async def remove_code_context(self, context: CodeContext | str) -> None:
        """Stop and remove a kernel (not the sandbox's first one)."""
        cid = context.id if isinstance(context, CodeContext) else context
        await self._client._run(core.code_context_call(self._client._cfg, self.id, cid, "remove"))

    def get_url(self, port: int, *, host_form: bool | None = None) -> str:
        """The URL of ``port`` in the sandbox (ends with ``/``). See :meth:`evalbox.Sandbox.get_url`."""
        domain = self._created.domain if host_form is not False else ""
        if host_form and not domain:
            raise ValueError("the server has no sandbox domain (serve --sandbox-domain): no host-form URL")
        return core.port_url(self._client._cfg, self.id, port, domain)

    async def set_public_ports(self, ports: Iterable[int]) -> SandboxInfo:
        """Make these ports' URLs open to anyone, and the others private."""
        return await self._client._run(core.set_public_ports(self._client._cfg, self.id, list(ports)))

    async def rotate_traffic_token(self) -> str:
        """Give the sandbox a new traffic token and return it."""
        self.traffic_token = await self._client._run(core.rotate_traffic_token(self._client._cfg, self.id))
        return self.traffic_token

    async def snapshot(self) -> SnapshotInfo:
        """Snapshot the sandbox (on gVisor its files, memory and running processes; on namespaces its files)
        and return the snapshot.

        The sandbox goes on; commands and calls in flight in it fail with
        :class:`~evalbox.ConflictError` (run them again). Make sandboxes from it
        with ``AsyncSandbox.create(snapshot=...)``; delete it with
        ``client.snapshots.delete(...)``. Other runtimes raise
        :class:`~evalbox.BadRequestError`.
        """
        return await self._client._run(core.snapshot_sandbox(self._client._cfg, self.id))

    async def fork(
        self,
        n: int,
        *,
        timeout: int | None = None,
        metadata: Mapping[str, str] | None = None,
        keep_snapshot: bool = False,
        wait: float | None = None,
    ) -> builtins.list[AsyncSandbox]:
        """Make ``n`` copies of the sandbox (1 to 100): each has its files and (on gVisor) its running
        processes, and is independent of it and of the others. All or none: when one fails, the others are deleted.

        Args:
            n: How many.
            timeout: Their TTL in seconds; default the server's.
            metadata: Labels of each.
            keep_snapshot: Keep the snapshot the fork takes (by default it is deleted once they run).
            wait: Seconds each may wait for a team slot or host capacity.
        """
        infos, _ = await self._client._run(
            core.fork_sandbox(
                self._client._cfg,
                self.id,
                n,
                timeout=timeout,
                metadata=metadata,
                keep_snapshot=keep_snapshot,
                wait=wait,
            )
        )
        return [type(self)(info, self._client) for info in infos]

    async def pause(self) -> SandboxInfo:
        """Pause the sandbox: its memory and processes go to disk, and it takes no CPU or memory until
        :meth:`resume`. It keeps its TTL. Calls to it raise :class:`~evalbox.SandboxNotRunningError` meanwhile."""
        return await self._client._run(core.pause_sandbox(self._client._cfg, self.id))

    async def resume(self, *, wait: float | None = None) -> SandboxInfo:
        """Resume a paused sandbox where it was (``wait``: seconds to wait for host capacity)."""
        return await self._client._run(core.resume_sandbox(self._client._cfg, self.id, wait=wait))

    async def set_timeout(self, seconds: int) -> SandboxInfo:
        """Make the sandbox expire ``seconds`` from now."""
        return await self._client._run(core.set_timeout(self._client._cfg, self.id, seconds))

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            await self.kill()
            return
        try:
            await self.kill()
        except EvalboxError as e:  # do not hide the exception that ended the block
            _log.warning("deleting sandbox %s after an error failed: %s", self.id, e)


class AsyncNetwork:
    """A sandbox's network (``sb.network``). See :class:`evalbox.Network`."""

    def __init__(self, sandbox_id: str, client: AsyncClient) -> None:
        self._id = sandbox_id
        self._client = client

    async def update(
        self,
        allow: Sequence[str] | None = None,
        deny: Sequence[str] | None = None,
        *,
        mode: str | None = None,
    ) -> SandboxInfo:
        """Replace the sandbox's egress rules, live. See :meth:`evalbox.Network.update`."""
        op = core.set_network(self._client._cfg, self._id, mode=mode, allow=allow, deny=deny)
        return await self._client._run(op)

    async def rules(self) -> SandboxInfo:
        """The sandbox as the server sees it now (``network``, ``network_rules``)."""
        return await self._client._run(core.get_sandbox(self._client._cfg, self._id))


class AsyncFiles:
    """Files inside a sandbox (``sb.files``). See :class:`evalbox.Files`."""

    def __init__(self, sandbox_id: str, client: AsyncClient) -> None:
        self._id = sandbox_id
        self._client = client

    async def write(self, path: str, data: AsyncWriteData, *, mode: int | None = None) -> FileInfo:
        """Write a file (text, bytes, a binary file, or a sync or async iterable of byte chunks), streamed."""
        return await self._client._run(core.write_file(self._client._cfg, self._id, path, core.upload_from(data), mode))

    async def upload(self, local: core.PathLike, remote: str, *, mode: int | None = None) -> FileInfo:
        """Stream a local file into the sandbox; ``mode`` defaults to the local file's permission bits."""
        f = await asyncio.to_thread(open, local, "rb")
        try:
            if mode is None:
                mode = os.fstat(f.fileno()).st_mode & 0o7777
            return await self.write(remote, f, mode=mode)
        finally:
            f.close()

    async def read(self, path: str) -> bytes:
        """A file's content."""
        return (await self._client._run(core.read_file(self._client._cfg, self._id, path, stream=False))).content

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """A file's content as text."""
        return (await self.read(path)).decode(encoding)

    async def download(self, remote: str, local: core.PathLike | IO[bytes]) -> int:
        """Stream a file out of the sandbox into a local path or binary file; returns its size."""
        resp = await self._client._run(core.read_file(self._client._cfg, self._id, remote, stream=True))
        try:
            if not isinstance(local, (str, os.PathLike)):
                return await self._copy(resp, local)
            f = await asyncio.to_thread(_open_wb, local)
            try:
                with f:
                    return await self._copy(resp, f)
            except BaseException:
                os.unlink(local)
                raise
        finally:
            await resp.aclose()

    async def _copy(self, resp: httpx.Response, f: IO[bytes]) -> int:
        n = 0
        try:
            async for chunk in resp.aiter_bytes(core.CHUNK_SIZE):
                await asyncio.to_thread(f.write, chunk)
                n += len(chunk)
        except httpx.TransportError as e:
            raise core.connection_error(e) from e
        return n

    async def list(self, path: str) -> builtins.list[FileInfo]:
        """A directory's entries (not recursive), sorted by name."""
        return await self._client._run(core.list_files(self._client._cfg, self._id, path))

    async def stat(self, path: str) -> FileInfo:
        """Describe a path (a symlink itself, not its target)."""
        return await self._client._run(core.stat_file(self._client._cfg, self._id, path))

    async def mkdir(self, path: str, *, parents: bool = False, mode: int | None = None) -> FileInfo:
        """Create a directory; with ``parents`` also missing parents."""
        return await self._client._run(core.mkdir(self._client._cfg, self._id, path, parents=parents, mode=mode))

    async def rename(self, path: str, target: str) -> FileInfo:
        """Move ``path`` to ``target``. See :meth:`evalbox.Files.rename`."""
        return await self._client._run(core.rename_file(self._client._cfg, self._id, path, target))

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file or directory (a non-empty directory needs ``recursive``)."""
        await self._client._run(core.remove_file(self._client._cfg, self._id, path, recursive=recursive))


class AsyncCommands:
    """Commands inside a sandbox (``sb.commands``). See :class:`evalbox.Commands`."""

    def __init__(self, sandbox_id: str, client: AsyncClient) -> None:
        self._id = sandbox_id
        self._client = client

    @overload
    async def run(
        self,
        cmd: str | Iterable[str],
        *,
        timeout: float | None = ...,
        cwd: str | None = ...,
        env: Mapping[str, str] | None = ...,
        user: str | None = ...,
        stdin: str | bytes | None = ...,
        on_stdout: AsyncOutputCallback | None = ...,
        on_stderr: AsyncOutputCallback | None = ...,
        background: Literal[False] = ...,
        max_output_bytes: int | None = ...,
        kill_on_output_limit: bool = ...,
        memory_limit_mb: int | None = ...,
        tag: str | None = ...,
        keep_stdin: Literal[False] = ...,
    ) -> CommandResult: ...

    @overload
    async def run(
        self,
        cmd: str | Iterable[str],
        *,
        timeout: float | None = ...,
        cwd: str | None = ...,
        env: Mapping[str, str] | None = ...,
        user: str | None = ...,
        stdin: str | bytes | None = ...,
        on_stdout: None = ...,
        on_stderr: None = ...,
        background: Literal[True],
        max_output_bytes: int | None = ...,
        kill_on_output_limit: bool = ...,
        memory_limit_mb: int | None = ...,
        tag: str | None = ...,
        keep_stdin: bool = ...,
    ) -> AsyncCommandHandle: ...

    async def run(
        self,
        cmd: str | Iterable[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        stdin: str | bytes | None = None,
        on_stdout: AsyncOutputCallback | None = None,
        on_stderr: AsyncOutputCallback | None = None,
        background: bool = False,
        max_output_bytes: int | None = None,
        kill_on_output_limit: bool = False,
        memory_limit_mb: int | None = None,
        tag: str | None = None,
        keep_stdin: bool = False,
    ) -> CommandResult | AsyncCommandHandle:
        """Run a command and wait for it, or start it in the background. See :meth:`evalbox.Commands.run`.

        The callbacks may be plain functions or coroutine functions.
        """
        body = core.exec_body(
            cmd,
            cwd=cwd,
            env=env,
            user=user,
            stdin=stdin,
            timeout=timeout,
            max_output_bytes=max_output_bytes,
            kill_on_output_limit=kill_on_output_limit,
            memory_limit_mb=memory_limit_mb,
            tag=tag,
            keep_stdin=keep_stdin,
        )
        cfg = self._client._cfg
        if keep_stdin and not background:
            raise ValueError("keep_stdin needs background=True (a foreground command takes stdin= whole)")
        if background:
            if on_stdout is not None or on_stderr is not None:
                raise ValueError("on_stdout/on_stderr need background=False; iterate handle.stdout instead")
            info = await self._client._run(core.start_process(cfg, self._id, body))
            return AsyncCommandHandle(info, self._id, self._client)
        if on_stdout is None and on_stderr is None:
            return await self._client._run(core.run_command(cfg, self._id, body))
        resp = await self._client._run(core.stream_command(cfg, self._id, body))
        result: CommandResult | None = None
        async with contextlib.aclosing(self._client._events(resp, keep_output=True)) as events:
            async for ev in events:
                if isinstance(ev, CommandResult):
                    result = ev
                elif (cb := on_stdout if ev.stream == "stdout" else on_stderr) is not None:
                    r = cb(ev.data)
                    if inspect.isawaitable(r):
                        await r
        assert result is not None, "an event stream without a result raises"
        return result

    async def list(self) -> builtins.list[ProcessInfo]:
        """The sandbox's background commands, running and ended."""
        return await self._client._run(core.list_processes(self._client._cfg, self._id))

    async def connect(self, command_id: str) -> AsyncCommandHandle:
        """A handle on a background command by its id."""
        info = await self._client._run(core.get_process(self._client._cfg, self._id, command_id))
        return AsyncCommandHandle(info, self._id, self._client)


class AsyncCommandHandle:
    """A background command. See :class:`evalbox.CommandHandle`."""

    id: str
    pid: int
    sandbox_id: str

    def __init__(self, info: ProcessInfo, sandbox_id: str, client: AsyncClient) -> None:
        self.id = info.id
        self.pid = info.pid
        self.sandbox_id = sandbox_id
        self._client = client

    def __repr__(self) -> str:
        return f"AsyncCommandHandle(id={self.id!r}, pid={self.pid}, sandbox_id={self.sandbox_id!r})"

    async def info(self) -> ProcessInfo:
        """The command's state now."""
        return await self._client._run(core.get_process(self._client._cfg, self.sandbox_id, self.id))

    async def wait(self, timeout: float | None = None, *, poll_interval: float = 1.0) -> CommandResult:
        """Wait for the command to end (long polls of ``poll_interval`` s). See :meth:`evalbox.CommandHandle.wait`."""
        return await self._client._run(
            core.wait_process(self._client._cfg, self.sandbox_id, self.id, timeout=timeout, poll_interval=poll_interval)
        )

    async def send_stdin(self, data: str | bytes, *, close: bool = False) -> None:
        """Write ``data`` (at most 1 MiB a call) to the stdin of a command started with ``keep_stdin=True``;
        ``close`` then closes it. See :meth:`evalbox.CommandHandle.send_stdin`."""
        await self._client._run(core.write_stdin(self._client._cfg, self.sandbox_id, self.id, data, close))

    async def close_stdin(self) -> None:
        """Close the command's stdin: its reads see end of file."""
        await self._client._run(core.write_stdin(self._client._cfg, self.sandbox_id, self.id, b"", True))

    async def kill(self, signal: str | int | None = None) -> None:
        """SIGKILL the command's whole tree, or send ``signal``. See :meth:`evalbox.CommandHandle.kill`."""
        cfg = self._client._cfg
        if signal is None:
            await self._client._run(core.kill_process(cfg, self.sandbox_id, self.id))
        else:
            await self._client._run(core.signal_process(cfg, self.sandbox_id, self.id, signal))

    @property
    def stdout(self) -> AsyncIterator[str]:
        """The command's stdout in chunks (``async for``): so far, then live until it ends."""
        return self._output("stdout")

    @property
    def stderr(self) -> AsyncIterator[str]:
        """The command's stderr in chunks (``async for``): so far, then live until it ends."""
        return self._output("stderr")

    async def _output(self, which: str) -> AsyncIterator[str]:
        resp = await self._client._run(core.stream_process(self._client._cfg, self.sandbox_id, self.id))
        async with contextlib.aclosing(self._client._events(resp, keep_output=False)) as events:
            async for ev in events:
                if isinstance(ev, core.Output) and ev.stream == which:
                    yield ev.data
