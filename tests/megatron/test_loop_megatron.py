"""``relax-gym train`` with ``backend: megatron`` through the real CLI and the colocate loop.

One process per run, megatron-core on the CPU debug shim (``RELAX_MEGATRON_CPU_SHIM=1``), a tiny
Qwen3 built from config and the embedded engine: warm-up SFT, GRPO with a KL term to the
reference model (a second MegatronBackend), held-out evaluation, checkpoints every step, weight
sync to the engine, the final HF export, and ``--resume`` from a cut run that continues with the
uninterrupted run's numbers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("megatron.core")

ROOT = Path(__file__).resolve().parents[2]
TRAIN_KEYS = ("train/loss", "train/pg_loss", "train/grad_norm", "train/kl_ref", "rollout/reward_mean",
              "adv/abs_mean")


def _config(model: Path, out: Path, steps: int) -> dict[str, Any]:
    return {
        "run_name": "meg", "output_dir": str(out), "seed": 3, "deterministic": True, "threads": 1,
        "backend": "megatron",
        "model": {"path": str(model)},
        "engine": {"threads": 1, "startup_timeout_s": 240},
        "data": {"envs": [{"id": "test/Letters-v0", "entry_point": "tests/trainer/envs.py:LetterEnv"}]},
        "rollout": {"group_size": 4, "prompts_per_step": 2, "max_new_tokens": 6, "concurrency": 8},
        "algorithm": {"kl_loss_coef": 0.05},
        "train": {"steps": steps, "lr": 0.05, "micro_batch_size": 3},
        "warmup": {"enabled": True, "steps": 2, "batch_size": 4, "micro_batch_size": 2, "lr": 0.01},
        "eval": {"every": 2, "episodes": 2},
        "checkpoint": {"every": 1, "keep_last": 5},
        "logging": {"progress": "none", "tensorboard": False, "plot": False},
    }


def _train(cfg: dict[str, Any], path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    env = {**os.environ, "RELAX_MEGATRON_CPU_SHIM": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "relax_gym.cli.main", "train", str(path), *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.mark.slow  # two CLI runs, ~1-2 min each on a loaded 2-core box
@pytest.mark.timeout(1500)
def test_cli_trains_on_megatron_and_resumes_exactly(tmp_path: Path) -> None:
    from relax_gym.trainer.models import build_tiny_model

    model = build_tiny_model("qwen3", tmp_path / "model", seed=0, tokenizer="tiny-bpe")
    full = _train(_config(model, tmp_path / "full", steps=3), tmp_path / "full.yaml")
    assert full.returncode == 0, full.stderr[-3000:]
    records = _records(tmp_path / "full")
    phases = {r["phase"] for r in records}
    assert {"warmup", "train", "eval"} <= phases, phases
    train = [r for r in records if r["phase"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3]
    for r in train:
        assert r["train/grad_norm"] > 0 and r["train/kl_ref"] >= 0 and r["sync/engines"] == 1
        # the engine sampled from the weights the trainer had after the last sync
        assert r["train/rollout_gap_max"] < 1e-4, r["train/rollout_gap_max"]
    assert any(r["train/kl_ref"] > 0 for r in train[1:])  # the policy moved off the reference
    assert (tmp_path / "full" / "checkpoints" / "step_000003").is_dir()
    assert (tmp_path / "full" / "final_model" / "config.json").is_file()
    assert (tmp_path / "full" / "reference_model" / "config.json").is_file()

    # a run killed after step 2 resumes and its step 3 is the uninterrupted run's
    cut = tmp_path / "cut"
    shutil.copytree(tmp_path / "full", cut)
    shutil.rmtree(cut / "checkpoints" / "step_000003")
    (cut / "checkpoints" / "latest").write_text("step_000002", encoding="utf-8")
    kept = [json.dumps(r) for r in records if r["step"] <= 2 or r["phase"] not in ("train", "eval")]
    (cut / "metrics.jsonl").write_text("".join(k + "\n" for k in kept), encoding="utf-8")
    for name in ("final_model",):
        shutil.rmtree(cut / name)
    resumed = _train(_config(model, cut, steps=3), tmp_path / "cut.yaml", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = next(r for r in records if r["phase"] == "train" and r["step"] == 3)
    # the cut kept no step-3 record: the one there now is the resumed run's (elapsed_s may equal
    # a's to the logged 0.01 s, so it cannot tell the runs apart)
    (b,) = [r for r in _records(cut) if r["phase"] == "train" and r["step"] == 3]
    for key in TRAIN_KEYS:
        assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key


@pytest.mark.slow  # a CLI run that imports megatron-core and transformers (~15 s quiet)
def test_bad_parallel_layout_is_one_line(tmp_path: Path) -> None:
    """TP=3 on a model whose heads do not split three ways: exit 2, one line naming the cause."""
    from relax_gym.trainer.models import build_tiny_model

    model = build_tiny_model("qwen3", tmp_path / "model", seed=0, tokenizer="tiny-bpe")
    cfg = _config(model, tmp_path / "run", steps=1)
    cfg["megatron"] = {"tensor_parallel_size": 3}
    cfg["warmup"]["enabled"] = False
    proc = _train(cfg, tmp_path / "run.yaml")
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last == "relax-gym train: parallel layout: world size 1 is not a multiple of tp*pp*cp=3", last
    assert "Traceback" not in proc.stderr


@pytest.mark.slow  # one CLI run per mode, ~1-2 min each on a loaded 2-core box
@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", ["fully_async", "hybrid"])
def test_cli_trains_on_megatron_in_the_async_modes(tmp_path: Path, mode: str) -> None:
    """The overlapped modes on megatron: KL to the reference and the proximal recompute (two
    mini-batches, decoupled correction) -- from the logprob workers in fully_async, computed by
    the megatron trainer itself in hybrid -- weights published to the engine every step."""
    from relax_gym.trainer.models import build_tiny_model

    model = build_tiny_model("qwen3", tmp_path / "model", seed=0, tokenizer="tiny-bpe")
    cfg = _config(model, tmp_path / "run", steps=3)
    cfg["mode"] = mode
    cfg["warmup"]["enabled"] = False
    cfg["deterministic"] = False
    cfg["rollout"]["prompts_per_step"] = 2
    cfg["train"]["mini_batches"] = 2
    cfg["algorithm"]["rollout_correction"] = "decoupled"
    # the env comes by module import (the learner runs in a process of its own)
    cfg["data"]["envs"] = [{"id": "modes-test/Vowels-v0"}]
    cfg["async_rl"] = {"max_staleness": 1, "imports": ["tests.modes.workload"]}
    proc = _train(cfg, tmp_path / "run.yaml")
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = _records(tmp_path / "run")
    train = [r for r in records if r["phase"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3]
    for r in train:
        assert r["train/grad_norm"] > 0 and r["train/updates"] == 2.0 and r["train/kl_ref"] >= 0
    assert any(r["train/kl_ref"] > 0 for r in train[1:])
    ledger = [json.loads(line) for line in (tmp_path / "run" / "ledger.jsonl").read_text().splitlines()]
    trained = [sid for rec in ledger for sid in rec["trained"]]
    assert len(trained) == len(set(trained)) > 0  # every sample trained at most once
    assert (tmp_path / "run" / "final_model" / "config.json").is_file()
