"""Tiny models, tokenizers and Qwen-VL input processing shared by the engine and the trainer.

``build_tiny_model("qwen3" | "qwen3_vl" | "qwen3_omni", path)`` writes a random tiny model as a HF folder
(config, safetensors, tokenizer with chat template, image processor) in about a second, with no
download. Importing this package is light; torch and transformers load inside the functions.
The Qwen-VL input functions re-exported here live in the core (:mod:`relax_gym.vision`), where
the leaderboards' HF agent can use them without importing the trainer.
"""

from relax_gym.vision import (
    VisionInputError,
    VisionInputs,
    VisionTokens,
    build_image_processor,
    expand_image_tokens,
    image_token_count,
    load_image_processor,
    prepare_vision_inputs,
)

from relax_gym.trainer.models.tiny import (
    KINDS,
    TinyModelError,
    build_tiny_model,
    folder_size_bytes,
    normalize_kind,
)
from relax_gym.trainer.models.tokenizer import (
    QWEN_SPECIAL_TOKENS,
    TokenizerFilesMissing,
    load_qwen3_tokenizer,
    qwen3_chat_template,
    qwen3_tokenizer_dir,
    train_tiny_bpe,
)

__all__ = [
    "KINDS",
    "QWEN_SPECIAL_TOKENS",
    "TinyModelError",
    "TokenizerFilesMissing",
    "VisionInputError",
    "VisionInputs",
    "VisionTokens",
    "build_image_processor",
    "build_tiny_model",
    "expand_image_tokens",
    "folder_size_bytes",
    "image_token_count",
    "load_image_processor",
    "load_qwen3_tokenizer",
    "normalize_kind",
    "prepare_vision_inputs",
    "qwen3_chat_template",
    "qwen3_tokenizer_dir",
    "train_tiny_bpe",
]
