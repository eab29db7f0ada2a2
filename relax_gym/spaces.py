"""Gymnasium spaces for language-model environments.

An observation is a structured :class:`~relax_gym.types.Observation` and an action is free text
(or a parsed :class:`~relax_gym.types.Action`), which no built-in Gymnasium space describes.
These two spaces let Gymnasium's own ``check_env`` and wrappers work on relax_gym envs.
"""

from __future__ import annotations

import string
from typing import Any

import numpy as np
from gymnasium import spaces

from relax_gym.types import Action, Observation

_SAMPLE_ALPHABET = string.ascii_letters + string.digits + string.punctuation + " \n"


class ObservationSpace(spaces.Space[Observation]):
    """Every :class:`Observation`; sampling is meaningless for chat observations."""

    def __init__(self, seed: int | np.random.Generator | None = None) -> None:
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        return isinstance(x, Observation)

    def sample(self, mask: Any | None = None, probability: Any | None = None) -> Observation:
        return Observation()

    def __repr__(self) -> str:
        return "ObservationSpace()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObservationSpace)


class TextActionSpace(spaces.Space[str]):
    """Free-form model output. ``sample()`` draws random printable text (a junk action that an
    env must survive), reproducibly from the space's own seed."""

    def __init__(self, max_length: int = 64, seed: int | np.random.Generator | None = None) -> None:
        self.max_length = max_length
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        return isinstance(x, (str, Action))

    def sample(self, mask: Any | None = None, probability: Any | None = None) -> str:
        length = int(self.np_random.integers(1, self.max_length + 1))
        idx = self.np_random.integers(0, len(_SAMPLE_ALPHABET), size=length)
        return "".join(_SAMPLE_ALPHABET[i] for i in idx)

    def __repr__(self) -> str:
        return f"TextActionSpace(max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TextActionSpace) and other.max_length == self.max_length
