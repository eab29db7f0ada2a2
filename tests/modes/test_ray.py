"""The Ray runtime on a local cluster bound to 127.0.0.1 (slow: Ray and five actor processes start).

One run exercises the whole runtime: learner, two engines, rollout, queue and a reward worker as
actors in a placement group; the reward worker's process crashes three times (retried on the
restarted actor, then one group marked reward-failed and dropped); one engine is killed mid-run
(failover). Training still finishes, and the exactly-once and staleness audits hold."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from relax_gym.trainer.checkpoint import latest_checkpoint
from relax_gym.trainer.config import config_from_dict
from relax_gym.trainer.modes.learner import read_ledger
from relax_gym.trainer.modes.async_runner import run_async

from .audit import audit_run
from .conftest import config_dict
from .workload import CRASH_COUNTER_ENV

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
ray = pytest.importorskip("ray")


async def test_ray_runtime_survives_reward_worker_and_engine_crashes(tiny_model: Path, tmp_path: Path) -> None:
    from relax_gym.trainer.modes.ray_runtime import RayRuntime

    assert not ray.is_initialized()
    counter = tmp_path / "crashes"
    counter.write_text("3")
    out = tmp_path / "run"
    raw = config_dict(tiny_model, out, [], train={"steps": 4}, rollout={"concurrency": 4, "max_new_tokens": 12},
                      rewards={"entries": [{"name": "modes_test_crashy"}]},
                      async_rl={"max_staleness": 1, "reward_retries": 1, "runtime": "ray",
                                "imports": ["tests.modes.workload"],
                                "ray": {"num_cpus": 2, "trainer": {"num_cpus": 1}, "engine": {"num_cpus": 0.5}, "actor_max_restarts": 4,
                                        "runtime_env": {"env_vars": {CRASH_COUNTER_ENV: str(counter)}}}})
    raw["engine"] = {"kind": "embedded", "num_engines": 2, "threads": 1, "sync": "tensor"}
    config = config_from_dict(raw)
    runtime = RayRuntime(config)
    task = asyncio.create_task(run_async(config, runtime=runtime))
    for _ in range(3000):  # bounded: 300 s
        await asyncio.sleep(0.1)
        if len(read_ledger(out)) >= 1 or task.done():
            break
    assert not task.done(), task.result() if task.done() else ""
    await runtime.engines[1].kill()  # an engine process dies under its actor
    summary = await asyncio.wait_for(task, 600)
    assert not ray.is_initialized()  # the runtime shut its local cluster down

    assert summary.steps == 4
    audit = audit_run(out, max_staleness=1)
    counts: dict[str, Any] = audit.producer["counts"]
    assert counter.read_text() == "0"
    assert counts["reward_worker_errors"] == 3
    assert counts["reward_failed_calls"] == 1  # two crashes in a row: that group's rewards failed ...
    assert counts["dropped_samples/reward_failed"] == config.rollout.group_size  # ... and it was dropped
    assert counts["reward_retried_calls"] >= 1  # the third crash was retried successfully
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["phase"] == "train"]
    assert train[-1]["sync/engines"] == 1.0  # the surviving engine got every later version
    state = json.loads((latest_checkpoint(out) / "trainer_state.json").read_text())
    assert state["phase"] == "done"


async def test_ray_hosts_sglang_engines_and_a_bad_install_is_one_clear_error(tiny_model: Path, tmp_path: Path) -> None:
    """engine.kind sglang under Ray: each engine actor reserves its TP GPUs (here a logical GPU of
    the local cluster) and checks SGLang on its own node before it starts the server. Without
    sglang in the serving python the run stops with that one line, and the cluster is shut down."""
    from relax_gym.trainer.modes.ray_runtime import RayRuntime

    out = tmp_path / "run"
    raw = config_dict(tiny_model, out, [], train={"steps": 2},
                      async_rl={"runtime": "ray", "imports": ["tests.modes.workload"],
                                "ray": {"num_cpus": 2, "num_gpus": 1, "trainer": {"num_cpus": 1},
                                        "engine": {"num_cpus": 0}, "placement_timeout_s": 60}})
    raw["engine"] = {"kind": "sglang", "num_engines": 1, "sync": "disk", "sglang": {"tp": 1, "health_timeout_s": 60}}
    config = config_from_dict(raw)
    with pytest.raises(Exception, match="sglang is not installed") as err:
        await asyncio.wait_for(run_async(config, runtime=RayRuntime(config)), 600)
    assert "could not place" not in str(err.value)  # placed on the logical GPU, failed on the check
    assert not ray.is_initialized()
