"""The environment base class and the wrapper that guards every episode.

Write an environment the Gymnasium way -- subclass :class:`Env`, implement ``reset`` and
``step`` -- and it works with Gymnasium tooling, the relax_gym checker, the rollout manager, the
evaluator and the trainer::

    class Counting(relax_gym.Env):
        modalities = ("text", "image")
        max_turns = 1

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)                   # seeds self.np_random
            self.n = int(self.np_random.integers(1, 9))
            return Observation([Message.user("How many dots?", draw_dots(self.n))]), {}

        def step(self, action):
            action = Action.coerce(action)
            ok = relax_gym.answers.last_boxed(action.text) == str(self.n)
            return Observation(), float(ok), True, False, {"success": ok}

        def oracle(self):
            yield f"\\boxed{{{self.n}}}"

``relax_gym.make`` wraps each env in :class:`EpisodeGuard`, which enforces the episode
protocol (reset first, no step after the end, the turn limit) and normalises ``info`` so every
consumer can rely on ``info["success"]`` (bool), ``info["reward_components"]`` (dict) and
``info["turn"]``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, ClassVar

import gymnasium
import numpy as np

from relax_gym.errors import EnvStepError, EpisodeEndedError, RelaxGymError, ResetNeededError
from relax_gym.formatting import Style, format_messages
from relax_gym.spaces import ObservationSpace, TextActionSpace
from relax_gym.threads import run_in_thread
from relax_gym.types import Action, Observation

StepResult = tuple[Observation, float, bool, bool, dict[str, Any]]


class Env(gymnasium.Env[Observation, Action | str]):
    """A language-model environment: Gymnasium's ``Env`` with chat observations.

    Class attributes declare what the env is, so it can be listed and filtered without running:

    * ``modalities`` -- which of text / image / audio / video its observations carry;
    * ``tags`` -- free-form labels (``"tools"``, ``"multi-turn"``, ``"math"``, ...);
    * ``max_turns`` -- how many actions an episode may take before it is truncated;
    * ``reward_range`` -- the bounds of the per-step reward.

    Contract:

    * ``reset(*, seed=None, options=None) -> (Observation, info)`` -- call
      ``super().reset(seed=seed)`` first and draw every random choice from ``self.np_random``.
    * ``step(action) -> (Observation, reward, terminated, truncated, info)`` -- ``action`` is an
      :class:`Action` or a plain string (use ``Action.coerce``). Set ``info["success"]`` to a
      bool, separate from the shaped reward, and ``info["reward_components"]`` to a dict when
      the reward has named parts. An invalid action must produce an error observation (or end
      the episode as a failure), never an exception.
    * ``oracle()`` (optional) -- yields the actions of a successful episode; it is advanced one
      action per step, so it may read the env's state after each step.
    * ``format_observation(obs, style)`` -- override only to change how observations render.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"]}
    modalities: tuple[str, ...] = ("text",)
    tags: tuple[str, ...] = ()
    max_turns: int = 1
    reward_range: tuple[float, float] = (0.0, 1.0)
    observation_space = ObservationSpace()
    action_space = TextActionSpace()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        """Start an episode. Subclasses call ``super().reset(seed=seed)`` to seed ``np_random``."""
        super().reset(seed=seed)
        return Observation(), {}

    def step(self, action: Action | str) -> StepResult:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must implement step()")

    def format_observation(self, obs: Observation, style: Style = "openai") -> list[dict[str, Any]]:
        """Render an observation's messages as ``"openai"``, ``"hf"`` or ``"text"`` dicts."""
        return format_messages(obs.messages, style)

    def oracle(self) -> Iterator[Action | str]:
        """Yield the actions of a successful episode from the current state (optional)."""
        raise NotImplementedError(f"{type(self).__name__} has no oracle")

    @property
    def has_oracle(self) -> bool:
        return type(self).oracle is not Env.oracle

    def random_action(self, rng: np.random.Generator) -> Action | str:
        """A random action in the env's answer format: the *random agent* baseline.

        Override it to draw uniformly from the valid answers (a random digit, a random move),
        so the baseline measures guessing rather than malformed output. The default is random
        printable text.
        """
        length = int(rng.integers(1, 32))
        return "".join(chr(int(c)) for c in rng.integers(32, 127, size=length))

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        """Async ``reset``; by default runs ``reset`` in a worker thread (:func:`relax_gym.threads.run_in_thread`)."""
        return await run_in_thread(self.reset, seed=seed, options=options)

    async def astep(self, action: Action | str) -> StepResult:
        """Async ``step``; by default runs ``step`` in a worker thread (:func:`relax_gym.threads.run_in_thread`)."""
        return await run_in_thread(self.step, action)


