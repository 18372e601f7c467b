"""A tiny OpenEnv env server (openenv's echo template, shortened), run inside an evalbox sandbox by
test_openenv.py: it echoes each step's message, rewarding its length."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class EchoAction(Action):
    message: str = Field(...)


class EchoObservation(Observation):
    echoed_message: str = ""
    message_length: int = 0


class EchoEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> EchoObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return EchoObservation(echoed_message="ready", done=False, reward=0.0)

    def step(self, action: EchoAction, timeout_s: float | None = None, **kw: Any) -> EchoObservation:
        self._state.step_count += 1
        return EchoObservation(
            echoed_message=action.message,
            message_length=len(action.message),
            reward=min(len(action.message) * 0.1, 1.0),
            done=action.message == "bye",
        )

    @property
    def state(self) -> State:
        return self._state


app = create_app(EchoEnvironment, EchoAction, EchoObservation, env_name="echo", max_concurrent_envs=4)
