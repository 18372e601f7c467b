"""Exceptions raised by the evalbox SDK.

Every error the server answers is an :class:`EvalboxError` whose subclass is
chosen by the stable error ``code`` of the answer (``{"error": {"code",
"message"}}``, see ``api/openapi.yaml``); unknown codes fall back on the HTTP
status. Network failures are :class:`APIConnectionError`.

A command that exits non-zero, is killed or times out is *not* an error: see
:attr:`evalbox.CommandResult.status`.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import Any

__all__ = [
    "APIConnectionError",
    "AuthenticationError",
    "BadRequestError",
    "CommandTimeoutError",
    "ConflictError",
    "EvalboxError",
    "InsufficientCapacityError",
    "NotFoundError",
    "OutputBudgetExhaustedError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RateLimitedError",
    "SandboxNotRunningError",
    "ServerError",
    "ServiceUnavailableError",
    "TooManySandboxesError",
]


class EvalboxError(Exception):
    """Base class of every error raised by the SDK.

    Attributes:
        code: The server's stable error code (``"not_found"``, …), or
            ``"connection"`` for a network failure.
        status: The HTTP status, or ``None`` when the error did not come with
            one (an error event inside a stream, a network failure, a
            client-side timeout).
        message: Human-readable detail.
        retry_after: The server's ``Retry-After`` in seconds, when it sent one.
    """

    code: str
    status: int | None
    message: str
    retry_after: float | None

    def __init__(
        self,
        message: str,
        *,
        code: str = "",
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.message = message
        self.retry_after = retry_after

    def __str__(self) -> str:
        if not self.code:
            return self.message
        if not self.message:
            return self.code
        return f"{self.code}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, status={self.status!r}, message={self.message!r})"


class BadRequestError(EvalboxError):
    """400 ``bad_request``: malformed input, unknown field, bad value or bad path."""


class AuthenticationError(EvalboxError):
    """401 ``unauthorized``: missing, unknown or revoked API key."""


class PermissionDeniedError(EvalboxError):
    """403 ``forbidden``: the key may not do this (an admin key is needed)."""


class NotFoundError(EvalboxError):
    """404 ``not_found``: no such sandbox, process, path, template, team or key for this team."""


class ConflictError(EvalboxError):
    """409 ``conflict``: the request clashes with the current state (e.g. mkdir of an existing path)."""


class SandboxNotRunningError(EvalboxError):
    """409 ``sandbox_not_running``: the sandbox ended (deleted, expired or lost)."""


class PayloadTooLargeError(EvalboxError):
    """413 ``payload_too_large``: the upload is larger than the server's maximum file size."""


class NoSpaceError(EvalboxError):
    """507 ``no_space``: the sandbox's disk (``disk_mb``) is full."""


class StorageQuotaExceededError(EvalboxError):
    """413 ``storage_quota_exceeded``: the team would store more than its storage limit.

    The limit (``max_storage_mb``) covers the team's templates, the build
    contexts and image uploads being processed and its eval runs' inputs.
    Nothing was stored; delete templates or eval runs, or ask an admin to
    raise the limit.
    """


class InsufficientBalanceError(EvalboxError):
    """402 ``insufficient_balance``: billing is on and the team's prepaid balance does not cover the sandbox.

    Nothing was created. An admin tops the balance up (``evalbox balance
    top-up``); ``GET /v1/balance`` shows it.
    """


class TooManySandboxesError(EvalboxError):
    """429 ``too_many_sandboxes``: the team is at its active-sandbox limit. Nothing was created."""


class RateLimitedError(EvalboxError):
    """429 ``rate_limited``: over a rate or concurrency limit of the team. Nothing was done.

    Either the team (or the API key) is over its request rate limit
    (``requests_per_minute``, or ``creates_per_minute`` for a create; see
    docs/limits.md), or it is at its concurrent-command limit. The request
    passes after :attr:`retry_after` seconds (the server's ``Retry-After``,
    rounded up to whole seconds); idempotent calls are retried after it by
    themselves while ``max_retry_wait`` allows.
    """


