"""A tiny random Qwen3-Omni *thinker* (audio + image + text in, text out), built from a config.

transformers ships ``Qwen3OmniMoeThinkerForConditionalGeneration``: a Whisper-style audio
encoder, Qwen3-VL's vision tower and a mixture-of-experts Qwen3 language model with M-RoPE. The
talker (speech out) is not built: the policy writes text. Sizes are kept tiny so a CPU trains it
in minutes: 2 decoder layers of hidden 64 with 4 experts of width 32 (2 routed per token), a
1-layer audio encoder of width 32, a 1-layer vision tower of width 32.

The tokenizer gets Qwen3-Omni's audio markers (``<|audio_start|>``, ``<|audio_end|>``,
``<|audio_pad|>``) and the chat template renders an audio part as
``<|audio_start|><|audio_pad|><|audio_end|>`` (one pad; :mod:`relax_gym.audio` expands it).
``preprocessor_config.json`` holds both the image processor's and Whisper's feature extractor's
settings, as a real Qwen3-Omni folder does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from relax_gym.audio import AUDIO_END, AUDIO_START, AUDIO_TOKEN

from relax_gym.trainer.models.chat_templates import QWEN3_VL_CHAT_TEMPLATE

OMNI_TEXT_DEFAULTS: dict[str, Any] = {
    "moe_intermediate_size": 32,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "decoder_sparse_step": 1,
    "norm_topk_prob": True,
}
AUDIO_DEFAULTS: dict[str, Any] = {
    "num_mel_bins": 128,
    "encoder_layers": 1,
    "encoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "d_model": 32,
    "downsample_hidden_size": 16,
    "max_source_positions": 1500,
    "n_window": 50,
    "n_window_infer": 800,
    "conv_chunksize": 500,
}
OMNI_VISION_DEFAULTS: dict[str, Any] = {
    "depth": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "num_position_embeddings": 64,
    "deepstack_visual_indexes": [0],
}
AUDIO_MARKERS = (AUDIO_START, AUDIO_END, AUDIO_TOKEN)
# the attributes Qwen3OmniMoeProcessor reads from its tokenizer
OMNI_TOKENIZER_TOKENS = {
    "image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "audio_token": AUDIO_TOKEN,
    "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": AUDIO_START, "audio_eos_token": AUDIO_END,
}

QWEN3_OMNI_CHAT_TEMPLATE = QWEN3_VL_CHAT_TEMPLATE.replace(
    "{%- elif part.type in ['video', 'video_url'] -%}",
    "{%- elif part.type in ['audio', 'audio_url', 'input_audio'] -%}\n"
    "                {{- '<|audio_start|><|audio_pad|><|audio_end|>' -}}\n"
    "            {%- elif part.type in ['video', 'video_url'] -%}",
)


def add_audio_tokens(tok: Any) -> None:
    """Give a Qwen tokenizer Qwen3-Omni's audio markers (special, never split)."""
    from tokenizers import AddedToken

    missing = [t for t in AUDIO_MARKERS if tok.convert_tokens_to_ids(t) in (None, tok.unk_token_id)]
    if missing:
        tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in missing], special_tokens=True)


def build_omni(text_cfg: dict[str, Any], ids: dict[str, int], *, audio: dict[str, Any] | None,
               vision: dict[str, Any] | None, section: list[int]) -> tuple[Any, Any, dict[str, Any]]:
    """Config and random model of a tiny thinker; returns also the vision config used."""
    from transformers import Qwen3OmniMoeThinkerConfig, Qwen3OmniMoeThinkerForConditionalGeneration

    hidden = text_cfg["hidden_size"]
    vision_cfg = {**OMNI_VISION_DEFAULTS, **(vision or {}), "out_hidden_size": hidden}
    audio_cfg = {**AUDIO_DEFAULTS, **(audio or {}), "output_dim": hidden}
    eos = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    text = {**OMNI_TEXT_DEFAULTS, **text_cfg,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": section,
                                "mrope_interleaved": True},
            "eos_token_id": eos, "pad_token_id": ids["<|endoftext|>"], "bos_token_id": None}
    config = Qwen3OmniMoeThinkerConfig(
        text_config=text, vision_config=vision_cfg, audio_config=audio_cfg,
        audio_token_id=ids[AUDIO_TOKEN], audio_start_token_id=ids[AUDIO_START], image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        tie_word_embeddings=True,
    )
    config.audio_end_token_id = ids[AUDIO_END]
    config.vision_end_token_id = ids["<|vision_end|>"]
    config.eos_token_id = eos
    config.pad_token_id = ids["<|endoftext|>"]
    config.architectures = ["Qwen3OmniMoeThinkerForConditionalGeneration"]
    return config, Qwen3OmniMoeThinkerForConditionalGeneration(config), vision_cfg


def save_omni_processor(out: Path, image_processor: Any, num_mel_bins: int) -> None:
    """One ``preprocessor_config.json`` with the image processor's and the feature extractor's keys."""
    from transformers import WhisperFeatureExtractor

    image_processor.save_pretrained(str(out))
    path = out / "preprocessor_config.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    fe = WhisperFeatureExtractor(feature_size=num_mel_bins).to_dict()
    for key in ("feature_size", "sampling_rate", "hop_length", "chunk_length", "n_fft", "padding_value",
                "dither", "n_samples", "nb_max_frames", "return_attention_mask"):
        if key in fe:
            data[key] = fe[key]
    data["feature_extractor_type"] = "WhisperFeatureExtractor"
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


__all__ = ["AUDIO_DEFAULTS", "QWEN3_OMNI_CHAT_TEMPLATE", "add_audio_tokens", "build_omni", "save_omni_processor"]
