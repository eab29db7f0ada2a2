"""SceneQuery: answer a question about the colours, shapes and positions in a synthetic scene.

* **Task** -- the image shows a few coloured shapes; the question asks for an attribute ("What
  colour is the star?"), an extreme ("What colour is the leftmost object?"), a relation ("Is
  the red circle above the blue square?") or the nearest neighbour of an object.
* **Observation** -- one user message: the question, the allowed answers, and a 224x224 image.
* **Action** -- free text ending with a one-word answer in ``\\boxed{}`` (a colour, a shape,
  or yes/no, as the question states).
* **Reward** -- 1.0 for the right word, 0.1 for a wrong word from the allowed list, else 0;
  ``success`` means the right word.
* **Difficulty** -- ``single``: one large object, "what colour is it?" (the CPU quickstart's
  level: a tiny model can learn it in minutes). ``easy``: 3 objects, attribute questions. ``medium``: 5 objects, extremes
  and left/right/above/below relations. ``hard``: 6 objects of varied sizes, nearest-neighbour
  and extreme questions.

Every object has its own colour and its own shape, so a description never names two objects,
and extremes, relations and nearest neighbours are drawn only when they win by a visible margin.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from relax_gym.types import ImagePart

from ._base import BoxedAnswerEnv, Task
from ._draw import BACKGROUND, COLORS, SHAPES, draw_shape, grid_positions

SIZE = 224
COLOR_WORDS = ("red", "green", "blue", "yellow", "purple", "orange")
MARGIN_PX = 14  # an extreme or relation must win by at least this much


@dataclass(frozen=True)
class Obj:
    color: str
    shape: str
    x: float
    y: float
    r: float

    @property
    def name(self) -> str:
        return f"{self.color} {self.shape}"


@dataclass(frozen=True)
class Level:
    objects: int
    cells: int
    radii: tuple[float, float]
    questions: tuple[str, ...]


LEVELS = {
    "single": Level(1, 1, (100, 112), ("color_of",)),
    "easy": Level(3, 3, (20, 20), ("color_of", "shape_of")),
    "medium": Level(5, 4, (16, 16), ("extreme", "relation")),
    "hard": Level(6, 4, (9, 20), ("nearest", "extreme")),
}
Question = tuple[str, str, tuple[str, ...]]  # (question text, answer, allowed answers)


class SceneQueryEnv(BoxedAnswerEnv[Level]):
    """Answer a colour / shape / position question about a synthetic scene in ``\\boxed{}``."""

    levels = LEVELS
    modalities = ("text", "image")
    tags = ("vision", "spatial")

    def make_task(self, level: Level) -> Task:
        question: Question | None = None
        for attempt in range(40):  # redraw the question, and every 8 tries the scene, until clear
            if attempt % 8 == 0:
                objs = self._scene(level)
            kind = str(self.np_random.choice(level.questions))
            question = self._QUESTIONS[kind](self, objs)
            if question is not None:
                break
        if question is None:  # never seen in practice; an attribute question is always clear
            question = self._color_of(objs)
        text, answer, options = question
        self._options = options
        prompt = (
            f"{text} Answer with one word from: {', '.join(options)}. Reply as \\boxed{{word}}."
        )
        image = self._render(objs)
        return Task(prompt, answer, answer, (ImagePart(image, id="scene"),), {"question": text})

    def _scene(self, level: Level) -> list[Obj]:
        rng = self.np_random
        colors = [str(c) for c in rng.choice(COLOR_WORDS, size=level.objects, replace=False)]
        shapes = [str(s) for s in rng.choice(SHAPES, size=level.objects, replace=False)]
        centres = grid_positions(rng, level.objects, SIZE, level.cells, level.radii[1])
        radii = rng.uniform(level.radii[0], level.radii[1], size=level.objects)
        return [Obj(c, s, x, y, float(r)) for c, s, (x, y), r in zip(colors, shapes, centres, radii, strict=True)]

    # -- question generators: each returns None when the scene does not support it clearly -------
    def _color_of(self, objs: list[Obj]) -> Question:
        o = objs[int(self.np_random.integers(0, len(objs)))]
        return f"What colour is the {o.shape}?", o.color, COLOR_WORDS

    def _shape_of(self, objs: list[Obj]) -> Question:
        o = objs[int(self.np_random.integers(0, len(objs)))]
        return f"What shape is the {o.color} object?", o.shape, SHAPES

    def _extreme(self, objs: list[Obj]) -> Question | None:
        which = str(self.np_random.choice(["leftmost", "rightmost", "topmost", "bottommost"]))
        key: Callable[[Obj], float] = {
            "leftmost": lambda o: o.x - o.r, "rightmost": lambda o: -(o.x + o.r),
            "topmost": lambda o: o.y - o.r, "bottommost": lambda o: -(o.y + o.r),
        }[which]
        ranked = sorted(objs, key=key)
        if key(ranked[1]) - key(ranked[0]) < MARGIN_PX:
            return None
        return f"What colour is the {which} object?", ranked[0].color, COLOR_WORDS

    def _relation(self, objs: list[Obj]) -> Question | None:
        i, j = (int(k) for k in self.np_random.choice(len(objs), size=2, replace=False))
        a, b = objs[i], objs[j]
        rel = str(self.np_random.choice(["left of", "right of", "above", "below"]))
        delta = {"left of": b.x - a.x, "right of": a.x - b.x, "above": b.y - a.y, "below": a.y - b.y}[rel]
        if abs(delta) < MARGIN_PX + a.r + b.r:
            return None
        return f"Is the {a.name} {rel} the {b.name}?", "yes" if delta > 0 else "no", ("yes", "no")

    def _nearest(self, objs: list[Obj]) -> Question | None:
        anchor = objs[int(self.np_random.integers(0, len(objs)))]
        others = sorted((o for o in objs if o is not anchor), key=lambda o: math.dist((o.x, o.y), (anchor.x, anchor.y)))
        d0 = math.dist((others[0].x, others[0].y), (anchor.x, anchor.y))
        d1 = math.dist((others[1].x, others[1].y), (anchor.x, anchor.y))
        if d1 - d0 < MARGIN_PX:
            return None
        return f"What colour is the object closest to the {anchor.name} (centre to centre)?", others[0].color, COLOR_WORDS

    _QUESTIONS: dict[str, Callable[[SceneQueryEnv, list[Obj]], Question | None]] = {
        "color_of": _color_of, "shape_of": _shape_of, "extreme": _extreme,
        "relation": _relation, "nearest": _nearest,
    }

    def _render(self, objs: list[Obj]) -> Image.Image:
        img = Image.new("RGB", (SIZE, SIZE), BACKGROUND)
        draw = ImageDraw.Draw(img)
        for o in objs:
            draw_shape(draw, o.shape, o.x, o.y, o.r, COLORS[o.color])
        return img

    def parse_answer(self, raw: str) -> str | None:
        word = raw.strip().strip(".").lower().removeprefix("\\text{").removesuffix("}").strip()
        return word if word in self._options else None

    def random_answer(self, rng: np.random.Generator) -> str:
        self.require_task()
        return str(rng.choice(self._options))
