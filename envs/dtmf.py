"""DTMFDecode: name the telephone keys pressed in an audio clip of DTMF tones.

* **Task** -- each key press of a phone keypad is a DTMF tone: the sum of a row frequency
  (697/770/852/941 Hz) and a column frequency (1209/1336/1477 Hz). Say which keys were pressed,
  in order.
* **Observation** -- one user message: the instructions and a mono 16 kHz clip (at most 2 s).
* **Action** -- free text ending with the keys as ``\\boxed{...}`` using ``0-9``, ``*`` and
  ``#``, e.g. ``\\boxed{41#7}`` (spaces, commas and dashes between keys are ignored).
* **Reward** -- 1.0 for the exact sequence, 0.1 for a well-formed wrong one, else 0;
  ``success`` means the exact sequence.
* **Difficulty** -- ``easy``: 2 digits (no ``*``/``#``), long tones, no noise, the count is
  given. ``medium``: 4 keys from all 12, shorter tones, noise at 15 dB SNR, the count is given.
  ``hard``: 5-8 keys, 60-90 ms tones with uneven gaps, 6 dB SNR and uneven row/column
  loudness; the count is not given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from relax_gym.types import AudioPart

from ._audio import SAMPLE_RATE, add_noise, concat, silence, tone
from ._base import BoxedAnswerEnv, Task

ROWS_HZ = (697.0, 770.0, 852.0, 941.0)
COLS_HZ = (1209.0, 1336.0, 1477.0)
KEYPAD = ("123", "456", "789", "*0#")
FREQS: dict[str, tuple[float, float]] = {
    key: (ROWS_HZ[r], COLS_HZ[c]) for r, row in enumerate(KEYPAD) for c, key in enumerate(row)
}
DIGITS = "0123456789"
ALL_KEYS = "".join(KEYPAD)
_SEPARATORS = re.compile(r"[\s,\-]")


@dataclass(frozen=True)
class Level:
    keys: str                      # the alphabet drawn from
    length: tuple[int, int]        # inclusive
    tone_s: tuple[float, float]
    gap_s: tuple[float, float]
    snr_db: float | None
    twist_db: float                # max loudness difference between row and column tones
    tell_length: bool


LEVELS = {
    "easy": Level(DIGITS, (2, 2), (0.18, 0.18), (0.15, 0.15), None, 0.0, True),
    "medium": Level(ALL_KEYS, (4, 4), (0.10, 0.10), (0.08, 0.08), 15.0, 0.0, True),
    "hard": Level(ALL_KEYS, (5, 8), (0.06, 0.09), (0.04, 0.10), 6.0, 4.0, False),
}


def parse_keys(raw: str) -> str | None:
    keys = _SEPARATORS.sub("", raw)
    return keys if keys and all(k in ALL_KEYS for k in keys) else None


class DTMFDecodeEnv(BoxedAnswerEnv[Level]):
    """Decode DTMF key presses from audio; answer ``\\boxed{keys}``."""

    levels = LEVELS
    modalities = ("text", "audio")
    tags = ("audio", "decoding")

    def make_task(self, level: Level) -> Task:
        rng = self.np_random
        n = int(rng.integers(level.length[0], level.length[1] + 1))
        keys = "".join(str(k) for k in rng.choice(list(level.keys), size=n))
        pieces = [silence(0.1)]
        for key in keys:
            low, high = FREQS[key]
            twist = 10 ** (float(rng.uniform(-level.twist_db, level.twist_db)) / 20)
            dur = float(rng.uniform(*level.tone_s))
            pieces.append(tone(low, dur, 0.3 * twist) + tone(high, dur, 0.3 / twist))
            pieces.append(silence(float(rng.uniform(*level.gap_s))))
        wave = add_noise(concat(pieces), level.snr_db, rng)
        count = f"It holds {n} key presses. " if level.tell_length else ""
        alphabet = "digits 0-9" if level.keys == DIGITS else "keys 0-9, * and #"
        prompt = (
            "The audio clip is a sequence of telephone keypad tones (DTMF). "
            f"{count}Which keys were pressed, in order? They are {alphabet}. "
            "Reply with the keys as \\boxed{...}, e.g. \\boxed{" + ("41" if level.keys == DIGITS else "41#7") + "}."
        )
        return Task(prompt, keys, keys, (AudioPart(wave, SAMPLE_RATE, id="tones"),), {"length": n})

    def parse_answer(self, raw: str) -> str | None:
        return parse_keys(raw)

    def random_answer(self, rng: np.random.Generator) -> str:
        lo, hi = self.level.length
        n = int(rng.integers(lo, hi + 1))
        return "".join(str(k) for k in rng.choice(list(self.level.keys), size=n))
