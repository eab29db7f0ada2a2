"""The one weight publisher (``relax_gym.trainer.weights``) against real embedded engines: every
transport delivers exactly the trainer's weights, engines that join or come back get the
published weights (not later ones), and an engine that dies mid-push fails over."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from relax_gym.trainer.backends.base import NamedTensors, SequenceBatch
from relax_gym.trainer.backends.pytorch import TorchBackend
from relax_gym.trainer.config import DistributedSyncConfig
from relax_gym.trainer.rollout import EngineRouter, WeightSyncError
from relax_gym.trainer.weights.broadcast import BroadcastTransport
from relax_gym.trainer.weights.disk import DiskTransport
from relax_gym.trainer.weights.publisher import WeightPublisher
from relax_gym.trainer.weights.tensor import TensorTransport
from relax_gym.trainer.weights.transport import LiveWeights, Snapshot, WeightTransport

from relax_gym.protocol import EngineClient, GenerateRequest, SamplingParams

from .conftest import API_KEY, start_engine

PROMPT = [20, 31, 42, 53, 64, 75]


def perturb(backend: TorchBackend, seed: int, scale: float = 0.05) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in backend.model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    backend.version += 1


def transport(path: str, tmp_path: Path, bucket_bytes: int = 256 << 20) -> WeightTransport:
    if path == "tensor":
        return TensorTransport(api_key=API_KEY, bucket_bytes=bucket_bytes)
    if path == "disk":
        return DiskTransport(tmp_path / "weights", api_key=API_KEY)
    return BroadcastTransport(DistributedSyncConfig(timeout_s=30), api_key=API_KEY, bucket_bytes=bucket_bytes)


async def engine_sample(url: str) -> tuple[list[int], list[float], str | None]:
    async with EngineClient(url, api_key=API_KEY) as client:
        reply = await client.generate(GenerateRequest(
            input_ids=PROMPT, sampling_params=SamplingParams(max_new_tokens=6, temperature=1.0, sampling_seed=5),
            return_logprob=True))
    return reply.token_ids(), reply.token_logprobs(), reply.meta_info.weight_version


def trainer_logprobs(backend: TorchBackend, output: list[int]) -> list[float]:
    batch = SequenceBatch(input_ids=[PROMPT + output], loss_mask=[[0] * len(PROMPT) + [1] * len(output)])
    return backend.compute_logprobs(batch).logprobs[0][len(PROMPT):].tolist()


async def assert_serves(url: str, backend: TorchBackend, version: int) -> None:
    ids, logprobs, served = await engine_sample(url)
    assert served == str(version)
    assert trainer_logprobs(backend, ids) == pytest.approx(logprobs, abs=1e-4)


async def test_broadcast_in_buckets_reaches_the_engine_exactly(tiny_model: Path, engine: Any) -> None:
    backend = TorchBackend(tiny_model)
    perturb(backend, seed=1)
    sync = BroadcastTransport(api_key=API_KEY, bucket_bytes=64 << 10)  # many buckets
    try:
        delivery = await sync.send(LiveWeights(backend), "41", [engine.url])
        assert delivery.buckets > 3 and not delivery.failed
        await assert_serves(engine.url, backend, 41)
        perturb(backend, seed=2)
        await sync.send(LiveWeights(backend), "42", [engine.url])
        assert sync.rebuilds == 1  # same members: the group is reused
        await assert_serves(engine.url, backend, 42)
    finally:
        await sync.close()


@pytest.mark.parametrize("path", ["tensor", "disk", "distributed"])
async def test_each_transport_publishes_the_trainers_weights(tiny_model: Path, engine: Any, tmp_path: Path,
                                                             path: str) -> None:
    backend = TorchBackend(tiny_model)
    perturb(backend, seed=5)
    router = await EngineRouter([engine.url], api_key=API_KEY).start()
    publisher = WeightPublisher(backend, router, transport(path, tmp_path, bucket_bytes=256 << 10))
    try:
        metrics = await publisher.publish(11)
        assert metrics["sync/engines"] == 1 and metrics["sync/version"] == 11 and metrics["sync/retries"] == 0
        assert metrics["sync/megabytes"] > 0 and metrics["sync/buckets"] >= 1
        assert router.weight_version == "11" and router.engines[0].weight_version == "11"
        assert (router.weights_path is not None) == (path == "disk")  # joiners load the folder
        await assert_serves(engine.url, backend, 11)
    finally:
        await publisher.close()
        await router.close()


@pytest.mark.parametrize("path", ["tensor", "distributed"])
async def test_a_joining_engine_gets_the_published_weights_not_later_ones(tiny_model: Path, engine: Any,
                                                                          tmp_path: Path, path: str) -> None:
    """Training goes on after a publish; an engine that joins then must serve the published
    version (what every other engine serves), verified before it takes traffic."""
    backend = TorchBackend(tiny_model)
    perturb(backend, seed=3)
    published = TorchBackend(tiny_model)
    published.model.load_state_dict(backend.model.state_dict())
    router = await EngineRouter([engine.url], api_key=API_KEY).start()
    publisher = WeightPublisher(backend, router, transport(path, tmp_path), keep_snapshot=True)
    try:
        await publisher.publish(7)
        perturb(backend, seed=4)  # the trainer moves on; engines still serve v7
        # the engine drops out and comes back with other weights, as a fresh engine would
        await router.remove_engine(router.engines[0].id, drain=False)
        stranger = TorchBackend(tiny_model)
        perturb(stranger, seed=99)
        await TensorTransport(api_key=API_KEY).send(LiveWeights(stranger), "0", [engine.url])
        handle = await router.add_engine(engine.url)
        assert handle.state == "ready" and handle.weight_version == "7"
        assert router.events["weight_syncs"] >= 1 and publisher.events["joins"] == 1
        await assert_serves(engine.url, published, 7)
    finally:
        await publisher.close()
        await router.close()


async def test_without_a_snapshot_catch_up_sends_the_live_weights_until_training_moves_on(
        tiny_model: Path, engine: Any, tmp_path: Path) -> None:
    """Colocate keeps no second copy: catch-up sends the backend's weights while they are the
    published ones, and refuses (the engine stays out until the next publish) once they are not."""
    backend = TorchBackend(tiny_model)
    perturb(backend, seed=6)
    router = await EngineRouter([engine.url], api_key=API_KEY).start()
    publisher = WeightPublisher(backend, router, transport("tensor", tmp_path))
    try:
        assert await publisher.bring_up_to_date(engine.url) is None  # nothing published yet
        await publisher.publish(3)
        assert publisher.snapshot is None
        assert await publisher.bring_up_to_date(engine.url) == "3"
        await assert_serves(engine.url, backend, 3)
        perturb(backend, seed=7)  # a training step
        with pytest.raises(WeightSyncError, match="moved on"):
            await publisher.bring_up_to_date(engine.url)
    finally:
        await publisher.close()
        await router.close()


class _KillsMidExport(TorchBackend):
    """A backend whose weight export kills ``victim`` once the first bucket has gone out."""

    victim: Any = None

    def export_weights(self, bucket_bytes: int = 256 << 20) -> Iterator[NamedTensors]:
        for i, bucket in enumerate(super().export_weights(bucket_bytes)):
            if i == 1 and self.victim is not None:
                self.victim.kill()
                self.victim = None
            yield bucket


@pytest.mark.slow
@pytest.mark.parametrize("path", ["tensor", "distributed"])
async def test_an_engine_that_dies_mid_push_fails_over_to_the_survivors(tiny_model: Path, engine: Any,
                                                                        tmp_path: Path, path: str) -> None:
    doomed = start_engine(tiny_model, tmp_path, "doomed")
    backend = _KillsMidExport(tiny_model)
    perturb(backend, seed=8)
    router = await EngineRouter([engine.url, doomed.url], api_key=API_KEY).start()
    publisher = WeightPublisher(backend, router, transport(path, tmp_path, bucket_bytes=128 << 10))
    try:
        assert len(router.live()) == 2
        backend.victim = doomed
        metrics = await publisher.publish(9)
        assert metrics["sync/engines"] == 1
        assert {h.url: h.state for h in router.engines} == {engine.url: "ready", doomed.url: "unhealthy"}
        await assert_serves(engine.url, backend, 9)
    finally:
        await publisher.close()
        await router.close()
        doomed.stop()


def test_a_snapshot_streams_in_buckets() -> None:
    named = [("a", torch.zeros(4)), ("b", torch.zeros(4)), ("c", torch.zeros(100))]
    assert [[n for n, _ in b] for b in Snapshot(named).buckets(40)] == [["a", "b"], ["c"]]


# ------------------------------------------------------------------------------------------------
# failover and catch-up against fake engines (no model: the publisher's decisions alone)
# ------------------------------------------------------------------------------------------------
class FakeEngine:
    """An SGLang-protocol stub: answers health, pause/continue, flush and model info, and takes
    ``/update_weights_from_tensor``. ``mode``: ``ok``; ``refuse`` (HTTP 500, still healthy);
    ``die`` (drops the connection and stops answering /health)."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.version = "0"
        self.updates = 0
        self.runner: Any = None
        self.url = ""

    async def start(self) -> FakeEngine:
        from aiohttp import web

        async def ok(_: web.Request) -> web.Response:
            return web.json_response({"success": True})

        async def health(_: web.Request) -> web.Response:
            return web.Response(status=503 if self.mode == "dead" else 200)

        async def info(_: web.Request) -> web.Response:
            return web.json_response({"model_path": "m", "weight_version": self.version})

        async def update(request: web.Request) -> web.Response:
            body = await request.json()
            self.updates += 1
            if self.mode == "refuse":
                return web.json_response({"success": False, "message": "no"}, status=500)
            if self.mode == "die":
                self.mode = "dead"
                assert request.transport is not None
                request.transport.close()
                return web.Response()
            if body.get("weight_version") is not None:
                self.version = body["weight_version"]
            return web.json_response({"success": True})

        app = web.Application(client_max_size=64 << 20)
        app.add_routes([web.get("/health", health), web.get("/get_model_info", info),
                        web.post("/update_weights_from_tensor", update)]
                       + [web.post(p, ok) for p in ("/pause_generation", "/continue_generation", "/flush_cache")])
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        await self.runner.cleanup()


