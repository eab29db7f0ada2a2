"""PyPuzzle: compute a number that takes a loop or a simulation, with a sandboxed python tool.

* **Task** -- one puzzle from six families: Collatz steps, the sum of the primes below a
  bound, the Josephus survivor, a linear congruential generator's values, counting numbers by
  digit sum, and counting monotone paths through a grid with blocked cells (the grid is shown
  as text). Each has one whole-number answer.
* **Observation** -- one user message with the puzzle (text only) and the tools:
  `python(code)` (runs in the sandbox: no network, read-only filesystem, 5 s and 1 GB per
  call; returns what the code prints) and `submit_answer(answer)`.
* **Action** -- tool calls in the model's format (Qwen3/Hermes `<tool_call>` blocks by default;
  the env takes `parser="qwen3_coder"` or `"openai"` too), then the answer: `submit_answer` with
  the number, or a reply ending in `\\boxed{N}`.
* **Reward** -- 1.0 for the right number, 0.1 for a well-formed wrong integer, else 0;
  `success` means the right number.
* **Difficulty** -- `easy`: small inputs (Collatz from 3-digit starts, primes below 2000,
  a dozen people in the circle...). `medium`: inputs of 10^4-10^6 and 6x6-8x8 grids.
  `hard`: primes below 3x10^5, circles of 2000-20000 people, 5000-20000 generator steps,
  digit sums up to 10^12 (too many to enumerate: it takes a digit DP) and grids of 10x10 to
  14x14. Tool budget: 4 calls.

The env computes each answer with the solver functions below; the oracle sends the same
function's source to the python tool, reads the printed number back and submits it. Tests
check every solver against a brute force on small inputs.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from relax_gym.tools import Tool, make_python_tool, submit_answer

from relax_gym.types import Action

from ._answers import parse_int
from ._base import Task
from ._tool_task import OracleError, ToolTask, ToolTaskEnv, pick

PYTHON = make_python_tool(timeout_s=5.0, memory_mb=1024)


# -- solvers: self-contained functions, imports inside (their source is what the oracle runs) ----
def collatz_steps(n: int) -> int:
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


def prime_sum(limit: int) -> int:
    import itertools
    import math

    sieve = bytearray([1]) * limit
    sieve[0:2] = b"\x00\x00"
    for i in range(2, math.isqrt(limit) + 1):
        if sieve[i]:
            sieve[i * i :: i] = bytearray(len(range(i * i, limit, i)))
    return sum(itertools.compress(range(limit), sieve))


def josephus(n: int, k: int) -> int:
    survivor = 0
    for size in range(2, n + 1):
        survivor = (survivor + k) % size
    return survivor + 1


def lcg_count(a: int, c: int, m: int, seed: int, steps: int, below: int) -> int:
    x, count = seed, 0
    for _ in range(steps):
        x = (a * x + c) % m
        if x < below:
            count += 1
    return count


def digit_sum_count(hi: int, s: int) -> int:
    from functools import cache

    digits = [int(d) for d in str(hi)]

    @cache
    def count(i: int, total: int, tight: bool) -> int:
        if total > s:
            return 0
        if i == len(digits):
            return int(total == s)
        top = digits[i] if tight else 9
        return sum(count(i + 1, total + d, tight and d == top) for d in range(top + 1))

    return count(0, 0, True) - (1 if s == 0 else 0)


def grid_paths(grid: list[str]) -> int:
    rows, cols = len(grid), len(grid[0])
    ways = [[0] * cols for _ in range(rows)]
    for r in range(rows):
        for c in range(cols):
            if grid[r][c] == "#":
                continue
            if r == 0 and c == 0:
                ways[r][c] = 1
            else:
                ways[r][c] = (ways[r - 1][c] if r else 0) + (ways[r][c - 1] if c else 0)
    return ways[-1][-1]


SOLVERS: dict[str, Callable[..., int]] = {
    f.__name__: f for f in (collatz_steps, prime_sum, josephus, lcg_count, digit_sum_count, grid_paths)
}


def solver_code(name: str, args: dict[str, Any]) -> str:
    """A program printing the solver's answer (the solvers import what they use themselves)."""
    call = ", ".join(f"{k}={v!r}" for k, v in args.items())
    return f"{inspect.getsource(SOLVERS[name])}\nprint({name}({call}))\n"


# -- puzzles ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Level:
    collatz: tuple[int, int]
    primes: tuple[int, int]
    josephus_n: tuple[int, int]
    josephus_k: tuple[int, int]
    lcg_steps: tuple[int, int]
    digits_hi: tuple[int, int]  # powers of ten bounding the upper end
    grid: tuple[int, int]
    families: tuple[str, ...]
    answer_range: tuple[int, int]  # the random agent guesses log-uniformly here


LEVELS = {
    "easy": Level((100, 999), (200, 2000), (10, 40), (2, 5), (20, 60), (3, 4), (4, 5),
                  ("collatz_steps", "prime_sum", "josephus", "lcg_count", "digit_sum_count", "grid_paths"), (1, 10**6)),
    "medium": Level((10**4, 10**6), (10**4, 10**5), (100, 2000), (3, 12), (500, 5000), (5, 6), (6, 8),
                    ("collatz_steps", "prime_sum", "josephus", "lcg_count", "digit_sum_count", "grid_paths"), (1, 10**9)),
    "hard": Level((10**6, 10**8), (10**5, 3 * 10**5), (2000, 20000), (5, 40), (5000, 20000), (8, 12), (10, 14),
                  ("prime_sum", "josephus", "lcg_count", "digit_sum_count", "grid_paths"), (1, 10**12)),
}


