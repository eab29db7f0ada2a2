"""GridRules: infer an ARC-style grid transformation from examples and apply it.

* **Task** -- the image shows example pairs (input grid -> output grid) that all follow one
  hidden rule (a flip, a rotation, a transpose, gravity, a shift, a colour swap, or, when hard,
  two of them in a row) and a test input; give the test output.
* **Observation** -- one user message: the instructions and an RGB image of the pairs, the
  test input and a legend that maps each colour to a digit 0-9 (0 is the black background).
* **Action** -- free text ending with the output grid as rows of digits separated by ``/``,
  e.g. ``\\boxed{012/340/001}`` (spaces, commas and newlines between rows are tolerated).
* **Reward** -- 1.0 for the right grid, 0.1 for a well-formed wrong grid, else 0; ``success``
  means the right grid. If two catalogue rules fit every example yet disagree on the test
  input (rare: the generator redraws grids to avoid it), both answers count as right.
* **Difficulty** -- ``easy``: 3x3 grids, 2 examples, one of flip left-right / flip up-down /
  rotate 180. ``medium``: 4x4, 3 examples, any one of the 8 rules. ``hard``: 5x5, 3 examples,
  two different rules applied in sequence.

The random agent guesses a rule from the level's catalogue and applies it to the test input.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from relax_gym.types import ImagePart

from ._base import BoxedAnswerEnv, Task
from ._draw import text_center

Grid = np.ndarray
# ARC's customary palette: 0 black, 1 blue, 2 red, 3 green, 4 yellow, 5 grey, 6 magenta,
# 7 orange, 8 azure, 9 maroon.
PALETTE: tuple[tuple[int, int, int], ...] = (
    (0, 0, 0), (0, 116, 217), (255, 65, 54), (46, 204, 64), (255, 220, 0),
    (170, 170, 170), (240, 18, 190), (255, 133, 27), (127, 219, 255), (135, 12, 37),
)


def _gravity(g: Grid) -> Grid:
    """Non-zero cells fall to the bottom of their column, keeping their order."""
    order = np.argsort(g != 0, axis=-2, kind="stable")  # zeros first, the rest in order
    return np.take_along_axis(g, order, axis=-2)


# Each step works on one grid [n, n] or a stack of grids [k, n, n] (the last two axes).
GEOMETRIC: dict[str, Callable[[Grid], Grid]] = {
    "flip left-right": lambda g: np.flip(g, -1),
    "flip up-down": lambda g: np.flip(g, -2),
    "rotate 90 clockwise": lambda g: np.rot90(g, -1, axes=(-2, -1)),
    "rotate 180": lambda g: np.rot90(g, 2, axes=(-2, -1)),
    "transpose": lambda g: np.swapaxes(g, -1, -2),
    "gravity down": _gravity,
    "shift right with wrap": lambda g: np.roll(g, 1, axis=-1),
}


@dataclass(frozen=True)
class Rule:
    """A sequence of named steps; ``swap`` steps exchange two colours."""

    steps: tuple[str, ...]
    swap: tuple[int, int] | None = None

    def __call__(self, g: Grid) -> Grid:
        for step in self.steps:
            if step == "swap colours":
                assert self.swap is not None
                a, b = self.swap
                g = np.where(g == a, b, np.where(g == b, a, g))
            else:
                g = GEOMETRIC[step](g)
        return np.ascontiguousarray(g)

    @property
    def name(self) -> str:
        swap = f"swap colours {self.swap[0]} and {self.swap[1]}" if self.swap else "swap colours"
        return " then ".join(swap if s == "swap colours" else s for s in self.steps)


@dataclass(frozen=True)
class Level:
    size: int
    examples: int
    steps: int                   # rules applied in sequence
    singles: tuple[str, ...]     # the catalogue of single steps
    cell: int                    # rendered cell size in px


_ALL_STEPS = (*GEOMETRIC, "swap colours")
LEVELS = {
    "easy": Level(3, 2, 1, ("flip left-right", "flip up-down", "rotate 180"), 16),
    "medium": Level(4, 3, 1, _ALL_STEPS, 14),
    "hard": Level(5, 3, 2, _ALL_STEPS, 12),
}
_ROW_SPLIT = re.compile(r"\\\\|[/;\n|]")


def grid_to_text(g: Grid) -> str:
    return "/".join("".join(str(int(v)) for v in row) for row in g)


def parse_grid(raw: str) -> tuple[str, ...] | None:
    """``"012/340"`` (or rows split by newlines, ``;``, ``|`` or ``\\\\``) -> ``("012", "340")``."""
    rows = [re.sub(r"[\s,]", "", r) for r in _ROW_SPLIT.split(raw.strip())]
    rows = [r for r in rows if r]
    if not rows or any(not (r.isascii() and r.isdigit()) for r in rows) or len({len(r) for r in rows}) != 1:
        return None
    return tuple(rows)


class GridRulesEnv(BoxedAnswerEnv[Level]):
    """Infer a grid rule from example pairs (an image); answer the test output as text."""

    levels = LEVELS
    modalities = ("text", "image")
    tags = ("vision", "reasoning", "arc")

    def make_task(self, level: Level) -> Task:
        rng = self.np_random
        for _attempt in range(64):  # redraw until the examples pin the answer down (almost always at once)
            colors = sorted(int(c) for c in rng.choice(np.arange(1, 10), size=int(rng.integers(2, 5)), replace=False))
            rule = self._draw_rule(level, colors)
            inputs = [self._draw_grid(level.size, colors) for _ in range(level.examples + 1)]
            pairs = [(g, rule(g)) for g in inputs[:-1]]
            test_in, target = inputs[-1], rule(inputs[-1])
            truth = np.stack([o for _, o in pairs] + [target])
            # every catalogue rule applied to the whole stack of grids at once: [rules, grids, n, n]
            grids = np.stack(inputs)
            outputs = np.stack([c(grids) for c in self.catalogue(level, colors)])
            same = (outputs == truth).all(axis=(2, 3))  # [rules, grids]: agrees with the true rule
            fits = same[:, :-1].all(axis=1)
            fitting = {grid_to_text(out) for out in outputs[fits, -1]}
            # a rule that lands on the answer for the test grid must agree with the true rule on
            # every grid shown: a test grid whose symmetry lets a wrong rule land on the answer
            # would make guessing pay
            lucky, equivalent = int(same[:, -1].sum()), int(same.all(axis=1).sum())
            informative = not any(np.array_equal(i, o) for i, o in pairs) and not np.array_equal(target, test_in)
            if informative and fitting == {grid_to_text(target)} and lucky == equivalent:
                break
        self._test_input, self._colors = test_in, colors
        answer = grid_to_text(target)
        image = self._render(level, pairs, test_in)
        n = level.size
        prompt = (
            f"The image shows {level.examples} example pairs: each input grid (left) is turned into "
            "its output grid (right) by the same rule. Apply the rule to the test grid at the bottom. "
            "Colours stand for digits as the legend shows (0 is the black background). "
            f"The output is {n}x{n}. Reply with its rows, top to bottom, as digits separated by '/', "
            f"e.g. \\boxed{{{'/'.join(['0' * n] * n)}}}."
        )
        also = frozenset(tuple(t.split("/")) for t in fitting) - {tuple(answer.split("/"))}
        return Task(
            prompt, tuple(answer.split("/")), answer, (ImagePart(image, id="grids"),),
            {"rule": rule.name}, also_correct=also,
        )

    def _draw_rule(self, level: Level, colors: list[int]) -> Rule:
        rng = self.np_random
        steps = tuple(str(s) for s in rng.choice(level.singles, size=level.steps, replace=False))
        swap = None
        if "swap colours" in steps:
            a, b = (int(c) for c in rng.choice(colors, size=2, replace=False))
            swap = (min(a, b), max(a, b))
        return Rule(steps, swap)

    def _draw_grid(self, n: int, colors: list[int]) -> Grid:
        rng = self.np_random
        filled = rng.random((n, n)) < rng.uniform(0.35, 0.65)
        values = rng.choice(colors, size=(n, n))
        return np.where(filled, values, 0).astype(np.int8)

    @staticmethod
    def catalogue(level: Level, colors: list[int]) -> list[Rule]:
        """Every rule of the level's family, colour swaps over the given colours."""
        swaps = [(a, b) for a, b in itertools.combinations(sorted(colors), 2)]
        rules: list[Rule] = []
        for steps in itertools.permutations(level.singles, level.steps):
            if "swap colours" in steps:
                rules += [Rule(steps, s) for s in swaps]
            else:
                rules.append(Rule(steps))
        return rules

    def _render(self, level: Level, pairs: list[tuple[Grid, Grid]], test_in: Grid) -> Image.Image:
        img = _template(level).copy()  # labels, arrows, the "?" box and the legend
        for r, (x_in, x_out, y) in enumerate(_rows(level)):
            if r < len(pairs):
                img.paste(_grid_image(pairs[r][0], level.cell), (x_in, y))
                img.paste(_grid_image(pairs[r][1], level.cell), (x_out, y))
            else:
                img.paste(_grid_image(test_in, level.cell), (x_in, y))
        return img

    def parse_answer(self, raw: str) -> tuple[str, ...] | None:
        return parse_grid(raw)

    def random_answer(self, rng: np.random.Generator) -> str:
        self.require_task()
        rules = self.catalogue(self.level, self._colors)
        return grid_to_text(rules[int(rng.integers(0, len(rules)))](self._test_input))