class TinyBackend(TorchBackend):
    """Just enough backend for the publisher: two named tensors and a version."""

    def __init__(self) -> None:  # noqa: D107 -- no model to load
        self.version = 1
        self.weights = [("a", torch.ones(64)), ("b", torch.zeros(64))]

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.weights)


async def fake_fleet(*modes: str) -> tuple[list[FakeEngine], EngineRouter, WeightPublisher]:
    engines = [await FakeEngine(m).start() for m in modes]
    router = await EngineRouter([e.url for e in engines], health_interval_s=3600, health_timeout_s=1.0).start()
    return engines, router, WeightPublisher(TinyBackend(), router, TensorTransport(bucket_bytes=256))


async def test_an_engine_that_refuses_the_push_is_retried_then_taken_out() -> None:
    engines, router, publisher = await fake_fleet("ok", "refuse")
    try:
        metrics = await publisher.publish(5)
        assert metrics["sync/engines"] == 1 and metrics["sync/retries"] == 2 and metrics["sync/buckets"] == 2
        assert engines[1].updates == 3  # first push + two retries, still paused
        good, bad = router.engines
        assert (good.state, good.weight_version, bad.state) == ("ready", "5", "unhealthy")
        assert "weight update failed" in (bad.last_error or "") and router.weight_version == "5"
    finally:
        await router.close()
        for e in engines:
            await e.stop()


