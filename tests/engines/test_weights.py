"""Weight updates on a live engine: from disk, in memory (safetensors), and over a gloo group.

The sending side is the trainer's (``relax_gym.trainer.weights`` transports); these tests check
what the engine receives."""

from __future__ import annotations

import asyncio
from typing import Any
import base64
import socket
from pathlib import Path

import httpx
import pytest
import torch
from relax_gym.trainer.engines.launch import EmbeddedEngineProcess
from relax_gym.trainer.config import DistributedSyncConfig
from relax_gym.trainer.engines.weight_receiver import UpdateWeightsFromTensorRequest, encode_named_tensors
from relax_gym.trainer.weights.broadcast import BroadcastTransport
from relax_gym.trainer.weights.tensor import TensorTransport
from relax_gym.trainer.weights.transport import Snapshot
from transformers import AutoModelForCausalLM

from relax_gym.protocol import (
    EngineClient,
    EngineError,
    GenerateRequest,
    GenerateResponse,
    SamplingParams,
    UpdateWeightsFromDiskRequest,
)

from .conftest import API_KEY, wait_for_tokens

PROMPT = list(range(40, 60))


def state_of(path: Path) -> dict[str, torch.Tensor]:
    return dict(AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).state_dict())


async def probe(client: EngineClient, n: int = 12) -> GenerateResponse:
    return await client.generate(
        GenerateRequest(
            input_ids=PROMPT,
            return_logprob=True,
            sampling_params=SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True),
        )
    )


def fresh_logprobs(path: Path, out: GenerateResponse) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + out.output_ids])).logits[0, len(PROMPT) - 1 : -1]
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(out.output_ids)[:, None]).squeeze(1)


def max_diff(ref: torch.Tensor, out: GenerateResponse) -> float:
    return float((ref - torch.tensor(out.token_logprobs())).abs().max())


async def restore(client: EngineClient, path: Path) -> None:
    await client.update_weights_from_disk(UpdateWeightsFromDiskRequest(model_path=str(path), weight_version="default"))


async def test_update_from_disk_changes_outputs_and_version(
    engine: EmbeddedEngineProcess, scripted_qwen3: Path, bpe_qwen3_seed1: Path
) -> None:
    async with EngineClient(engine.url, api_key=API_KEY) as client:
        before = await probe(client)
        reply = await client.update_weights_from_disk(
            UpdateWeightsFromDiskRequest(model_path=str(bpe_qwen3_seed1), weight_version="v1")
        )
        after = await probe(client)
        info = await client.model_info()
        await restore(client, scripted_qwen3)
        back = await probe(client)
    assert reply.success and "v1" in reply.message
    assert info.weight_version == "v1" == after.meta_info.weight_version
    assert after.token_logprobs() != before.token_logprobs()
    assert max_diff(fresh_logprobs(bpe_qwen3_seed1, after), after) < 1e-4
    assert back.output_ids == before.output_ids and back.meta_info.weight_version == "default"


async def test_update_waits_for_running_requests_or_aborts_them(
    engine: EmbeddedEngineProcess, scripted_qwen3: Path, bpe_qwen3_seed1: Path
) -> None:
    long = GenerateRequest(input_ids=PROMPT, sampling_params=SamplingParams(max_new_tokens=400, ignore_eos=True))
    async with EngineClient(engine.url, api_key=API_KEY) as client:
        v0 = (await client.model_info()).weight_version
        running = asyncio.create_task(client.generate(long))
        await wait_for_tokens(engine.url, 5)
        update = asyncio.create_task(
            client.update_weights_from_disk(
                UpdateWeightsFromDiskRequest(model_path=str(bpe_qwen3_seed1), weight_version="drained")
            )
        )
        finished = await asyncio.wait_for(running, 60)
        await asyncio.wait_for(update, 60)
        # The update waited for the request, which drained on the old weights.
        assert finished.finish_type == "length"
        spans = finished.meta_info.weight_versions or []
        assert [(s.version, s.start, s.end) for s in spans] == [(v0, 0, 400)]

        running = asyncio.create_task(client.generate(long.model_copy(update={"rid": "to-abort"})))
        await wait_for_tokens(engine.url, 5)
        await client.update_weights_from_disk(
            UpdateWeightsFromDiskRequest(
                model_path=str(scripted_qwen3), weight_version="default", abort_all_requests=True
            )
        )
        aborted = await asyncio.wait_for(running, 60)
    assert aborted.finish_type == "abort" and len(aborted.output_ids) < 400


