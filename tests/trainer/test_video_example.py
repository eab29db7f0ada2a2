"""examples/video_cpu.yaml keeps working (slow): a shortened run of the same config -- a few
warm-up and RL steps -- trains on video and its numbers are sane. That the full config learns
(near chance -> held-out success >= 0.8) is measured by bench/quickstart.py and recorded in
docs/benchmarks.md, not asserted here (it takes minutes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from relax_gym.trainer.config import load_config
from relax_gym.trainer.modes.colocate import train
from relax_gym.trainer.observability import read_metrics

ROOT = Path(__file__).resolve().parents[2]


SHORT = ["logging.progress=none", "logging.tensorboard=false", "warmup.steps=4", "warmup.eval_every=2",
         "train.steps=3", "eval.every=3", "eval.episodes=8", "rollout.prompts_per_step=4", "checkpoint.every=0"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_video_example_runs_shortened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the example's env entry point is a path from the repository root
    config = load_config(ROOT / "examples" / "video_cpu.yaml", [f"output_dir={tmp_path / 'run'}", *SHORT])
    summary = train(config)
    records = read_metrics(summary.out_dir / "metrics.jsonl")
    train_steps = [r for r in records if r["phase"] == "train"]
    evals = [r for r in records if r["phase"] == "eval"]
    assert len(train_steps) == 3 and evals
    for r in train_steps:
        assert r["train/rollout_gap_max"] < 1e-4  # engine and trainer saw the same video pixels
        assert r["rollout/video_reduced/fps"] > 0  # the 4 fps clips were sampled to 2 fps
        assert r["rollout/videos"] > 0 and r["rollout/video_tokens_mean"] == 2 * 4  # 2 x 2x2 merged tokens
    assert all(0.0 <= r["success"] <= 1.0 for r in evals)


@pytest.mark.slow  # one CLI run importing megatron-core, ~1 min on a loaded 2-core box
@pytest.mark.timeout(600)
def test_video_example_runs_shortened_on_megatron(tmp_path: Path) -> None:
    """The same shortened run with ``backend=megatron`` (CPU shim): the megatron Qwen3-VL
    recomputes the rollout's video logprobs exactly and trains on the clips."""
    pytest.importorskip("megatron.core")
    out = tmp_path / "run"
    env = {**os.environ, "RELAX_MEGATRON_CPU_SHIM": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-m", "relax_gym.cli.main", "train", "examples/video_cpu.yaml",
                           f"output_dir={out}", "backend=megatron", "threads=1", "engine.threads=1", *SHORT],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_metrics(out / "metrics.jsonl")
    train_steps = [r for r in records if r["phase"] == "train"]
    assert len(train_steps) == 3
    for r in train_steps:
        assert r["train/rollout_gap_max"] < 1e-4  # megatron's recompute == the engine's video logprobs
        assert r["rollout/videos"] > 0 and r["rollout/video_tokens_mean"] == 2 * 4
        if r["adv/zero_variance_group_frac"] < 1.0:  # a step whose groups all tie has no gradient
            assert r["train/grad_norm"] > 0
    warmup = [r for r in records if r["phase"] == "warmup"]
    assert warmup and all(r["grad_norm"] > 0 for r in warmup)  # SFT on the clips moves megatron's weights
