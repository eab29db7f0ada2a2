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


# -- a reward whose worker process crashes a set number of times (Ray fault tests) ---------------
CRASH_COUNTER_ENV = "MODES_TEST_REWARD_CRASHES"


def _crashy(sample: Any) -> float:
    """The env's reward; but while the counter file named by $MODES_TEST_REWARD_CRASHES holds a
    positive number, decrement it and kill this process (a reward worker crash)."""
    import fcntl
    import os
    from pathlib import Path

    path = os.environ.get(CRASH_COUNTER_ENV)
    if path and Path(path).is_file():
        with open(path, "r+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            left = int(fh.read().strip() or 0)
            if left > 0:
                fh.seek(0)
                fh.truncate()
                fh.write(str(left - 1))
                fh.flush()
                os.fsync(fh.fileno())
                os._exit(3)
    return float(sample.env_reward)


def _register_reward() -> None:
    from relax_gym.rewards import list_rewards, register_reward

    if "modes_test_crashy" not in {r.name for r in list_rewards()}:
        register_reward("modes_test_crashy", _crashy)


_register_reward()
