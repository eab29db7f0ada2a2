"""Weighted composition of reward functions, per env or per dataset row.

A config is a list of entries::

    [{"name": "math_equiv", "weight": 1.0},
     {"name": "format_tags", "weight": 0.1, "kwargs": {"tags": ["think", "answer"]}},
     {"name": "env", "weight": 1.0}]

Each entry becomes one component of :class:`RewardResult` (named by ``component``, default the
reward's name); the total is the weighted sum of the components' values. The plan for a sample
is chosen in this order: its own ``metadata["rewards"]`` (a per-row config), the composer's
``per_env[metadata["env_id"]]``, the composer's default entries.

A component that fails marks the sample failed (``total=None``) unless its entry says
``on_failure: skip``, which leaves it out of the total but still records the failure.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from relax_gym.rewards.metrics import RewardStats
from relax_gym.rewards.registry import RewardFn, get_reward
from relax_gym.rewards.safe_call import Outcome, run_group, run_sample
from relax_gym.rewards.types import RewardInput, RewardResult


class RewardEntry(BaseModel):
    """One component of a reward plan."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="registered reward name or 'module:function'")
    weight: float = Field(1.0, description="multiplies the component's value in the total")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for the function")
    component: str | None = Field(None, description="name in results and metrics; default: the reward name")
    timeout_s: float | None = Field(None, gt=0, description="per call; default: the composer's timeout")
    on_failure: Literal["fail", "skip"] = Field(
        "fail", description="fail: the sample's total is None; skip: leave the component out of the total"
    )

    @field_validator("name")
    @classmethod
    def _non_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("reward name must not be empty")
        return v.strip()

    @property
    def label(self) -> str:
        return self.component or self.name.rsplit(":", 1)[-1]


EntryLike = RewardEntry | Mapping[str, Any] | str


def parse_entries(config: Sequence[EntryLike] | EntryLike) -> list[RewardEntry]:
    """Validate a config: entries may be dicts, RewardEntry objects or bare names (weight 1)."""
    if isinstance(config, (str, RewardEntry, Mapping)):
        config = [config]
    entries = [
        e if isinstance(e, RewardEntry) else RewardEntry(name=e) if isinstance(e, str) else RewardEntry.model_validate(dict(e))
        for e in config
    ]
    if not entries:
        raise ValueError("a reward config needs at least one entry")
    labels = [e.label for e in entries]
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        raise ValueError(f"duplicate reward components {dupes}: give each a distinct 'component' name")
    return entries


class _Plan:
    """Entries with their functions resolved (names are checked when the plan is built).

    A plan that could not be built from a dataset row's config carries ``error`` instead: its
    samples fail with kind ``config`` rather than crashing the whole batch.
    """

    def __init__(self, entries: list[RewardEntry], error: str | None = None) -> None:
        self.entries = entries
        self.error = error
        self.fns: list[RewardFn] = [get_reward(e.name) for e in entries]
        self.key = json.dumps([e.model_dump() for e in entries], sort_keys=True, default=str) + (error or "")


