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
