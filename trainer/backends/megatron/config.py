"""Typed configuration for the megatron-core backend, and the HF config -> Megatron mapping.

``MegatronConfig`` is what a training config's ``megatron:`` section holds (parallel sizes,
dtype, bucket size for weight streaming). ``ModelDims`` is the part of a Hugging Face Qwen3 /
Qwen3-VL config the bridge needs; reading it once keeps HF config quirks (``rope_parameters``
vs ``rope_theta``, nested ``text_config``, top-level ``tie_word_embeddings``) in one place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from relax_gym.errors import RelaxGymError


class MegatronBridgeError(RelaxGymError, ValueError):
    """A model config, checkpoint or parallel layout the Megatron bridge cannot handle."""


DTypeName = Literal["float32", "bfloat16", "float16"]
if TYPE_CHECKING:  # validating a training config must not import torch
    import torch


class MegatronConfig(BaseModel):
    """Parallel layout and numerics of the Megatron model (the ``megatron:`` config section).

    The data-parallel size is not set here: it is ``world_size // (tp * pp * cp)``.
    """

    model_config = ConfigDict(extra="forbid")

    tensor_parallel_size: int = Field(1, ge=1, description="TP: shards heads, FFN and vocab.")
    pipeline_parallel_size: int = Field(1, ge=1, description="PP: splits the layers into stages.")
    context_parallel_size: int = Field(
        1, ge=1, description="CP: splits the sequence; needs Transformer Engine attention."
    )
    params_dtype: DTypeName = Field("float32", description="dtype of the Megatron parameters.")
    export_bucket_mb: float = Field(
        512.0, gt=0, description="Upper bound of one streamed bucket of HF tensors, in MiB."
    )
    seed: int = Field(1234, description="Seed of Megatron's model-parallel RNG tracker (GPU).")
    distributed_optimizer: bool = Field(
        False, description="Shard the optimizer state over data-parallel ranks (ZeRO-1)."
    )
    micro_batch_layout: Literal["auto", "packed", "padded"] = Field(
        "auto",
        description="packed: one row per micro-batch with a block-causal mask; padded: [b, S_max] "
        "rows; auto: the cheaper of the two for each micro-batch (packing.layout_cost).",
    )
    collective_timeout_s: float = Field(
        600.0, gt=0, description="Timeout of every collective; a dead rank ends the others."
    )
    follower_timeout_s: float = Field(
        3600.0, gt=0,
        description="Under torchrun: how long ranks > 0 wait for rank 0's next backend call "
        "(rollouts and evaluation run between calls).",
    )

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        dtype: torch.dtype = getattr(torch, self.params_dtype)
        return dtype

    @property
    def model_parallel_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.context_parallel_size

    def data_parallel_size(self, world_size: int) -> int:
        """DP size for a world of ``world_size`` ranks; raises when the sizes do not divide."""
        if world_size % self.model_parallel_size:
            raise MegatronBridgeError(
                f"world size {world_size} is not a multiple of tp*pp*cp={self.model_parallel_size}"
            )
        return world_size // self.model_parallel_size


@dataclass(frozen=True)
class ModelDims:
    """Shape facts of a Qwen3-family decoder, read from a Hugging Face config."""

    vocab_size: int
    hidden_size: int
    ffn_hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    tied_embeddings: bool
    max_position_embeddings: int
    hf_prefix: str
    """Prefix of the decoder's HF names: ``model.`` (Qwen3) or ``model.language_model.`` (VL)."""
    mrope_section: tuple[int, int, int] | None = None
    """Qwen3-VL's (t, h, w) split of the rotary frequencies; None for a text-only model."""

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_kv_heads


