"""Build Qwen3 decoders on megatron-core's ``GPTModel`` and set up model parallelism.

The model uses megatron-core's own modules (``get_gpt_layer_local_spec``: column/row-parallel
linears, torch RMSNorm, ``DotProductAttention``), so it runs wherever megatron-core runs and
its parameter names are the ones ``layout.py`` maps. Text models use ``rope``; Qwen3-VL's
language model uses ``mrope`` with the interleaved rotary embedding from ``rope.py``.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from relax_gym.trainer.backends.megatron.config import (
    MegatronBridgeError,
    MegatronConfig,
    ModelDims,
    transformer_config,
)


def init_model_parallel(cfg: MegatronConfig) -> None:
    """Create Megatron's TP/PP/CP/DP groups on an initialised ``torch.distributed`` world.

    On CUDA this also binds the local device and seeds Megatron's model-parallel RNG tracker.
    """
    from megatron.core import parallel_state, tensor_parallel

    if not dist.is_initialized():
        raise MegatronBridgeError("torch.distributed must be initialised before Megatron")
    cfg.data_parallel_size(dist.get_world_size())
    if parallel_state.model_parallel_is_initialized():
        return
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", dist.get_rank() % torch.cuda.device_count()))
        torch.cuda.set_device(local)
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=cfg.tensor_parallel_size,
        pipeline_model_parallel_size=cfg.pipeline_parallel_size,
        context_parallel_size=cfg.context_parallel_size,
    )
    if torch.cuda.is_available():
        tensor_parallel.model_parallel_cuda_manual_seed(cfg.seed)


def destroy_model_parallel() -> None:
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()


def build_gpt_model(dims: ModelDims, cfg: MegatronConfig, config: Any | None = None) -> Any:
    """A ``GPTModel`` for this pipeline stage, shaped like the HF model ``dims`` describes.

    Forward: ``model(input_ids [b, s], position_ids, attention_mask)`` where ``position_ids``
    is ``[b, s]`` (text) or ``[3, b, s]`` (Qwen3-VL) and ``attention_mask`` is None (causal)
    or a bool ``[b, 1, s, s]`` mask, True where attention is blocked (packed sequences).
    The output layer keeps logits split over TP ranks (``parallel_output=True``); use
    ``logprobs.vocab_parallel_logprobs`` on them instead of gathering the full vocabulary.
    """
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from relax_gym.trainer.backends.megatron.rope import PositionRotaryEmbedding

    config = config or transformer_config(dims, cfg)
    spec = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=dims.vocab_size,
        max_sequence_length=dims.max_position_embeddings,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        parallel_output=True,
        share_embeddings_and_output_weights=dims.tied_embeddings,
        # The mRoPE path is the one that reads position_ids (see rope.py).
        position_embedding_type="mrope",
        rotary_base=dims.rope_theta,  # HF thetas are floats; Megatron only uses it in a pow
    )
    model.rotary_pos_emb = PositionRotaryEmbedding(
        kv_channels=config.kv_channels,
        rotary_base=dims.rope_theta,
        mrope_section=dims.mrope_section,
    )
    _norms_to_params_dtype(model, config.params_dtype)
    if torch.cuda.is_available():
        model.cuda(torch.cuda.current_device())
    return model


def _norms_to_params_dtype(model: Any, dtype: torch.dtype) -> None:
    """torch's RMSNorm (the local spec's norm) ignores ``params_dtype`` and stays float32.

    Mixed parameter dtypes break Megatron's bf16/fp16 optimizer checkpointing (it maps only the
    half-precision parameters), and HF keeps its norms in the model dtype too.
    """
    for module in model.modules():
        if isinstance(module, torch.nn.RMSNorm):
            module.to(dtype)


def unwrap_model(model: Any) -> Any:
    """Strip DDP / Float16Module wrappers down to the module that owns the parameters."""
    while hasattr(model, "module") and not hasattr(model, "decoder"):
        model = model.module
    return model
