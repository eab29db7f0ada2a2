"""Metrics JSONL + TensorBoard, curves, sample dumps and the time breakdown."""

from __future__ import annotations

import json
import time
from pathlib import Path

from relax_gym.trainer.observability import PhaseTimer, RunLogger, dump_samples, plot_curves, read_metrics, sample_record
from relax_gym.trainer.rollout import Trajectory, TurnRecord


def test_run_logger_writes_jsonl_and_tensorboard(tmp_path: Path) -> None:
    logger = RunLogger(tmp_path, progress="none", tensorboard=True, total_steps=3)
    logger.log(1, {"rollout/reward_mean": 0.5, "bad": float("nan"), "inf": float("inf"), "text": "x"})
    logger.log(1, {"success": 0.25}, phase="eval")
    logger.close()
    recs = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert recs[0]["step"] == 1 and recs[0]["phase"] == "train" and recs[0]["rollout/reward_mean"] == 0.5
    assert "bad" not in recs[0] and "inf" not in recs[0] and logger.dropped == 3
    assert recs[1]["phase"] == "eval"
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0


def test_read_metrics_keeps_the_last_record_per_step(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join([
        json.dumps({"step": 1, "phase": "train", "elapsed_s": 1.0, "x": 1}),
        json.dumps({"step": 2, "phase": "train", "elapsed_s": 2.0, "x": 2}),
        '{"step": 3, "phase": "tr',  # torn line from a crash
        json.dumps({"step": 2, "phase": "train", "elapsed_s": 5.0, "x": 20}),  # after a resume
    ]) + "\n")
    recs = read_metrics(path)
    assert [(r["step"], r["x"]) for r in recs] == [(1, 1), (2, 20)]


def test_plot_curves_draws_a_png(tmp_path: Path) -> None:
    logger = RunLogger(tmp_path, progress="none", tensorboard=False)
    logger.log(0, {"success": 0.1}, phase="warmup_eval")
    for step in range(1, 4):
        logger.log(step, {"rollout/success": step / 4, "rollout/reward_mean": step / 3})
        logger.log(step, {"success": step / 3, "reward_mean": step / 3}, phase="eval")
    logger.close()
    png = plot_curves(tmp_path / "metrics.jsonl", tmp_path / "curves.png", title="t")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_curves(tmp_path / "missing.jsonl", tmp_path / "none.png") is None


def test_phase_timer() -> None:
    timer = PhaseTimer()
    with timer.phase("rollout"):
        time.sleep(0.02)
    with timer.phase("train"):
        time.sleep(0.01)
    with timer.phase("rollout"):
        time.sleep(0.01)
    m = timer.metrics()
    assert m["time/rollout"] >= 0.03 and m["time/train"] >= 0.01
    assert m["time/step"] >= m["time/rollout"] + m["time/train"]
    assert m["time/other"] >= 0


def test_sample_dump_is_readable(tmp_path: Path) -> None:
    traj = Trajectory(token_ids=[10, 11, 7, 7, 7, 12], loss_mask=[0, 0, 0, 0, 0, 1], rollout_logprobs=[0.0] * 5 + [-1.0],
                      weight_versions=[-1] * 5 + [4], prompt_length=5, env_id="e", seed=3, group_id="g",
                      turns=[TurnRecord(index=0, assistant_text="hi", num_sampled_tokens=1, finish_reason="stop")],
                      image_token_id=7, success=True, reward=1.0)
    rec = sample_record(traj, lambda ids: " ".join(map(str, ids)), reward=1.5, advantage=0.7)
    assert rec["prompt"] == "10 11 7" and rec["response"] == "12"  # image pads collapsed
    assert rec["reward"] == 1.5 and rec["weight_versions"] == [4] and rec["turns"] == ["hi"]
    path = dump_samples(tmp_path, 12, [rec])
    assert path.name == "step_000012.jsonl" and json.loads(path.read_text())["advantage"] == 0.7
