"""evalbox: self-hosted sandboxes for LLM evaluation and RL — the Python SDK.

The trial loop::

    from evalbox import Sandbox

    with Sandbox.create(template="python", timeout=600) as sb:  # deleted on exit
        sb.files.write("/work/solution.py", completion)
        r = sb.commands.run("python3 /work/solution.py", timeout=5)
        score = r.exit_code == 0 and r.stdout.strip() == expected

``AsyncSandbox`` has the same surface with ``await``. For RL rewards,
``evalbox.execute(scripts, timeout=5)`` runs a batch of scripts, each in its
own fresh sandbox; ``evalbox.evals.run(problems=..., samples=...)`` scores a
HumanEval-format benchmark on the server (``async_execute`` and
``async_evals`` are the async twins). The server is found
with ``EVALBOX_API_URL`` and ``EVALBOX_API_KEY`` (or ``api_url=``/``api_key=``
arguments, or a :class:`Client`). Errors answered by the server raise
subclasses of :class:`EvalboxError` (see :mod:`evalbox.errors`).
"""

from __future__ import annotations

__version__ = "0.1.0"

from ._async import (
    AsyncClient,
    AsyncCommandHandle,
    AsyncCommands,
    AsyncEvals,
    AsyncFiles,
    AsyncNetwork,
    AsyncSandbox,
    AsyncSecrets,
    AsyncSnapshots,
    AsyncTemplates,
    async_evals,
    async_execute,
    async_templates,
)
from ._core import TRAFFIC_TOKEN_HEADER
from ._sync import (
    Client,
    CommandHandle,
    Commands,
    Evals,
    Files,
    Network,
    Sandbox,
    Secrets,
    Snapshots,
    Templates,
    evals,
    execute,
    templates,
)
from .errors import (
    APIConnectionError,
    AuthenticationError,
    BadRequestError,
    CommandTimeoutError,
    ConflictError,
    EvalboxError,
    InsufficientBalanceError,
    InsufficientCapacityError,
    NoSpaceError,
    NotFoundError,
    OutputBudgetExhaustedError,
    PayloadTooLargeError,
    PermissionDeniedError,
    PortClosedError,
    RateLimitedError,
    SandboxNotRunningError,
    ServerError,
    ServiceUnavailableError,
    StorageQuotaExceededError,
    TemplateBuildError,
    TooManySandboxesError,
)
from .models import (
    BalanceInfo,
    CodeContext,
    CodeResult,
    CommandResult,
    EvalCompile,
    EvalResult,
    EvalRun,
    EvalSummary,
    EvalTestResult,
    Execution,
    ExecutionError,
    FileInfo,
    NetworkRules,
    PhaseStats,
    ProcessInfo,
    SandboxInfo,
    SecretInfo,
    SnapshotInfo,
    TemplateBuild,
    TemplateInfo,
    UsageLine,
    UsageReport,
)

#: ``evalbox.TimeoutError`` is :class:`CommandTimeoutError` (also a built-in
#: :class:`TimeoutError`). It is left out of ``__all__`` so that
#: ``from evalbox import *`` does not shadow the built-in.
TimeoutError = CommandTimeoutError  # noqa: A001

__all__ = [
    "TRAFFIC_TOKEN_HEADER",
    "APIConnectionError",
    "AsyncClient",
    "AsyncCommandHandle",
    "AsyncCommands",
    "AsyncEvals",
    "AsyncFiles",
    "AsyncNetwork",
    "AsyncSandbox",
    "AsyncSecrets",
    "AsyncSnapshots",
    "AsyncTemplates",
    "AuthenticationError",
    "BadRequestError",
    "BalanceInfo",
    "Client",
    "CodeContext",
    "CodeResult",
    "CommandHandle",
    "CommandResult",
    "CommandTimeoutError",
    "Commands",
    "ConflictError",
    "EvalCompile",
    "EvalResult",
    "EvalRun",
    "EvalSummary",
    "EvalTestResult",
    "EvalboxError",
    "Evals",
    "Execution",
    "ExecutionError",
    "FileInfo",
    "Files",
    "InsufficientBalanceError",
    "InsufficientCapacityError",
    "Network",
    "NetworkRules",
    "NoSpaceError",
    "NotFoundError",
    "OutputBudgetExhaustedError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "PhaseStats",
    "PortClosedError",
    "ProcessInfo",
    "RateLimitedError",
    "Sandbox",
    "SandboxInfo",
    "SandboxNotRunningError",
    "SecretInfo",
    "Secrets",
    "ServerError",
    "ServiceUnavailableError",
    "SnapshotInfo",
    "Snapshots",
    "StorageQuotaExceededError",
    "TemplateBuild",
    "TemplateBuildError",
    "TemplateInfo",
    "Templates",
    "TooManySandboxesError",
    "UsageLine",
    "UsageReport",
    "__version__",
    "async_evals",
    "async_execute",
    "async_templates",
    "evals",
    "execute",
    "templates",
]
