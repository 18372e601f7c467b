"""evalbox: self-hosted sandboxes for LLM evaluation and RL — the Python SDK.

The trial loop::

    from evalbox import Sandbox

    with Sandbox.create(template="python", timeout=600) as sb:  # deleted on exit
        sb.files.write("/work/solution.py", completion)
        r = sb.commands.run("python3 /work/solution.py", timeout=5)
        score = r.exit_code == 0 and r.stdout.strip() == expected

``AsyncSandbox`` has the same surface with ``await``. The server is found
with ``EVALBOX_API_URL`` and ``EVALBOX_API_KEY`` (or ``api_url=``/``api_key=``
arguments, or a :class:`Client`). Errors answered by the server raise
subclasses of :class:`EvalboxError` (see :mod:`evalbox.errors`).
"""

from __future__ import annotations

__version__ = "0.1.0"

from ._async import AsyncClient, AsyncCommandHandle, AsyncCommands, AsyncFiles, AsyncSandbox
from ._sync import Client, CommandHandle, Commands, Files, Sandbox
from .errors import (
    APIConnectionError,
    AuthenticationError,
    BadRequestError,
    CommandTimeoutError,
    ConflictError,
    EvalboxError,
    NoSpaceError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitedError,
    SandboxNotRunningError,
    ServerError,
    ServiceUnavailableError,
    TooManySandboxesError,
)
from .models import CommandResult, FileInfo, ProcessInfo, SandboxInfo

#: ``evalbox.TimeoutError`` is :class:`CommandTimeoutError` (also a built-in
#: :class:`TimeoutError`). It is left out of ``__all__`` so that
#: ``from evalbox import *`` does not shadow the built-in.
TimeoutError = CommandTimeoutError  # noqa: A001

__all__ = [
    "APIConnectionError",
    "AsyncClient",
    "AsyncCommandHandle",
    "AsyncCommands",
    "AsyncFiles",
    "AsyncSandbox",
    "AuthenticationError",
    "BadRequestError",
    "Client",
    "CommandHandle",
    "CommandResult",
    "CommandTimeoutError",
    "Commands",
    "ConflictError",
    "EvalboxError",
    "FileInfo",
    "Files",
    "NoSpaceError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "ProcessInfo",
    "RateLimitedError",
    "Sandbox",
    "SandboxInfo",
    "SandboxNotRunningError",
    "ServerError",
    "ServiceUnavailableError",
    "TooManySandboxesError",
    "__version__",
]
