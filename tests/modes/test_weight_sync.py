"""Weight updates against a real embedded engine: the distributed broadcast path (the GPU code
path, over gloo), and joiners getting exactly the published weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from relax_gym.trainer.backends.base import SequenceBatch
from relax_gym.trainer.weights.publisher import DistributedWeightSync, ElasticRouter, WeightPublisher
from relax_gym.trainer.backends.pytorch import TorchBackend

from relax_gym.protocol import EngineClient, GenerateRequest, SamplingParams

from .conftest import API_KEY

PROMPT = [20, 31, 42, 53, 64, 75]


def perturb(backend: TorchBackend, seed: int, scale: float = 0.05) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in backend.model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    backend.version += 1


async def engine_sample(url: str) -> tuple[list[int], list[float], str | None]:
    async with EngineClient(url, api_key=API_KEY) as client:
        reply = await client.generate(GenerateRequest(
            input_ids=PROMPT, sampling_params=SamplingParams(max_new_tokens=6, temperature=1.0, sampling_seed=5),
            return_logprob=True))
    return reply.token_ids(), reply.token_logprobs(), reply.meta_info.weight_version


def trainer_logprobs(backend: TorchBackend, output: list[int]) -> list[float]:
    batch = SequenceBatch(input_ids=[PROMPT + output], loss_mask=[[0] * len(PROMPT) + [1] * len(output)])
    return backend.compute_logprobs(batch).logprobs[0][len(PROMPT):].tolist()


async def test_broadcast_in_buckets_reaches_the_engine_exactly(tiny_model: Path, engine: Any) -> None:
    backend = TorchBackend(tiny_model)
    perturb(backend, seed=1)
    sync = DistributedWeightSync(api_key=API_KEY, bucket_bytes=64 << 10)  # many buckets
    try:
        buckets = await sync.push(list(backend.named_weights()), 41, [engine.url])
        assert buckets > 3
        ids, logprobs, version = await engine_sample(engine.url)
        assert version == "41"
        assert trainer_logprobs(backend, ids) == pytest.approx(logprobs, abs=1e-4)
        perturb(backend, seed=2)
        await sync.push(list(backend.named_weights()), 42, [engine.url])
        assert sync.rebuilds == 1  # same members: the group is reused
        ids, logprobs, version = await engine_sample(engine.url)
        assert version == "42"
        assert trainer_logprobs(backend, ids) == pytest.approx(logprobs, abs=1e-4)
    finally:
        await sync.close()


@pytest.mark.parametrize("path", ["tensor", "distributed"])
async def test_a_joining_engine_gets_the_published_weights_not_later_ones(tiny_model: Path, engine: Any,
                                                                          tmp_path: Path, path: str) -> None:
    """Training goes on after a publish; an engine that joins then must serve the published
    version (what every other engine serves), verified before it takes traffic."""
    backend = TorchBackend(tiny_model)
    perturb(backend, seed=3)
    published = TorchBackend(tiny_model)
    published.model.load_state_dict(backend.model.state_dict())
    router = await ElasticRouter([engine.url], api_key=API_KEY).start()
    publisher = WeightPublisher(backend, router, path=path, staging_dir=tmp_path, api_key=API_KEY)  # type: ignore[arg-type]
    router.provider = publisher.bring_up_to_date
    try:
        await publisher.publish(7)
        perturb(backend, seed=4)  # the trainer moves on; engines still serve v7
        # the engine drops out and comes back with other weights, as a fresh engine would
        await router.remove_engine(router.engines[0].id, drain=False)
        if publisher.distributed is not None:
            await publisher.distributed.close()  # its member left: the group is gone
        stranger = TorchBackend(tiny_model)
        perturb(stranger, seed=99)
        from relax_gym.trainer.engines.weights import push_weights_from_tensor

        await push_weights_from_tensor(engine.url, list(stranger.named_weights()), weight_version="0", api_key=API_KEY)
        handle = await router.add_engine(engine.url)
        assert handle.state == "ready" and handle.weight_version == "7"
        assert router.events["joined_with_weights"] == 1 and publisher.events["joins"] == 1
        ids, logprobs, version = await engine_sample(engine.url)
        assert version == "7"
        assert trainer_logprobs(published, ids) == pytest.approx(logprobs, abs=1e-4)
    finally:
        await publisher.close()
        await router.close()
