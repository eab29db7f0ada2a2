"""The embedded engine in the trainer's process (``engine.placement``): the socket-free client
serves the same routes as the HTTP engine, with logprobs equal to a fresh forward; auth and bad
input behave as over HTTP; a stopped or unknown engine is a typed failure the router handles; the
weight transports reach it; and ``auto`` picks it only where it fits (colocate, one embedded
engine, no broadcast group)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from relax_gym.protocol import EngineClient, EngineError, EngineUnavailable, GenerateRequest, SamplingParams
from relax_gym.trainer.config import config_from_dict
from relax_gym.trainer.engines.in_process import (
    InProcessClient,
    InProcessEngine,
    client_for,
    engine_client,
    is_in_process_url,
)
from relax_gym.trainer.rollout.router import EngineRouter
from relax_gym.trainer.weights.tensor import TensorTransport
from relax_gym.trainer.weights.transport import Snapshot
from transformers import AutoModelForCausalLM

from .conftest import API_KEY
from .test_weights import PROMPT, fresh_logprobs, max_diff, probe


@pytest.fixture(scope="module")
def live(bpe_qwen3: Path) -> Iterator[InProcessEngine]:
    with InProcessEngine(bpe_qwen3, api_key=API_KEY, max_batch_size=16) as engine:
        yield engine


@pytest.fixture
async def client(live: InProcessEngine) -> AsyncIterator[InProcessClient]:
    async with client_for(live.url, api_key=API_KEY) as c:
        yield c


async def test_generate_is_exact_and_shaped_as_over_http(client: InProcessClient, bpe_qwen3: Path) -> None:
    outs = await asyncio.gather(*(client.generate(GenerateRequest(
        input_ids=PROMPT[: 10 + i], return_logprob=True,
        sampling_params=SamplingParams(max_new_tokens=8, temperature=1.0, ignore_eos=True, sampling_seed=i)))
        for i in range(4)))
    model = AutoModelForCausalLM.from_pretrained(str(bpe_qwen3), dtype=torch.float32).eval()
    for i, out in enumerate(outs):
        prompt = PROMPT[: 10 + i]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + out.output_ids])).logits[0, len(prompt) - 1: -1]
        ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(out.output_ids)[:, None]).squeeze(1)
        assert len(out.output_ids) == 8 and out.meta_info.finish_reason.type == "length"
        assert float((ref - torch.tensor(out.token_logprobs())).abs().max()) < 1e-4
    info = await client.model_info()
    assert info.weight_version == "0" and await client.health()


async def test_control_routes_need_the_key_and_bad_input_is_a_400(live: InProcessEngine,
                                                                  client: InProcessClient) -> None:
    async with client_for(live.url) as anonymous:
        with pytest.raises(EngineError) as denied:
            await anonymous.flush_cache()
        assert denied.value.status == 401
        assert (await anonymous.generate(GenerateRequest(input_ids=PROMPT, sampling_params=SamplingParams(
            max_new_tokens=2)))).output_ids  # generation stays open, as over HTTP
    with pytest.raises(EngineError) as bad:
        await client.generate(GenerateRequest(input_ids=[10 ** 9], sampling_params=SamplingParams(max_new_tokens=2)))
    assert bad.value.status == 400
    assert await client.health()  # still serving


async def test_a_caller_that_gives_up_aborts_its_request(live: InProcessEngine, client: InProcessClient) -> None:
    for _ in range(600):  # the earlier tests' requests leave the batch first (bounded: 60 s), so
        snap = live.engine.snapshot()  # a running request below is this one
        if not snap["num_running_reqs"] and not snap["num_waiting_reqs"]:
            break
        await asyncio.sleep(0.1)
    before = live.engine.stats.requests_aborted
    call = asyncio.create_task(client.generate(GenerateRequest(
        # 8000 tokens (the tiny model's context is 8192): seconds of decoding, so the request cannot
        # finish between the poll that sees it running and the abort (400 tokens sometimes did)
        input_ids=PROMPT, sampling_params=SamplingParams(max_new_tokens=8000, ignore_eos=True))))
    for _ in range(6000):  # until the engine decodes it (bounded: 60 s)
        if live.engine.snapshot()["num_running_reqs"]:
            break
        await asyncio.sleep(0.01)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    for _ in range(600):
        if live.engine.stats.requests_aborted > before and not live.engine.snapshot()["num_running_reqs"]:
            break
        await asyncio.sleep(0.1)
    assert live.engine.stats.requests_aborted == before + 1
    assert not live.engine.snapshot()["num_running_reqs"]


async def test_the_tensor_transport_reaches_it(live: InProcessEngine, client: InProcessClient,
                                               bpe_qwen3: Path, bpe_qwen3_seed1: Path) -> None:
    for path, version in ((bpe_qwen3_seed1, "v1"), (bpe_qwen3, "0")):
        target = dict(AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).state_dict())
        transport = TensorTransport(api_key=API_KEY, bucket_bytes=64 << 10)
        delivery = await transport.send(Snapshot(list(target.items())), version, [live.url])
        out = await probe(client)
        assert not delivery.failed and transport.modes == {live.url: "shm"}
        assert out.meta_info.weight_version == version
        assert max_diff(fresh_logprobs(path, out), out) < 1e-4


async def test_a_stopped_or_unknown_engine_is_unavailable(bpe_qwen3: Path) -> None:
    with pytest.raises(EngineUnavailable):
        client_for("http://in-process-engine-999999")
    engine = InProcessEngine(bpe_qwen3, max_batch_size=2)
    engine.start()
    client = engine_client(engine.url)
    assert isinstance(client, InProcessClient) and is_in_process_url(engine.url)
    router = await EngineRouter([engine.url], health_interval_s=60).start()
    try:
        assert [h.state for h in router.engines] == ["ready"]
        engine.stop()
        assert not await client.health()
        with pytest.raises(EngineUnavailable):
            await client.generate(GenerateRequest(input_ids=PROMPT, sampling_params=SamplingParams(max_new_tokens=2)))
    finally:
        await client.aclose()
        await router.close()


def test_other_urls_keep_the_http_client() -> None:
    client = engine_client("http://127.0.0.1:9")
    assert type(client) is EngineClient


def _config(*overrides: str, **extra: Any) -> Any:
    data: dict[str, Any] = {"model": {"path": "m"}, "data": {"envs": [{"id": "relax/SenseCount-v0"}]}, **extra}
    return config_from_dict(data, list(overrides))


def test_auto_placement_picks_in_process_only_where_it_fits() -> None:
    assert _config().engines_in_process  # colocate, one embedded engine
    assert not _config("engine.num_engines=2").engines_in_process
    assert not _config("engine.sync=distributed").engines_in_process
    assert not _config("mode=fully_async").engines_in_process
    assert not _config("engine.placement=process").engines_in_process
    assert _config("engine.num_engines=2", "engine.placement=in_process").engines_in_process
    assert not _config("engine.kind=external", "engine.urls=[http://127.0.0.1:30000]").engines_in_process


@pytest.mark.parametrize("overrides", [["mode=fully_async"], ["engine.sync=distributed"],
                                       ["engine.kind=external", "engine.urls=[http://127.0.0.1:30000]"]])
def test_in_process_placement_is_refused_where_it_cannot_run(overrides: list[str]) -> None:
    with pytest.raises(ValueError, match="placement 'in_process'"):
        _config("engine.placement=in_process", *overrides)
