"""FrameOrder: put the shuffled shots of a short process back in time order.

* **Task** -- a simple process (a tower being built block by block, a glass filling with
  water, a clock hand sweeping clockwise from 12, a ball rolling from a green flag to a red
  one) was filmed at a few moments. The video shows those shots out of order, each stamped
  with a letter; say the letters in the order the shots were taken.
* **Observation** -- one user message: what the process is, and a 96x96 video at 2 fps in
  which each lettered shot lasts two frames (6-12 frames in all).
* **Action** -- free text ending with the letters in time order, e.g. ``\\boxed{CADB}``
  (spaces, commas and arrows between letters are ignored).
* **Reward** -- 1.0 for the right order, 0.1 for a wrong permutation of the letters, else 0;
  ``success`` means the right order.
* **Difficulty** -- ``easy``: 3 shots far apart in time. ``medium``: 4 shots. ``hard``: 6
  shots closer together, with drifting grey clutter in every shot.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from relax_gym.types import VideoPart

from ._base import BoxedAnswerEnv, Task
from ._draw import text_center

SIZE = 96
FPS = 2.0
HOLD = 2  # frames per shot
LETTERS = "ABCDEFGH"
_SEPARATORS = re.compile(r"[\s,;>\-]|\\to|\\rightarrow")

Painter = Callable[[ImageDraw.ImageDraw, float], None]


def _tower(draw: ImageDraw.ImageDraw, p: float) -> None:
    blocks = 1 + int(p * 12)  # shots are >= 1/12 apart in p (6 shots at most): counts differ
    for k in range(blocks):
        y = SIZE - 6 - (k + 1) * 6
        draw.rectangle((38, y, 58, y + 5), fill=(200, 120, 40), outline=(90, 50, 10))
    draw.line((10, SIZE - 6, SIZE - 10, SIZE - 6), fill=(80, 80, 80), width=2)


def _glass(draw: ImageDraw.ImageDraw, p: float) -> None:
    top, bottom, left, right = 20, SIZE - 10, 30, 66
    level = bottom - int(p * (bottom - top - 4))
    draw.rectangle((left, level, right, bottom), fill=(70, 140, 230))
    draw.line((left, top, left, bottom), fill=(40, 40, 40), width=2)
    draw.line((right, top, right, bottom), fill=(40, 40, 40), width=2)
    draw.line((left, bottom, right, bottom), fill=(40, 40, 40), width=2)


def _clock(draw: ImageDraw.ImageDraw, p: float) -> None:
    c, r = SIZE / 2, 34
    draw.ellipse((c - r, c - r, c + r, c + r), outline=(40, 40, 40), width=2)
    draw.line((c, c - r, c, c - r + 6), fill=(40, 40, 40), width=2)  # the 12 o'clock mark
    angle = math.radians(p * 330 - 90)
    draw.line((c, c, c + (r - 6) * math.cos(angle), c + (r - 6) * math.sin(angle)), fill=(200, 30, 30), width=3)


def _ball(draw: ImageDraw.ImageDraw, p: float) -> None:
    y = SIZE - 24
    draw.rectangle((12, y - 20, 14, y + 8), fill=(40, 160, 60))
    draw.polygon([(14, y - 20), (24, y - 16), (14, y - 12)], fill=(40, 160, 60))
    draw.rectangle((SIZE - 14, y - 20, SIZE - 12, y + 8), fill=(220, 40, 40))
    draw.polygon([(SIZE - 12, y - 20), (SIZE - 2, y - 16), (SIZE - 12, y - 12)], fill=(220, 40, 40))
    x = 18 + p * (SIZE - 40)
    draw.ellipse((x - 6, y - 2, x + 6, y + 10), fill=(60, 60, 200))
    draw.line((6, y + 10, SIZE - 6, y + 10), fill=(80, 80, 80), width=2)


PROCESSES: dict[str, tuple[str, Painter]] = {
    "tower": ("a tower being built, one block at a time", _tower),
    "glass": ("a glass being filled with water", _glass),
    "clock": ("a red clock hand sweeping clockwise, starting at 12", _clock),
    "ball": ("a ball rolling from the green flag towards the red flag", _ball),
}


@dataclass(frozen=True)
class Level:
    shots: int
    clutter: int


LEVELS = {"easy": Level(3, 0), "medium": Level(4, 0), "hard": Level(6, 6)}


def parse_order(raw: str) -> str | None:
    letters = _SEPARATORS.sub("", raw).upper()
    return letters if letters and letters.isalpha() else None


class FrameOrderEnv(BoxedAnswerEnv[Level]):
    """Order the lettered, shuffled shots of a process in time; answer ``\\boxed{letters}``."""

    levels = LEVELS
    modalities = ("text", "video")
    tags = ("video", "ordering", "temporal")

    def make_task(self, level: Level) -> Task:
        rng = self.np_random
        n = level.shots
        process = str(rng.choice(sorted(PROCESSES)))
        description, paint = PROCESSES[process]
        # times spread over [0, 1]: one per n-th of the range, jittered, so shots differ clearly
        times = (np.arange(n) + 0.5 + rng.uniform(-0.25, 0.25, size=n)) / n
        shown = rng.permutation(n)  # shot k of the video is moment shown[k]
        labels = LETTERS[:n]
        frames = []
        for k, moment in enumerate(shown):
            img = Image.new("RGB", (SIZE, SIZE), (240, 240, 235))
            draw = ImageDraw.Draw(img)
            for _ in range(level.clutter):
                cx, cy = (float(v) for v in rng.uniform(6, SIZE - 6, size=2))
                draw.ellipse((cx - 3, cy - 3, cx + 3, cy + 3), fill=(175, 175, 175))
            paint(draw, float(times[moment]))
            draw.rectangle((0, 0, 17, 17), fill=(30, 30, 30))
            text_center(draw, (9, 9), labels[k], 14, (255, 255, 255))
            frames += [np.asarray(img)] * HOLD
        order = "".join(labels[int(np.flatnonzero(shown == m)[0])] for m in range(n))
        self._labels = labels
        prompt = (
            f"The video shows {n} shots of {description}, out of order. Each shot is marked "
            f"with a letter ({', '.join(labels)}) in its top-left corner. Put the shots in the order "
            f"they were taken, earliest first. Reply with the letters as \\boxed{{...}}, e.g. "
            f"\\boxed{{{labels[::-1]}}}."
        )
        video = VideoPart(np.stack(frames).astype(np.uint8), FPS, id="shots")
        return Task(prompt, order, order, (video,), {"process": process})

    def parse_answer(self, raw: str) -> str | None:
        letters = parse_order(raw)
        return letters if letters is not None and sorted(letters) == sorted(self._labels) else None

    def random_answer(self, rng: np.random.Generator) -> str:
        self.require_task()
        return "".join(self._labels[int(i)] for i in rng.permutation(len(self._labels)))
