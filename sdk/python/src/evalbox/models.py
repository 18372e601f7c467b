"""Values returned by the SDK (immutable dataclasses parsed from the API's JSON)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

__all__ = ["CommandResult", "FileInfo", "ProcessInfo", "SandboxInfo"]


@dataclass(frozen=True, slots=True)
class SandboxInfo:
    """A sandbox as the API describes it (``Sandbox`` in ``api/openapi.yaml``)."""

    id: str
    team_id: str
    template: str
    runtime: str
    state: str
    """``running``, ``deleted``, ``expired`` or ``lost``."""
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
    ended_at: datetime | None = None
    end_reason: str = ""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SandboxInfo:
        """Parse a ``Sandbox`` JSON object."""
        ended = d.get("ended_at")
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
            ended_at=parse_time(ended) if ended else None,
            end_reason=d.get("end_reason", ""),
        )


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
