"""Reward metrics: each component's mean, the total's mean, and every failure counted by kind.

Keys (all floats, ready for a logger)::

    reward/mean, reward/count, reward/failed, reward/failure_rate
    reward/<component>/mean, reward/<component>/count, reward/<component>/failed
    reward/<component>/retries            (when the component reports HTTP retries)
    reward/failures/<kind>                (timeout, exception, unparseable, http, ...)

Means are over the samples that have the value; failures never enter a mean as 0.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from relax_gym.rewards.types import RewardResult


class RewardStats:
    """Running sums that :meth:`summary` turns into the metric dict; :meth:`reset` per step."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.count = 0
        self.failed = 0
        self.total_sum = 0.0
        self.total_n = 0
        self.comp_sum: dict[str, float] = defaultdict(float)
        self.comp_n: dict[str, int] = defaultdict(int)
        self.comp_failed: dict[str, int] = defaultdict(int)
        self.comp_retries: dict[str, int] = defaultdict(int)
        self.kinds: dict[str, int] = defaultdict(int)

    def update(self, results: Iterable[RewardResult]) -> None:
        for r in results:
            self.count += 1
            if r.failed:
                self.failed += 1
            if r.total is not None:
                self.total_sum += r.total
                self.total_n += 1
            for name, value in r.components.items():
                self.comp_sum[name] += value
                self.comp_n[name] += 1
            for name, fail in r.errors.items():
                self.comp_failed[name] += 1
                self.kinds[fail.kind] += 1
            for name, details in r.details.items():
                retries = details.get("retries")
                if isinstance(retries, int) and not isinstance(retries, bool):
                    self.comp_retries[name] += retries

    def summary(self, prefix: str = "reward") -> dict[str, float]:
        out: dict[str, float] = {
            f"{prefix}/count": float(self.count),
            f"{prefix}/failed": float(self.failed),
            f"{prefix}/failure_rate": self.failed / self.count if self.count else 0.0,
        }
        if self.total_n:
            out[f"{prefix}/mean"] = self.total_sum / self.total_n
        for name in sorted(set(self.comp_n) | set(self.comp_failed)):
            if self.comp_n.get(name):
                out[f"{prefix}/{name}/mean"] = self.comp_sum[name] / self.comp_n[name]
            out[f"{prefix}/{name}/count"] = float(self.comp_n.get(name, 0))
            out[f"{prefix}/{name}/failed"] = float(self.comp_failed.get(name, 0))
        for name, retries in sorted(self.comp_retries.items()):
            out[f"{prefix}/{name}/retries"] = float(retries)
        for kind, n in sorted(self.kinds.items()):
            out[f"{prefix}/failures/{kind}"] = float(n)
        return out


def summarize(results: Iterable[RewardResult], prefix: str = "reward") -> dict[str, float]:
    """Metrics for one batch of results (see the module docstring for the keys)."""
    stats = RewardStats()
    stats.update(results)
    return stats.summary(prefix)


__all__ = ["RewardStats", "summarize"]
