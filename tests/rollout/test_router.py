"""Router and scheduler pieces that need no engine: version parsing, waiting with no engine,
the turn barrier of the baseline scheduler, and the config's validation."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError
from relax_gym.trainer.rollout import EngineRouter, NoEngineAvailable, RolloutConfig, parse_weight_version
from relax_gym.trainer.rollout.manager import _TurnBarrier


@pytest.mark.parametrize(("wire", "version"), [(None, 0), ("", 0), ("default", 0), ("7", 7), ("step_12", 12), (3, 3)])
def test_parse_weight_version(wire: str | int | None, version: int) -> None:
    assert parse_weight_version(wire) == version


async def test_acquire_waits_then_gives_up_clearly() -> None:
    async with EngineRouter(["http://127.0.0.1:9"], health_timeout_s=0.5, no_engine_timeout_s=0.3) as router:
        assert router.engines[0].state == "unhealthy"  # nothing listens on port 9
        with pytest.raises(NoEngineAvailable, match="unhealthy"):
            await router.acquire("episode-1")
        router._running.clear()  # paused: the message says so
        with pytest.raises(NoEngineAvailable, match="paused"):
            await router.acquire("episode-1", timeout_s=0.1)


async def test_turn_barrier_releases_when_the_slowest_arrives_or_leaves() -> None:
    barrier = _TurnBarrier(3)
    order: list[str] = []

    async def episode(name: str, turns: int) -> None:
        for t in range(turns):
            await barrier.wait()
            order.append(f"{name}{t}")
            await asyncio.sleep(0.01 * (ord(name) - ord("a")))
        barrier.leave()

    await asyncio.wait_for(asyncio.gather(episode("a", 1), episode("b", 2), episode("c", 3)), 5)
    # nobody starts turn t+1 before everyone still running has started turn t
    assert order.index("b1") > order.index("c0") and order.index("c2") > order.index("b1")
    assert sorted(order) == ["a0", "b0", "b1", "c0", "c1", "c2"]


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ValidationError):
        RolloutConfig(concurrency=0)
    with pytest.raises(ValidationError):
        RolloutConfig(think_policy="drop")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        RolloutConfig(unknown_knob=1)  # type: ignore[call-arg]


async def test_a_few_missed_health_checks_do_not_drop_an_engine() -> None:
    """A busy CPU engine may answer /health late: only ``unhealthy_after`` misses in a row mark
    it unhealthy, an answer revives it, and ``live_engines(wait_s=...)`` waits for that."""
    from aiohttp import web

    answering = {"ok": True}

    async def health(_: web.Request) -> web.Response:
        return web.Response(status=200 if answering["ok"] else 503)

    async def model_info(_: web.Request) -> web.Response:
        return web.json_response({"model_path": "m", "weight_version": None})

    app = web.Application()
    app.add_routes([web.get("/health", health), web.get("/get_model_info", model_info)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with EngineRouter([f"http://127.0.0.1:{port}"], health_interval_s=3600, health_timeout_s=1.0,
                                unhealthy_after=3, no_engine_timeout_s=2.0) as router:
            engine = router.engines[0]
            assert engine.state == "ready"
            answering["ok"] = False
            await router.check_health()
            await router.check_health()
            assert engine.state == "ready" and engine.missed_health == 2
            answering["ok"] = True
            await router.check_health()  # an answer resets the count
            assert engine.missed_health == 0
            answering["ok"] = False
            for _ in range(3):
                await router.check_health()
            assert engine.state == "unhealthy" and router.events["marked_unhealthy"] == 1
            assert await router.live_engines() == []
            answering["ok"] = True

            async def revive_soon() -> None:
                await asyncio.sleep(0.2)
                await router.check_health()

            reviver = asyncio.create_task(revive_soon())
            live = await router.live_engines(wait_s=2.0)  # woken by the revival
            await reviver
            assert [h.id for h in live] == [engine.id] and router.events["revived"] == 1
    finally:
        await runner.cleanup()


async def test_an_engine_finishing_requests_stays_ready_while_its_health_answers_fail() -> None:
    """A CPU engine deep in a large batch may miss every /health deadline while it keeps
    returning results: finished requests count as signs of life, and only silence in both
    marks it unhealthy."""
    from aiohttp import web

    answering = {"ok": True}

    async def health(_: web.Request) -> web.Response:
        return web.Response(status=200 if answering["ok"] else 503)

    async def model_info(_: web.Request) -> web.Response:
        return web.json_response({"model_path": "m", "weight_version": None})

    app = web.Application()
    app.add_routes([web.get("/health", health), web.get("/get_model_info", model_info)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with EngineRouter([f"http://127.0.0.1:{port}"], health_interval_s=3600, health_timeout_s=1.0,
                                unhealthy_after=2, no_engine_timeout_s=2.0) as router:
            engine = router.engines[0]
            assert engine.state == "ready"
            answering["ok"] = False  # from now on every /health answer fails
            for i in range(5):  # a result comes back between every two checks
                handle = await router.acquire(f"episode-{i}")
                router.release(handle, ok=True)
                await router.check_health()
                assert engine.state == "ready" and engine.missed_health == 0
            for _ in range(2):  # then nothing: both signals silent
                await router.check_health()
            assert engine.state == "unhealthy" and router.events["marked_unhealthy"] == 1
    finally:
        await runner.cleanup()


def test_rollout_counters_fold_and_flatten_for_a_step() -> None:
    from relax_gym.trainer.rollout.metrics import RolloutMetrics

    a, b = RolloutMetrics(), RolloutMetrics()
    a.engine_errors["EngineTimeout"] += 2
    a.failovers = 1
    b.engine_errors["EngineTimeout"] += 1
    b.engine_errors["EngineError"] += 1
    b.drift["think_dropped"] += 3
    b.template_errors = 4
    a.add(b)
    m = a.step_counters()
    assert m["rollout/engine_errors/EngineTimeout"] == 3 and m["rollout/engine_errors/EngineError"] == 1
    assert m["rollout/failovers"] == 1 and m["rollout/template_errors"] == 4
    assert m["rollout/drift/think_dropped"] == 3 and m["rollout/resumes"] == 0
