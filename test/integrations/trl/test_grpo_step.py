"""One real GRPOTrainer step (TRL from PyPI, pinned in constraints.txt) on CPU, with a tiny randomly
initialised model built here (no download: a character-level tokenizer and a two-layer Llama), whose
rewards come from evalbox: `code_reward` on a code column, and `SandboxEnvironment` as the
environment_factory's reward. Run by scripts/test-trl.sh, not scripts/test.sh: torch is several GB.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import pytest
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import GRPOConfig, GRPOTrainer
from trl.chat_template_utils import qwen2_5_chat_template

import evalbox
from evalbox.integrations.trl import SandboxEnvironment, code_reward

from ..conftest import Server


def tiny_model(path: Path) -> str:
    """A two-layer Llama with a character tokenizer and Qwen2.5's chat template (one TRL ships and
    parses tool calls of), saved at path."""
    specials = ["<pad>", "<|im_end|>", "<unk>", "<|im_start|>", "<tool_call>", "</tool_call>"]
    vocab = {c: i for i, c in enumerate([*specials, *string.printable])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<|im_end|>",
        unk_token="<unk>",
        additional_special_tokens=specials[3:],
    )
    fast.chat_template = qwen2_5_chat_template
    fast.save_pretrained(path)
    cfg = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
    )
    LlamaForCausalLM(cfg).save_pretrained(path)
    return str(path)


def config(out: Path, **kw: Any) -> GRPOConfig:
    return GRPOConfig(
        output_dir=str(out),
        max_steps=1,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=8,
        use_cpu=True,
        bf16=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        **kw,
    )


def test_grpo_step_with_code_reward(keyed_server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = keyed_server.new_team(max_sandboxes=8)
    monkeypatch.setenv("EVALBOX_API_URL", keyed_server.url)
    monkeypatch.setenv("EVALBOX_API_KEY", key)
    calls: list[list[float | None]] = []
    inner = code_reward(tests_column="test", runtime="namespaces", timeout=5)

    def reward(**kw: Any) -> list[float | None]:
        out = inner(**kw)
        calls.append(out)
        return out

    reward.__name__ = "evalbox_code_reward"
    data = Dataset.from_list([{"prompt": "def add(a, b):", "test": "assert add(2, 3) == 5"}] * 4)
    trainer = GRPOTrainer(
        model=tiny_model(tmp_path / "model"), reward_funcs=[reward], args=config(tmp_path / "out"), train_dataset=data
    )
    trainer.train()
    # Every completion was scored by running it in a sandbox: a random model writes no add().
    assert calls
    assert all(r == 0.0 for batch in calls for r in batch), calls
    assert any("rewards/evalbox_code_reward/mean" in h for h in trainer.state.log_history), trainer.state.log_history
    assert evalbox.Sandbox.list() == []


def test_grpo_step_with_sandbox_environment(
    keyed_server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = keyed_server.new_team(max_sandboxes=8)
    monkeypatch.setenv("EVALBOX_API_URL", keyed_server.url)
    monkeypatch.setenv("EVALBOX_API_KEY", key)
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    made: list[SandboxEnvironment] = []
    factory = SandboxEnvironment.factory(runtime="namespaces", tests_column="test", timeout=5)

    def tracked() -> SandboxEnvironment:
        env = factory()
        made.append(env)
        return env

    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": "Write solution.py."}], "test": "import solution"}] * 4
    )
    trainer = GRPOTrainer(
        model=tiny_model(tmp_path / "model"),
        environment_factory=tracked,
        args=config(tmp_path / "out", max_tool_calling_iterations=1),
        train_dataset=data,
    )
    trainer.train()
    # Each rollout had its own sandbox, and was scored in it: a random model writes no solution.py.
    assert len({e.sandbox.id for e in made if e.sandbox is not None}) >= 2
    history = trainer.state.log_history
    assert any("rewards/SandboxEnvironment/mean" in h for h in history), history
    for e in made:
        e._close()
    assert evalbox.Sandbox.list() == []
