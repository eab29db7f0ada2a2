"""SenseCount: count things across an image, a sound and a video clip.

* **Task** -- the image shows some dots, the audio clip has some beeps and the video has some
  flashes of a white square. The answer is the total count.
* **Observation** -- one user message with the instructions, an image (PNG-able RGB), a mono
  16 kHz audio clip and a short video (4 fps).
* **Action** -- free text with the answer as ``\\boxed{N}``.
* **Reward** -- 1.0 for the right total, 0.1 for a well-formed but wrong ``\\boxed{}``
  integer, 0 otherwise; ``success`` means the total is right.
* **Difficulty** -- ``easy`` (1-3 of each), ``medium`` (1-5), ``hard`` (1-8, smaller dots,
  shorter beeps).

It exists mostly to exercise every modality of the API end to end, and as a small but real
multimodal counting task.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from relax_gym.core import Env
from relax_gym.types import Action, AudioPart, ImagePart, Message, Observation, VideoPart

from ._answers import boxed_answer, parse_int
from ._base import check_difficulty

_LEVELS = {
    "easy": {"max_count": 3, "radius": 10, "beep_s": 0.15},
    "medium": {"max_count": 5, "radius": 8, "beep_s": 0.12},
    "hard": {"max_count": 8, "radius": 6, "beep_s": 0.08},
}
SAMPLE_RATE = 16_000
VIDEO_FPS = 4.0


class SenseCountEnv(Env):
    """Count dots (image) + beeps (audio) + flashes (video); answer the total in \\boxed{}."""

    modalities = ("text", "image", "audio", "video")
    tags = ("counting", "multimodal")
    max_turns = 1

    def __init__(self, difficulty: str = "easy", image_size: int = 128) -> None:
        check_difficulty(difficulty, _LEVELS)
        self.difficulty = difficulty
        self.level = _LEVELS[difficulty]
        self.image_size = image_size
        self.counts = (0, 0, 0)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]:
        super().reset(seed=seed)
        hi = self.level["max_count"]
        self.counts = tuple(int(x) for x in self.np_random.integers(1, hi + 1, size=3))
        dots, beeps, flashes = self.counts
        prompt = (
            "Count the dots in the image, the beeps in the audio clip and the flashes of the white "
            "square in the video. Reply with the total as \\boxed{N}."
        )
        msg = Message.user(
            prompt,
            ImagePart(self._draw_dots(dots), id="image"),
            AudioPart(self._beeps(beeps), SAMPLE_RATE, id="audio"),
            VideoPart(self._flashes(flashes), VIDEO_FPS, id="video"),
        )
        return Observation([msg]), {"difficulty": self.difficulty}

    def step(self, action: Action | str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        action = Action.coerce(action)
        answer = parse_int(boxed_answer(action.text))
        correct = answer is not None and answer == sum(self.counts)
        format_ok = answer is not None
        reward = 1.0 if correct else (0.1 if format_ok else 0.0)
        info = {
            "success": correct,
            "reward_components": {"correct": float(correct), "format": 0.1 if format_ok and not correct else 0.0},
            "answer": answer,
            "target": sum(self.counts),
        }
        return Observation(), reward, True, False, info

    def oracle(self) -> Iterator[str]:
        yield f"The total is \\boxed{{{sum(self.counts)}}}"

    def random_action(self, rng: np.random.Generator) -> str:
        hi = self.level["max_count"]
        return f"\\boxed{{{int(rng.integers(3, 3 * hi + 1))}}}"

    # -- rendering ------------------------------------------------------------------------------
    def _draw_dots(self, n: int) -> Image.Image:
        size, r = self.image_size, self.level["radius"]
        img = Image.new("RGB", (size, size), (245, 245, 240))
        draw = ImageDraw.Draw(img)
        centers: list[tuple[int, int]] = []
        attempts = 0
        while len(centers) < n and attempts < 1000:
            attempts += 1
            x, y = (int(v) for v in self.np_random.integers(r + 2, size - r - 2, size=2))
            if all((x - a) ** 2 + (y - b) ** 2 > (2 * r + 4) ** 2 for a, b in centers):
                centers.append((x, y))
        for x, y in centers:
            color = tuple(int(c) for c in self.np_random.integers(0, 180, size=3))
            draw.ellipse((x - r, y - r, x + r, y + r), fill=color)
        return img

    def _beeps(self, n: int) -> np.ndarray:
        beep_s, gap_s = self.level["beep_s"], 0.15
        t = np.arange(int(beep_s * SAMPLE_RATE)) / SAMPLE_RATE
        freq = float(self.np_random.uniform(500, 1000))
        envelope = np.minimum(1.0, np.minimum(t, beep_s - t) / 0.01)
        beep = 0.5 * np.sin(2 * np.pi * freq * t) * envelope
        gap = np.zeros(int(gap_s * SAMPLE_RATE))
        pieces = [gap]
        for _ in range(n):
            pieces += [beep, gap]
        return np.concatenate(pieces).astype(np.float32)

    def _flashes(self, n: int) -> np.ndarray:
        frames_per_flash, size = 3, 48
        total = 2 + n * frames_per_flash + 1
        frames = np.full((total, size, size, 3), 30, dtype=np.uint8)
        for k in range(n):
            f = 2 + k * frames_per_flash
            x, y = (int(v) for v in self.np_random.integers(4, size - 16, size=2))
            frames[f, y : y + 12, x : x + 12] = 255
        return frames
