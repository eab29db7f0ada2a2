"""Reward workers: the configured reward composer behind a role, and scoring with retries.

A :class:`RewardWorker` scores :class:`~relax_gym.rewards.RewardInput` lists with the run's
:class:`~relax_gym.rewards.RewardComposer` (rule rewards, GenRM judge clients). The composer
itself never raises -- a failing reward function becomes a failed result -- so an exception out
of a worker means the *worker* broke (in the Ray runtime: its actor process died).
:func:`score_with_retries` then tries the next worker (a restarted actor), and after
``retries`` failures marks the samples' rewards failed, which the batch selection drops or
scores 0 as ``rewards.failed`` says. Nothing is lost silently: every retry and failure is counted.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from relax_gym.rewards import RewardComposer, RewardInput, RewardResult

log = logging.getLogger("relax_gym.trainer.modes")


class RewardWorker:
    """Scores samples with a reward composer built from the run's ``rewards:`` section."""

    def __init__(self, entries: list[dict[str, Any]], per_env: dict[str, list[dict[str, Any]]] | None = None,
                 timeout_s: float = 60.0, imports: Sequence[str] = ()) -> None:
        import importlib

        for name in imports:  # custom rewards register on import (in every process)
            importlib.import_module(name)
        self.composer = RewardComposer(entries, per_env=per_env or None, timeout_s=timeout_s)
        self.calls = 0

    async def score(self, inputs: list[RewardInput]) -> list[RewardResult]:
        self.calls += 1
        return await self.composer.score(inputs)

    def ping(self) -> int:
        return self.calls


async def wait_until_ready(worker: Any, timeout_s: float) -> bool:
    """Ping a worker until it answers (a crashed actor restarts in the meantime); False if it
    does not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    delay = 0.1
    while True:
        try:
            await worker.ping()
            return True
        except Exception:  # noqa: BLE001 -- unavailable or restarting: wait and ask again
            if time.monotonic() + delay > deadline:
                return False
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 2)


async def score_with_retries(workers: Sequence[Any], inputs: list[RewardInput], *, retries: int,
                             counts: Counter[str], start: int = 0, recover_timeout_s: float = 120.0
                             ) -> list[RewardResult]:
    """Score with the workers in turn (role objects with async ``score`` and ``ping``). A call
    that raises -- the worker crashed under it -- is retried, on the next worker once that one
    answers again (a restarted actor), up to ``retries`` times; then every sample gets a failed
    result naming the last error. Waiting for a restart is not an attempt; a crash is (and so is a
    worker that does not come back within ``recover_timeout_s``)."""
    if not workers:
        raise ValueError("no reward worker")
    order = itertools.islice(itertools.cycle(range(len(workers))), start, None)
    last: BaseException | None = None
    for attempt in range(retries + 1):
        worker = workers[next(order)]
        if not await wait_until_ready(worker, recover_timeout_s):
            last = TimeoutError(f"the reward worker did not come back within {recover_timeout_s:.0f} s")
            counts["reward_worker_errors"] += 1
            continue
        try:
            results = list(await worker.score(inputs))
        except Exception as exc:  # noqa: BLE001 -- a crashed worker must not stop the rollout
            last = exc
            counts["reward_worker_errors"] += 1
            log.warning("reward worker failed (attempt %d of %d): %s", attempt + 1, retries + 1, exc)
            continue
        if len(results) != len(inputs):
            last = RuntimeError(f"reward worker returned {len(results)} results for {len(inputs)} samples")
            counts["reward_worker_errors"] += 1
            continue
        if attempt:
            counts["reward_retried_calls"] += 1
        return results
    counts["reward_failed_calls"] += 1
    message = f"reward worker crashed {retries + 1} times; last error: {type(last).__name__}: {last}"
    return [RewardResult.failure("unavailable", message, component="worker") for _ in inputs]


__all__ = ["RewardWorker", "score_with_retries"]
