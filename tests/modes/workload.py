"""A tiny single-turn text task for the modes tests: "write vowels". The reward is the fraction of
letters in the reply that are vowels, so a random tiny model scores about 0.3 and RL can move it.
Importing this module registers the env (Ray workers import it through ``async_rl.imports``)."""

from __future__ import annotations

from typing import Any

import relax_gym
from relax_gym import Action, Message, Observation

ENV_ID = "modes-test/Vowels-v0"


class VowelsEnv(relax_gym.Env):
    max_turns = 1

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):  # type: ignore[override]
        super().reset(seed=seed)
        self.n = int(self.np_random.integers(0, 1000))
        return Observation([Message.user(f"Task {self.n}: reply with vowels only.")]), {}

    def step(self, action: Action | str):  # type: ignore[override]
        text = Action.coerce(action).text
        letters = [ch for ch in text.lower() if ch.isalpha()]
        score = sum(ch in "aeiou" for ch in letters) / max(1, len(letters))
        return Observation([]), float(score), True, False, {"success": score >= 0.5}


if ENV_ID not in relax_gym.registration.registry:
    relax_gym.register(ENV_ID, VowelsEnv, max_turns=1, modalities=["text"], description="modes test task")