async def test_update_while_paused_in_place_mixes_versions(
    engine: EmbeddedEngineProcess, scripted_qwen3: Path, bpe_qwen3_seed1: Path
) -> None:
    async with EngineClient(engine.url, api_key=API_KEY) as client:
        v0 = (await client.model_info()).weight_version
        task = asyncio.create_task(
            client.generate(
                GenerateRequest(input_ids=PROMPT, sampling_params=SamplingParams(max_new_tokens=400, ignore_eos=True))
            )
        )
        await wait_for_tokens(engine.url, 5)
        await client.pause_generation("in_place")
        reply = await client.update_weights_from_disk(
            UpdateWeightsFromDiskRequest(model_path=str(bpe_qwen3_seed1), weight_version="mid")
        )
        await client.continue_generation()
        out = await asyncio.wait_for(task, 60)
        await restore(client, scripted_qwen3)
    assert reply.num_paused_requests == 1
    spans = out.meta_info.weight_versions or []  # SGLang's spans [start, end) over output_ids
    assert [s.version for s in spans] == [v0, "mid"]
    assert spans[0].start == 0 and spans[0].end == spans[1].start and spans[1].end == 400
    assert out.meta_info.weight_version == "mid"
    cut = spans[0].end
    assert out.meta_info.token_versions(400) == [v0] * cut + ["mid"] * (400 - cut)


async def test_failed_updates_leave_weights_untouched(engine: EmbeddedEngineProcess, tmp_path: Path) -> None:
    async with EngineClient(engine.url, api_key=API_KEY) as client:
        before = await probe(client)
        with pytest.raises(EngineError) as info:
            await client.update_weights_from_disk(UpdateWeightsFromDiskRequest(model_path=str(tmp_path / "nope")))
        assert info.value.status == 400 and "not a model folder" in str(info.value)
        async with httpx.AsyncClient(base_url=engine.url, headers={"Authorization": f"Bearer {API_KEY}"}) as http:
            bad_items = [
                (
                    UpdateWeightsFromTensorRequest(
                        serialized_named_tensors=[
                            encode_named_tensors([("model.layers.0.mlp.up_proj.weight", torch.zeros(3, 3))])
                        ]
                    ),
                    "shape",
                ),
                (
                    UpdateWeightsFromTensorRequest(
                        serialized_named_tensors=[encode_named_tensors([("no.such.weight", torch.zeros(3))])]
                    ),
                    "unknown parameter",
                ),
                (UpdateWeightsFromTensorRequest(serialized_named_tensors=["!!notbase64"]), "base64"),
                (
                    UpdateWeightsFromTensorRequest(serialized_named_tensors=[base64.b64encode(b"junk").decode()]),
                    "safetensors",
                ),
                (
                    UpdateWeightsFromTensorRequest(serialized_named_tensors=["eA=="], load_format="direct"),
                    "never unpickles",
                ),
                # SGLang's default form: no load_format at all (pickled items, one per TP rank)
                ({"serialized_named_tensors": ["eA=="]}, "load_format None is not accepted"),
            ]
            for body, fragment in bad_items:
                payload = body if isinstance(body, dict) else body.model_dump(exclude_none=True)
                resp = await http.post("/update_weights_from_tensor", json=payload)
                assert resp.status_code == 400, resp.text
                assert fragment in resp.text, (fragment, resp.text)
        after = await probe(client)
        info2 = await client.model_info()
    assert after.output_ids == before.output_ids
    # Equal up to float noise (the second probe may reuse cached prefix KV).
    assert max(abs(a - b) for a, b in zip(after.token_logprobs(), before.token_logprobs(), strict=True)) < 1e-5
    assert info2.weight_version == before.meta_info.weight_version


