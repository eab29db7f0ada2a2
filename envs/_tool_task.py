"""Shared base of the shipped tool-using envs: a *task* that grades the final answer, wrapped in
``ToolEnv`` with the tools the task needs.

Each tool env module defines two classes:

* a :class:`ToolTask` (a ``_base.TaskEnv``): draws the task from its seed, may provide tools bound
  to the episode (``tools()``, e.g. a shop database's ``place_order``), and grades the final
  reply -- by default as an answer compared with the task's target (``1.0`` right, ``0.1``
  well-formed but wrong, ``0`` otherwise, like the tool-free envs);
* a :class:`ToolTaskEnv` (a ``ToolEnv``), the registered class: it fixes the shared tools and
  the tool budget, declares modalities/tags/turn limit as class attributes for the registry,
  and holds the **oracle**, a scripted agent that calls the tools in model-style text (the
  env's tool-call format: Qwen3/Hermes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  by default, ``parser="qwen3_coder"`` or ``"openai"`` on request), reads their results from
  the observations and then answers -- so an oracle episode exercises the tools like a model's.
  Its random agent calls a tool with random arguments or gives a random answer.

The final answer is what ``submit_answer(answer=...)`` hands over, or a reply without a tool
call; in both, the content of the last ``\\boxed{...}`` counts when there is one, else the
whole text (thinking removed).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, Generic, TypeVar, cast

import numpy as np
from relax_gym.tools import Tool, ToolEnv, strip_thinking

from relax_gym.core import StepResult
from relax_gym.types import Action, Observation, ToolCall

from ._answers import boxed_answer
from ._base import TaskEnv

LevelT = TypeVar("LevelT")
TaskT = TypeVar("TaskT", bound="ToolTask[Any]")
MAX_ANSWER_CHARS = 200  # a longer un-boxed reply is prose, not an answer


def answer_text(reply: str) -> str | None:
    """The answer in a final reply: the last ``\\boxed{}``'s content, else the whole (short) text."""
    text = strip_thinking(reply)
    boxed = boxed_answer(text)
    if boxed is not None:
        return boxed
    text = text.strip()
    return text if 0 < len(text) <= MAX_ANSWER_CHARS else None


class OracleError(RuntimeError):
    """The scripted oracle met a tool result it did not expect (a bug in the env or a tool)."""


class ToolTask(TaskEnv[LevelT]):
    """The inner env of a tool env: one task, one final answer (tools run in the wrapper).

    Subclasses set ``levels`` and implement ``make_task`` (and ``parse_answer`` /
    ``random_answer`` for answer tasks); state-graded tasks override ``grade``.
    """

    def grade(self, reply: str) -> tuple[float, dict[str, Any]]:
        """(reward, info) for the final reply; default: compare the parsed answer with the target."""
        return self.grade_answer(answer_text(reply))

    def step(self, action: Action | str) -> StepResult:
        task = self.require_task()
        reward, info = self.grade(Action.coerce(action).text)
        return Observation(), reward, True, False, {**info, **task.details}


