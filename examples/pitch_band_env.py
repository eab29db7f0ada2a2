"""PitchBand: in which pitch band is a tone? An audio task for the CPU example.

* **Task** -- one tone plays; say which of ``bands`` pitch bands it falls in (1 = lowest). The
  band centres are an octave apart from 400 Hz (``easy``: 4 bands, 400-3200 Hz, chance 1/4),
  two thirds of an octave apart from 300 Hz (``medium``: 6 bands), the tone within +-3 semitones
  of its centre, with a random length and loudness. ``hard``: like medium, in white noise at
  10 dB SNR. (Centres start at 400 Hz: below 1 kHz Whisper's mel bins are linear, 250 and 500 Hz
  fall only 11 bins apart, and a first version with a 250 Hz base never told those two apart.)
* **Observation** -- the question and a mono 16 kHz clip (under 1.5 s).
* **Action** -- ``\\boxed{k}``; reward 1 for the right band, 0.1 for another valid band.

Used by ``examples/audio_cpu.yaml`` through ``entry_point``. The shipped relax/ToneCompare-v0
``easy`` (which of two tones is higher: a comparison across time) did not learn within the CPU
budget with the tiny thinker (docs/benchmarks.md, "Audio").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from relax_gym.envs._audio import SAMPLE_RATE, add_noise, concat, silence, tone
from relax_gym.envs._base import BoxedAnswerEnv, Task
from relax_gym.types import AudioPart


@dataclass(frozen=True)
class Level:
    bands: int
    base_hz: float
    octaves_apart: float
    snr_db: float | None


class PitchBandEnv(BoxedAnswerEnv[Level]):
    """Name the pitch band (1 = lowest) of one tone."""

    levels = {"easy": Level(4, 400.0, 1.0, None), "medium": Level(6, 300.0, 2 / 3, None),
              "hard": Level(6, 300.0, 2 / 3, 10.0)}
    modalities = ("text", "audio")
    tags = ("audio", "pitch")

    def make_task(self, level: Level) -> Task:
        rng = self.np_random
        band = int(rng.integers(1, level.bands + 1))
        hz = level.base_hz * 2 ** ((band - 1) * level.octaves_apart) * 2 ** (float(rng.uniform(-3, 3)) / 12)
        wave = concat([silence(0.1), tone(hz, float(rng.uniform(0.4, 0.9)), float(rng.uniform(0.2, 0.5))),
                       silence(0.2)])
        wave = add_noise(wave, level.snr_db, rng)
        prompt = (f"A tone plays. Which pitch band is it in, from 1 (lowest) to {level.bands} (highest)? "
                  "Reply as \\boxed{k}.")
        self._bands = level.bands
        return Task(prompt, band, str(band), (AudioPart(wave, SAMPLE_RATE, id="tone"),), {"hz": round(hz, 1)})

    def parse_answer(self, raw: str) -> int | None:
        try:
            value = int(raw.strip().strip("."))
        except ValueError:
            return None
        return value if 1 <= value <= self._bands else None

    def random_answer(self, rng: np.random.Generator) -> str:
        self.require_task()
        return str(int(rng.integers(1, self._bands + 1)))
