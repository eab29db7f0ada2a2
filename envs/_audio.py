"""Waveform synthesis shared by the audio envs: tones with click-free edges, silence, noise.

Everything is float32 mono at :data:`SAMPLE_RATE`; randomness comes from the caller's
generator, so a clip is a pure function of the env's seed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SAMPLE_RATE = 16_000
RAMP_S = 0.005  # fade in/out so tone edges do not click


def tone(freqs: float | Sequence[float], duration_s: float, amplitude: float = 0.4) -> np.ndarray:
    """A sum of sines (one per frequency) with short linear fades at both ends."""
    n = max(1, int(round(duration_s * SAMPLE_RATE)))
    t = np.arange(n, dtype=np.float64) / SAMPLE_RATE
    fs = [freqs] if isinstance(freqs, (int, float)) else list(freqs)
    wave = sum(np.sin(2 * np.pi * f * t) for f in fs) / len(fs)
    ramp = min(int(RAMP_S * SAMPLE_RATE), n // 2)
    if ramp > 0:
        env = np.ones(n)
        env[:ramp] = np.linspace(0.0, 1.0, ramp)
        env[-ramp:] = np.linspace(1.0, 0.0, ramp)
        wave = wave * env
    return (amplitude * wave).astype(np.float32)


def silence(duration_s: float) -> np.ndarray:
    return np.zeros(max(0, int(round(duration_s * SAMPLE_RATE))), dtype=np.float32)


def add_noise(wave: np.ndarray, snr_db: float | None, rng: np.random.Generator) -> np.ndarray:
    """White noise at ``snr_db`` relative to the clip's non-silent power (None: no noise)."""
    if snr_db is None:
        return wave.astype(np.float32)
    active = wave[np.abs(wave) > 1e-4]
    power = float(np.mean(active.astype(np.float64) ** 2)) if active.size else 1e-4
    noise = rng.normal(0.0, np.sqrt(power / 10 ** (snr_db / 10)), size=wave.shape)
    return np.clip(wave + noise, -1.0, 1.0).astype(np.float32)


def concat(pieces: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(p, dtype=np.float32) for p in pieces]) if pieces else silence(0.1)

