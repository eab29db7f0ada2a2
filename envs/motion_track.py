"""MotionTrack: follow a moving ball in a short video.

* **Task** -- a red ball moves at constant speed inside a walled box, bouncing off the walls.
  The question asks its direction of motion, how many times it bounces, or in which quadrant
  of the frame it ends.
* **Observation** -- one user message: the question, its allowed answers, and a 96x96 video
  (16-24 frames at 8 fps).
* **Action** -- free text ending with the answer in ``\\boxed{}``: a direction (``up``,
  ``down-left`` ...), a count, or a quadrant (``top-left`` ...), as the question states.
* **Reward** -- 1.0 for the right answer, 0.1 for a wrong but valid one, else 0; ``success``
  means the right answer.
* **Difficulty** -- ``easy``: 16 frames, no bounce, one of 4 directions. ``medium``: 20
  frames, one of 8 directions, or the number of bounces (0-3). ``hard``: 24 frames, a blue
  ball as a distractor, the red ball's bounces (0-4) or final quadrant.

Bounces and final positions are only asked when they are clear: no bounce within a frame of
the clip's ends, no two walls hit at once, and the final position away from the midlines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from relax_gym.types import VideoPart

from ._base import BoxedAnswerEnv, Task

SIZE = 96
WALL = 3          # wall thickness in px; the ball moves inside [WALL, SIZE - WALL)
FPS = 8.0
DIRECTIONS4 = ("up", "down", "left", "right")
DIRECTIONS8 = ("up", "down", "left", "right", "up-left", "up-right", "down-left", "down-right")
QUADRANTS = ("top-left", "top-right", "bottom-left", "bottom-right")
_VECTORS = {
    "up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0),
    "up-left": (-1, -1), "up-right": (1, -1), "down-left": (-1, 1), "down-right": (1, 1),
}
RED, BLUE = (230, 50, 40), (60, 110, 240)


@dataclass(frozen=True)
class Level:
    frames: int
    radius: int
    questions: tuple[str, ...]
    max_bounces: int
    distractor: bool


LEVELS = {
    "easy": Level(16, 6, ("direction4",), 0, False),
    "medium": Level(20, 5, ("direction8", "bounces"), 3, False),
    "hard": Level(24, 5, ("bounces", "quadrant"), 4, True),
}


def reflect(start: float, velocity: float, t: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """Positions of a point bouncing between ``lo`` and ``hi``, and how many walls it has hit
    by each time (a triangle wave and its fold count)."""
    span = hi - lo
    s = start - lo + velocity * t
    folds = np.floor(s / span)
    u = np.mod(s, 2 * span)
    pos = lo + np.where(u <= span, u, 2 * span - u)
    return pos, np.abs(folds)


@dataclass(frozen=True)
class Track:
    x: np.ndarray
    y: np.ndarray
    bounces: int
    clear: bool  # no ambiguous bounce timing


def simulate(x0: float, y0: float, vx: float, vy: float, frames: int, r: float) -> Track:
    lo, hi = WALL + r, SIZE - WALL - r
    fine = np.linspace(0, frames - 1, (frames - 1) * 20 + 1)
    x, fx = reflect(x0, vx, fine, lo, hi)
    y, fy = reflect(y0, vy, fine, lo, hi)
    hits_x = np.flatnonzero(np.diff(fx)) + 1
    hits_y = np.flatnonzero(np.diff(fy)) + 1
    times = np.sort(np.concatenate([fine[hits_x], fine[hits_y]]))
    clear = bool(
        np.all(times >= 1.0) and np.all(times <= frames - 2.0) and (len(times) < 2 or np.min(np.diff(times)) >= 1.5)
    )
    idx = np.arange(frames) * 20
    return Track(x[idx], y[idx], len(times), clear)


class MotionTrackEnv(BoxedAnswerEnv[Level]):
    """Track a bouncing ball in a video; answer a direction, a count or a quadrant."""

    levels = LEVELS
    modalities = ("text", "video")
    tags = ("video", "tracking")

    def make_task(self, level: Level) -> Task:
        rng = self.np_random
        kind = str(rng.choice(level.questions))
        r = level.radius
        if kind.startswith("direction"):
            track, answer, options = self._straight(level, kind)
            question = "In which direction does the red ball move (up = towards the top of the frame)?"
        else:
            track = self._bouncing(level, kind)
            if kind == "bounces":
                answer = str(track.bounces)
                options = tuple(str(k) for k in range(level.max_bounces + 1))
                question = "How many times does the red ball bounce off a wall?"
            else:
                left = track.x[-1] < SIZE / 2
                top = track.y[-1] < SIZE / 2
                answer = f"{'top' if top else 'bottom'}-{'left' if left else 'right'}"
                options = QUADRANTS
                question = "In which quadrant of the frame is the red ball at the end of the video?"
        balls = [(self._distractor(level), BLUE)] if level.distractor else []
        balls.append((track, RED))  # drawn last: the red ball is never hidden
        frames = self._render(balls, level.frames, r)
        self._options = options
        note = " A blue ball also moves around; ignore it." if level.distractor else ""
        prompt = (
            f"{question}{note} Answer with one of: {', '.join(options)}. Reply as \\boxed{{answer}}."
        )
        return Task(prompt, answer, answer, (VideoPart(frames, FPS, id="clip"),), {"question": kind})

    def _straight(self, level: Level, kind: str) -> tuple[Track, str, tuple[str, ...]]:
        rng = self.np_random
        options = DIRECTIONS4 if kind == "direction4" else DIRECTIONS8
        name = str(rng.choice(options))
        dx, dy = _VECTORS[name]
        norm = math.hypot(dx, dy)
        distance = float(rng.uniform(30, 55))
        step = distance / (level.frames - 1)
        vx, vy = dx / norm * step, dy / norm * step
        lo, hi = WALL + level.radius + 2, SIZE - WALL - level.radius - 2
        # pick a start so the whole path stays clear of the walls
        x_range = (lo - min(0.0, vx * (level.frames - 1)), hi - max(0.0, vx * (level.frames - 1)))
        y_range = (lo - min(0.0, vy * (level.frames - 1)), hi - max(0.0, vy * (level.frames - 1)))
        x0, y0 = float(rng.uniform(*x_range)), float(rng.uniform(*y_range))
        return simulate(x0, y0, vx, vy, level.frames, level.radius), name, options

    def _random_motion(self, level: Level, speed: tuple[float, float] = (4.0, 8.0)) -> tuple[float, float, float, float]:
        rng = self.np_random
        lo, hi = WALL + level.radius, SIZE - WALL - level.radius
        v = float(rng.uniform(*speed))
        angle = float(rng.uniform(0, 2 * math.pi))
        x0, y0 = (float(c) for c in rng.uniform(lo, hi, size=2))
        return x0, y0, v * math.cos(angle), v * math.sin(angle)

    def _bouncing(self, level: Level, kind: str) -> Track:
        """A clear track; for bounce questions the count is drawn first, uniformly."""
        rng = self.np_random
        want = int(rng.integers(0, level.max_bounces + 1)) if kind == "bounces" else None
        for _ in range(500):  # rejection sampling: a few dozen tries at most in practice
            track = simulate(*self._random_motion(level, (1.5, 9.0)), level.frames, level.radius)
            if not track.clear or track.bounces > level.max_bounces:
                continue
            if want is not None and track.bounces != want:
                continue
            if kind == "quadrant":
                margin = level.radius + 4
                if track.bounces == 0 or min(abs(track.x[-1] - SIZE / 2), abs(track.y[-1] - SIZE / 2)) < margin:
                    continue
            return track
        # safety net, never reached in tests: a slow ball in the top-left quadrant, no bounce
        return simulate(SIZE / 4, SIZE / 4, 0.5, 0.0, level.frames, level.radius)

    def _distractor(self, level: Level) -> Track:
        return simulate(*self._random_motion(level), level.frames, level.radius)

    @staticmethod
    def _render(balls: list[tuple[Track, tuple[int, int, int]]], frames: int, r: int) -> np.ndarray:
        video = np.full((frames, SIZE, SIZE, 3), 25, dtype=np.uint8)
        video[:, :WALL] = video[:, -WALL:] = 170
        video[:, :, :WALL] = video[:, :, -WALL:] = 170
        for track, color in balls:
            for f in range(frames):  # a disc, computed only in the ball's bounding box
                cx, cy = float(track.x[f]), float(track.y[f])
                x0, y0 = max(0, int(cx) - r - 1), max(0, int(cy) - r - 1)
                x1, y1 = min(SIZE, int(cx) + r + 2), min(SIZE, int(cy) + r + 2)
                ys, xs = np.ogrid[y0:y1, x0:x1]
                mask = (xs - cx) ** 2 + (ys - cy) ** 2 <= r * r
                video[f, y0:y1, x0:x1][mask] = color
        return video

    def parse_answer(self, raw: str) -> str | None:
        word = raw.strip().strip(".").lower().replace(" ", "-").replace("_", "-")
        return word if word in self._options else None

    def random_answer(self, rng: np.random.Generator) -> str:
        self.require_task()
        return str(rng.choice(self._options))
