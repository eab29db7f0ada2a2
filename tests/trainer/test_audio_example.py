"""examples/audio_cpu.yaml keeps working (slow): a shortened run of the same config -- a few
warm-up and RL steps -- trains on audio and its numbers are sane. That the full config learns
(near chance -> held-out success >= 0.8) is measured by bench/quickstart.py and recorded in
docs/benchmarks.md, not asserted here (it takes minutes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from relax_gym.trainer.config import load_config
from relax_gym.trainer.modes.colocate import train
from relax_gym.trainer.observability import read_metrics

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_audio_example_runs_shortened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the example's env entry point is a path from the repository root
    config = load_config(ROOT / "examples" / "audio_cpu.yaml", [
        f"output_dir={tmp_path / 'run'}", "logging.progress=none", "logging.tensorboard=false",
        "warmup.steps=4", "warmup.eval_every=2", "train.steps=3", "eval.every=3", "eval.episodes=8",
        "rollout.prompts_per_step=4", "checkpoint.every=0",
    ])
    summary = train(config)
    records = read_metrics(summary.out_dir / "metrics.jsonl")
    train_steps = [r for r in records if r["phase"] == "train"]
    evals = [r for r in records if r["phase"] == "eval"]
    assert len(train_steps) == 3 and evals
    for r in train_steps:
        assert r["train/rollout_gap_max"] < 1e-4  # engine and trainer heard the same samples
        assert r["rollout/audios"] == 16  # 4 clips x 4 samples, each one clip
        assert r["rollout/audio_tokens_mean"] >= 9  # a tone of >= 0.7 s: >= 9 audio-encoder tokens
        assert "rollout/media_errors" not in r
    assert all(0.0 <= r["success"] <= 1.0 for r in evals)