def _between(rng: np.random.Generator, lo_hi: tuple[int, int]) -> int:
    return int(rng.integers(lo_hi[0], lo_hi[1] + 1))


def make_puzzle(rng: np.random.Generator, level: Level) -> tuple[str, str, dict[str, Any]]:
    """(statement, solver name, solver arguments) for one puzzle of ``level``."""
    family = str(pick(rng, level.families))
    if family == "collatz_steps":
        n = _between(rng, level.collatz)
        text = (
            f"Start with n = {n}. Repeatedly replace n by n / 2 if n is even, or by 3n + 1 if n is odd, until n "
            "becomes 1. How many replacements does that take?"
        )
        return text, family, {"n": n}
    if family == "prime_sum":
        limit = _between(rng, level.primes)
        return f"What is the sum of all prime numbers below {limit}?", family, {"limit": limit}
    if family == "josephus":
        n, k = _between(rng, level.josephus_n), _between(rng, level.josephus_k)
        text = (
            f"{n} people stand in a circle, numbered 1 to {n}. Starting the count at person 1, every {k}th person "
            f"still in the circle is removed (so person {k} goes first, if {k} <= {n}); counting goes on around the "
            "circle from the next person. What is the number of the last person left?"
        )
        return text, family, {"n": n, "k": k}
    if family == "lcg_count":
        m = int(pick(rng, (2**16, 2**20, 10**6 + 3, 2**24)))
        a, c, seed = int(rng.integers(3, m // 7)) | 1, int(rng.integers(1, m)), int(rng.integers(0, m))
        steps, below = _between(rng, level.lcg_steps), int(rng.integers(m // 10, m // 2))
        text = (
            f"A generator starts with x = {seed} and repeats x = ({a} * x + {c}) mod {m}. Of the first {steps} "
            f"values it produces (not counting the start), how many are smaller than {below}?"
        )
        return text, family, {"a": a, "c": c, "m": m, "seed": seed, "steps": steps, "below": below}
    if family == "digit_sum_count":
        lo, hi = level.digits_hi
        upper = int(rng.integers(10**lo, 10**hi))
        s = int(rng.integers(3, 9 * len(str(upper)) // 2 + 2))
        return f"How many whole numbers from 1 to {upper:,} have digits that add up to {s}?", family, {"hi": upper, "s": s}
    if family == "grid_paths":
        rows, cols = _between(rng, level.grid), _between(rng, level.grid)
        for density in np.linspace(0.2, 0.0, 21):  # thin the walls until a path exists (an empty grid has one)
            cells = rng.random((rows, cols)) < density
            cells[0, 0] = cells[-1, -1] = False
            grid = ["".join("#" if b else "." for b in row) for row in cells]
            if grid_paths(grid) > 0:
                break
        text = (
            f"In this {rows}x{cols} grid, '#' cells are blocked:\n" + "\n".join(grid) + "\nHow many paths lead from "
            "the top-left cell to the bottom-right cell, moving only right or down and never through a blocked cell?"
        )
        return text, family, {"grid": grid}
    raise ValueError(f"unknown puzzle family {family!r}")


class PyPuzzleTask(ToolTask[Level]):
    """One puzzle; graded on the whole-number answer."""

    levels = LEVELS
    modalities = ("text",)

    def __init__(self, difficulty: str = "easy") -> None:
        super().__init__(difficulty)
        self.solver = ""
        self.args: dict[str, Any] = {}

    def make_task(self, level: Level) -> Task:
        text, solver, args = make_puzzle(self.np_random, level)
        self.solver, self.args = solver, args
        answer = SOLVERS[solver](**args)
        prompt = (
            f"{text}\n\nWrite Python and run it with the python tool to work this out (print the result). When you "
            "have the number, call submit_answer with just the number (or reply with \\boxed{N})."
        )
        return Task(prompt, answer, str(answer), (), {"puzzle": solver})

    def parse_answer(self, raw: str) -> int | None:
        return parse_int(raw)

    def random_answer(self, rng: np.random.Generator) -> str:
        lo, hi = self.level.answer_range
        return str(int(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


class PyPuzzleEnv(ToolTaskEnv[PyPuzzleTask]):
    """Python puzzles (loops, simulations, DP) solved with the sandboxed python tool."""

    task_cls = PyPuzzleTask
    tool_budget = 4
    random_tool_p = 0.3  # each random call is a real sandbox run: keep the baseline cheap
    modalities = ("text",)
    tags = ("tools", "multi-turn", "code", "math")

    @classmethod
    def shared_tools(cls) -> list[Tool]:
        return [PYTHON, submit_answer]

    def random_tool_call(self, rng: np.random.Generator) -> tuple[str, dict[str, Any]]:
        n = int(rng.integers(1, 10**4))
        code = str(pick(rng, (f"print(sum(range({n})))", f"print({n} * {n})", f"print(len(str(2 ** {n})))")))
        return "python", {"code": code}

    def oracle(self) -> Iterator[Action | str]:
        task = self.task_env
        task.require_task()
        yield self.call("python", code=solver_code(task.solver, task.args))
        printed = self.tool_text("python").strip()
        if parse_int(printed) is None:
            raise OracleError(f"the solver printed {printed[:200]!r}")
        yield self.submit(printed)