class Wrapper(gymnasium.Wrapper[Observation, Action | str, Observation, Action | str], Env):
    """Base class for relax_gym wrappers: forwards the relax_gym API to the wrapped env.

    ``areset``/``astep`` are :class:`Env`'s: they run *this* wrapper's ``reset``/``step`` in a
    thread, so the wrapper's own logic applies; a wrapper with native async overrides them.
    """

    def __init__(self, env: Env) -> None:
        gymnasium.Wrapper.__init__(self, env)

    @property
    def modalities(self) -> tuple[str, ...]:  # type: ignore[override]
        return self.env.modalities

    @property
    def tags(self) -> tuple[str, ...]:  # type: ignore[override]
        return self.env.tags

    @property
    def max_turns(self) -> int:  # type: ignore[override]
        return self.env.max_turns

    @property
    def reward_range(self) -> tuple[float, float]:  # type: ignore[override]
        return self.env.reward_range

    @property
    def spec(self) -> Any:  # type: ignore[override]
        return self.env.spec

    @property
    def has_oracle(self) -> bool:
        return self.env.has_oracle

    def format_observation(self, obs: Observation, style: Style = "openai") -> list[dict[str, Any]]:
        return self.env.format_observation(obs, style)

    def oracle(self) -> Iterator[Action | str]:
        return self.env.oracle()

    def random_action(self, rng: np.random.Generator) -> Action | str:
        return self.env.random_action(rng)


class EpisodeGuard(Wrapper):
    """Enforces the episode protocol and normalises what ``step`` returns.

    * ``step`` before ``reset`` raises :class:`ResetNeededError`; ``step`` after the episode
      ended raises :class:`EpisodeEndedError` -- never a silent extra transition.
    * After ``max_turns`` actions without termination the step is marked truncated
      (``info["truncation"] = "max_turns"``).
    * A malformed return value, or an exception inside the env's own code, raises
      :class:`EnvStepError` naming the env, so a bad env fails loudly and attributably.
    * ``info`` always has ``success`` (bool), ``reward_components`` (dict) and ``turn`` (int).
    """

    def __init__(self, env: Env, max_turns: int | None = None) -> None:
        super().__init__(env)
        self._max_turns = int(max_turns) if max_turns is not None else int(env.max_turns)
        if self._max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self._max_turns}")
        self._needs_reset = True
        self._ended: str | None = None
        self._turn = 0

    @property
    def max_turns(self) -> int:  # type: ignore[override]
        return self._max_turns

    @property
    def turn(self) -> int:
        return self._turn

    @property
    def episode_over(self) -> bool:
        return self._ended is not None

    def _name(self) -> str:
        spec = self.spec
        return getattr(spec, "id", None) or type(self.unwrapped).__name__

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        try:
            result = self.env.reset(seed=seed, options=options)
        except RelaxGymError:
            raise
        except Exception as exc:
            raise EnvStepError(f"{self._name()}: reset() raised {type(exc).__name__}: {exc}") from exc
        if not (isinstance(result, tuple) and len(result) == 2):
            raise EnvStepError(f"{self._name()}: reset() must return (Observation, info)")
        obs, info = result
        if not isinstance(obs, Observation) or not isinstance(info, dict):
            raise EnvStepError(
                f"{self._name()}: reset() returned ({type(obs).__name__}, {type(info).__name__}); "
                "expected (Observation, dict)"
            )
        self._needs_reset = False
        self._ended = None
        self._turn = 0
        return obs, info

    def step(self, action: Action | str) -> StepResult:
        if self._needs_reset:
            raise ResetNeededError(f"{self._name()}: call reset() before step()")
        if self._ended is not None:
            raise EpisodeEndedError(
                f"{self._name()}: step() called after the episode {self._ended} at turn "
                f"{self._turn}; call reset() to start a new episode"
            )
        action = Action.coerce(action)
        try:
            result = self.env.step(action)
        except RelaxGymError:
            self._ended = "failed"
            raise
        except Exception as exc:
            self._ended = "failed"
            raise EnvStepError(f"{self._name()}: step() raised {type(exc).__name__}: {exc}") from exc
        obs, reward, terminated, truncated, info = self._validate(result)
        self._turn += 1
        info["turn"] = self._turn
        if not terminated and not truncated and self._turn >= self._max_turns:
            truncated = True
            info["truncation"] = "max_turns"
        if terminated or truncated:
            self._ended = "terminated" if terminated else "was truncated"
        return obs, reward, terminated, truncated, info

    def _validate(self, result: Any) -> StepResult:
        name = self._name()
        if not (isinstance(result, tuple) and len(result) == 5):
            raise EnvStepError(f"{name}: step() must return (obs, reward, terminated, truncated, info)")
        obs, reward, terminated, truncated, info = result
        if not isinstance(obs, Observation):
            raise EnvStepError(f"{name}: step() returned {type(obs).__name__}, expected Observation")
        if not isinstance(info, dict):
            raise EnvStepError(f"{name}: step() info is {type(info).__name__}, expected dict")
        try:
            reward_f = float(reward)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise EnvStepError(f"{name}: step() reward {reward!r} is not a number") from None
        if not math.isfinite(reward_f):
            raise EnvStepError(f"{name}: step() reward is {reward_f}")
        info = dict(info)
        success = info.get("success", False)
        if not isinstance(success, (bool, int)) or isinstance(success, float):
            raise EnvStepError(f"{name}: info['success'] must be a bool, got {success!r}")
        info["success"] = bool(success)
        components = info.get("reward_components")
        if components is None:
            components = {"env": reward_f}
        elif not isinstance(components, dict):
            raise EnvStepError(f"{name}: info['reward_components'] must be a dict")
        info["reward_components"] = {str(k): float(v) for k, v in components.items()}
        return obs, reward_f, bool(terminated), bool(truncated), info

