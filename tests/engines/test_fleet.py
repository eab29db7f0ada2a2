"""The run's engine fleet: one launch path for embedded and SGLang engines, checks before start.

On CPU the fleet launches embedded engines through the same :meth:`EngineFleet.launch_one` that
starts SGLang servers on GPUs (and that scale-out calls); ``engine.kind: sglang`` on a machine
that cannot run it fails before any server starts, with one line.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import httpx
import pytest

from relax_gym.protocol import EngineClient
from relax_gym.trainer.config import EngineConfig
from relax_gym.trainer.engines.fleet import EngineFleet
from relax_gym.trainer.engines.launch import ServerStartError
from relax_gym.trainer.engines.sglang_launcher import SGLangOptions, check_sglang_server, preflight
from relax_gym.trainer.weights.broadcast import engine_ranks


@pytest.mark.slow
def test_fleet_launches_embedded_engines_and_one_more(bpe_qwen3: Path, tmp_path: Path) -> None:
    cfg = EngineConfig(kind="embedded", num_engines=1, threads=1)
    fleet = EngineFleet(cfg, bpe_qwen3, tmp_path / "engines")
    start = time.monotonic()
    with fleet:
        first = time.monotonic() - start
        fleet.launch_one()  # what scale-out does: a new engine of the configured kind
        assert len(fleet.urls) == 2 and len(set(fleet.urls)) == 2
        for url in fleet.urls:
            info = httpx.get(f"{url}/server_info", timeout=10).json()
            assert info["weight_version"] == "0" and info["tp_size"] == 1
            assert check_sglang_server(info, url).startswith("relax-gym-embedded")
        urls = list(fleet.urls)
    for url in urls:  # stopped at the end
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{url}/health", timeout=2)
    print(f"embedded engine healthy in {first:.1f} s")


def test_sglang_kind_refuses_before_start_on_cpu(tmp_path: Path) -> None:
    """No server starts; the message is one line that says what to do."""
    cfg = EngineConfig(kind="sglang", num_engines=2, sglang={"python": sys.executable})
    fleet = EngineFleet(cfg, tmp_path / "model", tmp_path / "engines")
    with pytest.raises(ServerStartError) as info:
        fleet.start()
    msg = str(info.value)
    assert "\n" not in msg and ("sglang" in msg) and fleet.urls == []


def test_preflight_names_a_missing_or_old_sglang(tmp_path: Path) -> None:
    fake = tmp_path / "site"
    (fake / "sglang").mkdir(parents=True)
    (fake / "sglang" / "__init__.py").write_text("")
    meta = fake / "sglang-0.4.9.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.4.9\n")
    old = SGLangOptions(model="/m", env={"PYTHONPATH": str(fake)})
    with pytest.raises(ServerStartError, match=r"sglang 0\.4\.9 is too old"):
        preflight(old, need_gpu=False, parse_flags=False)
    missing = SGLangOptions(model="/m", python=sys.executable, env={"PYTHONNOUSERSITE": "1"})
    try:
        import importlib.util

        has = importlib.util.find_spec("sglang") is not None
    except ValueError:
        has = True
    if not has:
        with pytest.raises(ServerStartError, match="sglang is not installed"):
            preflight(missing, need_gpu=False, parse_flags=False)


def test_check_sglang_server_tells_servers_apart() -> None:
    assert check_sglang_server({"version": "0.5.23"}, "http://a") == "0.5.23"
    with pytest.raises(ServerStartError, match="not an SGLang server"):
        check_sglang_server({"model": "x"}, "http://b")
    with pytest.raises(ServerStartError, match="needs 0.5.23"):
        check_sglang_server({"version": "0.4.6.post1"}, "http://c")


def test_tensor_sync_is_refused_with_sglang_engines() -> None:
    with pytest.raises(ValueError, match="engine.sync 'tensor' needs embedded engines"):
        EngineConfig(kind="sglang", sync="tensor")
    EngineConfig(kind="external", urls=["http://127.0.0.1:30000"], sync="tensor")  # checked when reached


async def _tensor_to(version: object) -> str:
    """TensorTransport against a stand-in whose /server_info reports ``version``."""
    from aiohttp import web

    from relax_gym.trainer.weights.broadcast import free_port
    from relax_gym.trainer.weights.tensor import TensorTransport
    from relax_gym.trainer.weights.transport import Snapshot, WeightSyncFailed

    import torch

    async def info(request: web.Request) -> web.Response:
        return web.json_response({"version": version, "tp_size": 1})

    async def update(request: web.Request) -> web.Response:
        return web.json_response({"success": True, "message": "ok"})

    app = web.Application()
    app.add_routes([web.get("/server_info", info), web.post("/update_weights_from_tensor", update)])
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        await TensorTransport().send(Snapshot([("w", torch.zeros(2))]), "1", [f"http://127.0.0.1:{port}"])
        return "sent"
    except WeightSyncFailed as exc:
        return str(exc)
    finally:
        await runner.cleanup()


def test_tensor_sync_refuses_a_real_sglang_server() -> None:
    assert "runs SGLang 0.5.23" in asyncio.run(_tensor_to("0.5.23"))
    assert asyncio.run(_tensor_to("relax-gym-embedded 0.1.0")) == "sent"


async def _ranks(tp_values: list[object]) -> list[object]:
    """engine_ranks against stand-ins whose /server_info reports ``tp_size`` (or not)."""
    from aiohttp import web

    from relax_gym.trainer.weights.broadcast import free_port

    out: list[object] = []
    for tp in tp_values:
        async def info(request: web.Request, tp: object = tp) -> web.Response:
            return web.json_response({} if tp is None else {"tp_size": tp, "version": "0.5.23"})

        app = web.Application()
        app.add_routes([web.get("/server_info", info)])
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            async with EngineClient(f"http://127.0.0.1:{port}") as client:
                try:
                    out.append(await engine_ranks(client, None))
                except Exception as exc:
                    out.append(type(exc).__name__)
                out.append(await engine_ranks(client, 3))  # configured wins
        finally:
            await runner.cleanup()
    return out


def test_engine_ranks_follow_tp_size() -> None:
    assert asyncio.run(_ranks([2, None, 0])) == [2, 3, 1, 3, "WeightGroupError", 3]


def test_ray_places_sglang_engines_on_tp_gpus_each() -> None:
    """Under the Ray runtime an SGLang engine is an actor reserving its TP size in GPUs (Ray
    hands them to its server); a larger reservation is kept. The run itself: tests/modes/test_ray.py."""
    from relax_gym.trainer.config import config_from_dict
    from relax_gym.trainer.modes.ray_runtime import engine_resources

    raw = {"model": {"build": {"kind": "qwen3"}}, "data": {"envs": [{"id": "relax/ShapeCount-v0"}]},
           "mode": "fully_async", "async_rl": {"runtime": "ray"},
           "engine": {"kind": "sglang", "sglang": {"tp": 2}, "sync": "disk"}}
    assert engine_resources(config_from_dict(raw)).num_gpus == 2.0
    raw["async_rl"]["ray"] = {"engine": {"num_gpus": 4}}
    assert engine_resources(config_from_dict(raw)).num_gpus == 4.0
    raw["engine"], raw["async_rl"]["ray"] = {"kind": "embedded"}, {}
    assert engine_resources(config_from_dict(raw)).num_gpus == 0.0
