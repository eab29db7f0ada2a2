"""ShapeCount: count the shapes of one kind in a synthetic image.

* **Task** -- the image shows coloured shapes (circles, squares, triangles, stars, diamonds,
  hexagons); the question asks how many match a description ("circles", "red triangles").
* **Observation** -- one user message: the question and a 224x224 RGB image.
* **Action** -- free text ending with the count as ``\\boxed{N}``.
* **Reward** -- 1.0 for the right count, 0.1 for a well-formed wrong integer, else 0;
  ``success`` means the count is right.
* **Difficulty** -- ``easy``: 3 shape kinds, count by shape only, 3-7 large objects, 1-5 to
  count. ``medium``: 6 kinds x 6 colours, count a colour+shape pair among distractors that share
  one of the two, 6-12 objects (tilted up to 25 degrees), 1-6 to count. ``hard``: 10-16 small tilted objects on a
  cluttered background, 0-8 to count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from relax_gym.types import ImagePart

from ._answers import parse_int
from ._base import BoxedAnswerEnv, Task
from ._draw import BACKGROUND, COLORS, SHAPES, draw_shape, grid_positions

SIZE = 224
_PLURAL = {"circle": "circles", "square": "squares", "triangle": "triangles", "star": "stars",
           "diamond": "diamonds", "hexagon": "hexagons"}
_COLOR_NAMES = ("red", "green", "blue", "yellow", "purple", "orange")


@dataclass(frozen=True)
class Level:
    shapes: tuple[str, ...]
    by_color: bool          # count a colour+shape pair (else shape only)
    total: tuple[int, int]  # inclusive range of objects in the image
    count: tuple[int, int]  # inclusive range of the answer
    radius: float
    cells: int              # placement grid is cells x cells
    rotate: bool
    clutter: int            # thin background lines


LEVELS = {
    "easy": Level(("circle", "square", "triangle"), False, (3, 7), (1, 5), 17, 5, False, 0),
    "medium": Level(SHAPES, True, (6, 12), (1, 6), 13, 6, True, 0),
    "hard": Level(SHAPES, True, (10, 16), (0, 8), 10, 7, True, 12),
}


class ShapeCountEnv(BoxedAnswerEnv[Level]):
    """Count the shapes matching a description; answer ``\\boxed{N}``."""

    levels = LEVELS
    modalities = ("text", "image")
    tags = ("counting", "vision")

    def make_task(self, level: Level) -> Task:
        rng = self.np_random
        shape = str(rng.choice(level.shapes))
        color = str(rng.choice(_COLOR_NAMES)) if level.by_color else None
        count = int(rng.integers(level.count[0], level.count[1] + 1))
        total = max(count + 2, int(rng.integers(level.total[0], level.total[1] + 1)))
        objects = [(shape, color or str(rng.choice(_COLOR_NAMES))) for _ in range(count)]
        while len(objects) < total:
            objects.append(self._distractor(level, shape, color))
        image = self._render(level, objects)
        what = f"{color} {_PLURAL[shape]}" if color else _PLURAL[shape]
        prompt = (
            f"How many {what} are in the image? Count only {what}"
            + (" (shape and colour must both match)" if color else ", whatever their colour")
            + ". Reply with the number as \\boxed{N}."
        )
        return Task(prompt, count, str(count), (ImagePart(image, id="image"),), {"question": what, "objects": total})

    def _distractor(self, level: Level, shape: str, color: str | None) -> tuple[str, str]:
        rng = self.np_random
        if color is None:  # anything but the target shape
            others = [s for s in level.shapes if s != shape]
            return str(rng.choice(others)), str(rng.choice(_COLOR_NAMES))
        kind = int(rng.integers(0, 3))  # same shape / same colour / neither
        other_shapes = [s for s in level.shapes if s != shape]
        other_colors = [c for c in _COLOR_NAMES if c != color]
        if kind == 0:
            return shape, str(rng.choice(other_colors))
        if kind == 1:
            return str(rng.choice(other_shapes)), color
        return str(rng.choice(other_shapes)), str(rng.choice(other_colors))

    def _render(self, level: Level, objects: list[tuple[str, str]]) -> Image.Image:
        rng = self.np_random
        img = Image.new("RGB", (SIZE, SIZE), BACKGROUND)
        draw = ImageDraw.Draw(img)
        for _ in range(level.clutter):
            x0, y0, x1, y1 = (float(v) for v in rng.uniform(0, SIZE, size=4))
            draw.line((x0, y0, x1, y1), fill=(200, 200, 195), width=1)
        order = rng.permutation(len(objects))
        centres = grid_positions(rng, len(objects), SIZE, level.cells, level.radius)
        for (cx, cy), idx in zip(centres, order, strict=True):
            shape, color = objects[int(idx)]
            # +-25 degrees keeps squares square-looking and diamonds distinct from them
            angle = float(rng.uniform(-25, 25)) if level.rotate else 0.0
            draw_shape(draw, shape, cx, cy, level.radius, COLORS[color], angle)
        return img

    def parse_answer(self, raw: str) -> int | None:
        return parse_int(raw)

    def random_answer(self, rng: np.random.Generator) -> str:
        lo, hi = self.level.count
        return str(int(rng.integers(lo, hi + 1)))