_PAD, _LABEL_W, _ARROW_W, _LEGEND_H = 8, 26, 34, 30


def _rows(level: Level) -> list[tuple[int, int, int]]:
    """(x of the input grid, x of the output grid, y) of each row: the examples, then the test."""
    g = level.size * level.cell
    x_in = _PAD + _LABEL_W
    return [(x_in, x_in + g + _ARROW_W, _PAD + r * (g + _PAD)) for r in range(level.examples + 1)]


@functools.lru_cache(maxsize=8)
def _template(level: Level) -> Image.Image:
    """Everything of the picture that does not depend on the task, drawn once per level."""
    g = level.size * level.cell
    rows = _rows(level)
    width = max(_PAD + _LABEL_W + g + _ARROW_W + g + _PAD, _PAD * 2 + 10 * 18)
    height = rows[-1][2] + g + _PAD + _LEGEND_H + _PAD
    img = Image.new("RGB", (width, height), (250, 250, 250))
    draw = ImageDraw.Draw(img)
    for r, (x_in, x_out, y) in enumerate(rows):
        test = r == len(rows) - 1
        text_center(draw, (_PAD + _LABEL_W / 2, y + g / 2), "test" if test else str(r + 1), 11 if test else 14, (40, 40, 40))
        text_center(draw, (x_in + g + _ARROW_W / 2, y + g / 2), "->", 16, (40, 40, 40))
        if test:
            draw.rectangle((x_out, y, x_out + g, y + g), outline=(120, 120, 120), width=1)
            text_center(draw, (x_out + g / 2, y + g / 2), "?", 20, (120, 120, 120))
    y = rows[-1][2] + g + _PAD
    for d in range(10):
        x = _PAD + d * 18
        draw.rectangle((x, y, x + 14, y + 14), fill=PALETTE[d], outline=(120, 120, 120))
        text_center(draw, (x + 7, y + 22), str(d), 10, (40, 40, 40))
    return img


_PALETTE_ARRAY = np.array(PALETTE, dtype=np.uint8)


def _grid_image(grid: Grid, cell: int) -> Image.Image:
    """The grid as coloured cells with a grey outline around each cell."""
    pixels = np.repeat(np.repeat(_PALETTE_ARRAY[grid.astype(np.intp)], cell, axis=0), cell, axis=1)
    edge = np.arange(grid.shape[0] * cell) % cell
    border = (edge == 0) | (edge == cell - 1)
    pixels[border, :] = (90, 90, 90)
    pixels[:, border] = (90, 90, 90)
    return Image.fromarray(pixels)
