"""ClockReading: read the time on an analog clock face.

* **Task** -- the image shows a clock with an hour and a minute hand; say the time it shows.
* **Observation** -- one user message: the instructions and a 224x224 RGB clock image.
* **Action** -- free text ending with the time as ``\\boxed{H:MM}`` (12-hour clock, ``H`` from
  1 to 12; ``03:05`` and ``15:05`` are read as ``3:05``).
* **Reward** -- 1.0 for the exact time, 0.1 for a well-formed wrong time, else 0; ``success``
  means the exact time.
* **Difficulty** -- ``easy``: quarter hours, numerals on the dial (48 possible times).
  ``medium``: five-minute steps, numerals, minute ticks (144). ``hard``: any minute, no
  numerals, a thin second hand as a distractor and a tinted dial (720).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from relax_gym.types import ImagePart

from ._base import BoxedAnswerEnv, Task
from ._draw import text_center

SIZE = 224
_TIME_RE = re.compile(r"^(\d{1,2})\s*[:h.]\s*(\d{2})$")


@dataclass(frozen=True)
class Level:
    minute_step: int
    numerals: bool
    minute_ticks: bool
    second_hand: bool
    tinted: bool


LEVELS = {
    "easy": Level(15, True, False, False, False),
    "medium": Level(5, True, True, False, False),
    "hard": Level(1, False, True, True, True),
}


def format_time(hour: int, minute: int) -> str:
    return f"{hour}:{minute:02d}"


def parse_time(raw: str) -> tuple[int, int] | None:
    """``"3:05"``, ``"03:05"``, ``"15:05"`` -> ``(3, 5)``; ``"0:05"`` -> ``(12, 5)``."""
    match = _TIME_RE.match(raw.strip().lower().replace(" ", "").removesuffix("am").removesuffix("pm"))
    if not match:
        return None
    hour, minute = int(match.group(1)), int(match.group(2))
    if hour > 23 or minute > 59:
        return None
    return (hour % 12 or 12, minute)


class ClockReadingEnv(BoxedAnswerEnv[Level]):
    """Read an analog clock; answer ``\\boxed{H:MM}``."""

    levels = LEVELS
    modalities = ("text", "image")
    tags = ("vision", "clock")

    def make_task(self, level: Level) -> Task:
        rng = self.np_random
        hour = int(rng.integers(1, 13))
        minute = int(rng.integers(0, 60 // level.minute_step)) * level.minute_step
        second = int(rng.integers(0, 60))
        image = self._render(level, hour, minute, second)
        prompt = (
            "What time does the analog clock show? The short hand shows the hours, the long hand "
            "the minutes" + (" (ignore the thin red second hand)" if level.second_hand else "")
            + ". Reply with the time on a 12-hour clock as \\boxed{H:MM}, e.g. \\boxed{7:05}."
        )
        return Task(prompt, (hour, minute), format_time(hour, minute), (ImagePart(image, id="clock"),))

    def _render(self, level: Level, hour: int, minute: int, second: int) -> Image.Image:
        rng = self.np_random
        face = (255, 255, 255)
        if level.tinted:
            face = tuple(int(v) for v in rng.integers(215, 256, size=3))  # type: ignore[assignment]
        img = Image.new("RGB", (SIZE, SIZE), (235, 235, 230))
        draw = ImageDraw.Draw(img)
        c, r = SIZE / 2, SIZE / 2 - 8
        draw.ellipse((c - r, c - r, c + r, c + r), fill=face, outline=(30, 30, 30), width=4)
        for tick in range(60):
            if tick % 5 and not level.minute_ticks:
                continue
            angle = math.radians(tick * 6 - 90)
            inner = r - (14 if tick % 5 == 0 else 7)
            width = 3 if tick % 5 == 0 else 1
            draw.line(
                (c + inner * math.cos(angle), c + inner * math.sin(angle),
                 c + (r - 3) * math.cos(angle), c + (r - 3) * math.sin(angle)),
                fill=(30, 30, 30), width=width,
            )
        if level.numerals:
            for n in range(1, 13):
                angle = math.radians(n * 30 - 90)
                text_center(draw, (c + (r - 28) * math.cos(angle), c + (r - 28) * math.sin(angle)), str(n), 18, (20, 20, 20))
        hour_angle = (hour % 12 + minute / 60) * 30
        self._hand(draw, c, hour_angle, r * 0.5, 7, (20, 20, 20))
        self._hand(draw, c, minute * 6, r * 0.85, 4, (20, 20, 20))
        if level.second_hand:
            self._hand(draw, c, second * 6, r * 0.9, 1, (200, 30, 30))
        draw.ellipse((c - 5, c - 5, c + 5, c + 5), fill=(20, 20, 20))
        return img

    @staticmethod
    def _hand(
        draw: ImageDraw.ImageDraw, c: float, degrees: float, length: float, width: int, color: tuple[int, int, int]
    ) -> None:
        angle = math.radians(degrees - 90)
        draw.line((c, c, c + length * math.cos(angle), c + length * math.sin(angle)), fill=color, width=width)

    def parse_answer(self, raw: str) -> tuple[int, int] | None:
        return parse_time(raw)

    def random_answer(self, rng: np.random.Generator) -> str:
        hour = int(rng.integers(1, 13))
        minute = int(rng.integers(0, 60 // self.level.minute_step)) * self.level.minute_step
        return format_time(hour, minute)
