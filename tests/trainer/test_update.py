"""update_policy: the one RL update both modes run (colocate and the asynchronous learner).

A recording backend checks the order of work and what each step sees (advantages over whole
groups, loss only on the trained rows, the proximal source asked once per step, mini-batch x
epoch updates over whole groups, merged metrics); the torch backend checks that it makes the
same update as the steps written out by hand.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from relax_gym.trainer.algorithms import AlgorithmConfig
from relax_gym.trainer.algorithms.batching import ScoredSample, attach_advantages, split_by_groups, to_sequence_batch
from relax_gym.trainer.algorithms.update import recomputed_by, update_policy
from relax_gym.trainer.backends.base import (
    LogprobResult,
    Objective,
    OptimizerSettings,
    PolicyObjective,
    SequenceBatch,
    TrainerBackend,
)

from .test_batching import scored


class RecordingBackend(TrainerBackend):
    """Logprobs of -0.25 everywhere; each train step is recorded and reports fixed metrics."""

    def __init__(self) -> None:
        self.steps: list[SequenceBatch] = []
        self.logprob_calls = 0
        self.configure_optimizer(OptimizerSettings())

    def _make_optimizer(self, settings: OptimizerSettings) -> Any:
        return None

    def compute_logprobs(self, batch: SequenceBatch, *, entropy: bool = False) -> LogprobResult:
        self.logprob_calls += 1
        return LogprobResult([torch.full((len(ids),), -0.25) for ids in batch.input_ids])

    def train_step(self, batch: SequenceBatch, objective: Objective) -> dict[str, float]:
        self.steps.append(batch)
        self.version += 1
        n = float(len(self.steps))
        return {"loss": n, "ratio_max": 10 * n, "is_weight_min": -n}

    def named_weights(self) -> Iterator[tuple[str, Tensor]]:
        return iter(())

    def save_pretrained(self, path: str | Path) -> Path:
        raise NotImplementedError

    def save_state(self, path: str | Path) -> None:
        raise NotImplementedError

    def load_state(self, path: str | Path) -> None:
        raise NotImplementedError


def six_samples() -> list[ScoredSample]:
    """Three groups of two; rewards 1 and 0 in each."""
    return [scored(g, r) for g in "abc" for r in (1.0, 0.0)]


def test_whole_groups_advantages_trained_rows_and_updates() -> None:
    backend = RecordingBackend()
    samples = six_samples()
    asked: dict[str, list[tuple[int, list[int]]]] = {"ref": [], "prox": []}

    def source(name: str, value: float) -> Any:
        async def fetch(batch: SequenceBatch, rows: list[int]) -> tuple[list[Tensor], dict[str, float]]:
            asked[name].append((len(batch), list(rows)))
            return [torch.full((len(ids),), value) for ids in batch.input_ids], {f"logprob/{name}": value}
        return fetch

    trained = [0, 1, 2, 4, 5]  # row 3 (group b, reward 0) was refused as too stale
    update = asyncio.run(update_policy(
        backend, AlgorithmConfig(kl_loss_coef=0.1), samples, mini_batches=2, epochs=2, trained_rows=trained,
        reference=source("ref", -1.0), proximal=source("prox", -2.0)))

    assert asked == {"ref": [(6, list(range(6)))], "prox": [(5, trained)]}
    assert backend.logprob_calls == 0  # both sources were the caller's
    # advantages over whole groups: the refused sample still shapes its group's baseline
    adv = update.batch.advantages
    assert adv is not None and float(adv[2][-1]) > 0 and float(adv[3][-1]) < 0
    assert update.batch.ref_logprobs is not None and float(update.batch.ref_logprobs[0][-1]) == -1.0
    # 2 epochs x 2 mini-batches over the 5 trained rows, each mini-batch whole groups
    assert len(backend.steps) == 4
    for step in backend.steps:
        groups = step.group_ids
        for g in set(groups):
            assert groups.count(g) == [samples[i].group for i in trained].count(g)
        assert step.old_logprobs is not None and all(float(t[-1]) == -2.0 for t in step.old_logprobs)
    assert sum(len(s) for s in backend.steps) == 2 * len(trained)
    m = update.metrics
    assert m["train/updates"] == 4.0 and m["train/loss"] == 2.5  # mean of 1..4
    assert m["train/ratio_max"] == 40.0 and m["train/is_weight_min"] == -4.0
    keys = list(m)
    assert keys.index("logprob/ref") < keys.index("adv/mean") < keys.index("logprob/prox") < keys.index("train/loss")
    assert update.train_span[0] <= update.train_span[1]


def test_one_update_needs_no_proximal_and_recomputes_by_default() -> None:
    backend = RecordingBackend()
    update = asyncio.run(update_policy(backend, AlgorithmConfig(), six_samples()))
    assert backend.logprob_calls == 0 and len(backend.steps) == 1
    assert backend.steps[0].old_logprobs is None  # one update: the current policy is the old one
    assert update.batch.ref_logprobs is None and update.metrics["train/updates"] == 1.0

    backend = RecordingBackend()
    asyncio.run(update_policy(backend, AlgorithmConfig(), six_samples(), epochs=2))
    assert backend.logprob_calls == 1  # the proximal policy: recomputed by the backend itself
    assert all(s.old_logprobs is not None for s in backend.steps)


def test_missing_inputs_fail_before_any_work() -> None:
    backend = RecordingBackend()
    with pytest.raises(ValueError, match="reference"):
        asyncio.run(update_policy(backend, AlgorithmConfig(kl_reward_coef=0.1), six_samples()))
    with pytest.raises(ValueError, match="trained row"):
        asyncio.run(update_policy(backend, AlgorithmConfig(), six_samples(), trained_rows=[]))
    assert backend.steps == []


def test_torch_backend_update_equals_the_steps_by_hand(tiny_text_model: Path) -> None:
    from relax_gym.trainer.backends.pytorch import TorchBackend

    config = AlgorithmConfig(kl_loss_coef=0.05)
    settings = OptimizerSettings(lr=1e-2)
    ours, by_hand = (TorchBackend(tiny_text_model, micro_batch_size=2, optimizer=settings) for _ in range(2))
    samples = six_samples()
    # the reference is the starting policy: by_hand before its own steps below
    update = asyncio.run(update_policy(ours, config, samples, mini_batches=2, temperature=0.8,
                                       reference=recomputed_by(lambda: by_hand)))

    batch = to_sequence_batch(samples, None, temperature=0.8)
    batch.ref_logprobs = by_hand.compute_logprobs(batch).logprobs
    attach_advantages(batch, [float(s.reward) for s in samples], config,  # type: ignore[arg-type]
                      ref_logprobs=batch.ref_logprobs)
    batch.old_logprobs = by_hand.compute_logprobs(batch).logprobs
    losses = [by_hand.train_step(batch.select(rows), PolicyObjective(config))["loss"]
              for rows in split_by_groups(batch.group_ids, 2)]

    assert ours.version == by_hand.version == 2
    assert update.metrics["train/loss"] == pytest.approx(sum(losses) / 2, abs=0, rel=0)
    for (name, a), (_, b) in zip(ours.named_weights(), by_hand.named_weights(), strict=True):
        assert torch.equal(a, b), name
