"""ToneCompare: which of a few pure tones is the highest, lowest, longest or shortest?

* **Task** -- the clip plays 2-4 tones separated by short silences; the question asks which
  tone is extreme in pitch or in duration.
* **Observation** -- one user message: the question and a mono 16 kHz clip (at most 3 s).
* **Action** -- free text ending with the tone's position (1 = first) as ``\\boxed{k}``.
* **Reward** -- 1.0 for the right tone, 0.1 for a wrong but valid position, else 0;
  ``success`` means the right tone.
* **Difficulty** -- ``easy``: 2 tones of equal length, "which is higher?", 4-12 semitones
  apart. ``medium``: 2 tones, pitch (1-3 semitones apart) or duration (30-60 % apart)
  questions. ``hard``: 3-4 tones, highest/lowest/longest/shortest, pitches at least one
  semitone apart, durations at least 25 % apart, uneven loudness as a distractor, 12 dB SNR.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from relax_gym.types import AudioPart

from ._answers import parse_int
from ._audio import SAMPLE_RATE, add_noise, concat, silence, tone
from ._base import BoxedAnswerEnv, Task

_QUESTION = {
    "highest": ("pitch", max, "highest in pitch"),
    "lowest": ("pitch", min, "lowest in pitch"),
    "longest": ("duration", max, "longest"),
    "shortest": ("duration", min, "shortest"),
}


@dataclass(frozen=True)
class Level:
    tones: tuple[int, int]
    questions: tuple[str, ...]
    semitones: tuple[float, float]   # spacing between neighbouring pitches
    ratio: tuple[float, float]       # spacing between neighbouring durations (fraction)
    loudness: tuple[float, float]
    snr_db: float | None


LEVELS = {
    "easy": Level((2, 2), ("highest",), (4, 12), (0.0, 0.0), (0.4, 0.4), None),
    "medium": Level((2, 2), ("highest", "lowest", "longest", "shortest"), (1, 3), (0.3, 0.6), (0.4, 0.4), None),
    "hard": Level((3, 4), ("highest", "lowest", "longest", "shortest"), (1, 2), (0.25, 0.4), (0.2, 0.5), 12.0),
}


class ToneCompareEnv(BoxedAnswerEnv[Level]):
    """Pick the highest / lowest / longest / shortest of a few tones; answer ``\\boxed{k}``."""

    levels = LEVELS
    modalities = ("text", "audio")
    tags = ("audio", "comparison")

    def make_task(self, level: Level) -> Task:
        rng = self.np_random
        n = int(rng.integers(level.tones[0], level.tones[1] + 1))
        question = str(rng.choice(level.questions))
        # pitches: a random base, then distinct steps up, shuffled into the play order
        base_hz = float(np.exp(rng.uniform(np.log(220), np.log(660))))
        steps = np.cumsum(np.concatenate([[0.0], rng.uniform(*level.semitones, size=n - 1)]))
        pitches = base_hz * 2 ** (rng.permutation(steps) / 12)
        growth = np.ones(n)
        if level.ratio[1] > 0:
            growth = np.cumprod(np.concatenate([[1.0], 1 + rng.uniform(*level.ratio, size=n - 1)]))
        # scale so the tones fit in about 1.8 s: the clip stays under 3 s with its silences
        base_s = min(float(rng.uniform(0.3, 0.4)), 1.8 / float(growth.sum()))
        durations = base_s * rng.permutation(growth)
        loud = rng.uniform(*level.loudness, size=n)
        pieces = [silence(0.1)]
        for f, d, a in zip(pitches, durations, loud, strict=True):
            pieces += [tone(float(f), float(d), float(a)), silence(0.25)]
        wave = add_noise(concat(pieces), level.snr_db, rng)
        attr, pick, words = _QUESTION[question]
        values = list(pitches if attr == "pitch" else durations)
        answer = values.index(pick(values)) + 1
        prompt = (
            f"The audio clip plays {n} tones, one after another with short silences between them. "
            f"Which tone is the {words}? Reply with its position (1 = the first tone) as \\boxed{{k}}."
        )
        self._n = n
        return Task(prompt, answer, str(answer), (AudioPart(wave, SAMPLE_RATE, id="tones"),), {"question": question})

    def parse_answer(self, raw: str) -> int | None:
        value = parse_int(raw)
        return value if value is not None and 1 <= value <= self._n else None

    def random_answer(self, rng: np.random.Generator) -> str:
        self.require_task()
        return str(int(rng.integers(1, self._n + 1)))
