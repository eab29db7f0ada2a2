"""The colocate loop end to end against a real embedded engine on 127.0.0.1.

* a few RL steps move the loss and the weights reach the engine: its logprobs change after the
  sync and equal the trainer's within 1e-4;
* kill-and-resume: stop after step k, resume, and step k+1's metrics equal an uninterrupted
  run's (same seed, deterministic mode).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from relax_gym.trainer.engines.in_process import engine_client, is_in_process_url
from relax_gym.trainer.config import TrainConfig, config_from_dict
from relax_gym.trainer.modes.colocate import Trainer, train
from relax_gym.trainer.rollout.teacher import teacher_logprobs
from relax_gym.trainer.observability import read_metrics
from relax_gym.trainer.rollout import Trajectory


def loop_config(model: Path, out: Path, *overrides: str) -> TrainConfig:
    data: dict[str, Any] = {
        "run_name": "t", "output_dir": str(out), "seed": 3, "deterministic": True, "threads": 1,
        "model": {"path": str(model)},
        "engine": {"threads": 1, "startup_timeout_s": 240},
        "data": {"envs": [{"id": "test/Letters-v0"}]},
        "rollout": {"group_size": 4, "prompts_per_step": 2, "max_new_tokens": 8, "concurrency": 8},
        "algorithm": {"loss_agg_mode": "seq-mean-token-mean"},
        "train": {"steps": 2, "lr": 0.05, "micro_batch_size": 3},
        "eval": {"every": 0, "episodes": 2, "at_start": False},
        "checkpoint": {"every": 1, "keep_last": 5},
        "logging": {"progress": "none", "tensorboard": False, "plot": False},
    }
    return config_from_dict(data, list(overrides))


async def engine_and_trainer_logprobs(trainer: Trainer, trajs: list[Trajectory]
                                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sampled tokens' logprobs: at rollout time, scored by the engine now, by the trainer now."""
    from relax_gym.trainer.backends.base import SequenceBatch

    client = engine_client(trainer.fleet.urls[0], api_key=trainer.fleet.api_key)
    try:
        engine = await teacher_logprobs(client, trajs)
    finally:
        await client.aclose()
    ours = trainer.backend.compute_logprobs(SequenceBatch([t.token_ids for t in trajs],
                                                          [t.loss_mask for t in trajs])).logprobs
    masks = [torch.tensor(t.loss_mask, dtype=torch.bool) for t in trajs]
    rollout = torch.cat([torch.tensor(t.rollout_logprobs)[m] for t, m in zip(trajs, masks, strict=True)])
    return (rollout, torch.cat([e[m] for e, m in zip(engine, masks, strict=True)]),
            torch.cat([o[m] for o, m in zip(ours, masks, strict=True)]))


@pytest.mark.parametrize("sync", ["auto", pytest.param("distributed", marks=pytest.mark.slow)])  # or a gloo broadcast
def test_loss_moves_and_weights_reach_the_engine(tiny_text_model: Path, tmp_path: Path, sync: str) -> None:
    async def scenario() -> None:
        trainer = Trainer(loop_config(tiny_text_model, tmp_path / "run", f"engine.sync={sync}"))
        await trainer.start()
        try:
            # auto: the engine runs in this process (one embedded engine, colocate); a broadcast needs two
            assert is_in_process_url(trainer.fleet.urls[0]) == (sync == "auto")
            m1 = await trainer.rl_step(1)
            trained = [s.traj for s in trainer.last_samples]
            rollout, engine_now, ours_now = await engine_and_trainer_logprobs(trainer, trained)
            m2 = await trainer.rl_step(2)
        finally:
            await trainer.close()
        assert trainer.backend.version == 2 and trainer.state.weight_version == 2
        assert trainer.publisher.path == ("tensor" if sync == "auto" else "distributed")
        for m in (m1, m2):
            assert m["train/grad_norm"] > 0 and m["train/loss"] != 0 and m["adv/abs_mean"] > 0
            assert m["sync/engines"] == 1 and m["time/rollout"] > 0
            # the rollout manager's own counters reach the step's metrics (nothing failed here)
            assert m["rollout/failovers"] == 0 and m["rollout/template_errors"] == 0
            assert not any(k.startswith("rollout/engine_errors/") for k in m)
            # the rollouts came from the weights the trainer had: engine and trainer agree on them
            assert m["train/rollout_gap_max"] < 1e-4
        assert (engine_now - rollout).abs().max() > 1e-2  # the engine serves new weights ...
        torch.testing.assert_close(engine_now, ours_now, atol=1e-4, rtol=0)  # ... the trainer's

    asyncio.run(scenario())


TRAIN_KEYS = ("train/loss", "train/pg_loss", "train/grad_norm", "rollout/reward_mean", "rollout/success",
              "adv/abs_mean", "rollout/response_tokens_mean", "train/approx_kl")


