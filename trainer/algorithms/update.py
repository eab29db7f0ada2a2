"""One RL policy update, the same in every mode and on every backend: :func:`update_policy`.

Given the scored samples of one step's whole groups, it

1. builds the tensors (:func:`~.batching.to_sequence_batch`);
2. fetches the reference policy's logprobs when a KL term needs them (``reference``) and the
   teacher's for on-policy distillation;
3. computes advantages over the *whole* groups (:func:`~.batching.attach_advantages`), then keeps
   the rows that carry loss (``trained_rows``: all of them in colocate; the samples the
   staleness check admitted in the asynchronous modes);
4. fetches the proximal policy's logprobs when the step makes more than one optimizer update
   (``proximal``; by default the backend recomputes them);
5. runs ``mini_batches`` x ``epochs`` optimizer updates, each over whole groups, and merges their
   metrics (``train/*``). The backend cuts micro-batches and normalises the loss over the whole
   update (:class:`~relax_gym.trainer.backends.base.PolicyObjective`).

Where logprobs come from is the caller's choice, a :data:`LogprobSource`: colocate recomputes
them (:func:`recomputed_by`), the asynchronous learner takes its workers' annotations when they
are fresh enough. Backend calls run in a worker thread, so the event loop (which runs the rollout
producer in the asynchronous modes) keeps going during the update.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from torch import Tensor

from relax_gym.trainer.algorithms.batching import ScoredSample, attach_advantages, split_by_groups, to_sequence_batch
from relax_gym.trainer.algorithms.config import AlgorithmConfig
from relax_gym.trainer.backends.base import PolicyObjective, SequenceBatch, TrainerBackend

if TYPE_CHECKING:
    from relax_gym.protocol import EngineClient
    from relax_gym.trainer.observability import PhaseTimer

#: ``source(batch, rows) -> (logprobs, metrics)``: per-token logprobs of ``batch``'s sequences,
#: which are the update's samples ``rows`` (indices into the ``samples`` given to
#: :func:`update_policy`), and metrics saying where they came from.
LogprobSource = Callable[[SequenceBatch, list[int]], Awaitable[tuple[list[Tensor], dict[str, float]]]]


def recomputed_by(backend: TrainerBackend | Callable[[], TrainerBackend]) -> LogprobSource:
    """A :data:`LogprobSource` that runs ``backend.compute_logprobs`` (in a worker thread). A
    callable is asked for the backend at each use, so a reference model is built only when
    first needed."""

    async def source(batch: SequenceBatch, rows: list[int]) -> tuple[list[Tensor], dict[str, float]]:
        model = backend if isinstance(backend, TrainerBackend) else backend()
        return (await asyncio.to_thread(model.compute_logprobs, batch)).logprobs, {}

    return source


@dataclass
class PolicyUpdate:
    """What :func:`update_policy` did."""

    batch: SequenceBatch  # every sample's tensors, advantages attached (rows as given)
    metrics: dict[str, float]  # logprob-source, ``adv/*`` and ``train/*`` metrics
    train_span: tuple[float, float]  # wall-clock (time.time()) start and end of the optimizer updates


async def update_policy(
    backend: TrainerBackend,
    algorithm: AlgorithmConfig,
    samples: Sequence[ScoredSample],
    *,
    mini_batches: int = 1,
    epochs: int = 1,
    temperature: float = 1.0,
    image_processor: Any | None = None,
    trained_rows: Sequence[int] | None = None,
    reference: LogprobSource | None = None,
    proximal: LogprobSource | None = None,
    teacher: EngineClient | None = None,
    timer: PhaseTimer | None = None,
) -> PolicyUpdate:
    """One RL step's policy update on ``samples`` (whole groups, rewards set); see the module
    docstring. ``temperature`` is the rollout's sampling temperature; ``reference`` is needed
    when the algorithm has a KL term (:attr:`AlgorithmConfig.needs_reference`); ``timer`` gets
    the ``logprob`` and ``train`` phases."""
    rows = list(range(len(samples)) if trained_rows is None else trained_rows)
    if not rows:
        raise ValueError("update_policy needs at least one trained row (skip the step instead)")
    if algorithm.needs_reference and reference is None:
        raise ValueError("the algorithm has a KL term: update_policy needs a reference LogprobSource")
    metrics: dict[str, float] = {}
    with _phase(timer, "logprob"):
        batch = await asyncio.to_thread(to_sequence_batch, samples, image_processor, temperature=temperature)
        ref = None
        if reference is not None and algorithm.needs_reference:
            ref = await _fetch(reference, batch, list(range(len(samples))), metrics)
            batch.ref_logprobs = ref
        distill = None
        if teacher is not None:
            from relax_gym.trainer.rollout.teacher import teacher_logprobs

            distill = await teacher_logprobs(teacher, [s.traj for s in samples])
        rewards = [float(s.reward) for s in samples]  # type: ignore[arg-type]
        metrics.update(attach_advantages(batch, rewards, algorithm, ref_logprobs=ref, teacher_logprobs=distill))
        train_batch = batch if trained_rows is None else batch.select(rows)
        if mini_batches * epochs > 1:
            train_batch.old_logprobs = await _fetch(proximal or recomputed_by(backend), train_batch, rows, metrics)
    start = time.time()
    with _phase(timer, "train"):
        metrics.update(await _optimizer_updates(backend, train_batch, PolicyObjective(algorithm),
                                                mini_batches=mini_batches, epochs=epochs))
    return PolicyUpdate(batch, metrics, (start, time.time()))


async def _fetch(source: LogprobSource, batch: SequenceBatch, rows: list[int],
                 metrics: dict[str, float]) -> list[Tensor]:
    logprobs, found = await source(batch, rows)
    metrics.update(found)
    return logprobs


async def _optimizer_updates(backend: TrainerBackend, batch: SequenceBatch, objective: PolicyObjective, *,
                             mini_batches: int, epochs: int) -> dict[str, float]:
    """``epochs`` passes of ``mini_batches`` updates over whole groups; ``train/<metric>``
    averaged over the updates (``*_max`` / ``*_min`` by max / min) and ``train/updates``."""
    merged: dict[str, list[float]] = {}
    for _epoch in range(epochs):
        for part in split_by_groups(batch.group_ids, mini_batches):
            out = await asyncio.to_thread(backend.train_step, batch.select(part), objective)
            for k, v in out.items():
                merged.setdefault(k, []).append(v)
    metrics: dict[str, float] = {}
    for k, values in merged.items():
        agg = max(values) if k.endswith("_max") else min(values) if k.endswith("_min") else float(np.mean(values))
        metrics[f"train/{k}"] = agg
    metrics["train/updates"] = float(len(merged.get("loss", [])))
    return metrics


def _phase(timer: PhaseTimer | None, name: str) -> AbstractContextManager[None]:
    return timer.phase(name) if timer is not None else nullcontext()


__all__ = ["LogprobSource", "PolicyUpdate", "recomputed_by", "update_policy"]