def _rope_theta(text_cfg: Any) -> float:
    params = getattr(text_cfg, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise MegatronBridgeError(f"rope_type {rope_type!r} is not supported (only 'default')")
    theta = params.get("rope_theta", getattr(text_cfg, "rope_theta", None))
    if theta is None:
        raise MegatronBridgeError("the HF config names no rope_theta")
    return float(theta)


OMNI_KINDS = frozenset({"qwen3_omni", "qwen3_omni_moe_thinker", "qwen3_omni_moe"})


def omni_refusal(model_type: str) -> str | None:
    """Why the bridge cannot train a Qwen3-Omni model (checked at config validation), else None."""
    if model_type not in OMNI_KINDS:
        return None
    return (f"model_type {model_type!r} (the Qwen3-Omni thinker) is not supported by the megatron backend: the "
            "bridge has no mixture-of-experts language model (router, experts, expert parallel), no audio "
            "encoder and no omni M-RoPE (docs/megatron.md); use backend: torch")


def dims_from_hf_config(hf_config: Any) -> ModelDims:
    """Read the decoder shape of a Qwen3 or Qwen3-VL ``PretrainedConfig`` (or its ``to_dict``)."""
    model_type = getattr(hf_config, "model_type", None)
    refusal = omni_refusal(str(model_type))
    if refusal is not None:
        raise MegatronBridgeError(refusal)
    if model_type == "qwen3_vl":
        text = hf_config.text_config
        prefix = "model.language_model."
        section = (text.rope_parameters or {}).get("mrope_section", [24, 20, 20])
        mrope: tuple[int, int, int] | None = (int(section[0]), int(section[1]), int(section[2]))
    elif model_type == "qwen3":
        text = hf_config
        prefix = "model."
        mrope = None
    else:
        raise MegatronBridgeError(
            f"model_type {model_type!r} is not supported; expected 'qwen3' or 'qwen3_vl'"
        )
    if getattr(text, "hidden_act", "silu") != "silu":
        raise MegatronBridgeError(f"hidden_act {text.hidden_act!r} is not supported (only silu)")
    if getattr(text, "attention_bias", False):
        raise MegatronBridgeError("attention_bias=True is not supported (Qwen3 has no biases)")
    if getattr(text, "use_sliding_window", False):
        raise MegatronBridgeError("sliding-window attention is not supported")
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    if text.num_attention_heads % kv_heads:
        raise MegatronBridgeError("num_attention_heads must be a multiple of num_key_value_heads")
    dims = ModelDims(
        vocab_size=int(text.vocab_size),
        hidden_size=int(text.hidden_size),
        ffn_hidden_size=int(text.intermediate_size),
        num_layers=int(text.num_hidden_layers),
        num_heads=int(text.num_attention_heads),
        num_kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        rms_norm_eps=float(text.rms_norm_eps),
        rope_theta=_rope_theta(text),
        tied_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        max_position_embeddings=int(text.max_position_embeddings),
        hf_prefix=prefix,
        mrope_section=mrope,
    )
    if mrope is not None and sum(mrope) != head_dim // 2:
        raise MegatronBridgeError(f"mrope_section {mrope} must sum to head_dim/2={head_dim // 2}")
    return dims


def check_parallel_layout(dims: ModelDims, cfg: MegatronConfig) -> None:
    """Raise a clear error when the model cannot be split the way ``cfg`` asks."""
    tp, pp = cfg.tensor_parallel_size, cfg.pipeline_parallel_size
    problems = []
    if dims.num_heads % tp:
        problems.append(f"num_attention_heads={dims.num_heads} is not divisible by tp={tp}")
    if dims.num_kv_heads % tp and tp % dims.num_kv_heads:
        problems.append(f"num_key_value_heads={dims.num_kv_heads} and tp={tp} do not divide")
    qkv_rows = (dims.num_heads + 2 * dims.num_kv_heads) * dims.head_dim
    if qkv_rows % tp:
        problems.append(f"the {qkv_rows} fused q/k/v rows do not split over tp={tp}")
    if dims.ffn_hidden_size % tp:
        problems.append(f"intermediate_size={dims.ffn_hidden_size} is not divisible by tp={tp}")
    if dims.vocab_size % tp:
        problems.append(f"vocab_size={dims.vocab_size} is not divisible by tp={tp}")
    if dims.num_layers % pp:
        problems.append(f"num_hidden_layers={dims.num_layers} is not divisible by pp={pp}")
    if cfg.context_parallel_size > 1:
        problems.append("context parallelism needs Transformer Engine attention (not wired)")
    if problems:
        raise MegatronBridgeError("; ".join(problems))


def transformer_config(dims: ModelDims, cfg: MegatronConfig) -> Any:
    """Megatron ``TransformerConfig`` equivalent to the HF Qwen3 decoder described by ``dims``.

    Fusions are off: they need Apex/TE kernels, and the unfused path is the one whose numerics
    match Hugging Face's eager implementation.
    """
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    check_parallel_layout(dims, cfg)
    dtype = cfg.torch_dtype
    return TransformerConfig(
        num_layers=dims.num_layers,
        hidden_size=dims.hidden_size,
        ffn_hidden_size=dims.ffn_hidden_size,
        num_attention_heads=dims.num_heads,
        num_query_groups=dims.num_kv_heads,
        kv_channels=dims.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=dims.rms_norm_eps,
        qk_layernorm=True,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        attention_softmax_in_fp32=True,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        tensor_model_parallel_size=cfg.tensor_parallel_size,
        pipeline_model_parallel_size=cfg.pipeline_parallel_size,
        context_parallel_size=cfg.context_parallel_size,
        sequence_parallel=False,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        pipeline_dtype=dtype,
        # GPTModel's mRoPE path (the one that reads position ids) asserts a section; text
        # models put every frequency on the first axis (see rope.py).
        mrope_section=list(dims.mrope_section or (dims.head_dim // 2, 0, 0)),
        use_cpu_initialization=not torch.cuda.is_available(),
        init_method_std=0.02,
    )


def bucket_bytes(cfg: MegatronConfig) -> int:
    return max(1, math.floor(cfg.export_bucket_mb * 1024 * 1024))
