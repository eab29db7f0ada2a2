"""Tiny random Qwen3 and Qwen3-VL models, built from configs (no download) and saved as HF folders.

The folder holds everything ``from_pretrained`` needs: ``config.json``, ``model.safetensors``,
``generation_config.json``, the tokenizer files with a chat template, and for Qwen3-VL the
image processor's ``preprocessor_config.json``. The engine, the rollout manager and the trainer
all load the same folder.

Sizes are kept tiny (hidden 64, 2 layers, head_dim 32: the smallest head size every engine we
target accepts). With the real 151k-token Qwen3 vocabulary the (tied) embedding dominates, about
39 MB in float32; with the tiny BPE tokenizer a model is well under 1 MB.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from relax_gym.errors import RelaxGymError
from relax_gym.vision import build_image_processor

from relax_gym.trainer.models._threads import torch_threads
from relax_gym.trainer.models.chat_templates import QWEN3_VL_CHAT_TEMPLATE
from relax_gym.trainer.models.tokenizer import load_qwen3_tokenizer, train_tiny_bpe

ModelKind = Literal["qwen3", "qwen3_vl", "qwen3_omni", "llama", "qwen2", "gemma3"]
TokenizerKind = Literal["qwen3", "tiny-bpe"]
# llama/qwen2/gemma3: the imported real families
KINDS: tuple[str, ...] = ("qwen3", "qwen3_vl", "qwen3_omni", "llama", "qwen2", "gemma3")

# Text-model defaults; any of them can be overridden through build_tiny_model(**overrides).
TEXT_DEFAULTS: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.02,
}
VISION_DEFAULTS: dict[str, Any] = {
    "depth": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "num_position_embeddings": 64,
    "deepstack_visual_indexes": [1],
}


QWEN3_VOCAB_SIZE = 151936  # the real checkpoints' (padded) embedding rows


class TinyModelError(RelaxGymError, ValueError):
    """Bad arguments for a tiny model."""


def normalize_kind(kind: str) -> ModelKind:
    """Accept ``qwen3-vl`` as well as ``qwen3_vl``."""
    k = kind.replace("-", "_").lower()
    if k not in KINDS:
        raise TinyModelError(f"unknown tiny model kind {kind!r}; expected one of {KINDS}")
    return k  # type: ignore[return-value]


def _padded_vocab(n: int, multiple: int = 128) -> int:
    """Real Qwen checkpoints pad the embedding to a multiple of 128 rows (151669 -> 151936)."""
    return (n + multiple - 1) // multiple * multiple


def _load_tokenizer(kind: TokenizerKind, out: Path) -> Any:
    from transformers import AutoTokenizer

    if kind == "qwen3":
        return load_qwen3_tokenizer()
    if kind == "tiny-bpe":
        train_tiny_bpe(out / "_bpe")
        tok = AutoTokenizer.from_pretrained(str(out / "_bpe"))
        for f in (out / "_bpe").iterdir():
            f.unlink()
        (out / "_bpe").rmdir()
        return tok
    raise TinyModelError(f"unknown tokenizer {kind!r}; expected 'qwen3' or 'tiny-bpe'")


def build_tiny_model(
    kind: str = "qwen3",
    path: str | Path = "tiny-model",
    *,
    seed: int = 0,
    tokenizer: TokenizerKind = "qwen3",
    vision: dict[str, Any] | None = None,
    audio: dict[str, Any] | None = None,
    image_min_pixels: int = 32 * 32,
    image_max_pixels: int = 256 * 256,
    threads: int | None = 1,
    **overrides: Any,
) -> Path:
    """Build a tiny random model of ``kind`` and save it as a HF folder at ``path``.

    ``overrides`` change the text config (e.g. ``num_hidden_layers=4``); ``vision`` changes the
    Qwen3-VL vision config, ``audio`` the Qwen3-Omni audio encoder's (``qwen3_omni``: the thinker,
    :mod:`relax_gym.trainer.models.tiny_omni`). The weights depend only on ``seed`` and the config.
    """
    with torch_threads(threads):
        return _build(
            kind,
            Path(path),
            seed=seed,
            tokenizer=tokenizer,
            vision=vision,
            audio=audio,
            image_min_pixels=image_min_pixels,
            image_max_pixels=image_max_pixels,
            **overrides,
        )


def _build(
    kind: str,
    out: Path,
    *,
    seed: int,
    tokenizer: TokenizerKind,
    vision: dict[str, Any] | None,
    image_min_pixels: int,
    image_max_pixels: int,
    audio: dict[str, Any] | None = None,
    **overrides: Any,
) -> Path:
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model_kind = normalize_kind(kind)
    out.mkdir(parents=True, exist_ok=True)
    tok = _load_tokenizer(tokenizer, out)
    markers = ["<|im_end|>", "<|endoftext|>", "<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"]
    if model_kind == "qwen3_omni":
        from relax_gym.trainer.models.tiny_omni import AUDIO_MARKERS, add_audio_tokens

        add_audio_tokens(tok)
        markers += AUDIO_MARKERS
    ids = {t: tok.convert_tokens_to_ids(t) for t in markers}
    eos = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    text_cfg = {**TEXT_DEFAULTS, **overrides}
    text_cfg.setdefault("vocab_size", QWEN3_VOCAB_SIZE if tokenizer == "qwen3" else _padded_vocab(len(tok)))
    if text_cfg["vocab_size"] < len(tok):
        raise TinyModelError(f"vocab_size {text_cfg['vocab_size']} is smaller than the tokenizer ({len(tok)})")

    torch.manual_seed(seed)
    config: Any
    model: Any
    if model_kind == "qwen3":
        from transformers import Qwen3Config, Qwen3ForCausalLM

        config = Qwen3Config(
            **text_cfg,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
            bos_token_id=None,
            eos_token_id=eos,
            pad_token_id=ids["<|endoftext|>"],
        )
        config.architectures = ["Qwen3ForCausalLM"]
        model = Qwen3ForCausalLM(config)
    elif model_kind in ("llama", "qwen2"):
        config, model = _text_family(model_kind, text_cfg, eos, ids["<|endoftext|>"])
    elif model_kind == "gemma3":
        config, model = _gemma3(text_cfg, eos, ids["<|endoftext|>"])
    elif model_kind == "qwen3_omni":
        _build_omni_into(out, tok, text_cfg, ids, audio, vision, image_min_pixels, image_max_pixels)
        model = config = None
    else:
        from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

        half = text_cfg["head_dim"] // 2
        section = [half - 2 * (half * 5 // 16), half * 5 // 16, half * 5 // 16]  # 16 -> [6, 5, 5]
        vision_cfg = {**VISION_DEFAULTS, **(vision or {}), "out_hidden_size": text_cfg["hidden_size"]}
        config = Qwen3VLConfig(
            text_config={
                **text_cfg,
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": 5_000_000.0,
                    "mrope_section": section,
                    "mrope_interleaved": True,
                },
                "eos_token_id": eos,
                "pad_token_id": ids["<|endoftext|>"],
                "bos_token_id": None,
            },
            vision_config=vision_cfg,
            image_token_id=ids["<|image_pad|>"],
            video_token_id=ids["<|video_pad|>"],
            vision_start_token_id=ids["<|vision_start|>"],
            vision_end_token_id=ids["<|vision_end|>"],
            tie_word_embeddings=True,
        )
        config.eos_token_id = eos
        config.pad_token_id = ids["<|endoftext|>"]
        config.architectures = ["Qwen3VLForConditionalGeneration"]
        model = Qwen3VLForConditionalGeneration(config)
        tok.chat_template = QWEN3_VL_CHAT_TEMPLATE
        processor = build_image_processor(
            patch_size=vision_cfg["patch_size"],
            merge_size=vision_cfg["spatial_merge_size"],
            temporal_patch_size=vision_cfg["temporal_patch_size"],
            min_pixels=image_min_pixels,
            max_pixels=image_max_pixels,
        )
        processor.save_pretrained(str(out))
    if model is not None:
        model = model.to(torch.float32).eval()
        model.generation_config.eos_token_id = eos
        model.generation_config.pad_token_id = ids["<|endoftext|>"]
        model.generation_config.bos_token_id = None
        model.save_pretrained(str(out))
        tok.save_pretrained(str(out))
    (out / "relax_gym_tiny.json").write_text(
        json.dumps({"kind": model_kind, "seed": seed, "tokenizer": tokenizer}, indent=2) + "\n", encoding="utf-8"
    )
    return out


def _build_omni_into(out: Path, tok: Any, text_cfg: dict[str, Any], ids: dict[str, int], audio: dict[str, Any] | None,
                     vision: dict[str, Any] | None, min_pixels: int, max_pixels: int) -> None:
    """The Qwen3-Omni thinker: model, processor files and tokenizer with audio markers."""
    import torch

    from relax_gym.trainer.models.tiny_omni import (
        OMNI_TOKENIZER_TOKENS,
        QWEN3_OMNI_CHAT_TEMPLATE,
        build_omni,
        save_omni_processor,
    )

    half = text_cfg["head_dim"] // 2
    section = [half - 2 * (half * 5 // 16), half * 5 // 16, half * 5 // 16]
    config, model, vision_cfg = build_omni(text_cfg, ids, audio=audio, vision=vision, section=section)
    model = model.to(torch.float32).eval()
    eos = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.generation_config.bos_token_id = None
    model.save_pretrained(str(out))
    save_omni_processor(out, build_image_processor(
        patch_size=vision_cfg["patch_size"], merge_size=vision_cfg["spatial_merge_size"],
        temporal_patch_size=vision_cfg["temporal_patch_size"], min_pixels=min_pixels, max_pixels=max_pixels,
    ), int(config.audio_config.num_mel_bins))
    tok.chat_template = QWEN3_OMNI_CHAT_TEMPLATE
    tok._set_model_specific_special_tokens(dict(OMNI_TOKENIZER_TOKENS))  # saved in tokenizer_config.json
    tok.save_pretrained(str(out))


def _text_family(kind: str, text_cfg: dict[str, Any], eos: list[int], pad: int) -> tuple[Any, Any]:
    """A tiny Llama (SmolLM2's family) or Qwen2 (Qwen2.5's) with the same sizes as the Qwen3 one."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = (LlamaConfig, LlamaForCausalLM) if kind == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    config = config_cls(
        **text_cfg,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 100_000.0},
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    config.architectures = [model_cls.__name__]
    return config, model_cls(config)


GEMMA3_SLIDING_WINDOW = 64  # small, so a test can reach it; Gemma-3-270M's is 512


def _gemma3(text_cfg: dict[str, Any], eos: list[int], pad: int) -> tuple[Any, Any]:
    """A tiny Gemma-3 text model: sliding-window layers, then a full one (Gemma-3's 5:1 pattern,
    cut short), local and global RoPE bases, embeddings scaled by sqrt(hidden)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = dict(text_cfg)
    layers = int(cfg.pop("num_hidden_layers"))
    cfg.setdefault("sliding_window", GEMMA3_SLIDING_WINDOW)
    config = Gemma3TextConfig(
        **cfg,
        num_hidden_layers=layers,
        layer_types=["full_attention" if (i + 1) % 6 == 0 or i == layers - 1 else "sliding_attention" for i in range(layers)],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
        },
        query_pre_attn_scalar=cfg["head_dim"],
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    config.architectures = ["Gemma3ForCausalLM"]
    return config, Gemma3ForCausalLM(config)


def folder_size_bytes(path: str | Path) -> int:
    """Total size of the files in a model folder."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


__all__ = ["KINDS", "ModelKind", "TinyModelError", "build_tiny_model", "folder_size_bytes", "normalize_kind"]
