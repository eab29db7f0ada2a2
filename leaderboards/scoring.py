"""Scores with their uncertainty: success rates, pass@k / pass^k, normalised and suite scores.

Every interval is a percentile bootstrap over *tasks* (an env seed and all its attempts form one
cluster), so attempts of the same task are never treated as independent evidence. Each env
draws its bootstrap resamples from its own RNG, seeded from a fixed constant and the env id: an
env's interval does not depend on which other envs share the report, and a suite's interval is
built from exactly the same resamples as its envs' intervals (the replicates are averaged across
envs). Rerunning the scorer on the same episodes gives the same numbers, to the bit.

* ``pass@k`` -- the chance that at least one of ``k`` attempts succeeds, by the unbiased
  estimator ``1 - C(n-c, k) / C(n, k)`` (Chen et al., 2021) averaged over tasks.
* ``pass^k`` -- the chance that all ``k`` attempts succeed, ``C(c, k) / C(n, k)`` (the
  tau-bench estimator), averaged over tasks.
* normalised score -- ``(success - random) / (oracle - random)`` with the env's stored random
  and oracle baselines: 0 is guessing, 1 is the oracle. Baselines are treated as constants.

Where the bootstrap degenerates (every task scored the same, e.g. 0/20), an env's interval is
the Wilson score interval over its tasks instead of a single point.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 20_250_101
CI_LEVEL = 0.95


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its bootstrap confidence interval and the number of tasks."""

    value: float
    low: float
    high: float
    n: int

    def to_dict(self) -> dict[str, float | int]:
        return {k: (_round(v) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def _round(x: float) -> float:
    # 12 significant digits: stable across platforms' last-bit differences in summation order
    return float(f"{x:.12g}")


@dataclass(frozen=True)
class Baseline:
    """The success rates an env's random agent and oracle reach (``oracle`` is usually 1)."""

    random: float
    oracle: float = 1.0
    source: str = ""

    def normalise(self, success: float) -> float | None:
        span = self.oracle - self.random
        if span <= 1e-12:
            return None
        return (success - self.random) / span


@dataclass
class TaskOutcomes:
    """The attempts of one env: per task (seed), how many attempts ran and how many succeeded."""

    env_id: str
    seeds: list[int] = field(default_factory=list)
    attempts: list[int] = field(default_factory=list)
    successes: list[int] = field(default_factory=list)

    @classmethod
    def from_rows(cls, env_id: str, rows: Iterable[tuple[int, bool]]) -> TaskOutcomes:
        """Group ``(seed, success)`` rows by seed (sorted, so row order never matters)."""
        n: dict[int, int] = {}
        c: dict[int, int] = {}
        for seed, success in rows:
            n[seed] = n.get(seed, 0) + 1
            c[seed] = c.get(seed, 0) + int(bool(success))
        seeds = sorted(n)
        return cls(env_id, seeds, [n[s] for s in seeds], [c[s] for s in seeds])

    @property
    def num_tasks(self) -> int:
        return len(self.seeds)

    @property
    def num_episodes(self) -> int:
        return int(sum(self.attempts))

    def per_task_success(self) -> np.ndarray:
        return np.asarray(self.successes, dtype=float) / np.asarray(self.attempts, dtype=float)


# ------------------------------------------------------------------------------------------------
# estimators
# ------------------------------------------------------------------------------------------------
def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task with ``n`` attempts of which ``c`` succeeded."""
    _check_nck(n, c, k)
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Unbiased pass^k (all ``k`` attempts succeed) for one task."""
    _check_nck(n, c, k)
    return math.comb(c, k) / math.comb(n, k)


def _check_nck(n: int, c: int, k: int) -> None:
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")


def ks_for(n: int) -> list[int]:
    """The k values reported for tasks with ``n`` attempts: powers of two up to n, and n."""
    ks = [k for k in (1 << i for i in range(max(n, 1).bit_length())) if k <= n]
    if n >= 1 and n not in ks:
        ks.append(n)
    return ks


# ------------------------------------------------------------------------------------------------
# bootstrap
# ------------------------------------------------------------------------------------------------
def env_rng(env_id: str, seed: int = BOOTSTRAP_SEED) -> np.random.Generator:
    """The bootstrap RNG of one env: fixed seed, mixed with the env id (never Python's hash)."""
    return np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(env_id.encode())]))


def bootstrap_indices(env_id: str, num_tasks: int, samples: int = BOOTSTRAP_SAMPLES) -> np.ndarray:
    """``[samples, num_tasks]`` task indices drawn with replacement, reproducibly per env."""
    if num_tasks < 1:
        raise ValueError(f"{env_id}: no tasks to bootstrap")
    return env_rng(env_id).integers(0, num_tasks, size=(samples, num_tasks))


def interval(replicates: np.ndarray, level: float = CI_LEVEL) -> tuple[float, float]:
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(replicates, [alpha, 1.0 - alpha])
    return float(low), float(high)


