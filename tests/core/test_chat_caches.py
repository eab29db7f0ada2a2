"""The chat codec's two caches change nothing but CPU: the ids are the tokenizer's own, and the
template sandbox refuses what it refused before (also the second time, from the memo)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from relax_gym.chat import ChatCodec

from .test_chat import TOOLS, TURN1, qwen3_tokenizer  # noqa: F401 -- the fixture


def _texts(codec: ChatCodec, seed: int) -> list[str]:
    """Rendered chat context (recurring pieces), decoded random ids (added tokens anywhere) and
    text with combining accents, CJK, emoji and whitespace runs around the added tokens."""
    rng = random.Random(seed)
    tokenizer = codec.tokenizer
    conv = [{"role": "user", "content": "Find fact #3."}, {"role": "assistant", "content": TURN1},
            {"role": "tool", "content": "found: 17 x 23 = 391"}]
    texts = [codec.render(conv[:k], tools=TOOLS, add_generation_prompt=True) for k in (1, 3)] * 2
    texts += [tokenizer.decode([rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 40))])
              for _ in range(300)]
    texts += ["e\u0301 <|im_end|>\u0301 caf\u00e9<think>\n\n</think>  \n\n\u4e2d\u6587\U0001f600<tool_call>\t\t x",
              "<|im_start|><|im_start|>", "", "   ", "<|im_end", "|im_end|>", "\n<tool_response>\n</tool_response>\n"]
    return texts


@pytest.mark.parametrize("which", ["qwen3", "tiny-bpe"])
def test_piece_cached_encode_gives_the_tokenizers_ids(which: str, qwen3_tokenizer: Any, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from relax_gym.trainer.models import train_tiny_bpe

    tokenizer = qwen3_tokenizer if which == "qwen3" else AutoTokenizer.from_pretrained(str(train_tiny_bpe(tmp_path)))
    codec = ChatCodec(tokenizer)
    assert codec._pieces is not None  # noqa: SLF001 -- in use, or this test would check nothing
    for text in _texts(codec, seed=len(which)):
        assert codec.encode(text) == tokenizer.encode(text, add_special_tokens=False), repr(text)


def test_the_memoized_sandbox_still_refuses_unsafe_attributes() -> None:
    """Each template behaves exactly as in jinja's stock immutable sandbox: the unsafe ones raise
    SecurityError there and here, twice (the second time the verdicts come from the memo)."""
    import jinja2.sandbox

    from relax_gym.chat import _compile

    stock = jinja2.sandbox.ImmutableSandboxedEnvironment()
    values = {"x": [1, 1], "y": {"a": 2}, "f": _texts, "s": "a,b"}
    sources = ["{{ x.count(1) }}|{{ y.get('a') }}|{{ s.split(',') }}", "{{ x.append(1) }}", "{{ y.update(a=3) }}",
               "{{ y.pop('a') }}", "{{ x.__class__.__mro__ }}", "{{ s.__class__ }}", "{{ f.__globals__ }}",
               "{{ f.__code__ }}", "{{ x._private }}", "{{ y.items() | list }}"]

    def outcome(template: Any) -> str:
        try:
            return "ok: " + template.render(**values)
        except jinja2.sandbox.SecurityError as exc:
            return f"refused: {exc}"

    refused = 0
    for source in sources:
        ours = _compile(source)
        assert ours is not None
        expected = outcome(stock.from_string(source))
        refused += expected.startswith("refused")
        assert outcome(ours) == expected == outcome(ours), source
    assert refused >= 4


def test_the_cached_image_processor_equals_the_processor_and_processes_each_image_once(tmp_path: Path) -> None:
    """Per image, cached by content and settings, concatenated in order: the processor's own
    output for the list; a second processor with the same settings reuses the work."""
    from unittest import mock

    import numpy as np
    import torch
    from PIL import Image

    from relax_gym.vision import CachedImageProcessor, build_image_processor, load_image_processor

    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)) for h, w in ((64, 48), (40, 90))]
    images += [images[0].copy(), images[1].convert("L"), images[0].convert("RGBA")]  # repeats, other modes
    raw = build_image_processor(min_pixels=32 * 32, max_pixels=96 * 96)
    raw.save_pretrained(str(tmp_path))
    cached = load_image_processor(tmp_path)
    assert isinstance(cached, CachedImageProcessor) and cached.merge_size == raw.merge_size
    ref = raw(images=[im.convert("RGB") for im in images], return_tensors="pt")
    calls: list[int] = []
    real_call = type(cached.processor).__call__

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(len(kwargs.get("images") or args[0]))
        return real_call(self, *args, **kwargs)

    with mock.patch.object(type(cached.processor), "__call__", counting):
        out = cached(images=images, return_tensors="pt")
        again = load_image_processor(tmp_path)(images=images[:2], return_tensors="pt")
    assert torch.equal(out["pixel_values"], ref["pixel_values"])
    assert torch.equal(out["image_grid_thw"], ref["image_grid_thw"])
    assert torch.equal(again["pixel_values"], ref["pixel_values"][: again["pixel_values"].shape[0]])
    assert calls == [1, 1, 1]  # the 64x48 and 40x90 images and the grey one; RGBA of image 0 is image 0
    other = build_image_processor(min_pixels=32 * 32, max_pixels=48 * 48)  # other settings: other pixels
    other.save_pretrained(str(tmp_path / "other"))
    assert not torch.equal(load_image_processor(tmp_path / "other")(images=images[:1], return_tensors="pt")[
        "image_grid_thw"], ref["image_grid_thw"][:1])
