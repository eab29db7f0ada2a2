"""Name and layout map between Hugging Face Qwen3 tensors and Megatron GPTModel parameters.

Every Megatron parameter corresponds to one ``ParamMap``: its Megatron name (with the
*global* layer index), the HF tensor(s) it is built from, and how the HF tensors are fused and
split over tensor-parallel (TP) ranks. The functions here are pure tensor code: they slice an
HF tensor into one rank's shard (load) and merge all ranks' shards back into HF tensors
(export). Fusion and splitting are pure data movement, so a round trip is bit-identical.

Layouts (``tp`` ranks, ``r`` = this rank):

- ``replicated``: RMSNorm weights; every rank holds the whole tensor.
- ``vocab``: rows split in ``tp`` contiguous chunks (embedding, output layer).
- ``row``: columns split in ``tp`` chunks (attention ``o_proj``, MLP ``down_proj``).
- ``qkv``: Megatron fuses q, k, v per key/value group -- for each group ``g``:
  ``[q heads of g (heads_per_group * head_dim rows); k_g (head_dim); v_g (head_dim)]`` --
  and each rank owns a contiguous ``1/tp`` slice of that fused matrix (so with more ranks than
  groups, several ranks share a group and Megatron all-gathers inside attention).
- ``gate_up``: ``linear_fc1`` of rank ``r`` is ``[gate_proj rows of r; up_proj rows of r]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from relax_gym.trainer.backends.megatron.config import MegatronBridgeError, ModelDims
from relax_gym.trainer.backends.megatron.sources import TensorSource

Layout = Literal["replicated", "vocab", "row", "qkv", "gate_up"]


@dataclass(frozen=True)
class ParamMap:
    """One Megatron parameter and the HF tensors it comes from."""

    megatron: str
    hf: tuple[str, ...]
    layout: Layout
    export: bool = True
    """False for a copy that must not be exported twice (tied output layer on the last stage)."""


def layer_maps(dims: ModelDims, layer: int) -> list[ParamMap]:
    """The parameters of decoder layer ``layer`` (a global index)."""
    hf = f"{dims.hf_prefix}layers.{layer}."
    mg = f"decoder.layers.{layer}."
    return [
        ParamMap(mg + "input_layernorm.weight", (hf + "input_layernorm.weight",), "replicated"),
        ParamMap(
            mg + "self_attention.linear_qkv.weight",
            (
                hf + "self_attn.q_proj.weight",
                hf + "self_attn.k_proj.weight",
                hf + "self_attn.v_proj.weight",
            ),
            "qkv",
        ),
        ParamMap(
            mg + "self_attention.q_layernorm.weight",
            (hf + "self_attn.q_norm.weight",),
            "replicated",
        ),
        ParamMap(
            mg + "self_attention.k_layernorm.weight",
            (hf + "self_attn.k_norm.weight",),
            "replicated",
        ),
        ParamMap(
            mg + "self_attention.linear_proj.weight", (hf + "self_attn.o_proj.weight",), "row"
        ),
        ParamMap(
            mg + "pre_mlp_layernorm.weight", (hf + "post_attention_layernorm.weight",), "replicated"
        ),
        ParamMap(
            mg + "mlp.linear_fc1.weight",
            (hf + "mlp.gate_proj.weight", hf + "mlp.up_proj.weight"),
            "gate_up",
        ),
        ParamMap(mg + "mlp.linear_fc2.weight", (hf + "mlp.down_proj.weight",), "row"),
    ]


def embedding_map(dims: ModelDims) -> ParamMap:
    return ParamMap(
        "embedding.word_embeddings.weight", (dims.hf_prefix + "embed_tokens.weight",), "vocab"
    )


def final_norm_map(dims: ModelDims) -> ParamMap:
    return ParamMap(
        "decoder.final_layernorm.weight", (dims.hf_prefix + "norm.weight",), "replicated"
    )


def output_map(dims: ModelDims) -> ParamMap:
    """The LM head; with tied embeddings it is read from ``embed_tokens`` and never exported."""
    if dims.tied_embeddings:
        return ParamMap(
            "output_layer.weight", (dims.hf_prefix + "embed_tokens.weight",), "vocab", export=False
        )
    return ParamMap("output_layer.weight", ("lm_head.weight",), "vocab")


def all_maps(dims: ModelDims) -> list[ParamMap]:
    """Every parameter of the full (unsplit) model, in HF export order."""
    maps = [embedding_map(dims)]
    for layer in range(dims.num_layers):
        maps.extend(layer_maps(dims, layer))
    maps.append(final_norm_map(dims))
    maps.append(output_map(dims))
    return maps


def hf_shapes(pm: ParamMap, dims: ModelDims) -> list[tuple[str, tuple[int, ...]]]:
    """Full HF shapes of the tensors ``pm`` exports, from the config alone."""
    h, hd = dims.hidden_size, dims.head_dim
    if pm.layout == "replicated":
        size = hd if ("q_layernorm" in pm.megatron or "k_layernorm" in pm.megatron) else h
        return [(pm.hf[0], (size,))]
    if pm.layout == "vocab":
        return [(pm.hf[0], (dims.vocab_size, h))]
    if pm.layout == "qkv":
        return [
            (pm.hf[0], (dims.num_heads * hd, h)),
            (pm.hf[1], (dims.num_kv_heads * hd, h)),
            (pm.hf[2], (dims.num_kv_heads * hd, h)),
        ]
    if pm.layout == "gate_up":
        return [(pm.hf[0], (dims.ffn_hidden_size, h)), (pm.hf[1], (dims.ffn_hidden_size, h))]
    if pm.layout == "row":
        if "linear_proj" in pm.megatron:
            return [(pm.hf[0], (h, dims.num_heads * hd))]
        return [(pm.hf[0], (h, dims.ffn_hidden_size))]
    raise MegatronBridgeError(f"no HF shape rule for layout {pm.layout!r}")


def _chunk(total: int, rank: int, tp: int) -> slice:
    size = total // tp
    return slice(rank * size, (rank + 1) * size)


def _qkv_shard(
    pm: ParamMap, source: TensorSource, dims: ModelDims, rank: int, tp: int
) -> torch.Tensor:
    hd, hpg = dims.head_dim, dims.heads_per_group
    group_rows = (hpg + 2) * hd
    total = dims.num_kv_heads * group_rows
    start, stop = rank * total // tp, (rank + 1) * total // tp
    g0, g1 = start // group_rows, -(-stop // group_rows)
    q = source.read(pm.hf[0], rows=slice(g0 * hpg * hd, g1 * hpg * hd))
    k = source.read(pm.hf[1], rows=slice(g0 * hd, g1 * hd))
    v = source.read(pm.hf[2], rows=slice(g0 * hd, g1 * hd))
    n = g1 - g0
    fused = torch.cat(
        [q.view(n, hpg * hd, -1), k.view(n, hd, -1), v.view(n, hd, -1)], dim=1
    ).reshape(n * group_rows, -1)
    return fused[start - g0 * group_rows : stop - g0 * group_rows].contiguous()


def shard_from_hf(
    pm: ParamMap, source: TensorSource, dims: ModelDims, rank: int, tp: int
) -> torch.Tensor:
    """This TP rank's shard of ``pm``, reading only the slices it needs from ``source``."""
    if pm.layout == "replicated":
        return source.read(pm.hf[0])
    if pm.layout == "vocab":
        rows = source.shape(pm.hf[0])[0]
        return source.read(pm.hf[0], rows=_chunk(rows, rank, tp))
    if pm.layout == "row":
        cols = source.shape(pm.hf[0])[1]
        return source.read(pm.hf[0], cols=_chunk(cols, rank, tp))
    if pm.layout == "gate_up":
        own = _chunk(dims.ffn_hidden_size, rank, tp)
        return torch.cat([source.read(pm.hf[0], rows=own), source.read(pm.hf[1], rows=own)])
    if pm.layout == "qkv":
        return _qkv_shard(pm, source, dims, rank, tp)
    raise MegatronBridgeError(f"unknown layout {pm.layout!r}")


