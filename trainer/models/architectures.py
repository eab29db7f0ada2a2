"""Which model families the embedded engine and the torch backend serve, and a clear refusal
for the rest.

Both load a folder through transformers' Auto classes and drive it with explicit positions, a
2-D attention mask and a plain ``DynamicCache`` (keys/values per layer). That holds for decoder
families with full attention on every layer and 1-D RoPE (Llama / SmolLM, Qwen2, Qwen3), for
Qwen3-VL's M-RoPE, which the runner computes itself, and for the Qwen3-Omni thinker (MoE decoder,
M-RoPE from its own rope index, audio encoder).

Sliding-window families are served *within their window*: the engine keeps every layer's full
KV, and while a sequence (left padding included) is no longer than the window, a sliding layer
attends to exactly what a full layer does. So for Gemma-3 text models the engine caps its
context at the sliding window (:func:`served_context`: 512 tokens for Gemma-3-270M) and ends or
refuses what would go past it. Training them is not supported yet (the torch backend refuses
them: :data:`ENGINE_ONLY_MODEL_TYPES`). Families with sliding layers but no ``layer_types``
(Mistral), state-space layers or other cache kinds are refused by name.
"""

from __future__ import annotations

from typing import Any

from relax_gym.errors import RelaxGymError
from relax_gym.model_context import served_context_of

#: HF ``model_type`` values the engine serves (and, but for ENGINE_ONLY_MODEL_TYPES, trains)
SERVABLE_MODEL_TYPES: frozenset[str] = frozenset(
    {"llama", "qwen2", "qwen3", "qwen3_vl", "qwen3_omni_moe_thinker", "gemma3_text"}
)
#: served for evaluation, refused by the trainer (sliding-window layers beyond the window)
ENGINE_ONLY_MODEL_TYPES: frozenset[str] = frozenset({"gemma3_text"})


class UnsupportedArchitecture(RelaxGymError, ValueError):
    """The model folder holds a family the engine / backend does not serve."""


def check_servable(config: Any, where: str = "the embedded engine", *, for_training: bool = False) -> str:
    """Return the config's ``model_type``, or raise one line naming it and what is supported
    (``for_training``: also refuse the families the engine serves for evaluation only)."""
    model_type = str(getattr(config, "model_type", "") or "")
    archs = getattr(config, "architectures", None) or []
    named = f"{model_type!r}" + (f" ({', '.join(map(str, archs))})" if archs else "")
    if model_type not in SERVABLE_MODEL_TYPES:
        raise UnsupportedArchitecture(
            f"model type {named} is not supported by {where}; supported: {', '.join(sorted(SERVABLE_MODEL_TYPES))}"
        )
    if for_training and model_type in ENGINE_ONLY_MODEL_TYPES:
        raise UnsupportedArchitecture(
            f"model type {named} is served by the embedded engine for evaluation only; {where} does not train "
            "sliding-window families yet"
        )
    return model_type


def served_context(text_config: Any) -> int:
    """The longest sequence the engine serves exactly: the model's context, or for a family with
    sliding-window layers the window (beyond it the engine's full-KV cache would over-attend)."""
    return served_context_of(getattr(text_config, "max_position_embeddings", None),
                             getattr(text_config, "layer_types", None), getattr(text_config, "sliding_window", None))


__all__ = [
    "ENGINE_ONLY_MODEL_TYPES",
    "SERVABLE_MODEL_TYPES",
    "UnsupportedArchitecture",
    "check_servable",
    "served_context",
]
