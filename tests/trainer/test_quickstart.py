"""The README's main job, end to end (slow: a few minutes on 2 cores): examples/quickstart.yaml
builds a tiny Qwen3-VL from config, warms it up on oracle answers until held-out success
reaches 0.25, then GRPO takes held-out success to >= 0.9. Wall-clock figures live in
bench/quickstart.py and docs/benchmarks.md, not here."""

from __future__ import annotations

from pathlib import Path

import pytest

from relax_gym.trainer.config import load_config
from relax_gym.trainer.modes.colocate import train
from relax_gym.trainer.observability import read_metrics

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_quickstart_success_rises_from_at_most_035_to_at_least_09(tmp_path: Path) -> None:
    config = load_config(ROOT / "examples" / "quickstart.yaml",
                         [f"output_dir={tmp_path / 'run'}", "logging.progress=none", "logging.tensorboard=false"])
    summary = train(config)
    records = read_metrics(summary.out_dir / "metrics.jsonl")
    warmup = [r for r in records if r["phase"] == "warmup"]
    evals = [r for r in records if r["phase"] == "eval"]
    assert warmup, "the warm-up (SFT) phase ran"
    assert evals[0]["step"] == 0 and evals[0]["success"] <= 0.35, evals[0]
    assert max(r["success"] for r in evals) >= 0.9, [(r["step"], r["success"]) for r in evals]
    assert summary.final_eval["success"] >= 0.85  # and it stays there (64 sampled episodes)
    assert (summary.out_dir / "final_model" / "config.json").is_file()