class RewardComposer:
    """Scores batches of samples with a weighted sum of reward functions.

    ``timeout_s`` bounds each call (an entry's ``timeout_s`` overrides it); ``max_concurrency``
    bounds how many calls run at once. ``stats`` accumulates per-component metrics across
    calls; :func:`relax_gym.rewards.summarize` gives the same metrics for one batch.
    """

    def __init__(
        self,
        entries: Sequence[EntryLike] | EntryLike,
        *,
        per_env: Mapping[str, Sequence[EntryLike] | EntryLike] | None = None,
        timeout_s: float | None = 60.0,
        max_concurrency: int = 64,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        self.default = _Plan(parse_entries(entries))
        self.per_env = {env_id: _Plan(parse_entries(cfg)) for env_id, cfg in (per_env or {}).items()}
        self.timeout_s = timeout_s
        self.max_concurrency = max_concurrency
        self.stats = RewardStats()
        self._row_plans: dict[str, _Plan] = {}

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | Sequence[EntryLike]) -> RewardComposer:
        """Build from a list of entries, or a dict ``{"rewards": [...], "per_env": {...},
        "timeout_s": ..., "max_concurrency": ...}`` (as it appears in a training config)."""
        if isinstance(config, Mapping):
            extra = set(config) - {"rewards", "per_env", "timeout_s", "max_concurrency"}
            if extra:
                raise ValueError(f"unknown reward config keys {sorted(extra)}")
            if "rewards" not in config:
                raise ValueError("a reward config dict needs a 'rewards' list")
            return cls(
                config["rewards"],
                per_env=config.get("per_env"),
                timeout_s=config.get("timeout_s", 60.0),
                max_concurrency=config.get("max_concurrency", 64),
            )
        return cls(config)

    # -- plan selection -----------------------------------------------------------------------
    def plan_for(self, sample: RewardInput) -> _Plan:
        row = sample.metadata.get("rewards")
        if row is not None:
            key = json.dumps(row, sort_keys=True, default=str)
            plan = self._row_plans.get(key)
            if plan is None:
                try:
                    plan = _Plan(parse_entries(row))
                except (ValueError, KeyError, TypeError) as exc:
                    plan = _Plan([], error=f"bad per-row reward config {row!r}: {exc}")
                self._row_plans[key] = plan
            return plan
        env_id = sample.metadata.get("env_id")
        if env_id is not None and env_id in self.per_env:
            return self.per_env[env_id]
        return self.default

    # -- scoring ------------------------------------------------------------------------------
    async def score(self, samples: Sequence[RewardInput]) -> list[RewardResult]:
        """Score a batch concurrently; one result per sample, in order. Never raises: a failing
        reward or a bad per-row config becomes a failed result."""
        samples = list(samples)
        plans = [self.plan_for(s) for s in samples]
        outcomes: list[dict[str, Outcome]] = [{} for _ in samples]
        sem = asyncio.Semaphore(self.max_concurrency)

        async def one(plan: _Plan, j: int, i: int) -> None:
            entry, rf = plan.entries[j], plan.fns[j]
            async with sem:
                outcomes[i][entry.label] = await run_sample(
                    rf, samples[i], entry.kwargs, self._timeout(entry), f"reward {entry.label!r}"
                )

        async def group(plan: _Plan, j: int, idx: list[int]) -> None:
            entry, rf = plan.entries[j], plan.fns[j]
            async with sem:
                outs = await run_group(
                    rf, [samples[i] for i in idx], entry.kwargs, self._timeout(entry), f"reward {entry.label!r}"
                )
            for i, out in zip(idx, outs):
                outcomes[i][entry.label] = out

        tasks = []
        for idx in self._groups(samples, plans).values():
            plan = plans[idx[0]]
            for j, rf in enumerate(plan.fns):
                if rf.group:
                    tasks.append(group(plan, j, idx))
                else:
                    tasks.extend(one(plan, j, i) for i in idx)
        await asyncio.gather(*tasks)
        results = [self._assemble(plans[i], outcomes[i]) for i in range(len(samples))]
        self.stats.update(results)
        return results

    def score_sync(self, samples: Sequence[RewardInput]) -> list[RewardResult]:
        """Blocking :meth:`score` for code without an event loop (it starts one)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.score(samples))
        raise RuntimeError("score_sync() called inside a running event loop; use `await composer.score(...)`")

    async def score_one(self, sample: RewardInput) -> RewardResult:
        return (await self.score([sample]))[0]

    # -- helpers ------------------------------------------------------------------------------
    def _timeout(self, entry: RewardEntry) -> float | None:
        return entry.timeout_s if entry.timeout_s is not None else self.timeout_s

    @staticmethod
    def _groups(samples: list[RewardInput], plans: list[_Plan]) -> dict[tuple[str, Any], list[int]]:
        """Samples sharing a plan and a ``group_id``; a sample without one is its own group."""
        groups: dict[tuple[str, Any], list[int]] = {}
        for i, (s, p) in enumerate(zip(samples, plans)):
            gid = s.group_id
            key = (p.key, ("__single__", i) if gid is None else ("group", _hashable(gid)))
            groups.setdefault(key, []).append(i)
        return groups

    @staticmethod
    def _assemble(plan: _Plan, outcomes: dict[str, Outcome]) -> RewardResult:
        if plan.error is not None:
            return RewardResult.failure("config", plan.error, component="config")
        result = RewardResult(total=None)
        total = 0.0
        for entry in plan.entries:
            out = outcomes[entry.label]
            if out.details:
                result.details[entry.label] = out.details
            if out.failure is not None:
                result.errors[entry.label] = out.failure
                if entry.on_failure == "fail":
                    result.failed = True
                continue
            assert out.total is not None
            result.components[entry.label] = out.total
            for part, value in out.parts.items():
                result.components[f"{entry.label}/{part}"] = value
            total += entry.weight * out.total
        result.total = None if result.failed else total
        if result.errors:
            result.error = "; ".join(f"{name}: {fail}" for name, fail in result.errors.items())
        return result


def _hashable(value: Any) -> Any:
    try:
        hash(value)
        return value
    except TypeError:
        return json.dumps(value, sort_keys=True, default=str)


async def score_samples(config: Sequence[EntryLike] | EntryLike, samples: Sequence[RewardInput],
                        **composer_kwargs: Any) -> list[RewardResult]:
    """One-off scoring without keeping a composer around."""
    return await RewardComposer(config, **composer_kwargs).score(samples)


def evaluate_reward(name: str, sample: RewardInput, *, call_timeout_s: float | None = 60.0,
                    **kwargs: Any) -> RewardResult:
    """Score one sample with one reward, blocking; for scripts and the evaluator. ``kwargs``
    go to the reward function; ``call_timeout_s`` bounds the call."""
    composer = RewardComposer([RewardEntry(name=name, kwargs=kwargs)], timeout_s=call_timeout_s)
    return composer.score_sync([sample])[0]


__all__ = ["RewardComposer", "RewardEntry", "evaluate_reward", "parse_entries", "score_samples"]