async def test_update_from_tensor_in_buckets(
    engine: EmbeddedEngineProcess, scripted_qwen3: Path, bpe_qwen3_seed1: Path
) -> None:
    target = state_of(bpe_qwen3_seed1)
    async with EngineClient(engine.url, api_key=API_KEY) as client:
        delivery = await TensorTransport(api_key=API_KEY, bucket_bytes=64 << 10).send(
            Snapshot(list(target.items())), "mem-1", [engine.url]
        )
        out = await probe(client)
        await restore(client, scripted_qwen3)
    assert delivery.buckets > 2 and not delivery.failed
    assert out.meta_info.weight_version == "mem-1"
    assert max_diff(fresh_logprobs(bpe_qwen3_seed1, out), out) < 1e-4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_update_over_a_gloo_group(
    engine: EmbeddedEngineProcess, scripted_qwen3: Path, bpe_qwen3_seed1: Path
) -> None:
    """This process is rank 0 (the trainer); the engine process joins as rank 1."""
    target = state_of(bpe_qwen3_seed1)
    sender = BroadcastTransport(DistributedSyncConfig(master_port=free_port(), timeout_s=60), api_key=API_KEY,
                                bucket_bytes=128 << 10)
    await sender.ensure_group([engine.url])
    try:
        async with httpx.AsyncClient() as http:
            groups = (await http.get(f"{engine.url}/get_server_info")).json()["weight_update_groups"]
            assert len(groups) == 1 and groups[0].startswith("relax_weights_")
        sent = (await sender.send(Snapshot(list(target.items())), "dist-1", [engine.url])).buckets
        async with EngineClient(engine.url, api_key=API_KEY) as client:
            out = await probe(client)
            info = await client.model_info()
    finally:
        await sender.close()
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"{engine.url}/get_server_info")).json()["weight_update_groups"] == []
    async with EngineClient(engine.url, api_key=API_KEY) as client:
        await restore(client, scripted_qwen3)
    assert sent >= 2 and info.weight_version == "dist-1"
    assert max_diff(fresh_logprobs(bpe_qwen3_seed1, out), out) < 1e-4


async def test_distributed_requests_are_validated(engine: EmbeddedEngineProcess) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(base_url=engine.url, headers=headers) as http:
        no_group = await http.post(
            "/update_weights_from_distributed",
            json={"names": ["x"], "dtypes": ["float32"], "shapes": [[1]], "group_name": "missing"},
        )
        assert no_group.status_code == 400 and "no weight update group" in no_group.text
        mismatch = await http.post(
            "/update_weights_from_distributed", json={"names": ["x", "y"], "dtypes": ["float32"], "shapes": [[1]]}
        )
        assert mismatch.status_code == 400 and "differ in length" in mismatch.text
        bad_dtype = await http.post(
            "/update_weights_from_distributed", json={"names": ["x"], "dtypes": ["float99"], "shapes": [[1]]}
        )
        assert bad_dtype.status_code == 400 and "unknown dtype" in bad_dtype.text
        nccl = await http.post(
            "/init_weights_update_group",
            json={"master_address": "127.0.0.1", "master_port": free_port(), "rank_offset": 1, "world_size": 2},
        )
        assert nccl.status_code == 400 and "gloo" in nccl.text


def test_safetensors_items_round_trip_tied_weights() -> None:
    from relax_gym.trainer.backends.base import buckets
    from relax_gym.trainer.engines.weight_receiver import decode_named_tensors

    shared = torch.randn(4, 3)
    named = [("model.embed_tokens.weight", shared), ("lm_head.weight", shared), ("b", torch.arange(5))]
    back = dict(decode_named_tensors(encode_named_tensors(named)))
    assert torch.equal(back["lm_head.weight"], shared) and torch.equal(back["model.embed_tokens.weight"], shared)
    assert torch.equal(back["b"], torch.arange(5))
    # The tied tensor travels once; a view that merely overlaps is copied.
    single = len(encode_named_tensors([("a", torch.randn(64, 64))]))
    big = torch.randn(64, 64)
    assert len(encode_named_tensors([("a", big), ("b", big)])) < 1.1 * single
    overlap = dict(decode_named_tensors(encode_named_tensors([("a", big), ("b", big[1:])])))
    assert torch.equal(overlap["b"], big[1:])
    sizes = [len(b) for b in buckets(named, bucket_bytes=60)]
    assert sizes == [1, 1, 1] and sum(len(b) for b in buckets(named, 1 << 20)) == 3


