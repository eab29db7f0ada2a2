"""Faults and elasticity with real engines on 127.0.0.1: scale out then in while episodes run
(through the token-protected control API), and kill one of two engines mid-rollout. Nothing is
lost: every episode completes with all its turns.

The second engine is shared by both tests, in file order: the scaling test adds and drains it,
the failover test kills it.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from relax_gym.chat import ChatCodec
from relax_gym.trainer.rollout import (
    ControlServer,
    EngineRouter,
    RolloutConfig,
    RolloutManager,
    WeightSyncError,
    parse_weight_version,
)

from relax_gym.protocol import EngineClient, UpdateWeightsFromDiskRequest

from .test_episode import assert_tool_structure, tool_specs


async def wait_until(predicate: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_control_api_needs_the_token() -> None:
    async with EngineRouter([]) as router, ControlServer(router, token="s3cret") as control:
        assert control.host == "127.0.0.1"
        async with httpx.AsyncClient(base_url=control.url) as http:
            assert (await http.get("/engines")).status_code == 401
            assert (await http.get("/engines", headers={"Authorization": "Bearer wrong"})).status_code == 401
            assert (await http.post("/engines", json={"url": "http://127.0.0.1:9"})).status_code == 401
            assert (await http.delete("/engines/e0")).status_code == 401
            ok = {"Authorization": "Bearer s3cret"}
            assert (await http.get("/engines", headers=ok)).json()["engines"] == []
            assert (await http.delete("/engines/nope", headers=ok)).status_code == 404
            assert (await http.post("/engines", json={"url": "ftp://x"}, headers=ok)).status_code == 422
            down = await http.post("/engines", json={"url": "http://127.0.0.1:9"}, headers=ok)
            assert down.status_code == 502 and router.engines == []
            both = await http.post("/engines", json={"url": "http://127.0.0.1:9", "launch": True}, headers=ok)
            assert both.status_code == 422 and (await http.post("/engines", json={}, headers=ok)).status_code == 422
            nothing_to_launch_with = await http.post("/engines", json={"launch": True}, headers=ok)
            assert nothing_to_launch_with.status_code == 409 and "url" in nothing_to_launch_with.json()["error"]
    with pytest.raises(ValueError, match="allow_remote"):
        ControlServer(router, host="0.0.0.0")


async def test_scale_out_then_in_while_running(qwen3_engine: Any, second_engine: Any, codec: ChatCodec,
                                               tiny_qwen3: Path) -> None:
    async with EngineRouter([qwen3_engine.url], health_interval_s=0.5) as router:
        await router.update_weights_from_disk(str(tiny_qwen3), 7)  # the checkpoint new engines must load
        manager = RolloutManager(router, codec, RolloutConfig(max_new_tokens=12, concurrency=6, group_size=1))
        async with ControlServer(router, manager=manager) as control, httpx.AsyncClient(
                base_url=control.url, headers={"Authorization": f"Bearer {control.token}"}, timeout=60) as http:
            task = asyncio.create_task(manager.generate(tool_specs(12, turns=4)))
            await wait_until(lambda: manager.metrics.turns >= 3)
            added = await http.post("/engines", json={"url": second_engine.url})
            assert added.status_code == 201, added.text
            new_id = added.json()["id"]
            assert added.json()["weight_version"] == "7"  # synced before taking traffic
            handle = router.get(new_id)
            assert handle is not None
            await wait_until(lambda: handle.served >= 4)
            drained = await http.delete(f"/engines/{new_id}")
            assert drained.status_code == 202 and drained.json()["state"] in ("draining", "removed")
            trajs = await asyncio.wait_for(task, 120)
            await wait_until(lambda: router.get(new_id) is None)
            listed = (await http.get("/engines")).json()["engines"]
            assert [e["url"] for e in listed] == [qwen3_engine.url]
            metrics = (await http.get("/metrics")).json()
            assert metrics["router"]["added"] == 1 and metrics["router"]["removed"] == 1
    assert len(trajs) == 12
    for traj in trajs:
        assert traj.stop_reason == "env_done" and len(traj.turns) == 4
        assert_tool_structure(traj, codec)
        assert traj.weight_version_mix.keys() == {7}
        engines = [e for t in traj.turns for e in t.engine_ids]
        assert len(set(engines)) == 1  # session affinity: a drained engine finishes what it has
    assert any(new_id in t.turns[0].engine_ids for t in trajs)  # the new engine took episodes


async def test_kill_one_of_two_engines_mid_rollout(qwen3_engine: Any, second_engine: Any, codec: ChatCodec) -> None:
    async with EngineRouter([qwen3_engine.url, second_engine.url], health_interval_s=0.5) as router:
        first, second = router.engines
        assert second.url == second_engine.url and second.state == "ready"
        manager = RolloutManager(router, codec, RolloutConfig(max_new_tokens=16, concurrency=8, group_size=1))
        task = asyncio.create_task(manager.generate(tool_specs(8, turns=4)))
        await wait_until(lambda: second.served >= 4)
        second_engine.kill()
        trajs = await asyncio.wait_for(task, 120)
        assert second.state == "unhealthy" and first.state == "ready"
    assert len(trajs) == 8
    moved = 0
    for traj in trajs:
        assert traj.stop_reason == "env_done" and len(traj.turns) == 4, traj.error
        assert_tool_structure(traj, codec)
        engines = [e for t in traj.turns for e in t.engine_ids]
        if second.id in engines and engines[-1] == first.id:
            moved += 1
            assert engines.index(first.id) > 0  # resumed on the survivor after the failure
    assert moved >= 1 and manager.metrics.failovers >= 1
    assert router.events["marked_unhealthy"] >= 1


async def test_weight_sync_hook_runs_before_an_engine_takes_traffic(qwen3_engine: Any, tiny_qwen3: Path) -> None:
    calls: list[tuple[str, str]] = []

    async def push(handle: Any, version: str) -> None:  # the trainer's own transport would go here
        calls.append((handle.url, version))
        await handle.client.update_weights_from_disk(
            UpdateWeightsFromDiskRequest(model_path=str(tiny_qwen3), weight_version=version))

    async def forget(handle: Any, version: str) -> None:
        calls.append((handle.url, "nothing"))

    async with EngineClient(qwen3_engine.url) as client:
        current = parse_weight_version((await client.model_info()).weight_version)
    async with EngineRouter([], weight_sync=forget) as router:
        router.set_current_weights(current + 1)
        with pytest.raises(WeightSyncError, match="expected"):
            await router.add_engine(qwen3_engine.url)
        assert router.engines == []  # a failed sync never takes traffic
        router.weight_sync = push
        handle = await router.add_engine(qwen3_engine.url)
        assert handle.state == "ready" and handle.weight_version == str(current + 1)
    assert calls == [(qwen3_engine.url, "nothing"), (qwen3_engine.url, str(current + 1))]


@pytest.mark.slow  # starts and stops a real engine process (~10-30 s on a busy 2-core box)
async def test_the_control_api_launches_an_engine_and_stops_it_when_removed(
        qwen3_engine: Any, tiny_qwen3: Path, codec: ChatCodec, tmp_path: Path) -> None:
    """Scale-out that *starts* an engine: POST {"launch": true} runs the run's own engine kind on
    the run's model (the same code path as the run's first engines), brings it to the current
    weights before traffic, records its pid; DELETE drains it and stops the process."""
    import json
    import os

    from relax_gym.trainer.config import EngineConfig
    from relax_gym.trainer.engines.fleet import SCALEOUT_PIDS, ScaleOutLauncher

    async with EngineRouter([qwen3_engine.url], health_interval_s=0.5, api_key="run-key") as router:
        await router.update_weights_from_disk(str(tiny_qwen3), 9)  # new engines must come up to 9
        launcher = ScaleOutLauncher(EngineConfig(kind="embedded", num_engines=1, threads=1), tiny_qwen3, tmp_path,
                                    api_key=router.api_key)
        manager = RolloutManager(router, codec, RolloutConfig(max_new_tokens=8, concurrency=4, group_size=1))
        try:
            async with ControlServer(router, launcher=launcher) as control, httpx.AsyncClient(
                    base_url=control.url, headers={"Authorization": f"Bearer {control.token}"}, timeout=180) as http:
                launched = await http.post("/engines", json={"launch": True, "id": "grown"})
                assert launched.status_code == 201, launched.text
                body = launched.json()
                assert body["launched"] and body["id"] == "grown" and body["weight_version"] == "9"
                assert (await http.post("/engines", json={"launch": True, "id": "grown"})).status_code == 409
                pids = json.loads((tmp_path / "engines" / SCALEOUT_PIDS).read_text())
                assert [p["url"] for p in pids] == [body["url"]] and (tmp_path / "engines" / "engine1.log").is_file()
                pid = int(pids[0]["pid"])
                trajs = await manager.generate(tool_specs(6, turns=1))
                handle = router.get("grown")
                assert handle is not None and handle.served > 0 and len(trajs) == 6
                removed = await http.delete("/engines/grown", params={"wait": "true"})
                assert removed.status_code == 200
                assert router.get("grown") is None and json.loads((tmp_path / "engines" / SCALEOUT_PIDS).read_text()) == []
                await wait_until(lambda: not os.path.exists(f"/proc/{pid}") or
                                 Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z", 30)
        finally:
            await launcher.close()
