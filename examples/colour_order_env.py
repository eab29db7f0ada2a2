"""ColourOrder: what colour does a disc in a short clip show (first)? A video task for the CPU example.

* **Task** -- ``easy``: the disc keeps one colour for the whole 2-second clip; name it.
  ``medium`` / ``hard``: the disc changes colour once, halfway; name the colour it has first (a
  reader that sees the colours but not their order gets at most 1/2, so the model has to use
  time: Qwen3-VL's temporal patches and timestamps). Four colours: chance is 1/4.
* **Observation** -- the question and a 64x64 video at 4 fps (8 frames), the disc at a random
  place on a grey background; its radius is 22-30 px at ``easy`` / ``medium`` and 10-20 px at
  ``hard``. The tiny CPU model reads 64x64 frames as 32-px merged patches: with the small disc
  it stayed at chance after 40-60 supervised steps whether the disc came as video or as one
  image (docs/benchmarks.md, "Video"), so the object size, not the video path, sets the level.
* **Action** -- ``\\boxed{colour}``; reward 1 for the right colour, 0.1 for another valid colour.

Used by ``examples/video_cpu.yaml`` through ``entry_point`` (a config can bring its own env
without a plugin). The shipped video envs (``relax/MotionTrack-v0``, ``relax/FrameOrder-v0``)
did not learn within the CPU budget with the tiny model at 64x64 (docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from relax_gym.envs._base import BoxedAnswerEnv, Task
from relax_gym.types import VideoPart

COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (50, 90, 230), "yellow": (230, 200, 40)}
SIZE, FRAMES, FPS = 64, 8, 4.0


@dataclass(frozen=True)
class Level:
    colours: int
    changes: bool  # the disc changes colour halfway (ask for the first)
    radius: tuple[int, int]  # smallest and largest disc radius in pixels


class ColourOrderEnv(BoxedAnswerEnv[Level]):
    """Name the colour of a disc in a clip (the first one, where it changes colour halfway)."""

    levels = {"easy": Level(4, False, (22, 30)), "medium": Level(4, True, (22, 30)), "hard": Level(4, True, (10, 20))}
    modalities = ("text", "video")
    tags = ("video", "temporal")

    def make_task(self, level: Level) -> Task:
        rng = self.np_random
        names = sorted(COLOURS)[: level.colours]
        first, second = (str(c) for c in rng.choice(names, size=2, replace=False))
        r = int(rng.integers(level.radius[0], level.radius[1] + 1))
        cx, cy = (int(v) for v in rng.integers(r, SIZE - r, size=2))
        ys, xs = np.ogrid[:SIZE, :SIZE]
        disc = (xs - cx) ** 2 + (ys - cy) ** 2 <= r * r
        frames = np.full((FRAMES, SIZE, SIZE, 3), 200, dtype=np.uint8)
        for f in range(FRAMES):
            frames[f][disc] = COLOURS[first if f < FRAMES // 2 or not level.changes else second]
        question = "Which colour does the disc show first?" if level.changes else "What colour is the disc?"
        prompt = f"{question} Answer with one of: {', '.join(names)}. Reply as \\boxed{{colour}}."
        self._options = tuple(names)
        return Task(prompt, first, first, (VideoPart(frames, FPS, id="clip"),),
                    {"second": second if level.changes else first})

    def parse_answer(self, raw: str) -> str | None:
        word = raw.strip().strip(".").lower()
        return word if word in self._options else None

    def random_answer(self, rng: np.random.Generator) -> str:
        self.require_task()
        return str(rng.choice(self._options))