class _TwoRankEngine:
    """A stand-in for an SGLang engine with TP = 2: ``/server_info`` says ``tp_size: 2``, and
    ``/init_weights_update_group`` joins two ranks (``rank_offset`` and ``rank_offset + 1``),
    each receiving every broadcast, as SGLang's TP workers do."""

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.received: list[list[torch.Tensor]] = [[], []]
        self.joined: list[tuple[int, int]] = []

    def app(self) -> Any:
        from aiohttp import web

        from relax_gym.trainer.engines.weight_receiver import broadcast, new_process_group, parse_dtype

        async def info(request: web.Request) -> web.Response:
            return web.json_response({"tp_size": 2, "version": "0.5.23"})

        async def init(request: web.Request) -> web.Response:
            body = await request.json()
            self.joined.append((body["rank_offset"], body["world_size"]))

            def join(tp_rank: int) -> Any:
                return new_process_group(body["master_address"], body["master_port"], body["rank_offset"] + tp_rank,
                                         body["world_size"], group_name=body["group_name"], timeout_s=60)

            self.handles = list(await asyncio.gather(*(asyncio.to_thread(join, r) for r in range(2))))
            return web.json_response({"success": True, "message": "joined"})

        async def update(request: web.Request) -> web.Response:
            body = await request.json()

            def receive(tp_rank: int) -> list[torch.Tensor]:
                got = [torch.empty(s, dtype=parse_dtype(d)) for s, d in zip(body["shapes"], body["dtypes"], strict=True)]
                broadcast(self.handles[tp_rank], got, 0)
                return got

            for r, got in enumerate(await asyncio.gather(*(asyncio.to_thread(receive, r) for r in range(2)))):
                self.received[r].extend(got)
            return web.json_response({"success": True, "message": "ok"})

        async def destroy(request: web.Request) -> web.Response:
            self.handles = []
            return web.json_response({"success": True, "message": "destroyed"})

        app = web.Application(client_max_size=1 << 30)
        app.add_routes([web.get("/server_info", info), web.post("/init_weights_update_group", init),
                        web.post("/update_weights_from_distributed", update),
                        web.post("/destroy_weights_update_group", destroy)])
        return app


async def test_group_with_an_engine_of_tp2_and_the_embedded_engine(
    engine: EmbeddedEngineProcess, scripted_qwen3: Path, bpe_qwen3_seed1: Path
) -> None:
    """World = 1 (trainer) + 1 (embedded, tp 1) + 2 (the TP=2 engine): ranks read from /server_info."""
    from aiohttp import web

    target = state_of(bpe_qwen3_seed1)
    stand_in = _TwoRankEngine()
    runner = web.AppRunner(stand_in.app())
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    tp2 = f"http://127.0.0.1:{port}"
    sender = BroadcastTransport(DistributedSyncConfig(timeout_s=60), api_key=API_KEY, bucket_bytes=256 << 10)
    try:
        sent = await sender.send(Snapshot(list(target.items())), "dist-tp", sorted([engine.url, tp2]))
        async with EngineClient(engine.url, api_key=API_KEY) as client:
            info = await client.model_info()
    finally:
        await sender.close()
        await runner.cleanup()
        async with EngineClient(engine.url, api_key=API_KEY) as client:
            await restore(client, scripted_qwen3)
    (offset, world), = stand_in.joined
    assert world == 4 and offset in (1, 2)  # after or before the embedded engine's one rank
    assert sent.buckets >= 2 and info.weight_version == "dist-tp"
    for rank_tensors in stand_in.received:  # both TP ranks got every tensor, exactly
        assert len(rank_tensors) == len(target)
        assert all(torch.equal(a, b) for a, b in zip(rank_tensors, target.values(), strict=True))