class OutputBudgetExhaustedError(EvalboxError):
    """429 ``output_budget_exhausted``: the server's memory for buffered command output is in use.

    Raised by a buffered ``commands.run``, a wait or ``execute`` when the server
    (``evalbox serve --output-memory-mb``) cannot hold their output. Nothing was
    run, and a waited-for command keeps running. Stream the output instead
    (``on_stdout``/``on_stderr`` callbacks, or the process's stream), lower
    ``max_output_bytes``, or retry after :attr:`retry_after`.
    """


class CommandTimeoutError(EvalboxError, builtins.TimeoutError):
    """``timeout``: a background command was still running when a wait gave up.

    The command keeps running. Also an instance of the built-in
    :class:`TimeoutError`. It is exported as ``evalbox.TimeoutError`` too
    (but not by ``from evalbox import *``, which would shadow the built-in).
    A foreground command that hits its own ``timeout`` is not an error: its
    result has status ``"timed_out"``.
    """


class ServerError(EvalboxError):
    """5xx ``internal``: a fault of the server."""


class ServiceUnavailableError(ServerError):
    """503 ``unavailable``: the server cannot take the request now. Nothing was done."""


class InsufficientCapacityError(ServiceUnavailableError):
    """503 ``insufficient_capacity``: the host has no room for a new sandbox. Nothing was created.

    The host's pids or memory budget, which every team shares, is reserved by
    running sandboxes, or its available memory is below its reserve; the
    message says which. ``Sandbox.create(wait=...)`` queues for room instead,
    or retry after :attr:`retry_after`.
    """


class PortClosedError(ServerError):
    """502 ``port_closed``: nothing listens on the sandbox port a port URL names (yet), or its server
    closed the connection before answering."""


class TemplateBuildError(EvalboxError):
    """A template build that ended ``failed``; ``build`` is its :class:`~evalbox.models.TemplateBuild`."""

    def __init__(self, build: Any) -> None:
        super().__init__(f"build {build.id} of template {build.template} failed: {build.error}", code="build_failed")
        self.build = build


class APIConnectionError(EvalboxError):
    """The server could not be reached, or the connection broke mid-answer.

    Attributes:
        unsent: True when the request surely did not reach the server (the
            connection could not be made), so that sending it again is safe.
    """

    unsent: bool

    def __init__(self, message: str, *, unsent: bool = False) -> None:
        super().__init__(message, code="connection")
        self.unsent = unsent


_BY_CODE: dict[str, type[EvalboxError]] = {
    "bad_request": BadRequestError,
    "unauthorized": AuthenticationError,
    "forbidden": PermissionDeniedError,
    "not_found": NotFoundError,
    "conflict": ConflictError,
    "sandbox_not_running": SandboxNotRunningError,
    "payload_too_large": PayloadTooLargeError,
    "no_space": NoSpaceError,
    "storage_quota_exceeded": StorageQuotaExceededError,
    "too_many_sandboxes": TooManySandboxesError,
    "rate_limited": RateLimitedError,
    "output_budget_exhausted": OutputBudgetExhaustedError,
    "timeout": CommandTimeoutError,
    "internal": ServerError,
    "unavailable": ServiceUnavailableError,
    "insufficient_capacity": InsufficientCapacityError,
    "port_closed": PortClosedError,
    "insufficient_balance": InsufficientBalanceError,
}


def error_class(code: str, status: int | None) -> type[EvalboxError]:
    """The exception class for an error code, falling back on the HTTP status."""
    cls = _BY_CODE.get(code)
    if cls is None and status is not None:
        cls = _BY_CODE.get(_code_for_status(status))
    return cls or EvalboxError


def error_from_detail(
    detail: Mapping[str, Any] | None, *, status: int | None = None, retry_after: float | None = None
) -> EvalboxError:
    """Build the exception for an ``ErrorDetail`` object (``{"code", "message"}``)."""
    code = ""
    message = ""
    if detail is not None:
        code = str(detail.get("code") or "")
        message = str(detail.get("message") or "")
    if not code:
        code = "internal" if status is None else _code_for_status(status)
    return error_class(code, status)(message, code=code, status=status, retry_after=retry_after)


_STATUS_CODES: dict[int, str] = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    408: "timeout",
    409: "conflict",
    413: "payload_too_large",
    429: "rate_limited",
    503: "unavailable",
}


def _code_for_status(status: int) -> str:
    return _STATUS_CODES.get(status, "internal" if status >= 500 else "bad_request")