def hf_from_shards(
    pm: ParamMap, shards: list[torch.Tensor], dims: ModelDims
) -> list[tuple[str, torch.Tensor]]:
    """Merge all TP ranks' shards of ``pm`` (in rank order) back into HF tensors."""
    if pm.layout == "replicated":
        return [(pm.hf[0], shards[0])]
    if pm.layout == "vocab":
        return [(pm.hf[0], torch.cat(shards, dim=0))]
    if pm.layout == "row":
        return [(pm.hf[0], torch.cat(shards, dim=1))]
    if pm.layout == "gate_up":
        halves = [s.chunk(2, dim=0) for s in shards]
        gate = torch.cat([g for g, _ in halves], dim=0)
        up = torch.cat([u for _, u in halves], dim=0)
        return [(pm.hf[0], gate), (pm.hf[1], up)]
    if pm.layout == "qkv":
        hd, hpg = dims.head_dim, dims.heads_per_group
        fused = torch.cat(shards, dim=0)
        grouped = fused.view(dims.num_kv_heads, (hpg + 2) * hd, -1)
        q, k, v = torch.split(grouped, [hpg * hd, hd, hd], dim=1)
        width = fused.shape[-1]
        return [
            (pm.hf[0], q.reshape(-1, width)),
            (pm.hf[1], k.reshape(-1, width)),
            (pm.hf[2], v.reshape(-1, width)),
        ]
    raise MegatronBridgeError(f"unknown layout {pm.layout!r}")
