"""CalcArithmetic: a chain of large-number arithmetic steps, worked out with a calculator tool.

* **Task** -- start from a number and apply a list of operations in order (add, subtract,
  multiply, divide exactly, square, take a remainder), with numbers large enough that mental
  arithmetic is unreliable; give the final whole number.
* **Observation** -- one user message with the numbered steps (text only) and the tools:
  `calculator(expression)` (exact integer arithmetic) and `submit_answer(answer)`.
* **Action** -- tool calls in the model's format (Qwen3/Hermes `<tool_call>` blocks by default;
  the env takes `parser="qwen3_coder"` or `"openai"` too), then the answer: `submit_answer` with
  the number, or a reply ending in `\\boxed{N}`.
* **Reward** -- 1.0 for the right number, 0.1 for a well-formed wrong integer, else 0;
  `success` means the right number. `info["tools"]` counts the calls.
* **Difficulty** -- `easy`: 2 steps on 3-4 digit numbers (one a 3-digit multiplier). `medium`: 4 steps on 4-5 digit
  numbers, one exact division. `hard`: 6 steps on 5-6 digit numbers with exact division,
  squaring and a remainder. Tool budget: 6 calls.

The oracle copies groups of up to three steps into one calculator expression, reads each
result back from the tool message and carries it into the next group.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from relax_gym.tools import Tool, calculator, submit_answer

from relax_gym.types import Action

from ._answers import parse_int
from ._base import Task
from ._tool_task import OracleError, ToolTask, ToolTaskEnv, pick

STEPS_PER_CALL = 3


@dataclass(frozen=True)
class Op:
    """One step: ``kind`` in add/sub/mul/div/square/mod, with its operand (0 for square)."""

    kind: str
    n: int = 0

    def apply(self, v: int) -> int:
        if self.kind == "add":
            return v + self.n
        if self.kind == "sub":
            return v - self.n
        if self.kind == "mul":
            return v * self.n
        if self.kind == "div":
            if v % self.n:
                raise ValueError(f"{v} is not divisible by {self.n}")
            return v // self.n
        if self.kind == "square":
            return v * v
        if self.kind == "mod":
            return v % self.n
        raise ValueError(f"unknown step {self.kind!r}")

    def text(self) -> str:
        return {
            "add": f"Add {self.n:,}.",
            "sub": f"Subtract {self.n:,}.",
            "mul": f"Multiply by {self.n:,}.",
            "div": f"Divide by {self.n:,} (it divides exactly).",
            "square": "Square the result (multiply it by itself).",
            "mod": f"Take the remainder after dividing by {self.n:,}.",
        }[self.kind]

    def expression(self, inner: str) -> str:
        """This step applied to the calculator expression ``inner``."""
        symbol = {"add": "+", "sub": "-", "mul": "*", "div": "/", "mod": "%"}.get(self.kind)
        inner = inner if inner.isdigit() else f"({inner})"
        return f"{inner}^2" if symbol is None else f"{inner} {symbol} {self.n}"


@dataclass(frozen=True)
class Level:
    start_digits: tuple[int, int]
    operand_digits: tuple[int, int]  # of added / subtracted numbers
    factor_digits: tuple[int, int]  # of multipliers
    plan: tuple[str, ...]  # step kinds in order; "div" is preceded by an adjusted add/sub
    answer_range: tuple[int, int]  # the random agent guesses log-uniformly here


LEVELS = {
    "easy": Level((3, 4), (3, 4), (3, 3), ("mul", "addsub"), (10**4, 10**8)),
    "medium": Level((4, 5), (4, 5), (3, 4), ("mul", "addsub", "div", "mul"), (10**3, 10**12)),
    "hard": Level((5, 6), (5, 6), (3, 4), ("mul", "addsub", "div", "square", "addsub", "mod"), (0, 10**5)),
}


def _digits(rng: np.random.Generator, lo: int, hi: int) -> int:
    """A uniform integer whose digit count is in [lo, hi]."""
    d = int(rng.integers(lo, hi + 1))
    return int(rng.integers(10 ** (d - 1), 10**d))


def _add_or_sub(rng: np.random.Generator, value: int, level: Level, divisor: int = 1) -> Op:
    """Add or subtract a number, nudged so that the result is a positive multiple of ``divisor``."""
    n = _digits(rng, *level.operand_digits)
    if n + divisor <= value and rng.random() < 0.5:
        return Op("sub", n + (value - n) % divisor)  # leaves value - n rounded down: >= 1
    return Op("add", n + (-(value + n)) % divisor)


def make_chain(rng: np.random.Generator, level: Level) -> tuple[int, list[Op]]:
    """A start value and steps following ``level.plan``; every intermediate value stays a
    positive whole number and every division is exact (the add/sub before it is nudged)."""
    start = _digits(rng, *level.start_digits)
    value, ops = start, []
    for i, kind in enumerate(level.plan):
        if kind == "mul":
            step = [Op("mul", _digits(rng, *level.factor_digits))]
        elif kind == "addsub":
            divisor = int(rng.integers(7, 98)) if level.plan[i + 1 : i + 2] == ("div",) else 1
            step = [_add_or_sub(rng, value, level, divisor)] + ([Op("div", divisor)] if divisor > 1 else [])
        elif kind == "div":
            continue  # emitted together with the add/sub before it
        elif kind == "square":
            step = [Op("square")]
        elif kind == "mod":
            step = [Op("mod", int(rng.integers(10**4, 10**5)))]
        else:
            raise ValueError(f"unknown step kind {kind!r}")
        for op in step:
            value = op.apply(value)
            ops.append(op)
    return start, ops


def run_chain(start: int, ops: list[Op]) -> int:
    value = start
    for op in ops:
        value = op.apply(value)
    return value


class CalcArithmeticTask(ToolTask[Level]):
    """The chain of steps; graded on the final whole number."""

    levels = LEVELS
    modalities = ("text",)

    def __init__(self, difficulty: str = "easy") -> None:
        super().__init__(difficulty)
        self.start = 0
        self.ops: list[Op] = []

    def make_task(self, level: Level) -> Task:
        start, ops = make_chain(self.np_random, level)
        self.start, self.ops = start, ops
        answer = run_chain(start, ops)
        lines = [f"1. Start with {start:,}."] + [f"{i}. {op.text()}" for i, op in enumerate(ops, start=2)]
        prompt = (
            "Carry out these steps in order, each on the result of the one before:\n"
            + "\n".join(lines)
            + "\nThe numbers are large: use the calculator tool for the arithmetic. When you have the final "
            "whole number, call submit_answer with just the number (or reply with \\boxed{N})."
        )
        details = {"start": start, "steps": [op.text() for op in ops]}
        return Task(prompt, answer, str(answer), (), details)

    def parse_answer(self, raw: str) -> int | None:
        return parse_int(raw)

    def random_answer(self, rng: np.random.Generator) -> str:
        lo, hi = self.level.answer_range
        return str(int(math.exp(rng.uniform(math.log(max(lo, 1)), math.log(hi)))))


class CalcArithmeticEnv(ToolTaskEnv[CalcArithmeticTask]):
    """Multi-step large-number arithmetic with a calculator tool; answer with submit_answer."""

    task_cls = CalcArithmeticTask
    tool_budget = 6
    modalities = ("text",)
    tags = ("tools", "multi-turn", "math")

    @classmethod
    def shared_tools(cls) -> list[Tool]:
        return [calculator, submit_answer]

    def random_tool_call(self, rng: np.random.Generator) -> tuple[str, dict[str, Any]]:
        a, b = int(rng.integers(1, 10**6)), int(rng.integers(1, 10**4))
        return "calculator", {"expression": f"{a} {pick(rng, ('+', '-', '*', '/'))} {b}"}

    def oracle(self) -> Iterator[Action | str]:
        task = self.task_env
        task.require_task()
        ops = task.ops
        value = str(task.start)
        for i in range(0, len(ops), STEPS_PER_CALL):
            expression = value
            for op in ops[i : i + STEPS_PER_CALL]:
                expression = op.expression(expression)
            yield self.call("calculator", expression=expression)
            value = self.tool_text("calculator").strip()
            if parse_int(value) is None:
                raise OracleError(f"calculator returned {value!r} for {expression!r}")
        yield self.submit(value)

