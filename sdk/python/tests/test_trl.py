"""evalbox.integrations.trl against the real server, called exactly as TRL's GRPOTrainer calls a
reward function: keyword arguments prompts, completions, completion_ids, one list per dataset
column other than the prompt, and trainer_state (GRPOTrainer._calculate_rewards). Every program
runs in its own fresh sandbox; an infra failure is None, never a false 0."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest

import evalbox
from evalbox import AsyncClient, Client, errors
from evalbox.integrations.trl import SandboxEnvironment, async_code_reward, code_reward, extract_code, program

from .server import NS, Team

TEST = "assert add(2, 3) == 5\nassert add(-1, 1) == 0"

#: chat-format completions (one assistant message each), and the reward each must get.
CHAT: list[tuple[list[dict[str, Any]], float]] = [
    ([{"role": "assistant", "content": "Here:\n```python\ndef add(a, b):\n    return a + b\n```\nDone."}], 1.0),
    ([{"role": "assistant", "content": "```python\ndef add(a, b):\n    return a - b\n```"}], 0.0),
    ([{"role": "assistant", "content": "```python\ndef add(a, b):\n    while True:\n        pass\n```"}], 0.0),
    ([{"role": "assistant", "content": "```py\ndef add(a, b)\n    return a + b\n```"}], 0.0),  # a syntax error
    ([{"role": "assistant", "content": [{"type": "text", "text": "def add(a, b):\n    return b + a\n"}]}], 1.0),
    # Reward hacks: leave before the tests with exit status 0, or print what looks like a pass.
    ([{"role": "assistant", "content": "```python\nimport sys\nsys.exit(0)\n```"}], 0.0),
    ([{"role": "assistant", "content": "```python\nimport os\nprint('ok', flush=True)\nos._exit(0)\n```"}], 0.0),
    # The last assistant message holds only tool calls: no code.
    ([{"role": "assistant", "content": "def add(a, b): return a + b"}, {"role": "assistant", "content": None}], 0.0),
]


def grpo_call(reward: Any, completions: list[Any], tests: list[Any]) -> Any:
    """What GRPOTrainer passes a reward function (its columns: the prompt's siblings)."""
    prompts = [[{"role": "user", "content": "Write add(a, b)."}] for _ in completions]
    return reward(
        prompts=prompts,
        completions=completions,
        completion_ids=[[1, 2, 3] for _ in completions],
        test=tests,
        task_id=[f"t{i}" for i in range(len(completions))],
        trainer_state=object(),
    )


def test_chat_completions(team: Team) -> None:
    reward = code_reward(timeout=3, runtime=NS)
    assert reward.__name__ == "evalbox_code_reward"
    got = grpo_call(reward, [c for c, _ in CHAT], [TEST] * len(CHAT))
    assert got == [want for _, want in CHAT]


def test_plain_completions_and_list_tests(team: Team) -> None:
    completions = ["def add(a, b):\n    return a + b\n", "def add(a, b):\n    return 0\n"]
    tests = [["assert add(1, 1) == 2", "assert add(0, 0) == 0"], ["assert add(0, 0) == 0", "assert add(1, 1) == 2"]]
    with team.client() as c:
        assert grpo_call(code_reward(timeout=3, runtime=NS, client=c), completions, tests) == [1.0, 0.0]


def test_async(team: Team) -> None:
    async def main() -> Any:
        async with AsyncClient(team.url, team.key) as c:
            reward = async_code_reward(timeout=3, runtime=NS, client=c)
            with_client = await grpo_call(reward, [c for c, _ in CHAT], [TEST] * len(CHAT))
        # Without one: the loop's default client, from EVALBOX_API_URL / KEY.
        default = await grpo_call(async_code_reward(timeout=3, runtime=NS), [CHAT[0][0]], [TEST])
        return with_client, default

    with_client, default = asyncio.run(main())
    assert with_client == [want for _, want in CHAT]
    assert default == [1.0]


def test_rows_without_tests_are_not_scored(team: Team) -> None:
    """A row whose tests are missing gets None (the code alone would pass), and the rest of the
    batch is still scored."""
    completions = ["def add(a, b):\n    return a + b\n"] * 4
    with team.client() as c:
        got = grpo_call(code_reward(timeout=3, runtime=NS, client=c), completions, [TEST, None, "", []])
        assert got == [1.0, None, None, None]
        assert grpo_call(code_reward(timeout=3, runtime=NS, client=c), completions[:1], [None]) == [None]
        # tests_column=None: the code alone, asked for.
        alone = code_reward(tests_column=None, timeout=3, runtime=NS, client=c)
        assert alone(completions=["assert 1 + 1 == 2"]) == [1.0]


def test_infra_failure_is_none() -> None:
    """An evalbox that cannot be reached gives None for every completion (TRL then leaves them
    out), not a false 0; a bad request still raises."""
    with Client("http://127.0.0.1:9", "evk_" + "x" * 40) as c:
        assert grpo_call(code_reward(client=c), ["def add(a, b): return a + b"], [TEST]) == [None]


def test_bad_input_raises(team: Team) -> None:
    with team.client() as c:
        with pytest.raises(errors.NotFoundError):
            grpo_call(code_reward(template="no-such-template", client=c), ["print(1)"], [TEST])
        with pytest.raises(KeyError, match="no column 'tests'"):
            code_reward(tests_column="tests", client=c)(completions=["x"], test=["y"])


def test_extract_code() -> None:
    assert extract_code("a\n```python\nx = 1\n```\nb\n```\ny = 2\n```") == "y = 2\n"
    assert extract_code("no fence") == "no fence"
    assert extract_code([{"role": "user", "content": "q"}, {"role": "assistant", "content": "```\nz\n```"}]) == "z\n"
    assert program("x = 1", ["assert x", "assert x == 1"]) == "x = 1\n\nassert x\n\nassert x == 1\n"
    assert program("x = 1", "assert x", marker="m") == "x = 1\n\nassert x\n\nprint('m')\n"
    assert program("true", None, marker="m", language="bash") == "true\n\nprintf '%s\\n' 'm'\n"
    assert extract_code([{"role": "assistant", "content": None}]) == ""


def test_sandbox_environment(team: Team) -> None:
    """SandboxEnvironment driven as GRPOTrainer drives an environment_factory: instances from
    factory(), the tools found as its public functions, reset(**example) per episode (a fresh
    sandbox, the last one deleted), the tools, get_reward from the example's tests."""
    with team.client() as c:
        factory = SandboxEnvironment.factory(runtime=NS, tests_column="test", timeout=5, client=c)
        env = factory()
        tools = [n for n, _ in inspect.getmembers(type(env), predicate=inspect.isfunction) if not n.startswith("_")]
        assert sorted(t for t in tools if t not in ("reset", "get_reward")) == ["run_code", "run_shell"]
        for t in (env.run_code, env.run_shell):
            assert t.__doc__ is not None
            assert "Args:" in t.__doc__

        assert (
            env.reset(prompt="Write add(a, b) in solution.py.", test="from solution import add\nassert add(2, 3) == 5")
            is None
        )
        first = env.sandbox
        assert first is not None
        assert env.run_shell("printf 'def add(a, b):\\n    return a - b\\n' > solution.py; echo written") == (
            "written\n\n[exit status 0]"
        )
        assert env.get_reward() == 0.0
        assert env.run_code("import solution; print(solution.add(2, 3))") == "-1\n\n[exit status 0]"
        out = env.run_code("import sys; print('x' * 20000); sys.exit(4)")
        assert out.startswith("[…]")
        assert out.endswith("[exit status 4]")
        assert "timed out after 5" in env.run_shell("sleep 30")
        env.run_shell("printf 'def add(a, b):\\n    return a + b\\n' > solution.py")
        assert env.get_reward() == 1.0
        # The next episode: a fresh sandbox, the old one gone; an example without tests is not scored.
        env.reset(prompt="again")
        assert env.sandbox is not None
        assert env.sandbox.id != first.id
        assert "No such file" in env.run_shell("cat solution.py")
        assert env.get_reward() is None
        assert first.info().state != "running"
        ids = [env.sandbox.id]
        env._close()
        assert [s.id for s in evalbox.Sandbox.list(client=c) if s.id in ids] == []
