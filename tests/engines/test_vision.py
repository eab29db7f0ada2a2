"""Qwen3-VL through the embedded engine: images on /generate and /v1/chat/completions.

The model uses the real Qwen3 tokenizer, so this module also runs the real 151k vocabulary and
the Qwen3-VL chat template through the server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from relax_gym.trainer.engines.launch import EmbeddedEngineProcess
from relax_gym.trainer.models import (
    VisionTokens,
    image_token_count,
    load_image_processor,
    prepare_vision_inputs,
)
from transformers import AutoConfig

from relax_gym.protocol import (
    ChatCompletionRequest,
    EngineClient,
    GenerateRequest,
    SamplingParams,
)

from .conftest import (
    chat_prompt_ids,
    image_b64,
    load_tokenizer,
    random_image,
    start_engine,
)


@pytest.fixture(scope="module")
def vl_engine(tiny_qwen3_vl: Path) -> Iterator[EmbeddedEngineProcess]:
    engine = start_engine(tiny_qwen3_vl)
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def tok(tiny_qwen3_vl: Path) -> Any:
    return load_tokenizer(tiny_qwen3_vl)


def image_prompt(tok: Any, n_images: int, text: str = "How many shapes?") -> list[int]:
    content: list[dict[str, Any]] = [{"type": "image"} for _ in range(n_images)] + [{"type": "text", "text": text}]
    return chat_prompt_ids(tok, [{"role": "user", "content": content}])


def vl_request(ids: list[int], images: list[str], n: int = 10, **sampling: Any) -> GenerateRequest:
    return GenerateRequest(
        input_ids=ids,
        image_data=images,
        return_logprob=True,
        sampling_params=SamplingParams(max_new_tokens=n, ignore_eos=True, **sampling),
    )


async def test_image_generation_logprobs_match_fresh_forward(
    vl_engine: EmbeddedEngineProcess, tiny_qwen3_vl: Path, tok: Any
) -> None:
    from transformers import AutoModelForImageTextToText

    images = [random_image(1, (64, 48)), random_image(2, (40, 72))]
    ids_one, ids_two = image_prompt(tok, 1), image_prompt(tok, 2, "Compare them.")
    async with EngineClient(vl_engine.url) as client:
        outs = await asyncio.gather(
            client.generate(vl_request(ids_one, [image_b64(images[0])], sampling_seed=1)),
            client.generate(vl_request(ids_two, [image_b64(im) for im in images], temperature=0.8, sampling_seed=2)),
            client.generate(vl_request(chat_prompt_ids(tok, [{"role": "user", "content": "Text only."}]), [])),
        )
    processor = load_image_processor(tiny_qwen3_vl)
    model = AutoModelForImageTextToText.from_pretrained(str(tiny_qwen3_vl), dtype=torch.float32).eval()
    vt = VisionTokens.from_config(model.config)
    worst = 0.0
    cases = [
        (ids_one, images[:1], 1.0),
        (ids_two, images, 0.8),
        (chat_prompt_ids(tok, [{"role": "user", "content": "Text only."}]), [], 1.0),
    ]
    for (ids, imgs, temp), out in zip(cases, outs, strict=True):
        vi = prepare_vision_inputs(ids, imgs, processor, vt)
        assert out.meta_info.prompt_tokens == len(vi.input_ids)
        full = vi.input_ids + out.output_ids
        kwargs: dict[str, Any] = {
            "input_ids": torch.tensor([full]),
            "mm_token_type_ids": torch.tensor([vi.mm_token_type_ids + [0] * len(out.output_ids)]),
        }
        if imgs:
            kwargs.update(pixel_values=vi.pixel_values, image_grid_thw=vi.image_grid_thw)
        model.model.rope_deltas = None
        with torch.no_grad():
            logits = model(**kwargs).logits[0, len(vi.input_ids) - 1 : -1]
        ref = torch.log_softmax(logits / temp, -1).gather(1, torch.tensor(out.output_ids)[:, None]).squeeze(1)
        worst = max(worst, float((ref - torch.tensor(out.token_logprobs())).abs().max()))
    print(f"Qwen3-VL max |engine - fresh forward| logprob diff: {worst:.3e}")
    assert worst < 1e-4
    grid = processor(images=[images[0]], return_tensors="pt")["image_grid_thw"][0]
    assert outs[0].meta_info.prompt_tokens == len(ids_one) - 1 + image_token_count(grid, vt.merge_size)


async def test_expanded_and_single_placeholder_prompts_agree(
    vl_engine: EmbeddedEngineProcess, tiny_qwen3_vl: Path, tok: Any
) -> None:
    image = random_image(5)
    ids = image_prompt(tok, 1)
    tokens = VisionTokens.from_config(AutoConfig.from_pretrained(str(tiny_qwen3_vl)))
    vi = prepare_vision_inputs(ids, [image], load_image_processor(tiny_qwen3_vl), tokens)
    data_url = "data:image/png;base64," + image_b64(image)
    async with EngineClient(vl_engine.url) as client:
        a = await client.generate(vl_request(ids, [data_url], sampling_seed=4))
        b = await client.generate(vl_request(vi.input_ids, [image_b64(image)], sampling_seed=4))
    assert a.output_ids == b.output_ids
    assert a.meta_info.prompt_tokens == b.meta_info.prompt_tokens == len(vi.input_ids)


@pytest.mark.parametrize(
    "images, n_placeholders, fragment",
    [
        (["bm90IGFuIGltYWdl"], 1, "image_data[0]"),  # base64 of "not an image"
        (["%%% not base64 %%%"], 1, "image_data[0]"),
        (["http://example.com/cat.png"], 1, "URLs are not fetched"),
        (["/etc/passwd"], 1, "image_data[0]"),
        (["GOOD"], 2, "2 image placeholder(s)"),
        ([], 1, "but 0 image(s) were given"),
    ],
)
async def test_bad_image_input_is_a_clear_400(
    vl_engine: EmbeddedEngineProcess, tok: Any, images: list[str], n_placeholders: int, fragment: str
) -> None:
    good = image_b64(random_image(0))
    body = {
        "input_ids": image_prompt(tok, n_placeholders),
        "image_data": [good if i == "GOOD" else i for i in images] or None,
        "sampling_params": {"max_new_tokens": 2},
    }
    async with httpx.AsyncClient(base_url=vl_engine.url) as http:
        resp = await http.post("/generate", json=body)
        assert resp.status_code == 400, resp.text
        assert fragment in resp.json()["error"]["message"]
        ok = await http.post("/generate", json={**body, "input_ids": image_prompt(tok, 1), "image_data": [good]})
        assert ok.status_code == 200


async def test_chat_completion_with_an_image(vl_engine: EmbeddedEngineProcess, tok: Any) -> None:
    image = random_image(9, (80, 64))
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look:"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64," + image_b64(image)}},
                {"type": "text", "text": "How many shapes?"},
            ],
        }
    ]
    async with EngineClient(vl_engine.url) as client:
        out = await client.chat_completions(
            ChatCompletionRequest(messages=messages, max_tokens=6, logprobs=True, seed=3)
        )
        text_only = await client.chat_completions(
            ChatCompletionRequest(messages=[{"role": "user", "content": "Look: How many shapes?"}], max_tokens=6)
        )
        info = await client.model_info()
    assert info.has_image_understanding  # type: ignore[attr-defined]
    choice = out.choices[0]
    assert choice.logprobs is not None and len(choice.logprobs.content or []) == out.usage.completion_tokens
    # The image adds its expanded pad tokens plus the two vision markers to the prompt.
    assert out.usage.prompt_tokens > text_only.usage.prompt_tokens + 2