def _kill_after(src: Path, dst: Path, step: int) -> None:
    """What a run killed right after step ``step`` leaves behind: its files up to that step
    (checkpoint ``step`` as the latest one, metrics and sample dumps of steps <= ``step``)."""
    shutil.copytree(src, dst)
    ckpts = dst / "checkpoints"
    for folder in ckpts.iterdir():
        if folder.is_dir() and int(folder.name.split("_")[-1]) > step:
            shutil.rmtree(folder)
    (ckpts / "latest").write_text(f"step_{step:06d}", encoding="utf-8")
    kept = [line for line in (dst / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
            if json.loads(line)["step"] <= step]
    (dst / "metrics.jsonl").write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    for dump in (dst / "samples").glob("step_*.jsonl"):
        if int(dump.stem.split("_")[-1]) > step:
            dump.unlink()


@pytest.mark.slow  # two runs (~20 s); resume exactness also runs by default in tests/modes
def test_kill_and_resume_continues_exactly(tiny_text_model: Path, tmp_path: Path) -> None:
    full = train(loop_config(tiny_text_model, tmp_path / "full", "train.steps=3"))
    assert full.steps == 3
    _kill_after(tmp_path / "full", tmp_path / "cut", 2)

    def step_records(out: Path, step: int) -> list[dict[str, float]]:
        return [r for r in read_metrics(out / "metrics.jsonl") if r["phase"] == "train" and r["step"] == step]

    assert not step_records(tmp_path / "cut", 3)  # step 3 below is the resumed run's own, not a copy
    resumed = train(loop_config(tiny_text_model, tmp_path / "cut", "train.steps=3"), resume=True)
    assert resumed.steps == 3

    def step_record(out: Path, step: int) -> dict[str, float]:
        recs = step_records(out, step)
        assert len(recs) == 1
        return recs[0]

    a, b = step_record(tmp_path / "full", 3), step_record(tmp_path / "cut", 3)
    for key in TRAIN_KEYS:
        assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key

    # the resumed run trained the same samples: the dumps of step 3 agree token for token
    def responses(out: Path) -> list[str]:
        lines = (out / "samples" / "step_000003.jsonl").read_text(encoding="utf-8").splitlines()
        return [json.loads(line)["response"] for line in lines]

    assert responses(tmp_path / "full") == responses(tmp_path / "cut")
    state = json.loads((tmp_path / "cut" / "checkpoints" / "step_000003" / "trainer_state.json").read_text())
    assert state["step"] == 3 and state["weight_version"] == 3


def test_resume_without_checkpoint_fails_clearly(tiny_text_model: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        train(loop_config(tiny_text_model, tmp_path / "empty"), resume=True)


def test_sigterm_stops_the_run_and_its_engines(tiny_text_model: Path, tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil
    import yaml

    root = Path(__file__).resolve().parents[2]
    # the engine in a child process (in colocate, auto puts it in the trainer's process: nothing to leave behind)
    cfg = loop_config(tiny_text_model, tmp_path / "run", "train.steps=100000",
                      "engine.placement=process").model_dump(mode="json")
    cfg["data"]["envs"] = [{"id": "test/Letters-v0", "entry_point": "tests/trainer/envs.py:LetterEnv"}]
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-m", "relax_gym.cli.main", "train", str(path)], cwd=root,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 240
        metrics = tmp_path / "run" / "metrics.jsonl"
        while time.monotonic() < deadline and proc.poll() is None:
            if metrics.is_file() and '"phase": "train"' in metrics.read_text(encoding="utf-8"):
                break
            time.sleep(0.5)
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        engines = psutil.Process(proc.pid).children(recursive=True)
        assert any("engine" in " ".join(p.cmdline()) for p in engines)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 130  # "interrupted"
    gone, alive = psutil.wait_procs(engines, timeout=30)
    assert not alive, f"engines left running: {[p.pid for p in alive]}"


@pytest.mark.slow  # a 2-step run through the CLI (~15 s)
def test_relax_gym_train_runs_colocate_with_the_engine_in_process(tiny_text_model: Path, tmp_path: Path) -> None:
    """The default colocate run: no engine process is started, the rollouts come from the trainer's
    weights (engine and trainer logprobs agree within 1e-4 after every sync) and the run ends cleanly."""
    import os
    import subprocess
    import sys
    import time

    import psutil
    import yaml

    root = Path(__file__).resolve().parents[2]
    cfg = loop_config(tiny_text_model, tmp_path / "run", "checkpoint.every=0").model_dump(mode="json")
    cfg["data"]["envs"] = [{"id": "test/Letters-v0", "entry_point": "tests/trainer/envs.py:LetterEnv"}]
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-m", "relax_gym.cli.main", "train", str(path)], cwd=root,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    children: set[str] = set()
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                children.update(" ".join(c.cmdline()) for c in psutil.Process(proc.pid).children(recursive=True))
            except psutil.Error:
                pass
            time.sleep(0.5)
        code = proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, proc.stderr.read().decode() if proc.stderr else ""
    assert not [c for c in children if "engine" in c], children
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["phase"] == "train"]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["sync/engines"] == 1 and r["train/rollout_gap_max"] < 1e-4
