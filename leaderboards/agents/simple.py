"""Agents that need no model: the env's random baseline, its oracle, and user callables."""

from __future__ import annotations

import asyncio
import importlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from relax_gym.core import Env
from relax_gym.types import Action, Message, Observation, ToolSpec

from .base import Agent, AgentError, AgentOptions, AgentSession, EpisodeInfo, FatalAgentError, TurnResult, count_media


def _turn(action: Action | str) -> TurnResult:
    act = Action.coerce(action)
    return TurnResult(action=act, message=Message.assistant(act.text, tool_calls=list(act.tool_calls)))


class RandomAgent(Agent):
    """``random``: ``env.random_action`` with an RNG seeded from the episode key."""

    spec = "random"

    def session(self, env: Env, episode: EpisodeInfo) -> AgentSession:
        return _RandomSession(env, np.random.default_rng(episode.agent_seed))


class _RandomSession(AgentSession):
    def __init__(self, env: Env, rng: np.random.Generator) -> None:
        self.env, self.rng = env, rng

    async def act(self, observation: Observation) -> TurnResult:
        return _turn(self.env.random_action(self.rng))


class OracleAgent(Agent):
    """``oracle``: replays ``env.oracle()``, advanced one action per step."""

    spec = "oracle"

    def session(self, env: Env, episode: EpisodeInfo) -> AgentSession:
        if not env.has_oracle:
            raise AgentError(f"{episode.env_id} has no oracle")
        return _OracleSession(env)


class _OracleSession(AgentSession):
    def __init__(self, env: Env) -> None:
        self.env = env
        self._plan: Iterator[Action | str] | None = None

    async def act(self, observation: Observation) -> TurnResult:
        if self._plan is None:  # created lazily: the env has been reset by now
            self._plan = iter(self.env.oracle())
        try:
            action = next(self._plan)
        except StopIteration:
            raise AgentError("the oracle ran out of actions before the episode ended") from None
        return _turn(action)


Policy = Callable[[list[Message], list[ToolSpec]], Any]


class PythonAgent(Agent):
    """``python:module:callable``: a custom agent.

    The callable is either an :class:`Agent` subclass (instantiated with the
    :class:`AgentOptions`) or a *policy*: ``fn(messages, tools) -> Action | str`` (sync or
    async), called with the whole conversation so far (observations and the policy's own
    earlier answers) and the tools of the latest observation that offered any.
    """

    def __init__(self, spec: str, policy: Policy) -> None:
        self.spec = spec
        self._policy = policy

    def session(self, env: Env, episode: EpisodeInfo) -> AgentSession:
        return _PolicySession(self._policy)


class _PolicySession(AgentSession):
    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.history: list[Message] = []
        self.tools: list[ToolSpec] = []

    async def act(self, observation: Observation) -> TurnResult:
        self.history.extend(observation.messages)
        if observation.tools:
            self.tools = list(observation.tools)
        if inspect.iscoroutinefunction(self.policy):
            out = await self.policy(list(self.history), list(self.tools))
        else:
            out = await asyncio.to_thread(self.policy, list(self.history), list(self.tools))
        if not isinstance(out, (str, Action)):
            raise AgentError(f"the policy returned {type(out).__name__}; it must return str or relax_gym.Action")
        turn = _turn(out)
        turn.media_sent = count_media(observation.messages)
        self.history.append(turn.message)
        return turn


def _load_callable(target: str) -> Any:
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise FatalAgentError(f"python agent {target!r} must look like 'package.module:callable'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise FatalAgentError(f"python agent: cannot import {module_name!r}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise FatalAgentError(f"python agent: {module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise FatalAgentError(f"python agent: {target!r} is not callable")
    return obj


def make_python_agent(spec: str, target: str, options: AgentOptions) -> Agent:
    obj = _load_callable(target)
    if isinstance(obj, type) and issubclass(obj, Agent):
        agent = obj(options)  # type: ignore[call-arg]
        agent.spec = spec
        return agent
    return PythonAgent(spec, obj)


__all__ = ["OracleAgent", "PythonAgent", "RandomAgent", "make_python_agent"]
