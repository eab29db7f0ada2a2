"""Tiny random Qwen3 / Qwen3-VL checkpoints (built from configs, never downloaded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch


def qwen3_config(
    *, tied: bool = False, kv_heads: int = 2, layers: int = 2, vocab: int = 256
) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        head_dim=16,
        max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        tie_word_embeddings=tied,
        rms_norm_eps=1e-6,
    )


def qwen3vl_config() -> Any:
    from transformers import Qwen3VLConfig

    return Qwen3VLConfig(
        text_config={
            "vocab_size": 512,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "max_position_embeddings": 512,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 5e5,
                "mrope_section": [6, 5, 5],
                "mrope_interleaved": True,
            },
        },
        vision_config={
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 64,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "deepstack_visual_indexes": [0, 1],
            "num_position_embeddings": 64,
        },
        image_token_id=500,
        video_token_id=501,
        vision_start_token_id=502,
        vision_end_token_id=503,
        tie_word_embeddings=True,
    )


def save_model(config: Any, folder: Path, seed: int = 0) -> Path:
    """Build a random HF model from ``config`` and save it (safetensors) to ``folder``."""
    from transformers import AutoModelForCausalLM, Qwen3VLForConditionalGeneration

    torch.manual_seed(seed)
    if config.model_type == "qwen3_vl":
        model = Qwen3VLForConditionalGeneration(config)
    else:
        model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(str(folder))
    return folder


def save_image(path: Path, seed: int = 0, size: tuple[int, int] = (64, 96)) -> Path:
    """A random RGB image of ``size`` = (height, width) pixels, as PNG."""
    from PIL import Image

    pixels = (np.random.default_rng(seed).random((*size, 3)) * 255).astype(np.uint8)
    Image.fromarray(pixels).save(path)
    return path
