"""/generate on a tiny Qwen3 through a real embedded-engine server on 127.0.0.1.

The served model is the tiny-BPE Qwen3 taught one tool call (see conftest); for everything
here it is just a small causal LM.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from relax_gym.trainer.engines.launch import EmbeddedEngineProcess
from transformers import AutoModelForCausalLM

from relax_gym.protocol import (
    EngineClient,
    EngineError,
    GenerateRequest,
    GenerateResponse,
    SamplingParams,
)

from .conftest import (
    API_KEY,
    chat_prompt_ids,
    load_tokenizer,
    server_info,
    wait_for_tokens,
)


def req(ids: list[int], n: int = 16, **sampling: object) -> GenerateRequest:
    return GenerateRequest(
        input_ids=ids, return_logprob=True, sampling_params=SamplingParams(max_new_tokens=n, **sampling)
    )


@pytest.fixture(scope="module")
def tok(scripted_qwen3: Path) -> Any:
    return load_tokenizer(scripted_qwen3)


@pytest.fixture(scope="module")
def ids(tok: Any) -> list[int]:
    return chat_prompt_ids(tok, [{"role": "user", "content": "How many red circles are there?"}])


async def test_generate_returns_tokens_logprobs_and_meta(
    text_engine: EmbeddedEngineProcess, ids: list[int], scripted_qwen3: Path
) -> None:
    async with EngineClient(text_engine.url) as client:
        out = await client.generate(req(ids, 12, ignore_eos=True, sampling_seed=3))
        info = await client.model_info()
    assert out.finish_type == "length" and out.meta_info.finish_reason.length == 12
    assert len(out.token_ids()) == 12 == out.meta_info.completion_tokens == len(out.token_logprobs())
    assert [t[1] for t in out.meta_info.output_token_logprobs] == out.output_ids
    assert all(lp <= 0.0 for lp in out.token_logprobs())
    assert out.meta_info.prompt_tokens == len(ids)
    assert out.meta_info.weight_version == "default" == info.weight_version
    assert info.model_path == str(scripted_qwen3)


async def test_text_prompt_matches_input_ids(text_engine: EmbeddedEngineProcess, tok: Any) -> None:
    text = "The answer is"
    async with EngineClient(text_engine.url) as client:
        a = await client.generate(
            GenerateRequest(text=text, sampling_params=SamplingParams(max_new_tokens=6, sampling_seed=9))
        )
        b = await client.generate(
            GenerateRequest(
                input_ids=tok(text)["input_ids"], sampling_params=SamplingParams(max_new_tokens=6, sampling_seed=9)
            )
        )
    assert a.output_ids == b.output_ids and a.text == b.text
    assert a.text == tok.decode(a.output_ids, skip_special_tokens=True)


async def test_logprobs_match_fresh_forward_pass(
    text_engine: EmbeddedEngineProcess, ids: list[int], scripted_qwen3: Path
) -> None:
    """The train/rollout mismatch: engine logprobs (batched, KV-cached) vs one fresh forward."""
    base = ids
    prompts = [base, base[:7], base + [100, 200, 300], base[3:]]
    temps = [1.0, 0.7, 1.0, 1.3]
    async with EngineClient(text_engine.url) as client:
        outs = await asyncio.gather(
            *(
                client.generate(req(p, 24, temperature=t, ignore_eos=True, sampling_seed=i))
                for i, (p, t) in enumerate(zip(prompts, temps, strict=True))
            )
        )
    model = AutoModelForCausalLM.from_pretrained(str(scripted_qwen3), dtype=torch.float32).eval()
    worst = 0.0
    for p, t, out in zip(prompts, temps, outs, strict=True):
        full = torch.tensor([p + out.output_ids])
        with torch.no_grad():
            logits = model(full).logits[0, len(p) - 1 : -1]
        ref = torch.log_softmax(logits / t, dim=-1).gather(1, torch.tensor(out.output_ids)[:, None]).squeeze(1)
        worst = max(worst, float((ref - torch.tensor(out.token_logprobs())).abs().max()))
    print(f"max |engine - fresh forward| logprob diff: {worst:.3e}")
    assert worst < 1e-4


async def test_sampling_seed_is_independent_of_batch(text_engine: EmbeddedEngineProcess, ids: list[int]) -> None:
    async with EngineClient(text_engine.url) as client:
        alone = await client.generate(req(ids, 20, sampling_seed=1234, ignore_eos=True))
        crowd = await asyncio.gather(
            client.generate(req(ids, 20, sampling_seed=1234, ignore_eos=True)),
            *(client.generate(req(ids[: 5 + i], 30, sampling_seed=i, ignore_eos=True)) for i in range(6)),
        )
        other_seed = await client.generate(req(ids, 20, sampling_seed=4321, ignore_eos=True))
    assert crowd[0].output_ids == alone.output_ids
    assert other_seed.output_ids != alone.output_ids


async def test_concurrent_requests_share_decode_steps(text_engine: EmbeddedEngineProcess, ids: list[int]) -> None:
    before = await server_info(text_engine.url)
    async with EngineClient(text_engine.url) as client:
        outs = await asyncio.gather(*(client.generate(req(ids[: 4 + i], 24, ignore_eos=True)) for i in range(8)))
    after = await server_info(text_engine.url)
    assert all(o.meta_info.completion_tokens == 24 for o in outs)
    steps = after["decode_steps"] - before["decode_steps"]
    # 8 x 24 tokens; one request at a time would need 8 * 23 decode steps.
    assert after["max_running_reqs"] >= 4
    assert steps < 8 * 23 / 2, steps


async def test_stop_token_ids_and_stop_strings(text_engine: EmbeddedEngineProcess, tok: Any, ids: list[int]) -> None:
    async with EngineClient(text_engine.url) as client:
        # A fixed seed replays the same tokens, so a stop condition taken from them must fire there.
        seeded = await client.generate(req(ids, 16, sampling_seed=5, ignore_eos=True))
        third = seeded.output_ids[2]
        by_id = await client.generate(req(ids, 16, sampling_seed=5, stop_token_ids=[third]))
        pieces = [tok.decode([t]) for t in seeded.output_ids]
        k = next(
            i
            for i in range(1, 16)
            if pieces[i].strip() and pieces[i].isascii() and pieces[i] not in "".join(pieces[:i])
        )
        by_str = await client.generate(req(ids, 16, sampling_seed=5, stop=[pieces[k]]))
    assert third not in seeded.output_ids[:2]
    assert by_id.output_ids == seeded.output_ids[:3]
    assert by_id.meta_info.finish_reason.type == "stop" and by_id.meta_info.finish_reason.matched == third
    assert by_str.meta_info.finish_reason.type == "stop" and by_str.meta_info.finish_reason.matched == pieces[k]
    assert by_str.output_ids == seeded.output_ids[: k + 1]
    assert pieces[k] not in by_str.text  # trimmed, as SGLang does without no_stop_trim


async def test_abort_returns_partial_tokens(text_engine: EmbeddedEngineProcess, ids: list[int]) -> None:
    async with EngineClient(text_engine.url, api_key=API_KEY) as client:
        task = asyncio.create_task(
            client.generate(
                GenerateRequest(
                    input_ids=ids,
                    rid="long-one",
                    return_logprob=True,
                    sampling_params=SamplingParams(max_new_tokens=3000, ignore_eos=True),
                )
            )
        )
        await wait_for_tokens(text_engine.url, 5)
        await client.abort("long-one")
        out = await asyncio.wait_for(task, 30)
    assert out.finish_type == "abort"
    assert 0 < len(out.output_ids) < 3000
    assert len(out.token_logprobs()) == len(out.output_ids) == out.meta_info.completion_tokens


async def test_pause_in_place_holds_and_continue_resumes(text_engine: EmbeddedEngineProcess, ids: list[int]) -> None:
    async with EngineClient(text_engine.url, api_key=API_KEY) as client:
        greedy = await client.generate(req(ids, 150, temperature=0.0, ignore_eos=True))
        tasks = [
            asyncio.create_task(client.generate(req(ids, 150, temperature=0.0, ignore_eos=True))) for _ in range(2)
        ]
        await wait_for_tokens(text_engine.url, 4)
        await client.pause_generation("in_place")
        held = (await server_info(text_engine.url))["generated_tokens"]
        await asyncio.sleep(0.4)
        assert (await server_info(text_engine.url))["generated_tokens"] == held
        assert not any(t.done() for t in tasks)
        await client.continue_generation()
        outs = await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert all(o.output_ids == greedy.output_ids and o.finish_type == "length" for o in outs)


async def test_pause_retract_reprefills_and_matches(text_engine: EmbeddedEngineProcess, ids: list[int]) -> None:
    async with EngineClient(text_engine.url, api_key=API_KEY) as client:
        greedy = await client.generate(req(ids, 150, temperature=0.0, ignore_eos=True))
        task = asyncio.create_task(client.generate(req(ids, 150, temperature=0.0, ignore_eos=True)))
        await wait_for_tokens(text_engine.url, 5)
        await client.pause_generation("retract")
        assert (await server_info(text_engine.url))["num_paused_reqs"] == 1
        await client.continue_generation()
        out = await asyncio.wait_for(task, 60)
    assert out.output_ids == greedy.output_ids
    assert max(abs(a - b) for a, b in zip(out.token_logprobs(), greedy.token_logprobs(), strict=True)) < 1e-4


async def test_pause_abort_aborts_and_new_requests_wait(text_engine: EmbeddedEngineProcess, ids: list[int]) -> None:
    async with EngineClient(text_engine.url, api_key=API_KEY) as client:
        running = asyncio.create_task(client.generate(req(ids, 3000, ignore_eos=True)))
        await wait_for_tokens(text_engine.url, 3)
        await client.pause_generation("abort")
        aborted = await asyncio.wait_for(running, 30)
        late = asyncio.create_task(client.generate(req(ids, 4)))
        await asyncio.sleep(0.4)
        assert not late.done()  # waits for /continue_generation
        await client.continue_generation()
        done = await asyncio.wait_for(late, 30)
    assert aborted.finish_type == "abort" and len(aborted.output_ids) > 0
    assert done.meta_info.completion_tokens > 0 and done.finish_type != "abort"


async def test_abort_all(text_engine: EmbeddedEngineProcess, ids: list[int]) -> None:
    async with EngineClient(text_engine.url, api_key=API_KEY) as client:
        tasks = [asyncio.create_task(client.generate(req(ids, 3000, ignore_eos=True))) for _ in range(3)]
        await wait_for_tokens(text_engine.url, 6)
        await client.abort()
        outs = await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert [o.finish_type for o in outs] == ["abort"] * 3


async def test_control_routes_need_the_token(text_engine: EmbeddedEngineProcess, scripted_qwen3: Path) -> None:
    url = text_engine.url
    control = [
        ("/pause_generation", {"mode": "in_place"}),
        ("/continue_generation", {}),
        ("/abort_request", {"abort_all": True}),
        ("/flush_cache", {}),
        ("/update_weights_from_disk", {"model_path": str(scripted_qwen3)}),
        ("/update_weights_from_tensor", {"serialized_named_tensors": ["x"]}),
        (
            "/init_weights_update_group",
            {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2},
        ),
    ]
    async with httpx.AsyncClient(base_url=url) as http:
        for path, body in control:
            assert (await http.post(path, json=body)).status_code == 401, path
            bad = await http.post(path, json=body, headers={"Authorization": "Bearer wrong"})
            assert bad.status_code == 401, path
        assert (await http.get("/health")).status_code == 200
        ok = await http.post("/flush_cache", headers={"Authorization": f"Bearer {API_KEY}"})
        assert ok.status_code == 200
        assert (await http.get("/get_server_info")).json()["unauthorized_requests"] >= 2 * len(control)
    async with EngineClient(url) as client:  # generation is open unless --protect-generation
        assert (await client.generate(req([1, 2, 3], 2))).meta_info.completion_tokens == 2


@pytest.mark.parametrize(
    "body, fragment",
    [
        (b"{not json", "malformed JSON"),
        ({"text": "hi", "input_ids": [1, 2]}, "exactly one"),
        ({"input_ids": [1, 2, 10_000_000]}, "outside the vocabulary"),
        ({"input_ids": [-1, 2]}, "outside the vocabulary"),
        ({"input_ids": []}, "empty"),
        ({"input_ids": [1, 2], "image_data": ["aGVsbG8="]}, "no vision encoder"),
        ({"input_ids": [1, 2], "sampling_params": {"temperature": -1}}, "temperature"),
        ({"input_ids": [1, 2], "sampling_params": {"top_k": 0}}, "top_k"),
        ({"input_ids": [1, 2], "sampling_params": {"frequency_penalty": 0.5}}, "not supported"),
        ({"input_ids": [1, 2], "sampling_params": {"stop_token_ids": [10_000_000]}}, "stop_token_ids"),
        ({"input_ids": [1, 2], "audio_data": ["x"]}, "audio_data"),
        ([1, 2, 3], "JSON object"),
    ],
)
async def test_bad_generate_input_is_a_clear_400(
    text_engine: EmbeddedEngineProcess, body: object, fragment: str
) -> None:
    async with httpx.AsyncClient(base_url=text_engine.url) as http:
        if isinstance(body, bytes):
            resp = await http.post("/generate", content=body, headers={"content-type": "application/json"})
        else:
            resp = await http.post("/generate", json=body)
        assert resp.status_code == 400, resp.text
        assert fragment in resp.json()["error"]["message"]
        ok = await http.post("/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}})
        assert ok.status_code == 200 and GenerateResponse.model_validate(ok.json()).meta_info.completion_tokens == 2


async def test_client_error_types(text_engine: EmbeddedEngineProcess) -> None:
    async with EngineClient(text_engine.url) as client:
        with pytest.raises(EngineError) as info:
            await client.generate(GenerateRequest(input_ids=[10_000_000]))
        assert info.value.status == 400
        assert await client.health()


async def test_next_turn_reuses_the_cached_prefix(
    text_engine: EmbeddedEngineProcess, ids: list[int], scripted_qwen3: Path
) -> None:
    """A multi-turn prompt (previous prompt + answer + new tokens) prefills only the new part."""
    first_prompt = ids + [7, 8, 9, 10]
    async with EngineClient(text_engine.url) as client:
        first = await client.generate(req(first_prompt, 12, ignore_eos=True, sampling_seed=1))
        turn2 = first_prompt + first.output_ids + [11, 12, 13]
        second = await client.generate(req(turn2, 10, ignore_eos=True, sampling_seed=2))
    # The engine cached every token it fed: the prompt and all but the last sampled token.
    assert second.meta_info.cached_tokens == len(first_prompt) + len(first.output_ids) - 1
    model = AutoModelForCausalLM.from_pretrained(str(scripted_qwen3), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([turn2 + second.output_ids])).logits[0, len(turn2) - 1 : -1]
    ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(second.output_ids)[:, None]).squeeze(1)
    assert float((ref - torch.tensor(second.token_logprobs())).abs().max()) < 1e-4


async def test_client_disconnect_aborts_the_request(text_engine: EmbeddedEngineProcess, ids: list[int]) -> None:
    before = await server_info(text_engine.url)
    async with httpx.AsyncClient(base_url=text_engine.url, timeout=60) as http:
        task = asyncio.create_task(
            http.post(
                "/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
            )
        )
        await wait_for_tokens(text_engine.url, 5)
        task.cancel()  # the client goes away mid-generation
        with pytest.raises(asyncio.CancelledError):
            await task
    deadline = asyncio.get_running_loop().time() + 20
    while True:
        info = await server_info(text_engine.url)
        if info["num_running_reqs"] == 0 and info["requests_aborted"] > before["requests_aborted"]:
            break
        assert asyncio.get_running_loop().time() < deadline, info
        await asyncio.sleep(0.1)
    assert info["generated_tokens"] - before["generated_tokens"] < 3000


async def test_input_token_logprobs_for_scoring(
    text_engine: EmbeddedEngineProcess, ids: list[int], scripted_qwen3: Path
) -> None:
    """``logprob_start_len`` + ``max_new_tokens=0`` scores a prompt (as a judge or scorer would)."""
    async with EngineClient(text_engine.url) as client:
        out = await client.generate(
            GenerateRequest(
                input_ids=ids,
                return_logprob=True,
                logprob_start_len=0,
                sampling_params=SamplingParams(max_new_tokens=0),
            )
        )
    triples = out.meta_info.input_token_logprobs or []
    assert out.output_ids == [] and out.finish_type == "length"
    assert [t[1] for t in triples] == ids and triples[0][0] is None
    model = AutoModelForCausalLM.from_pretrained(str(scripted_qwen3), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1], -1).gather(1, torch.tensor(ids[1:])[:, None])
    assert float((ref.squeeze(1) - torch.tensor([t[0] for t in triples[1:]])).abs().max()) < 1e-4

    # SGLang: from any start the first entry is None (token `start` is not scored), so a
    # scorer that wants token k asks from k - 1; -1 means none of the prompt
    async with EngineClient(text_engine.url) as client:
        mid = await client.generate(GenerateRequest(input_ids=ids, return_logprob=True, logprob_start_len=3,
                                                    return_text_in_logprobs=True,
                                                    sampling_params=SamplingParams(max_new_tokens=0)))
        none = await client.generate(GenerateRequest(input_ids=ids, return_logprob=True,
                                                     sampling_params=SamplingParams(max_new_tokens=1)))
        with pytest.raises(EngineError, match="logprob_start_len"):
            await client.generate(GenerateRequest(input_ids=ids, return_logprob=True, logprob_start_len=len(ids) + 1,
                                                  sampling_params=SamplingParams(max_new_tokens=0)))
    part = mid.meta_info.input_token_logprobs or []
    assert [t[1] for t in part] == ids[3:] and part[0][0] is None
    assert [t[0] for t in part[1:]] == pytest.approx([t[0] for t in triples[4:]], abs=1e-5)
    assert all(isinstance(t[2], str) for t in part)  # return_text_in_logprobs
    assert none.meta_info.input_token_logprobs == []
