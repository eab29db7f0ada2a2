"""LoRA adapters for the torch backend, through peft.

Why: full fine-tuning keeps AdamW state for every weight (3x the model in float32); LoRA trains
two small matrices per chosen linear layer and freezes the rest, which cuts optimizer memory and
the weight-gradient work of the backward pass. The engine never sees adapters: the backend
hands it **merged** weights (``W + scale * B @ A``) under the plain HF names, so weight sync,
checkpoints for the engine and ``final_model`` stay ordinary HF folders. The adapter itself can
also be saved in peft's format (``adapter/``) for reuse.

At step 0 the adapters are exact no-ops (peft initialises ``B = 0``), so a LoRA run starts from
exactly the base model's logprobs and loss (tests/trainer/test_lora.py checks it).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:  # torch loads only when adapters are applied: the config imports this module
    from torch import Tensor

from relax_gym.errors import RelaxGymError

#: attention and MLP projections of the Llama / Qwen families
DEFAULT_TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraError(RelaxGymError, ValueError):
    """LoRA cannot be applied as configured (peft missing, no module matches the targets)."""


class LoraSettings(BaseModel):
    """``model.lora`` in a training config."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    rank: int = Field(16, ge=1, le=1024, description="adapter rank r")
    alpha: float = Field(32.0, gt=0, description="scale numerator: the update is (alpha / r) * B @ A")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter input (0 keeps the loss exact)")
    target_modules: list[str] = Field(
        default_factory=lambda: list(DEFAULT_TARGETS),
        description="names (suffixes) of the linear layers that get adapters",
    )
    save_adapter: bool = Field(False, description="also write the peft adapter to <folder>/adapter when saving")


def apply_lora(model: Any, settings: LoraSettings) -> Any:
    """Wrap ``model`` in a peft LoRA model; only the adapters stay trainable."""
    import torch

    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise LoraError("model.lora needs the `peft` package: pip install 'relax-gym[real]'") from None
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    missing = [t for t in settings.target_modules if t not in names]
    if missing:
        raise LoraError(f"model.lora.target_modules {missing} match no linear layer (this model has {sorted(names)})")
    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                        target_modules=list(settings.target_modules), bias="none", task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def merged_weights(peft_model: Any) -> Iterator[tuple[str, Tensor]]:
    """The base model's state dict with every adapter folded in, under the plain HF names.

    Nothing is modified: ``W + delta`` is computed per layer, so training continues on the same
    adapters. Tied duplicates (``lm_head.weight`` = embeddings) are yielded once.
    """
    from peft.tuners.lora import LoraLayer

    base = peft_model.get_base_model()
    deltas: dict[str, Tensor] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            delta = None
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    d = module.get_delta_weight(adapter)
                    delta = d if delta is None else delta + d
            if delta is not None:
                deltas[f"{name}.weight"] = delta
    seen: set[int] = set()
    for key, tensor in base.state_dict().items():
        if ".lora_" in key:
            continue
        plain = key.replace(".base_layer.", ".")
        ptr = tensor.data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        delta = deltas.get(plain)
        yield plain, (tensor + delta.to(tensor.dtype)).detach() if delta is not None else tensor.detach()


def trainable_counts(model: Any) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in model.parameters())


def save_merged_folder(peft_model: Any, out: Any, merged: dict[str, Tensor], *, adapter: bool = False) -> None:
    """An ordinary HF folder (config, generation config, ``model.safetensors``) of the merged
    weights; with ``adapter``, peft's adapter files under ``out/adapter`` as well."""
    from pathlib import Path

    from safetensors.torch import save_file

    folder = Path(out)
    base = peft_model.get_base_model()
    base.config.save_pretrained(str(folder))
    if getattr(base, "generation_config", None) is not None:
        base.generation_config.save_pretrained(str(folder))
    save_file({n: t.contiguous().cpu() for n, t in merged.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    if adapter:
        peft_model.save_pretrained(str(folder / "adapter"))


__all__ = ["DEFAULT_TARGETS", "LoraError", "LoraSettings", "apply_lora", "merged_weights", "save_merged_folder",
           "trainable_counts"]
