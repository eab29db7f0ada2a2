"""Small environments used by the core tests (importable by spawned worker processes)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
from PIL import Image

import relax_gym
from relax_gym import Action, Message, Observation


class GuessEnv(relax_gym.Env):
    """Guess a number in 1..10 within 3 turns; feedback says higher/lower."""

    max_turns = 3
    tags = ("game", "multi-turn")

    def __init__(self, high: int = 10) -> None:
        self.high = high
        self.target = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.target = int(self.np_random.integers(1, self.high + 1))
        self.lo, self.hi = 1, self.high
        return Observation([Message.user(f"Guess a number from 1 to {self.high}. Reply with the number.")]), {}

    def step(self, action: Action | str):
        text = Action.coerce(action).text.strip()
        if not text.isdigit():
            return Observation.from_text("Invalid guess: reply with a whole number."), 0.0, False, False, {"invalid_action": True}
        guess = int(text)
        if guess == self.target:
            return Observation(), 1.0, True, False, {"success": True}
        if guess < self.target:
            self.lo = max(self.lo, guess + 1)
            return Observation.from_text("Higher."), 0.0, False, False, {}
        self.hi = min(self.hi, guess - 1)
        return Observation.from_text("Lower."), 0.0, False, False, {}

    def oracle(self):
        while True:
            yield str(self.target)

    def random_action(self, rng: np.random.Generator) -> str:
        return str(int(rng.integers(1, self.high + 1)))


class GlobalRandomEnv(relax_gym.Env):
    """Deliberately broken: draws its task from the global `random` module, not np_random."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.value = random.randint(0, 10**9)
        return Observation([Message.user(f"Repeat {self.value}")]), {}

    def step(self, action: Action | str):
        ok = Action.coerce(action).text.strip() == str(self.value)
        return Observation(), float(ok), True, False, {"success": ok}

    def oracle(self):
        yield str(self.value)


class CrashOnJunkEnv(relax_gym.Env):
    """Deliberately broken: raises on any non-numeric action."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.n = int(self.np_random.integers(0, 100))
        return Observation([Message.user(f"Echo {self.n}")]), {}

    def step(self, action: Action | str):
        value = int(Action.coerce(action).text)  # ValueError on junk
        return Observation(), float(value == self.n), True, False, {"success": value == self.n}

    def oracle(self):
        yield str(self.n)


class ImageEnv(relax_gym.Env):
    """Declares text only but returns an image: the checker must flag it."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        color = tuple(int(c) for c in self.np_random.integers(0, 255, size=3))
        return Observation([Message.user("What colour?", Image.new("RGB", (8, 8), color))]), {}

    def step(self, action: Action | str):
        return Observation(), 0.0, True, False, {"success": False}
