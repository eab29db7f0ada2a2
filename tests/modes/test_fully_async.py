"""fully_async and hybrid runs on the embedded runtime against a real engine on 127.0.0.1:
staleness bounds from recorded versions, exactly-once accounting, logprob workers, crash/resume."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from relax_gym.trainer.config import EnvEntry, config_from_dict
from relax_gym.trainer.rollout.sampler import EpisodeSampler
from relax_gym.trainer.modes.learner import read_ledger
from relax_gym.trainer.modes.async_runner import run_async

from . import workload
from .audit import audit_run
from .conftest import config_dict


def read_metrics(out: Path, phase: str = "train") -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if r["phase"] == phase]


async def test_zero_staleness_reproduces_colocates_on_policy_batches(tiny_model: Path, engine: Any,
                                                                     tmp_path: Path) -> None:
    """max_staleness=0: every trained token was sampled by exactly the weights being trained, and
    step n trains the groups colocate's sampler draws for step n (draws nB+1 .. (n+1)B)."""
    out = tmp_path / "k0"
    cfg = config_from_dict(config_dict(tiny_model, out, [engine.url], train={"steps": 3},
                                       engine={"sync": "distributed"},
                                       async_rl={"max_staleness": 0, "imports": ["tests.modes.workload"]}))
    summary = await run_async(cfg)
    assert summary.steps == 3
    audit = audit_run(out, max_staleness=0)
    B, G = cfg.rollout.prompts_per_step, cfg.rollout.group_size
    sampler = EpisodeSampler([EnvEntry(id=workload.ENV_ID)], seed=cfg.seed, seed_start=cfg.data.seed_start,
                             seed_count=cfg.data.seed_count)
    for record in audit.ledger:
        expected = {(s.env_id, s.seed) for s in sampler.next(B)}
        got = {(g.split(":", 2)[2].split("#")[0], int(g.rsplit("#", 1)[1])) for g in record["groups"]}
        assert got == expected, f"step {record['step']} trained other groups than colocate would"
        assert len(record["trained"]) == B * G and not record["refused"]
        assert set(record["min_versions"]) == {record["version"]}
    metrics = read_metrics(out)
    assert all(m["staleness/off_policy_token_frac"] == 0.0 for m in metrics)
    assert [r["version"] for r in audit.ledger] == [1, 2, 3]  # one new version per step
    pushed = [m["sync/version"] for m in metrics if "sync/version" in m]  # (a step reports the last landed push)
    assert pushed == sorted(pushed) and set(pushed) <= {2.0, 3.0, 4.0}


async def test_staleness_bound_and_exactly_once_in_hybrid_mode(tiny_model: Path, engine: Any, tmp_path: Path) -> None:
    """max_staleness=2 lets rollout run ahead: samples are older than the trained weights but never
    by more than 2 versions, and every produced sample is trained once or accounted as dropped.
    Hybrid mode: the trainer itself computes the reference and proximal logprobs."""
    out = tmp_path / "k2"
    cfg = config_from_dict(config_dict(
        tiny_model, out, [engine.url], mode="hybrid", train={"steps": 5, "mini_batches": 2},
        algorithm={"kl_loss_coef": 0.01, "rollout_correction": "tis"},
        async_rl={"max_staleness": 2, "imports": ["tests.modes.workload"]}))
    await run_async(cfg)
    audit = audit_run(out, max_staleness=2)
    assert max(st for r in audit.ledger for st in r["staleness"]) >= 1  # rollout really ran ahead
    metrics = read_metrics(out)
    assert all(m["logprob/ref_from_worker_frac"] == 0.0 for m in metrics)  # hybrid: all computed here
    assert all(m["logprob/prox_from_worker"] == 0.0 for m in metrics)
    assert all(m["train/updates"] == 2.0 for m in metrics)
    assert any(m["train/is_weight_mean"] > 0 for m in metrics)  # the TIS correction used the versions


