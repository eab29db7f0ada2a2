"""Faults during fully_async training (slow: they start extra engines and processes):
an engine dies, engines join and leave through the control API, the trainer process is killed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from relax_gym.trainer.config import config_from_dict
from relax_gym.trainer.modes.learner import read_ledger
from relax_gym.trainer.modes.async_runner import run_async

from .audit import audit_run
from .conftest import config_dict, start_engine

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
REPO = Path(__file__).resolve().parents[2]


async def wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def test_an_engine_killed_during_training_fails_over(tiny_model: Path, engine: Any, tmp_path: Path) -> None:
    doomed = start_engine(tiny_model, tmp_path, "doomed")
    out = tmp_path / "run"
    try:
        cfg = config_from_dict(config_dict(
            tiny_model, out, [engine.url, doomed.url], train={"steps": 6},
            rollout={"max_new_tokens": 16}, async_rl={"max_staleness": 1, "imports": ["tests.modes.workload"]}))
        task = asyncio.create_task(run_async(cfg))
        await wait_for(lambda: len(read_ledger(out)) >= 2 or task.done(), 120, "two steps")
        doomed.kill()  # mid-run: requests in flight on it fail over, pushes to it fail
        summary = await asyncio.wait_for(task, 300)
    finally:
        doomed.stop()
    assert summary.steps == 6
    audit_run(out, max_staleness=1)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if r["phase"] == "train"][-1]
    assert last["sync/engines"] == 1.0  # the survivor gets every version after the crash


async def test_engines_join_with_current_weights_and_leave_after_draining(tiny_model: Path, engine: Any,
                                                                         tmp_path: Path) -> None:
    joiner = start_engine(tiny_model, tmp_path, "joiner")  # serves the base weights as version 0
    out = tmp_path / "run"
    try:
        cfg = config_from_dict(config_dict(
            tiny_model, out, [engine.url], train={"steps": 8}, rollout={"max_new_tokens": 16},
            async_rl={"max_staleness": 1, "control_port": 0, "imports": ["tests.modes.workload"]}))
        task = asyncio.create_task(run_async(cfg))
        await wait_for(lambda: len(read_ledger(out)) >= 2 or task.done(), 120, "two steps")
        control = json.loads((out / "control.json").read_text())
        auth = {"Authorization": f"Bearer {control['token']}"}
        async with httpx.AsyncClient(base_url=control["url"], timeout=60) as http:
            assert (await http.post("/engines", json={"url": joiner.url})).status_code == 401  # no token
            added = await http.post("/engines", json={"url": joiner.url, "id": "joiner"}, headers=auth)
            assert added.status_code == 201, added.text
            listing = (await http.get("/engines", headers=auth)).json()
            versions = {e["id"]: e["weight_version"] for e in listing["engines"]}
            # it joined at the version every engine serves, never at its own stale 0
            assert versions["joiner"] == listing["weight_version"] != "0"
            # rollouts already queued before the join may cover the next steps (max_staleness=1),
            # so wait for traffic on the joiner itself, bounded, not for a fixed number of steps
            joined: dict[str, Any] = {}
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and not task.done():
                listing = (await http.get("/engines", headers=auth)).json()
                joined = next(e for e in listing["engines"] if e["id"] == "joiner")
                if joined["served_requests"] > 0:
                    break
                await asyncio.sleep(0.2)
            assert joined["served_requests"] > 0, f"the joined engine got no traffic: {listing}"
            assert joined["weight_version"] == listing["weight_version"]
            removed = await http.delete("/engines/joiner", params={"wait": "true"}, headers=auth)
            assert removed.status_code == 200
            assert [e["id"] for e in (await http.get("/engines", headers=auth)).json()["engines"]] != ["joiner"]
            # engine.kind external: the run launches no engines, so a launch request is refused
            refused = await http.post("/engines", json={"launch": True}, headers=auth)
            assert refused.status_code == 409 and "url" in refused.json()["error"]
        summary = await asyncio.wait_for(task, 300)
    finally:
        joiner.stop()
    assert summary.steps == 8
    audit_run(out, max_staleness=1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


def _kill_leftovers(proc: subprocess.Popen[bytes], engine_pids: list[int]) -> None:
    """Whatever a failed test left running: the trainer's process group and its engines."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    for pid in engine_pids:
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)


def test_trainer_killed_and_resumed_loses_and_repeats_no_sample(tiny_model: Path, tmp_path: Path) -> None:
    """SIGKILL the trainer process after its step-2 checkpoint, resume with --resume: the orphaned
    engine is stopped, and the ledger shows every sample trained once or accounted for."""
    out = tmp_path / "run"
    raw = config_dict(tiny_model, out, [], train={"steps": 6}, checkpoint={"every": 2, "keep_last": 5},
                      rollout={"max_new_tokens": 16}, async_rl={"max_staleness": 1, "imports": ["tests.modes.workload"]})
    raw["engine"] = {"kind": "embedded", "num_engines": 1, "threads": 1, "sync": "tensor"}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    command = [sys.executable, "-m", "relax_gym.cli.main", "train", str(path)]  # relax-gym train
    engine_pids: list[int] = []
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if (out / "checkpoints" / "latest").is_file() and len(read_ledger(out)) >= 3:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        engine_pids = [e["pid"] for e in json.loads((out / "engines" / "pids.json").read_text())]
        os.killpg(proc.pid, signal.SIGKILL)  # the trainer dies; its engine (own session) lives on
        proc.wait(30)
        assert all(_alive(pid) for pid in engine_pids)
        resumed = subprocess.run([*command, "--resume"], cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
        assert not any(_alive(pid) for pid in engine_pids)  # the orphan was stopped on resume
    finally:
        _kill_leftovers(proc, engine_pids)
    audit = audit_run(out, max_staleness=1)
    assert [r["step"] for r in audit.ledger] == [1, 2, 3, 4, 5, 6]


def test_sigterm_stops_an_async_run_and_its_engines(tiny_model: Path, tmp_path: Path) -> None:
    """``relax-gym train`` on a fully_async config: SIGTERM to the trainer ends the run as an
    interrupt (exit 130) and stops the engine it started, as in colocate."""
    out = tmp_path / "run"
    raw = config_dict(tiny_model, out, [], train={"steps": 100000})
    raw["engine"] = {"kind": "embedded", "num_engines": 1, "threads": 1, "sync": "tensor"}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    proc = subprocess.Popen([sys.executable, "-m", "relax_gym.cli.main", "train", str(path)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    engine_pids: list[int] = []
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None and not read_ledger(out):
            time.sleep(0.2)
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        engine_pids = [e["pid"] for e in json.loads((out / "engines" / "pids.json").read_text())]
        assert engine_pids and all(_alive(pid) for pid in engine_pids)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
        output = proc.stdout.read().decode() if proc.stdout else ""
        assert code == 130, output[-3000:]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(pid) for pid in engine_pids):
            time.sleep(0.2)
        assert not any(_alive(pid) for pid in engine_pids), "engines left running"
    finally:
        _kill_leftovers(proc, engine_pids)
