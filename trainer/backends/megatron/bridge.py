"""Move weights between Hugging Face checkpoints and a live (TP/PP-sharded) Megatron GPTModel.

Load: every rank copies into its own parameters exactly the shard it owns, reading only that
slice from the source (``sources.py``).

Export: ``iter_hf_buckets`` is a generator that all ranks of one model-parallel group (TP x PP)
iterate in lockstep. Per parameter, the owning pipeline stage all-gathers the TP shards and
rebuilds the HF tensors; with PP > 1 the owner broadcasts them to the other stages. Tensors are
yielded in buckets of bounded bytes, so besides its own shards a rank only ever holds one
bucket (plus the parameter being gathered) -- never a second full copy of the model. Weight
sync sends each bucket to the engines; ``save_hf_folder`` writes one safetensors file per
bucket.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from relax_gym.trainer.backends.megatron.config import MegatronBridgeError, ModelDims
from relax_gym.trainer.backends.megatron.layout import (
    ParamMap,
    embedding_map,
    final_norm_map,
    hf_from_shards,
    hf_shapes,
    layer_maps,
    output_map,
    shard_from_hf,
)
from relax_gym.trainer.backends.megatron.model import unwrap_model
from relax_gym.trainer.backends.megatron.sources import TensorSource

Bucket = list[tuple[str, torch.Tensor]]


def local_param_maps(model: Any, dims: ModelDims) -> dict[str, ParamMap]:
    """Local Megatron parameter name -> its ``ParamMap`` (global layer index), for this stage."""
    gpt = unwrap_model(model)
    maps: dict[str, ParamMap] = {}
    if getattr(gpt, "pre_process", False):
        maps["embedding.word_embeddings.weight"] = embedding_map(dims)
    for local_idx, layer in enumerate(gpt.decoder.layers):
        global_idx = layer.layer_number - 1
        for pm in layer_maps(dims, global_idx):
            local = pm.megatron.replace(
                f"decoder.layers.{global_idx}.", f"decoder.layers.{local_idx}.", 1
            )
            maps[local] = pm
    if getattr(gpt, "post_process", False):
        maps["decoder.final_layernorm.weight"] = final_norm_map(dims)
        params = dict(gpt.named_parameters())
        if "output_layer.weight" in params:
            maps["output_layer.weight"] = output_map(dims)
    return maps


def _tp() -> tuple[int, int, Any]:
    from megatron.core import parallel_state

    return (
        parallel_state.get_tensor_model_parallel_rank(),
        parallel_state.get_tensor_model_parallel_world_size(),
        parallel_state.get_tensor_model_parallel_group(),
    )


@torch.no_grad()
def load_hf_weights(model: Any, dims: ModelDims, source: TensorSource) -> int:
    """Copy this rank's shard of every parameter from ``source``; returns tensors loaded.

    Raises ``MegatronBridgeError`` when a parameter has no mapping, a checkpoint tensor is
    missing, or a shard's shape differs from the parameter's.
    """
    gpt = unwrap_model(model)
    rank, tp, _ = _tp()
    maps = local_param_maps(gpt, dims)
    params = dict(gpt.named_parameters())
    unmapped = sorted(set(params) - set(maps))
    if unmapped:
        raise MegatronBridgeError(f"Megatron parameters without an HF mapping: {unmapped}")
    for name, pm in maps.items():
        shard = shard_from_hf(pm, source, dims, rank, tp)
        param = params[name]
        if tuple(shard.shape) != tuple(param.shape):
            raise MegatronBridgeError(
                f"{name}: checkpoint shard {tuple(shard.shape)} != parameter {tuple(param.shape)}"
                f" (tp rank {rank}/{tp}, from {pm.hf})"
            )
        param.copy_(shard.to(device=param.device, dtype=param.dtype))
    return len(maps)


def _export_plan(model: Any, dims: ModelDims) -> list[tuple[ParamMap, int, str | None]]:
    """Exported ``(map, owner pipeline rank, local name on the owner)`` in HF order.

    Ownership is exchanged over the PP group, so uneven pipeline splits work too.
    """
    from megatron.core import parallel_state

    local = {pm.megatron: name for name, pm in local_param_maps(model, dims).items() if pm.export}
    pp = parallel_state.get_pipeline_model_parallel_world_size()
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    owned: list[list[str]] = [[] for _ in range(pp)]
    if pp > 1:
        dist.all_gather_object(
            owned, sorted(local), group=parallel_state.get_pipeline_model_parallel_group()
        )
    else:
        owned[0] = sorted(local)
    owner = {name: stage for stage, names in enumerate(owned) for name in names}
    order = [embedding_map(dims)]
    for layer in range(dims.num_layers):
        order.extend(layer_maps(dims, layer))
    order += [final_norm_map(dims), output_map(dims)]
    plan = []
    for pm in order:
        if not pm.export:
            continue
        if pm.megatron not in owner:
            raise MegatronBridgeError(f"no pipeline stage owns {pm.megatron}")
        stage = owner[pm.megatron]
        plan.append((pm, stage, local.get(pm.megatron) if stage == pp_rank else None))
    return plan


def plan_bucket_sizes(sizes: list[int], limit: int) -> list[int]:
    """Greedy split of tensors (bytes, in order) into buckets of at most ``limit`` bytes.

    Returns the number of tensors per bucket. A tensor larger than ``limit`` gets a bucket
    of its own. Both the exporter and ``save_hf_folder`` use this, so file names are known
    before the first tensor is gathered.
    """
    counts: list[int] = []
    used = 0
    for size in sizes:
        if counts and used + size <= limit:
            counts[-1] += 1
            used += size
        else:
            counts.append(1)
            used = size
    return counts


def export_specs(
    dims: ModelDims, plan: list[tuple[ParamMap, int, str | None]]
) -> list[tuple[str, tuple[int, ...]]]:
    """The ``(HF name, shape)`` of every exported tensor, in yield order."""
    return [spec for pm, _, _ in plan for spec in hf_shapes(pm, dims)]


@torch.no_grad()
def iter_hf_buckets(
    model: Any,
    dims: ModelDims,
    *,
    bucket_bytes: int,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Iterator[Bucket]:
    """Yield the model as HF-named full tensors, in buckets of at most ``bucket_bytes``.

    Collective: every rank of the TP x PP group must iterate it to the end together. Every
    such rank receives the same buckets. ``dtype`` casts on the way out (default: the
    parameters' dtype); ``device`` is where yielded tensors live (default: the parameters').
    """
    from megatron.core import parallel_state

    gpt = unwrap_model(model)
    params = dict(gpt.named_parameters())
    ref = next(iter(params.values()))
    out_dtype = dtype or ref.dtype
    out_device = torch.device(device) if device is not None else ref.device
    _, tp, tp_group = _tp()
    pp = parallel_state.get_pipeline_model_parallel_world_size()
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    pp_group = parallel_state.get_pipeline_model_parallel_group() if pp > 1 else None
    elem = torch.tensor([], dtype=out_dtype).element_size()

    plan = _export_plan(gpt, dims)
    specs = export_specs(dims, plan)
    counts = plan_bucket_sizes([elem * _numel(shape) for _, shape in specs], bucket_bytes)
    bucket: Bucket = []
    spec_idx = 0
    bucket_idx = 0
    for pm, stage, local_name in plan:
        if stage == pp_rank:
            assert local_name is not None
            shard = params[local_name].detach()
            if pm.layout == "replicated" or tp == 1:
                shards = [shard]
            else:
                shards = [torch.empty_like(shard) for _ in range(tp)]
                dist.all_gather(shards, shard.contiguous(), group=tp_group)
            tensors = [
                (n, t.to(device=out_device, dtype=out_dtype).clone().contiguous())
                for n, t in hf_from_shards(pm, shards, dims)
            ]
        else:
            tensors = [
                (n, torch.empty(shape, dtype=out_dtype, device=out_device))
                for n, shape in hf_shapes(pm, dims)
            ]
        if pp_group is not None:
            src = dist.get_global_rank(pp_group, stage)
            for _, t in tensors:
                comm = t if t.device == ref.device else t.to(ref.device)
                dist.broadcast(comm, src=src, group=pp_group)
                if comm is not t:
                    t.copy_(comm)
        for name, tensor in tensors:
            if name != specs[spec_idx][0]:
                raise MegatronBridgeError(f"export order drifted at {name} vs {specs[spec_idx][0]}")
            spec_idx += 1
            bucket.append((name, tensor))
            if len(bucket) == counts[bucket_idx]:
                yield bucket
                bucket, bucket_idx = [], bucket_idx + 1
    if bucket:
        raise MegatronBridgeError("export ended with a partial bucket; plan and yield disagree")


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def save_hf_folder(
    model: Any,
    dims: ModelDims,
    hf_config: Any,
    out_dir: str | Path,
    *,
    bucket_bytes: int,
    dtype: torch.dtype | None = None,
    extra_tensors: Bucket | None = None,
    write: bool | None = None,
) -> Path | None:
    """Export an HF model folder (``config.json`` + sharded safetensors + index).

    Collective like ``iter_hf_buckets``. Only the writer rank (by default global rank 0 of the
    first data-parallel replica: TP, PP and DP rank 0) touches the disk and gets the path back.
    ``extra_tensors`` (e.g. a vision tower's HF tensors) go into a final shard.
    """
    from megatron.core import parallel_state
    from safetensors.torch import save_file

    if write is None:
        write = (
            parallel_state.get_tensor_model_parallel_rank() == 0
            and parallel_state.get_pipeline_model_parallel_rank() == 0
            and parallel_state.get_data_parallel_rank() == 0
        )
    out = Path(out_dir)
    gpt = unwrap_model(model)
    out_dtype = dtype or next(gpt.parameters()).dtype
    plan = _export_plan(gpt, dims)
    specs = export_specs(dims, plan)
    elem = torch.tensor([], dtype=out_dtype).element_size()
    n_files = len(plan_bucket_sizes([elem * _numel(s) for _, s in specs], bucket_bytes))
    n_files += 1 if extra_tensors else 0
    weight_map: dict[str, str] = {}
    total = 0
    if write:
        out.mkdir(parents=True, exist_ok=True)

    def _write(idx: int, bucket: Bucket) -> None:
        nonlocal total
        fname = f"model-{idx + 1:05d}-of-{n_files:05d}.safetensors"
        tensors = {name: t.detach().to("cpu").contiguous() for name, t in bucket}
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        for name, t in tensors.items():
            weight_map[name] = fname
            total += t.numel() * t.element_size()

    idx = 0
    for bucket in iter_hf_buckets(
        gpt, dims, bucket_bytes=bucket_bytes, dtype=out_dtype, device="cpu"
    ):
        if write:
            _write(idx, bucket)
        idx += 1
    if not write:
        return None
    if extra_tensors:
        _write(
            idx, [(n, t.to(out_dtype) if t.is_floating_point() else t) for n, t in extra_tensors]
        )
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    hf_config.save_pretrained(str(out))
    return out