class ToolTaskEnv(ToolEnv, Generic[TaskT]):
    """A registered tool env: ``ToolEnv(task_cls(difficulty), shared tools, budget)``.

    Subclasses set ``task_cls``, ``tool_budget``, ``modalities``, ``tags`` and implement
    ``oracle`` (with :meth:`call`, :meth:`tool_text` and :meth:`submit`) and
    ``random_tool_call``. ``max_turns`` is derived: one answer, the budget, one spare turn.
    """

    task_cls: ClassVar[type[ToolTask[Any]]]
    tool_budget: ClassVar[int] = 6
    answer_tool: ClassVar[str] = "submit_answer"  # the tool the oracle and the random agent answer with
    parallel_tools: ClassVar[bool] = True  # run the calls of one turn concurrently
    random_tool_p: ClassVar[float] = 0.5  # how often the random agent calls a tool instead of answering
    # class attributes (not ToolEnv's properties), so the registry can read them without an instance
    modalities: ClassVar[tuple[str, ...]] = ("text",)  # type: ignore[misc]
    tags: ClassVar[tuple[str, ...]] = ("tools",)  # type: ignore[misc]
    max_turns: ClassVar[int] = 1 + 6 + 1  # type: ignore[misc]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        task_cls = getattr(cls, "task_cls", None)
        if task_cls is not None:
            cls.max_turns = int(task_cls.max_turns) + cls.tool_budget + 1

    def __init__(self, difficulty: str = "easy", *, parser: str = "hermes") -> None:
        super().__init__(
            self.task_cls(difficulty),
            tools=self.shared_tools(),
            parser=parser,
            max_tool_calls=self.tool_budget,
            parallel=self.parallel_tools,
        )
        self.last_observation = Observation()

    @classmethod
    def shared_tools(cls) -> Sequence[Tool]:
        """The tools every episode offers besides the task's own ``tools()``."""
        return ()

    @property
    def task_env(self) -> TaskT:
        return cast(TaskT, self.env.unwrapped)

    @property
    def has_oracle(self) -> bool:
        return True

    # -- remember the latest observation: the oracle reads tool results from it ---------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]:
        obs, info = super().reset(seed=seed, options=options)
        self.last_observation = obs
        return obs, info

    def step(self, action: Action | str) -> StepResult:
        result = super().step(action)
        self.last_observation = result[0]
        return result

    async def astep(self, action: Action | str) -> StepResult:
        result = await super().astep(action)
        self.last_observation = result[0]
        return result

    # -- oracle helpers -----------------------------------------------------------------------------
    def call(self, name: str, /, **arguments: Any) -> Action | str:
        """One tool call as the model would write it with this env's parser."""
        return self.calls([(name, arguments)])

    def calls(self, calls: Sequence[tuple[str, dict[str, Any]]]) -> Action | str:
        """Several tool calls in one turn (they run concurrently)."""
        tool_calls = [ToolCall(name, dict(args)) for name, args in calls]
        rendered = self.parser.render(tool_calls)
        return rendered if isinstance(rendered, str) else Action(text="", tool_calls=tool_calls)

    def submit(self, answer: str | float) -> Action | str:
        return self.call(self.answer_tool, answer=str(answer))

    def tool_texts(self, name: str) -> list[str]:
        """Texts of this turn's results of tool ``name``, in call order; an error result raises."""
        out = []
        for msg in self.last_observation.messages:
            if msg.role == "tool" and msg.name == name:
                if msg.text.startswith("Error:"):
                    raise OracleError(f"{type(self).__name__} oracle: tool {name!r} failed: {msg.text[:300]}")
                out.append(msg.text)
        if not out:
            raise OracleError(f"{type(self).__name__} oracle: no result of tool {name!r} in the last observation")
        return out

    def tool_text(self, name: str) -> str:
        return self.tool_texts(name)[-1]

    def tool_json(self, name: str) -> Any:
        return json.loads(self.tool_text(name))

    # -- the random agent ---------------------------------------------------------------------------
    def random_tool_call(self, rng: np.random.Generator) -> tuple[str, dict[str, Any]]:  # pragma: no cover
        raise NotImplementedError

    def random_action(self, rng: np.random.Generator) -> Action | str:
        """A random well-formed turn: a tool call with random arguments, or a random answer
        (through ``submit_answer`` or as ``\\boxed{}``) -- never a look at the task's target."""
        if rng.random() < self.random_tool_p:
            name, arguments = self.random_tool_call(rng)
            return self.call(name, **arguments)
        answer = self.task_env.random_answer(rng)
        return self.submit(answer) if rng.random() < 0.5 else f"The answer is \\boxed{{{answer}}}."

    def oracle(self) -> Iterator[Action | str]:  # pragma: no cover - abstract
        raise NotImplementedError


def pick(rng: np.random.Generator, options: Sequence[Any]) -> Any:
    """A uniform choice that keeps the element's own type (``rng.choice`` returns numpy types)."""
    return options[int(rng.integers(0, len(options)))]

