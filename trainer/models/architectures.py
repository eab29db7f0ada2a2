"""Which model families the embedded engine and the torch backend serve, and a clear refusal
for the rest.

Both load a folder through transformers' Auto classes and drive it with explicit positions, a
2-D attention mask and a plain ``DynamicCache`` (keys/values per layer). That holds for decoder
families with full attention on every layer and 1-D RoPE (Llama / SmolLM, Qwen2, Qwen3), for
Qwen3-VL's M-RoPE, which the runner computes itself, and for the Qwen3-Omni thinker (MoE decoder,
M-RoPE from its own rope index, audio encoder). Families with sliding-window layers
(Gemma-3, Mistral), state-space layers or other cache kinds would load but decode wrongly in the
engine's batched cache, so they are refused by name instead.
"""

from __future__ import annotations

from typing import Any

from relax_gym.errors import RelaxGymError

#: HF ``model_type`` values the engine and the torch backend are tested on
SERVABLE_MODEL_TYPES: frozenset[str] = frozenset({"llama", "qwen2", "qwen3", "qwen3_vl", "qwen3_omni_moe_thinker"})


class UnsupportedArchitecture(RelaxGymError, ValueError):
    """The model folder holds a family the engine / backend does not serve."""


def check_servable(config: Any, where: str = "the embedded engine") -> str:
    """Return the config's ``model_type``, or raise one line naming it and what is supported."""
    model_type = str(getattr(config, "model_type", "") or "")
    if model_type not in SERVABLE_MODEL_TYPES:
        archs = getattr(config, "architectures", None) or []
        named = f"{model_type!r}" + (f" ({', '.join(map(str, archs))})" if archs else "")
        raise UnsupportedArchitecture(
            f"model type {named} is not supported by {where}; supported: {', '.join(sorted(SERVABLE_MODEL_TYPES))}"
        )
    return model_type


__all__ = ["SERVABLE_MODEL_TYPES", "UnsupportedArchitecture", "check_servable"]