async def test_an_engine_that_dies_mid_push_is_dropped_at_once_and_caught_up_later() -> None:
    engines, router, publisher = await fake_fleet("ok", "die")
    try:
        metrics = await publisher.publish(6)
        assert metrics["sync/engines"] == 1 and metrics["sync/retries"] == 0  # dead: no retry
        assert [h.state for h in router.engines] == ["ready", "unhealthy"]
        engines[1].mode = "ok"  # it comes back (serving its old weights)
        await router.check_health()  # revival brings it to v6 through the publisher first
        assert [h.state for h in router.engines] == ["ready", "ready"] and engines[1].version == "6"
        assert publisher.events["joins"] == 1
    finally:
        await router.close()
        for e in engines:
            await e.stop()


async def test_with_no_engine_left_the_sync_fails_loudly() -> None:
    from relax_gym.trainer.weights.transport import WeightSyncFailed

    engines, router, publisher = await fake_fleet("refuse")
    try:
        with pytest.raises(WeightSyncFailed, match="failed on every engine"):
            await publisher.publish(2)
        assert router.weight_version != "2"  # joiners are not sent to a version nobody serves
    finally:
        await router.close()
        for e in engines:
            await e.stop()


async def test_the_router_tells_a_listener_of_engines_added_and_removed() -> None:
    engine = await FakeEngine().start()
    heard: list[tuple[str, str]] = []

    async def listen(event: str, url: str) -> None:
        heard.append((event, url))

    try:
        async with EngineRouter([], on_change=listen, health_interval_s=3600) as router:
            handle = await router.add_engine(engine.url)
            await router.remove_engine(handle.id, drain=False)
        assert heard == [("added", engine.url), ("removed", engine.url)]
    finally:
        await engine.stop()