def wilson(p: float, n: int, level: float = CI_LEVEL) -> tuple[float, float]:
    """Wilson score interval of a proportion ``p`` observed on ``n`` trials."""
    z = float(_z(level))
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(max(p * (1 - p), 0.0) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def _z(level: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(0.5 + level / 2)


def _estimate(value: float, replicates: np.ndarray, n: int, *, proportion: bool = True) -> Estimate:
    """Percentile bootstrap interval; Wilson's where the bootstrap degenerates.

    When every task scored the same (0/20 for a random agent, 20/20 for the oracle) each
    resample has the same mean and the percentile interval collapses to a point, claiming a
    certainty 20 tasks cannot give. For proportions the Wilson score interval over tasks is
    used then (0/20 -> [0, 0.16]).
    """
    if proportion and n > 0 and float(np.ptp(replicates)) == 0.0 and 0.0 <= value <= 1.0:
        low, high = wilson(value, n)
    else:
        low, high = interval(replicates)
    # percentile intervals of a mean always contain it, but guard against float noise
    return Estimate(value, min(low, value), max(high, value), n)


@dataclass
class EnvScore:
    """Everything scored for one env, with the bootstrap replicates kept for suite aggregation."""

    env_id: str
    success: Estimate
    normalised: Estimate | None
    pass_at: dict[int, Estimate]
    pass_hat: dict[int, Estimate]
    baseline: Baseline | None
    num_episodes: int
    success_replicates: np.ndarray = field(repr=False)
    normalised_replicates: np.ndarray | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, object]:
        return {
            "success": self.success.to_dict(),
            "normalised": self.normalised.to_dict() if self.normalised else None,
            "pass_at_k": {str(k): e.to_dict() for k, e in self.pass_at.items()},
            "pass_hat_k": {str(k): e.to_dict() for k, e in self.pass_hat.items()},
            "baseline": (
                {
                    "random": _round(self.baseline.random),
                    "oracle": _round(self.baseline.oracle),
                    "source": self.baseline.source,
                }
                if self.baseline
                else None
            ),
            "tasks": self.success.n,
            "episodes": self.num_episodes,
        }


def score_env(outcomes: TaskOutcomes, baseline: Baseline | None = None, samples: int = BOOTSTRAP_SAMPLES) -> EnvScore:
    """Success, pass@k, pass^k and the normalised score of one env, each with a 95% CI."""
    idx = bootstrap_indices(outcomes.env_id, outcomes.num_tasks, samples)
    per_task = outcomes.per_task_success()
    reps = per_task[idx].mean(axis=1)
    success = _estimate(float(per_task.mean()), reps, outcomes.num_tasks)

    pass_at: dict[int, Estimate] = {}
    pass_hat: dict[int, Estimate] = {}
    n_min = min(outcomes.attempts)
    for k in ks_for(n_min):
        at = np.array([pass_at_k(n, c, k) for n, c in zip(outcomes.attempts, outcomes.successes, strict=True)])
        hat = np.array([pass_hat_k(n, c, k) for n, c in zip(outcomes.attempts, outcomes.successes, strict=True)])
        pass_at[k] = _estimate(float(at.mean()), at[idx].mean(axis=1), outcomes.num_tasks)
        pass_hat[k] = _estimate(float(hat.mean()), hat[idx].mean(axis=1), outcomes.num_tasks)

    normalised = norm_reps = None
    if baseline is not None and baseline.normalise(success.value) is not None:
        # a fixed linear map of the success rate: its interval is the mapped success interval
        span = baseline.oracle - baseline.random
        norm_reps = (reps - baseline.random) / span
        lo, hi = sorted(((success.low - baseline.random) / span, (success.high - baseline.random) / span))
        normalised = Estimate((success.value - baseline.random) / span, lo, hi, outcomes.num_tasks)
    return EnvScore(
        outcomes.env_id, success, normalised, pass_at, pass_hat, baseline, outcomes.num_episodes, reps, norm_reps
    )


def aggregate(scores: Sequence[EnvScore], *, normalised: bool) -> Estimate | None:
    """Mean over envs with a CI from the envs' own replicates (envs resampled independently).

    For ``normalised=True`` every env needs a baseline; otherwise the result is None rather
    than a mean over a silently smaller set of envs.
    """
    if not scores:
        return None
    if normalised:
        if any(s.normalised is None or s.normalised_replicates is None for s in scores):
            return None
        members = [s.normalised for s in scores]
        reps = np.mean([s.normalised_replicates for s in scores if s.normalised_replicates is not None], axis=0)
    else:
        members = [s.success for s in scores]
        reps = np.mean([s.success_replicates for s in scores], axis=0)
    value = float(np.mean([m.value for m in members]))  # type: ignore[union-attr]
    n = sum(s.success.n for s in scores)
    if float(np.ptp(reps)) == 0.0:
        # every env degenerate: average the envs' own (Wilson) bounds -- conservative, as if
        # the envs' errors were perfectly correlated
        low = float(np.mean([m.low for m in members]))  # type: ignore[union-attr]
        high = float(np.mean([m.high for m in members]))  # type: ignore[union-attr]
        return Estimate(value, min(low, value), max(high, value), n)
    return _estimate(value, reps, n, proportion=False)


def group_scores(scores: Mapping[str, EnvScore], groups: Mapping[str, Sequence[str]]) -> dict[str, dict[str, object]]:
    """Sub-scores over named groups of envs (per modality, tool use): raw and normalised means."""
    out: dict[str, dict[str, object]] = {}
    for name, env_ids in groups.items():
        members = [scores[e] for e in sorted(env_ids) if e in scores]
        if not members:
            continue
        raw = aggregate(members, normalised=False)
        norm = aggregate(members, normalised=True)
        out[name] = {
            "envs": [m.env_id for m in members],
            "success": raw.to_dict() if raw else None,
            "normalised": norm.to_dict() if norm else None,
        }
    return out


__all__ = [
    "BOOTSTRAP_SAMPLES",
    "BOOTSTRAP_SEED",
    "CI_LEVEL",
    "Baseline",
    "EnvScore",
    "Estimate",
    "TaskOutcomes",
    "aggregate",
    "bootstrap_indices",
    "group_scores",
    "interval",
    "ks_for",
    "pass_at_k",
    "pass_hat_k",
    "score_env",
    "wilson",
]
