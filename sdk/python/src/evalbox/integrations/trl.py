"""Code rewards for TRL's trainers (``GRPOTrainer(reward_funcs=[...])``).

:func:`code_reward` builds a reward function with TRL's signature,
``reward(prompts, completions, completion_ids, **columns) -> list[float | None]``: it takes the
code out of each completion (a chat completion's last assistant message, or plain text; the
last fenced code block, else the whole text), appends the completion's tests (a dataset
column), runs each program in its own fresh sandbox through ``POST /v1/execute`` and scores
1.0 when it exits 0 having run past its tests (a random line printed after them must end its
output, so that an early ``sys.exit(0)`` earns nothing), 0.0 when it fails or times out, and
``None`` when the row has no tests or evalbox could not run it
(TRL leaves ``None`` out of the reward instead of counting a false 0); so is a whole batch
that evalbox could not take (unreachable, overloaded), while a bad request or key raises. :func:`async_code_reward`
is its ``async def`` twin (TRL awaits async reward functions). TRL itself is not imported: the
functions only follow its calling convention (docs/integrations/trl.md).

:class:`SandboxEnvironment` is an ``environment_factory`` for multi-turn tool use
(``GRPOTrainer(environment_factory=SandboxEnvironment.factory(...))``): one fresh sandbox per
episode, the tools ``run_code`` and ``run_shell``, and (with a tests column) ``get_reward``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import re
import secrets
import threading
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal

from .._async import AsyncClient, async_execute
from .._sync import Client, Sandbox, execute
from ..errors import (
    APIConnectionError,
    EvalboxError,
    OutputBudgetExhaustedError,
    RateLimitedError,
    ServerError,
    TooManySandboxesError,
)
from ..models import CommandResult

__all__ = ["RewardFunc", "SandboxEnvironment", "async_code_reward", "code_reward", "extract_code", "program"]

log = logging.getLogger("evalbox.integrations.trl")

# What makes a batch's rewards None rather than an exception: evalbox, not the caller, failed
# (unreachable, overloaded, out of room). A bad request or key raises: it would fail every step.
_INFRA = (APIConnectionError, ServerError, RateLimitedError, OutputBudgetExhaustedError, TooManySandboxesError)

RewardFunc = Callable[..., list[float | None]]
"""A reward function as TRL calls it: keyword arguments ``prompts``, ``completions``,
``completion_ids`` and one list per dataset column; one reward per completion."""

_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)


def extract_code(completion: str | Sequence[Mapping[str, Any]]) -> str:
    """The code of a completion: its text (a chat completion's last assistant message), and of
    that the last fenced code block, or, without one, the whole text."""
    text = _text(completion)
    blocks = _FENCE.findall(text)
    return str(blocks[-1]) if blocks else text


def _text(completion: str | Sequence[Mapping[str, Any]]) -> str:
    if isinstance(completion, str):
        return completion
    for msg in reversed(completion):
        if msg.get("role", "assistant") != "assistant":
            continue
        content = msg.get("content")
        if content is None:
            # A message of tool calls only.
            return ""
        if isinstance(content, str):
            return content
        # A list of parts: its text parts, in order.
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping) and p.get("type") == "text")
    return ""


def program(code: str, tests: str | Sequence[str] | None, marker: str = "", language: str = "python") -> str:
    """The program a completion is scored by: its code, then its tests (asserts, one string or a
    list), each on lines of their own, then (with a marker) a last line that prints it: a program
    that exits 0 before its tests ran does not print it."""
    parts = [code]
    if tests is not None:
        parts += [tests] if isinstance(tests, str) else list(tests)
    if marker:
        parts.append(f"print({marker!r})" if language == "python" else f"printf '%s\\n' '{marker}'")
    return "\n\n".join(parts) + "\n"


def _score(r: CommandResult, marker: str) -> float | None:
    if r.status == "error":
        log.warning("evalbox could not run a completion's program: %s", r.error)
        return None
    # Exit 0 alone is not a pass: `sys.exit(0)` at the top of the code would be one. The run must
    # also have reached the line after the tests.
    return 1.0 if r.ok and r.stdout.rstrip("\n").endswith(marker) else 0.0


def _programs(
    completions: Sequence[Any], columns: Mapping[str, Any], tests_column: str | None, marker: str, language: str
) -> list[str | None]:
    """Each completion's program, or None for a row whose tests are missing (it is not scored:
    the code alone would pass)."""
    tests: Sequence[Any] | None = None
    if tests_column is not None:
        if tests_column not in columns:
            raise KeyError(f"the dataset has no column {tests_column!r} (it has {sorted(columns)})")
        tests = columns[tests_column]
        if len(tests) != len(completions):
            raise ValueError(f"{len(completions)} completions but {len(tests)} values of {tests_column!r}")
    out: list[str | None] = []
    for i, c in enumerate(completions):
        t = tests[i] if tests is not None else None
        if tests is not None and (t is None or len(t) == 0):
            log.warning("completion %d has no tests in %r: not scored", i, tests_column)
            out.append(None)
            continue
        out.append(program(extract_code(c), t, marker, language))
    return out


def _marker() -> str:
    """A line no completion can know in advance, printed after the tests."""
    return "evalbox-tests-ran-" + secrets.token_hex(16)


def _rewards(programs: list[str | None], results: Sequence[CommandResult], marker: str) -> list[float | None]:
    """The rewards of programs, from the results of those that ran, in order."""
    it = iter(results)
    return [None if p is None else _score(next(it), marker) for p in programs]


def code_reward(
    *,
    tests_column: str | None = "test",
    timeout: float = 10,
    language: Literal["python", "bash"] = "python",
    template: str | None = None,
    runtime: str | None = None,
    client: Client | None = None,
    name: str = "evalbox_code_reward",
) -> RewardFunc:
    """A TRL reward function that runs each completion's code with its tests in a fresh sandbox.

    Args:
        tests_column: The dataset column whose value (a string, or a list of strings) is
            appended to each completion's code; a row whose value is missing (None or empty) is
            not scored (``None``). ``tests_column=None``: the code alone, for code that tests
            itself.
        timeout: Seconds each program may run.
        language: ``python`` or ``bash``.
        template: The sandboxes' template (default ``python`` / ``base``).
        runtime: ``gvisor`` or ``namespaces`` (default the server's).
        client: The evalbox client (default: the process's, from ``EVALBOX_API_URL`` /
            ``EVALBOX_API_KEY`` when the reward is called).
        name: The function's ``__name__``, under which TRL logs the reward.
    """

    def reward(
        prompts: Sequence[Any] | None = None,
        completions: Sequence[Any] = (),
        completion_ids: Sequence[Any] | None = None,
        **columns: Any,
    ) -> list[float | None]:
        marker = _marker()
        programs = _programs(completions, columns, tests_column, marker, language)
        runnable = [p for p in programs if p is not None]
        if not runnable:
            return [None] * len(programs)
        try:
            results = execute(
                runnable, timeout=timeout, language=language, template=template, runtime=runtime, client=client
            )
        except _INFRA as e:
            log.warning("evalbox could not run the batch of %d completions: %s", len(runnable), e)
            return [None] * len(programs)
        return _rewards(programs, results, marker)

    reward.__name__ = reward.__qualname__ = name
    return reward


def async_code_reward(
    *,
    tests_column: str | None = "test",
    timeout: float = 10,
    language: Literal["python", "bash"] = "python",
    template: str | None = None,
    runtime: str | None = None,
    client: AsyncClient | None = None,
    name: str = "evalbox_code_reward",
) -> Callable[..., Awaitable[list[float | None]]]:
    """:func:`code_reward` as an ``async def`` (same arguments, an :class:`AsyncClient`)."""

    async def reward(
        prompts: Sequence[Any] | None = None,
        completions: Sequence[Any] = (),
        completion_ids: Sequence[Any] | None = None,
        **columns: Any,
    ) -> list[float | None]:
        marker = _marker()
        programs = _programs(completions, columns, tests_column, marker, language)
        runnable = [p for p in programs if p is not None]
        if not runnable:
            return [None] * len(programs)
        try:
            # Without a client: the awaiting loop's default one (evalbox.async_execute).
            results = await async_execute(
                runnable, timeout=timeout, language=language, template=template, runtime=runtime, client=client
            )
        except _INFRA as e:
            log.warning("evalbox could not run the batch of %d completions: %s", len(runnable), e)
            return [None] * len(programs)
        return _rewards(programs, results, marker)

    reward.__name__ = reward.__qualname__ = name
    return reward


#: Most characters of a tool's answer the model sees (the output's end is kept).
MAX_TOOL_OUTPUT = 8000

# Every environment that holds a sandbox, for the deletes at interpreter exit.
_live: weakref.WeakSet[SandboxEnvironment] = weakref.WeakSet()
_live_lock = threading.Lock()


@atexit.register
def _close_all() -> None:
    with _live_lock:
        envs = list(_live)
    for env in envs:
        env._close()


class SandboxEnvironment:
    """A TRL environment (``GRPOTrainer(environment_factory=...)``): each episode gets its own
    fresh sandbox, and the model works in it through two tools, :meth:`run_code` and
    :meth:`run_shell`.

    TRL makes instances with ``factory()`` and calls :meth:`reset` with each example's columns
    at the start of every episode: the previous episode's sandbox is deleted and a new one made.
    With ``tests_column``, :meth:`get_reward` scores the episode by running that column's tests
    (Python that imports or reads what the model left in the sandbox, run in the template's
    working directory) in the episode's sandbox: 1.0 when they pass and run to their end, 0.0
    when not, ``None`` when the example has none or evalbox could not run them (TRL ignores
    it). Sandboxes still held at interpreter exit are
    deleted; each one's TTL bounds what a crash leaves.

    The reward is best-effort against a model that games it: the tests run in the sandbox the
    model controlled, after it (an interpreter it replaced, a module it shadowed, the marker it
    read from the program) could cheat them. Score models trained to cheat with tests they cannot
    reach: copy what they made into a fresh sandbox.
    """

    def __init__(
        self,
        *,
        template: str = "python",
        runtime: str | None = None,
        network: str | None = None,
        timeout: float = 30,
        ttl: int = 3600,
        tests_column: str | None = None,
        client: Client | None = None,
    ) -> None:
        self._template, self._runtime, self._network = template, runtime, network
        self._timeout, self._ttl, self._tests_column, self._client = timeout, ttl, tests_column, client
        self._sandbox: Sandbox | None = None
        self._tests: str | None = None

    @classmethod
    def factory(
        cls,
        *,
        template: str = "python",
        runtime: str | None = None,
        network: str | None = None,
        timeout: float = 30,
        ttl: int = 3600,
        tests_column: str | None = None,
        client: Client | None = None,
    ) -> Callable[[], SandboxEnvironment]:
        """The ``environment_factory`` for TRL: a callable that makes environments with these options.

        Args:
            template: The episodes' template.
            runtime: ``gvisor`` or ``namespaces`` (default: the server's).
            network: The sandboxes' network (``none`` by default on the server).
            timeout: Seconds one tool call may run.
            ttl: Each sandbox's TTL, in seconds.
            tests_column: The dataset column holding each example's tests, for :meth:`get_reward`.
            client: The evalbox client (default: the process's, from the environment).
        """
        return functools.partial(
            cls,
            template=template,
            runtime=runtime,
            network=network,
            timeout=timeout,
            ttl=ttl,
            tests_column=tests_column,
            client=client,
        )

    @property
    def sandbox(self) -> Sandbox | None:
        """The current episode's sandbox (``None`` before the first :meth:`reset`)."""
        return self._sandbox

    def reset(self, **example: Any) -> str | None:
        """Start an episode: the previous one's sandbox is deleted, a fresh one made."""
        self._close()
        tests = example.get(self._tests_column) if self._tests_column else None
        self._tests = tests if isinstance(tests, str) and tests.strip() else None
        self._sandbox = Sandbox.create(
            template=self._template,
            runtime=self._runtime,
            network=self._network,
            timeout=self._ttl,
            metadata={"via": "trl-environment"},
            client=self._client,
        )
        with _live_lock:
            _live.add(self)
        return None

    def run_code(self, code: str) -> str:
        """Run Python code in the sandbox, in its working directory, and return what it printed and
        its exit status.

        Args:
            code: The Python program to run.

        Returns:
            Its standard output and standard error, then its exit status.
        """
        sb = self._require()
        # On standard input, so that it imports from the working directory as a script there would.
        return self._answer(sb.commands.run(["python3", "-"], stdin=code, timeout=self._timeout))

    def run_shell(self, command: str) -> str:
        """Run a shell command in the sandbox and return what it printed and its exit status.

        Args:
            command: The command line, run by bash.

        Returns:
            Its standard output and standard error, then its exit status.
        """
        sb = self._require()
        return self._answer(sb.commands.run(["bash", "-c", command], timeout=self._timeout))

    def get_reward(self) -> float | None:
        """The episode's reward: 1.0 when its tests pass in its sandbox, 0.0 when not, None when it
        has no tests or evalbox could not run them."""
        if self._tests is None or self._sandbox is None:
            return None
        marker = _marker()
        try:
            tests = program("", self._tests, marker)
            # -E -s: no PYTHON* variables, no user site-packages the model could have planted.
            r = self._sandbox.commands.run(["python3", "-E", "-s", "-"], stdin=tests, timeout=self._timeout)
        except EvalboxError as e:
            log.warning("evalbox could not run an episode's tests: %s", e)
            return None
        return _score(r, marker)

    def _require(self) -> Sandbox:
        if self._sandbox is None:
            raise RuntimeError("the environment has no sandbox: reset() starts an episode")
        return self._sandbox

    def _answer(self, r: CommandResult) -> str:
        if r.status == "timed_out":
            status = f"timed out after {self._timeout} s"
        elif r.status == "error":
            status = f"could not run: {r.error}"
        elif r.status == "killed":
            status = f"killed by signal {r.signal}"
        else:
            status = f"exit status {r.exit_code}"
        out = r.stdout + r.stderr
        if len(out) > MAX_TOOL_OUTPUT:
            out = "[…]" + out[-MAX_TOOL_OUTPUT:]
        return f"{out}\n[{status}]" if out else f"[{status}]"

    def _close(self) -> None:
        """Delete the episode's sandbox (not a tool: TRL exposes public methods only)."""
        sb, self._sandbox = self._sandbox, None
        if sb is not None:
            with contextlib.suppress(EvalboxError):
                sb.kill()