async def test_fully_async_logprob_workers_annotate_off_the_critical_path(tiny_model: Path, engine: Any,
                                                                         tmp_path: Path) -> None:
    out = tmp_path / "workers"
    # The reference worker first loads the reference model saved at RL start; on a loaded box
    # that took longer than 4 steps of this tiny run (every batch then recomputed, frac 0), so
    # the run is long enough for the worker to be up for several steps.
    cfg = config_from_dict(config_dict(
        tiny_model, out, [engine.url], train={"steps": 10, "mini_batches": 2},
        algorithm={"kl_loss_coef": 0.01, "rollout_correction": "decoupled"},
        async_rl={"max_staleness": 2, "prox_max_lag": 2, "imports": ["tests.modes.workload"]}))
    await run_async(cfg)
    audit_run(out, max_staleness=2)
    metrics = read_metrics(out)
    last = metrics[-1]
    assert last["logprob/ref_worker_annotated"] > 0 and last["logprob/ref_worker_errors"] == 0
    assert last["logprob/prox_worker_annotated"] > 0
    assert last["logprob/prox_worker_version"] == last["sync/version"]  # the worker follows every publish
    assert max(m["logprob/ref_from_worker_frac"] for m in metrics) > 0
    # the rollout managers' counters reach the metrics (as running totals; nothing failed here)
    assert last["rollout/failovers_total"] == 0 and last["rollout/template_errors_total"] == 0
    assert last["rollout/requests_total"] > 0


async def test_trainer_crash_and_resume_loses_and_repeats_nothing(tiny_model: Path, engine: Any,
                                                                  tmp_path: Path) -> None:
    """The run dies after step 3 (checkpoint at step 2: queued groups and pending ones inside);
    the resumed run trains steps 3..5 from the checkpoint and no sample is lost or repeated."""
    out = tmp_path / "crash"
    raw = config_dict(tiny_model, out, [engine.url], train={"steps": 5}, checkpoint={"every": 2, "keep_last": 5},
                      async_rl={"max_staleness": 1, "imports": ["tests.modes.workload"]})
    task = asyncio.create_task(run_async(config_from_dict(raw)))
    deadline = time.monotonic() + 120
    # a step of this tiny run can take well under 0.1 s: poll finely, or step 4 lands before the cancel
    while time.monotonic() < deadline and len(read_ledger(out)) < 3 and not task.done():
        await asyncio.sleep(0.002)
    assert not task.done(), "the run ended before it could be interrupted"
    task.cancel()  # the crash: no final checkpoint, everything in memory is gone
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(read_ledger(out)) == 3
    before = json.loads((out / "checkpoints" / "step_000002" / "trainer_state.json").read_text())
    assert before["buffer_size"] + len(before["extra"]["async"]["producer"]["pending"]) > 0

    summary = await run_async(config_from_dict(raw), resume=True)
    assert summary.steps == 5
    audit = audit_run(out, max_staleness=1)
    assert [r["step"] for r in audit.ledger] == [1, 2, 3, 4, 5]  # the rolled-back step 3 was redone once
    # what the checkpoint held (queued or pending) was trained after the resume, not lost
    held = {p["group_id"] for p in before["extra"]["async"]["producer"]["pending"]}
    later = {g for r in audit.ledger[2:] for g in r["groups"]} | set(audit.leftover_groups) | set(audit.pending_groups)
    assert held <= later


@pytest.mark.slow
async def test_the_learner_in_a_process_of_its_own_is_as_exact(tiny_model: Path, engine: Any,
                                                                tmp_path: Path) -> None:
    """``async_rl.learner_process=true``: the learner lives in a child process (the producer has
    its own router over the engines), and the run passes the same audit as the default."""
    import os

    out = tmp_path / "proc"
    cfg = config_from_dict(config_dict(tiny_model, out, [engine.url], train={"steps": 3},
                                       async_rl={"max_staleness": 1, "learner_process": True,
                                                 "imports": ["tests.modes.workload"]}))
    summary = await run_async(cfg)
    assert summary.steps == 3
    audit_run(out, max_staleness=1)
    pids = json.loads((out / "summary.json").read_text())
    assert pids["learner_pid"] not in (None, os.getpid()) and pids["driver_pid"] == os.getpid()
