"""ArithmeticWord: solve a short arithmetic word problem without tools.

* **Task** -- a generated story problem (shopping, sharing, travel, packing ...) with a
  whole-number answer.
* **Observation** -- one user message with the problem (text only).
* **Action** -- free text (working allowed) ending with the number as ``\\boxed{N}``.
* **Reward** -- 1.0 for the right number, 0.1 for a well-formed wrong integer, else 0;
  ``success`` means the right number.
* **Answer format** -- ``answer_format="boxed"`` (default) reads only ``\\boxed{N}``.
  ``"last_number"`` reads the box when there is one and otherwise the last integer of the reply,
  like the "flexible" GSM8K match of other RL stacks: small pretrained models that reason
  correctly but never learned the box then get credit for the number they end on
  (``info["answer_source"]`` says which rule read it).
* **Difficulty** -- ``easy``: one operation on numbers up to 20 (answers up to 100).
  ``medium``: two operations (answers up to 500). ``hard``: three or more operations with
  larger numbers, percentages and exact division (answers up to 5000).

Every template draws its numbers so that each intermediate result is a non-negative whole
number, and the problem's answer is computed from the same numbers the text shows.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from relax_gym.types import Action, Observation

from ._answers import MAX_ANSWER_CHARS, boxed_answer, parse_int
from ._base import BoxedAnswerEnv, EnvOptionError, Task

AnswerFormat = Literal["boxed", "last_number"]
ANSWER_FORMATS: tuple[str, ...] = ("boxed", "last_number")
# A number as written: thousands groups (1,024) or plain digits, with an optional decimal part
# (so "2.5" is one wrong number, not a right "5").
_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?!\d)")

NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivan", "Julia", "Kofi", "Lena")
ITEMS = ("apples", "marbles", "stickers", "pencils", "cookies", "stamps", "shells", "cards")
Problem = tuple[str, int]
Template = Callable[[np.random.Generator], Problem]


def _pick(rng: np.random.Generator, options: tuple[str, ...]) -> str:
    return str(options[int(rng.integers(0, len(options)))])


def _i(rng: np.random.Generator, lo: int, hi: int) -> int:
    """A uniform integer in [lo, hi]."""
    return int(rng.integers(lo, hi + 1))


# -- easy: one operation -------------------------------------------------------------------------
def _buy_more(rng: np.random.Generator) -> Problem:
    n, it, a, b = _pick(rng, NAMES), _pick(rng, ITEMS), _i(rng, 2, 20), _i(rng, 2, 20)
    return f"{n} has {a} {it} and gets {b} more. How many {it} does {n} have now?", a + b


def _give_away(rng: np.random.Generator) -> Problem:
    n, it, a = _pick(rng, NAMES), _pick(rng, ITEMS), _i(rng, 8, 20)
    b = _i(rng, 1, a - 1)
    return f"{n} has {a} {it} and gives {b} of them to a friend. How many {it} does {n} have left?", a - b


def _boxes(rng: np.random.Generator) -> Problem:
    it, a, b = _pick(rng, ITEMS), _i(rng, 2, 9), _i(rng, 2, 9)
    return f"There are {a} boxes with {b} {it} in each box. How many {it} are there in total?", a * b


def _share(rng: np.random.Generator) -> Problem:
    it, friends, each = _pick(rng, ITEMS), _i(rng, 2, 6), _i(rng, 2, 9)
    return f"{friends * each} {it} are shared equally among {friends} friends. How many {it} does each friend get?", each


# -- medium: two operations ----------------------------------------------------------------------
def _change(rng: np.random.Generator) -> Problem:
    n, price, count = _pick(rng, NAMES), _i(rng, 2, 12), _i(rng, 2, 8)
    note = next(v for v in (20, 50, 100) if v >= price * count)
    return (
        f"Notebooks cost {price} dollars each. {n} buys {count} notebooks and pays with a {note}-dollar "
        f"note. How many dollars of change does {n} get?",
        note - price * count,
    )


def _packs_left(rng: np.random.Generator) -> Problem:
    it, packs, per = _pick(rng, ITEMS), _i(rng, 3, 12), _i(rng, 4, 12)
    used = _i(rng, 1, packs * per - 1)
    return f"A shop gets {packs} packs of {per} {it} and sells {used} {it}. How many {it} are left?", packs * per - used


def _two_sizes(rng: np.random.Generator) -> Problem:
    a, x, b, y = _i(rng, 2, 9), _i(rng, 3, 15), _i(rng, 2, 9), _i(rng, 3, 15)
    return (
        f"A class orders {a} small pizzas with {x} slices each and {b} large pizzas with {y} slices each. "
        "How many slices are there altogether?",
        a * x + b * y,
    )


def _teams(rng: np.random.Generator) -> Problem:
    per, teams, extra = _i(rng, 3, 9), _i(rng, 2, 8), _i(rng, 1, 10)
    return (
        f"{per * teams + extra} children come to a game. {extra} of them watch, and the rest form teams of "
        f"{per}. How many teams are there?",
        teams,
    )


# -- hard: three or more operations --------------------------------------------------------------
def _orchard(rng: np.random.Generator) -> Problem:
    rows, trees, apples, bag = _i(rng, 3, 12), _i(rng, 4, 15), _i(rng, 10, 40), _i(rng, 4, 12)
    total = rows * trees * apples
    rotten = total % bag + bag * _i(rng, 0, max(0, min(5, total // bag - 1)))
    return (
        f"An orchard has {rows} rows of {trees} trees. Each tree gives {apples} apples. {rotten} apples are "
        f"rotten and the rest are packed in bags of {bag}. How many full bags are packed?",
        (total - rotten) // bag,
    )


def _discount(rng: np.random.Generator) -> Problem:
    n = _pick(rng, NAMES)
    pct = int(rng.choice([10, 20, 25, 50]))
    price = 20 * _i(rng, 2, 40)
    qty, ship = _i(rng, 2, 5), _i(rng, 3, 15)
    unit = price * (100 - pct) // 100
    return (
        f"A jacket costs {price} dollars. In a sale every jacket is {pct}% off. {n} buys {qty} jackets in the "
        f"sale and pays {ship} dollars for delivery. How many dollars does {n} pay in total?",
        unit * qty + ship,
    )


def _trip(rng: np.random.Generator) -> Problem:
    v, h, w, k, back = _i(rng, 40, 120), _i(rng, 2, 6), _i(rng, 30, 90), _i(rng, 1, 5), _i(rng, 10, 60)
    return (
        f"A bus drives for {h} hours at {v} km/h, then for {k} hours at {w} km/h. It then drives {back} km "
        "back the way it came. How far, in km, is it from where it started?",
        v * h + w * k - back,
    )


def _savings(rng: np.random.Generator) -> Problem:
    n, start, weekly, weeks = _pick(rng, NAMES), _i(rng, 10, 200), _i(rng, 5, 40), _i(rng, 3, 12)
    spend = _i(rng, 1, (start + weekly * weeks) // 2)
    share = int(rng.choice([2, 3, 4]))
    left = start + weekly * weeks - spend
    left -= left % share  # make the final split exact
    spend = start + weekly * weeks - left
    return (
        f"{n} has {start} dollars and saves {weekly} dollars every week for {weeks} weeks, then spends {spend} "
        f"dollars on a bike. {n} splits the money that is left equally into {share} jars. How many dollars go "
        "in each jar?",
        left // share,
    )


@dataclass(frozen=True)
class Level:
    templates: tuple[Template, ...]
    answer_range: tuple[int, int]  # the random agent guesses here


LEVELS = {
    "easy": Level((_buy_more, _give_away, _boxes, _share), (0, 100)),
    "medium": Level((_change, _packs_left, _two_sizes, _teams), (0, 500)),
    "hard": Level((_orchard, _discount, _trip, _savings), (0, 5000)),
}


class ArithmeticWordEnv(BoxedAnswerEnv[Level]):
    """Solve an arithmetic word problem directly (no tools); answer ``\\boxed{N}``."""

    levels = LEVELS
    modalities = ("text",)
    tags = ("math", "text")

    def __init__(self, difficulty: str = "easy", answer_format: AnswerFormat = "boxed") -> None:
        super().__init__(difficulty)
        if answer_format not in ANSWER_FORMATS:
            raise EnvOptionError(f"answer_format must be one of {list(ANSWER_FORMATS)}, got {answer_format!r}")
        self.answer_format = answer_format

    def step(self, action: Action | str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        task = self.require_task()
        text = Action.coerce(action).text
        raw, source = boxed_answer(text), "boxed"
        if self.answer_format == "last_number" and (raw is None or self.parse_answer(raw) is None):
            raw, source = last_integer(text), "last_number"
        reward, info = self.grade_answer(raw)
        return Observation(), reward, True, False, {**info, **task.details, "answer_source": source if raw is not None else None}

    def make_task(self, level: Level) -> Task:
        template = level.templates[int(self.np_random.integers(0, len(level.templates)))]
        story, answer = template(self.np_random)
        prompt = f"{story}\nGive the answer as a whole number in \\boxed{{N}}."
        return Task(prompt, answer, str(answer), (), {"template": template.__name__.strip("_")})

    def parse_answer(self, raw: str) -> int | None:
        return parse_int(raw.replace("\\$", "").replace("$", "").removesuffix("km").strip())

    def random_answer(self, rng: np.random.Generator) -> str:
        lo, hi = self.level.answer_range
        return str(int(rng.integers(lo, hi + 1)))


def last_integer(text: str) -> str | None:
    """The last number written in ``text`` (``parse_answer`` then rejects a decimal), or
    None. Only the reply's last ``MAX_ANSWER_CHARS`` characters are searched: linear time."""
    found = _NUMBER.findall(text[-MAX_ANSWER_CHARS:])
    return found[-1] if found else None
