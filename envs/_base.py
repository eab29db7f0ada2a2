"""Shared base for the shipped single-question envs: one prompt, one ``\\boxed{}`` answer.

A subclass declares its difficulty levels and implements three small methods:

* ``make_task(level)`` -- draw a task from ``self.np_random`` and render its media;
* ``parse_answer(raw)`` -- turn the text inside ``\\boxed{}`` into a comparable value (or None
  when it is not a well-formed answer);
* ``random_answer(rng)`` -- a uniformly drawn well-formed answer (the random-agent baseline).

Everything else -- seeding, the observation, grading, ``info`` and the oracle -- lives here, so
every env scores the same way: ``1.0`` for a right answer, ``0.1`` for a well-formed wrong one,
``0`` otherwise, and ``info["success"]`` only for the right answer. :class:`TaskEnv` holds the
part that the tool envs' tasks (``_tool_task.ToolTask``) share: levels, reset and grading.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np

from relax_gym.core import Env
from relax_gym.errors import RelaxGymError
from relax_gym.types import Action, ContentPart, Message, Observation

from ._answers import boxed_answer

LevelT = TypeVar("LevelT")
DIFFICULTIES: tuple[str, ...] = ("easy", "medium", "hard")
FORMAT_REWARD = 0.1


@dataclass(frozen=True)
class Task:
    """One generated question.

    ``target`` is what ``parse_answer`` must return for a right answer (``also_correct`` holds
    other parsed answers that are equally right, for tasks whose evidence allows several);
    ``answer`` is the canonical text the oracle puts inside ``\\boxed{}``; ``details``
    (JSON-friendly) goes into the step ``info`` so transcripts show what was asked.
    """

    prompt: str
    target: Hashable
    answer: str
    media: tuple[ContentPart, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)
    also_correct: frozenset[Hashable] = frozenset()

    def accepts(self, parsed: Hashable | None) -> bool:
        return parsed is not None and (parsed == self.target or parsed in self.also_correct)


class EnvOptionError(RelaxGymError, ValueError):
    """A constructor option of a shipped env has a bad value (the CLI prints it cleanly)."""


def check_difficulty(difficulty: str, levels: Mapping[str, Any]) -> None:
    if difficulty not in levels:
        raise EnvOptionError(f"difficulty must be one of {list(levels)}, got {difficulty!r}")


class TaskEnv(Env, Generic[LevelT]):
    """One task per episode, drawn at a named difficulty; the base of both kinds of shipped env.

    Subclasses set ``levels`` and implement ``make_task`` (and ``parse_answer`` /
    ``random_answer`` for answer tasks); :meth:`grade_answer` scores every env the same way.
    """

    levels: ClassVar[Mapping[str, Any]]
    max_turns = 1

    def __init__(self, difficulty: str = "easy") -> None:
        check_difficulty(difficulty, self.levels)
        self.difficulty = difficulty
        self.level: LevelT = self.levels[difficulty]
        self.task: Task | None = None

    # -- subclass hooks ---------------------------------------------------------------------------
    def make_task(self, level: LevelT) -> Task:  # pragma: no cover - abstract
        raise NotImplementedError

    def parse_answer(self, raw: str) -> Hashable | None:
        """Default: the answer text, whitespace-collapsed and lower-cased."""
        cleaned = " ".join(raw.split()).lower()
        return cleaned or None

    def random_answer(self, rng: np.random.Generator) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- the Env API ------------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        super().reset(seed=seed)
        self.task = self.make_task(self.level)
        return Observation([Message.user(self.task.prompt, *self.task.media)]), {"difficulty": self.difficulty}

    def grade_answer(self, raw: str | None) -> tuple[float, dict[str, Any]]:
        """(reward, info) for the answer text ``raw`` (None: no answer found in the reply)."""
        task = self.require_task()
        parsed = self.parse_answer(raw) if raw is not None else None
        correct = task.accepts(parsed)
        well_formed = parsed is not None
        info = {
            "success": correct,
            "reward_components": {
                "correct": 1.0 if correct else 0.0,
                "format": FORMAT_REWARD if well_formed and not correct else 0.0,
            },
            "answer": raw,
            "well_formed": well_formed,
            "target": task.answer,
        }
        return (1.0 if correct else (FORMAT_REWARD if well_formed else 0.0)), info

    def require_task(self) -> Task:
        if self.task is None:
            raise RuntimeError(f"{type(self).__name__}: call reset() first")
        return self.task


class BoxedAnswerEnv(TaskEnv[LevelT]):
    """A one-turn question answered as ``\\boxed{...}``; subclasses generate and parse."""

    def step(self, action: Action | str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        task = self.require_task()
        reward, info = self.grade_answer(boxed_answer(Action.coerce(action).text))
        return Observation(), reward, True, False, {**info, **task.details}

    def oracle(self) -> Iterator[str]:
        yield f"\\boxed{{{self.require_task().answer}}}"

    def random_action(self, rng: np.random.Generator) -> str:
        return f"\\boxed{{{self.random_answer(rng)}}}"
