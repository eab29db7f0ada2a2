"""Checkpoints: atomic folders, the latest pointer, pruning, RNG states, buffered trajectories."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from relax_gym.trainer.backends.base import NLLObjective, OptimizerSettings, SequenceBatch
from relax_gym.trainer.checkpoint import (
    CheckpointError,
    TrainerState,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from relax_gym.trainer.rollout import Trajectory
from relax_gym.trainer.backends.pytorch import TorchBackend


def buffered() -> list[Trajectory]:
    return [Trajectory(token_ids=[1, 2, 3, 4], loss_mask=[0, 0, 1, 1], rollout_logprobs=[0.0, 0.0, -0.5, -1.0],
                       weight_versions=[-1, -1, 2, 2], prompt_length=2, group_id="g1", env_id="test/Letters-v0",
                       seed=5, reward=0.25)]


def test_save_load_round_trip(tiny_text_model: Path, tmp_path: Path) -> None:
    be = TorchBackend(tiny_text_model, optimizer=OptimizerSettings(lr=1e-2))
    batch = SequenceBatch([[5, 6, 7, 8]], [[0, 1, 1, 1]])
    be.train_step(batch, NLLObjective())
    state = TrainerState(step=7, phase="rl_started", weight_version=7, sampler={"drawn": 3}, extra={"x": 1})
    random.seed(11)
    np.random.seed(11)
    torch.manual_seed(11)
    folder = save_checkpoint(tmp_path, "step_000007", be, state, buffer=buffered())
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    assert latest_checkpoint(tmp_path) == folder
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))

    other = TorchBackend(tiny_text_model)
    loaded, buffer = load_checkpoint(folder, other)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected  # RNG restored
    assert loaded.step == 7 and loaded.sampler == {"drawn": 3} and loaded.extra == {"x": 1}
    assert other.version == be.version
    for (n, a), (_, b) in zip(be.named_weights(), other.named_weights(), strict=True):
        assert torch.equal(a, b), n
    assert len(buffer) == 1 and buffer[0].token_ids == [1, 2, 3, 4] and buffer[0].reward == 0.25


def test_latest_skips_incomplete_and_prunes_old(tiny_text_model: Path, tmp_path: Path) -> None:
    be = TorchBackend(tiny_text_model)
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, f"step_{step:06d}", be, TrainerState(step=step), keep_last=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir())
    assert names == ["step_000002", "step_000003"]
    # a crash mid-save leaves a .tmp folder and an unchanged pointer
    (tmp_path / "checkpoints" / "step_000004.tmp").mkdir()
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step_000003"
    # a pointer to a folder without its state file is ignored
    (tmp_path / "checkpoints" / "latest").write_text("step_000004.tmp", encoding="utf-8")
    assert latest_checkpoint(tmp_path) is None
    assert latest_checkpoint(tmp_path / "nowhere") is None


def test_bad_checkpoint_is_a_clear_error(tiny_text_model: Path, tmp_path: Path) -> None:
    be = TorchBackend(tiny_text_model)
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        load_checkpoint(tmp_path, be)
    folder = save_checkpoint(tmp_path, "step_000001", be, TrainerState(step=1))
    (folder / "trainer_state.json").write_text('{"format": 99}', encoding="utf-8")
    with pytest.raises(CheckpointError, match="format"):
        load_checkpoint(folder, be)
