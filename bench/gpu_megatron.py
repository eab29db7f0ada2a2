"""GPU check of the Megatron backend: conversion, logprobs and export at a real model size.

Run through ``bench/gpu_megatron.sh`` (torchrun). Per model it:

1. builds a random HF model from a config shaped like a released one (default: Qwen3-0.6B)
   and saves it as safetensors (rank 0);
2. loads it into a TP-sharded Megatron GPTModel from those files (each rank reads its slices);
3. compares per-token logprobs and entropy with the HF model on the same GPU, in float32 with
   TF32 off (the figure to look at is the max abs difference);
4. streams the Megatron weights back as HF tensors in buckets, checks they are bit-identical
   to the checkpoint, and times it; writes an HF folder and reloads it with transformers;
5. (Qwen3) runs ``--train-steps`` GRPO steps through ``MegatronBackend`` (packed micro-batches,
   Megatron DDP/optimizer/schedule) and reports step time, tokens/s and the losses.

It prints one JSON line per model with the figures. ``--dry-run-cpu`` runs the same script
with a tiny config on CPU through the debug-only shim (trainer/backends/megatron/cpu_debug.py); it exists
only to check the script itself where no GPU is available.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

QWEN3_06B = {
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
# Qwen3-VL-2B-shaped language model, shortened to 8 layers, with a 6-block vision tower.
QWEN3VL_SMALL = {
    "text_config": {
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 8,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 5_000_000.0,
            "mrope_section": [24, 20, 20],
            "mrope_interleaved": True,
        },
    },
    "vision_config": {
        "depth": 6,
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_heads": 16,
        "out_hidden_size": 2048,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "deepstack_visual_indexes": [1, 3, 5],
        "num_position_embeddings": 2304,
    },
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "tie_word_embeddings": True,
}
# --dry-run-cpu: the same shapes, shrunk (one set of tiny text sizes for both models).
_TINY_TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2}
TINY_QWEN3 = dict(QWEN3_06B, **_TINY_TEXT, vocab_size=512, num_hidden_layers=2, head_dim=16)
TINY_QWEN3VL = dict(
    QWEN3VL_SMALL,
    text_config=dict(
        QWEN3VL_SMALL["text_config"],
        **_TINY_TEXT,
        num_hidden_layers=3,
        head_dim=32,
        rope_parameters={"rope_type": "default", "rope_theta": 5e5, "mrope_section": [6, 5, 5], "mrope_interleaved": True},
    ),
    vision_config=dict(
        QWEN3VL_SMALL["vision_config"],
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=64,
        deepstack_visual_indexes=[0, 1],
        num_position_embeddings=64,
    ),
)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _now() -> float:
    _sync()
    return time.perf_counter()


def _hf_logprobs(hf: Any, ids: torch.Tensor, **inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        logits = hf(input_ids=ids, **inputs).logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    token = logp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)[:, :-1]
    return token, entropy


def _save_random(config: Any, folder: Path, is_vl: bool) -> None:
    from transformers import AutoModelForCausalLM, Qwen3VLForConditionalGeneration

    torch.manual_seed(0)
    model = (
        Qwen3VLForConditionalGeneration(config)
        if is_vl
        else AutoModelForCausalLM.from_config(config)
    )
    model.save_pretrained(str(folder))


def _image_inputs(config: Any) -> tuple[torch.Tensor, torch.Tensor, int]:
    import numpy as np
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    v = config.vision_config
    proc = Qwen2VLImageProcessorPil(
        patch_size=v.patch_size,
        temporal_patch_size=v.temporal_patch_size,
        merge_size=v.spatial_merge_size,
        min_pixels=64 * 64,
        max_pixels=256 * 256,
    )
    pixels = (np.random.default_rng(0).random((224, 160, 3)) * 255).astype(np.uint8)
    enc = proc(images=[Image.fromarray(pixels)], return_tensors="pt")
    n_pad = int(enc["image_grid_thw"].prod()) // v.spatial_merge_size**2
    return enc["pixel_values"], enc["image_grid_thw"], n_pad


def run_model(
    kind: str, shape: dict[str, Any], args: argparse.Namespace, device: torch.device
) -> dict[str, Any]:
    from relax_gym.trainer.backends.megatron.bridge import iter_hf_buckets, load_hf_weights, save_hf_folder
    from relax_gym.trainer.backends.megatron.config import MegatronConfig, dims_from_hf_config
    from relax_gym.trainer.backends.megatron.logprobs import next_token_logprobs
    from relax_gym.trainer.backends.megatron.model import build_gpt_model
    from relax_gym.trainer.backends.megatron.sources import SafetensorsSource
    from relax_gym.trainer.backends.megatron.vl import Qwen3VLMegatron
    from transformers import (
        AutoModelForCausalLM,
        Qwen3Config,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
    )

    is_vl = kind == "qwen3vl"
    hf_config = Qwen3VLConfig(**shape) if is_vl else Qwen3Config(**shape)
    cfg = MegatronConfig(tensor_parallel_size=args.tp, export_bucket_mb=args.bucket_mb)
    rank = dist.get_rank()
    tmp = Path(args.workdir) / kind
    if rank == 0:
        tmp.mkdir(parents=True, exist_ok=True)
        _save_random(hf_config, tmp / "hf", is_vl)
    dist.barrier()

    figures: dict[str, Any] = {"model": kind, "tp": args.tp, "device": str(device)}
    t0 = _now()
    if is_vl:
        model = Qwen3VLMegatron(hf_config, cfg).eval()
        model.load_hf(SafetensorsSource(tmp / "hf"))
        gpt, dims = model.language_model, model.dims
    else:
        dims = dims_from_hf_config(hf_config)
        gpt = model = build_gpt_model(dims, cfg).eval()
        load_hf_weights(gpt, dims, SafetensorsSource(tmp / "hf"))
    figures["megatron_load_s"] = round(_now() - t0, 3)
    figures["params_per_rank"] = sum(p.numel() for p in model.parameters())

    gen = torch.Generator().manual_seed(1)
    seq = args.seq_len
    inputs: dict[str, Any] = {}
    if is_vl:
        pixel_values, grid, n_pad = _image_inputs(hf_config)
        text = torch.randint(0, 150000, (seq,), generator=gen).tolist()
        ids = torch.tensor(
            [
                text[:8]
                + [hf_config.vision_start_token_id]
                + [hf_config.image_token_id] * n_pad
                + [hf_config.vision_end_token_id]
                + text[8:]
            ]
        )
        inputs = {"pixel_values": pixel_values.to(device), "image_grid_thw": grid.to(device)}
        figures["image_tokens"] = n_pad
    else:
        ids = torch.randint(0, dims.vocab_size, (args.batch, seq), generator=gen)
    ids = ids.to(device)
    figures["tokens"] = int(ids.numel())

    with torch.no_grad():
        t0 = _now()
        if is_vl:
            logits = model(ids, **inputs)
        else:
            logits = gpt(ids, torch.arange(ids.shape[1], device=device).expand_as(ids), None)
        lp, ent = next_token_logprobs(logits, ids, with_entropy=True)
        figures["megatron_forward_s"] = round(_now() - t0, 3)
    del logits

    hf_cls = Qwen3VLForConditionalGeneration if is_vl else AutoModelForCausalLM
    hf = hf_cls.from_pretrained(str(tmp / "hf"), dtype=torch.float32).to(device).eval()
    if is_vl:
        inputs["mm_token_type_ids"] = (ids == hf_config.image_token_id).int()
    ref_lp, ref_ent = _hf_logprobs(hf, ids, **inputs)
    assert ent is not None
    figures["logprob_max_abs_diff"] = float((lp - ref_lp).abs().max())
    figures["logprob_mean_abs_diff"] = float((lp - ref_lp).abs().mean())
    figures["entropy_max_abs_diff"] = float((ent - ref_ent).abs().max())
    state = {k: v for k, v in hf.state_dict().items()}
    del hf

    t0 = _now()
    identical, n_tensors, n_bytes, n_buckets = True, 0, 0, 0
    for bucket in iter_hf_buckets(gpt, dims, bucket_bytes=int(args.bucket_mb * 2**20)):
        n_buckets += 1
        for name, tensor in bucket:
            identical &= torch.equal(tensor, state[name])
            n_tensors += 1
            n_bytes += tensor.numel() * tensor.element_size()
    export_s = _now() - t0
    figures.update(
        export_s=round(export_s, 3),
        export_gb_per_s=round(n_bytes / export_s / 1e9, 2),
        export_buckets=n_buckets,
        export_tensors=n_tensors,
        roundtrip_bit_identical=bool(identical),
    )
    extra = model.vision_hf_tensors() if is_vl else None
    t0 = _now()
    written = save_hf_folder(
        gpt,
        dims,
        hf_config,
        tmp / "export",
        bucket_bytes=int(args.bucket_mb * 2**20),
        extra_tensors=extra,
    )
    figures["save_hf_folder_s"] = round(_now() - t0, 3)
    dist.barrier()
    if written is not None:
        again = hf_cls.from_pretrained(str(written), dtype=torch.float32)
        figures["export_reload_identical"] = all(
            torch.equal(v.cpu(), state[k].cpu()) for k, v in again.state_dict().items()
        )
    if torch.cuda.is_available():
        figures["peak_gpu_mem_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 2)
    return figures


def run_training(args: argparse.Namespace) -> dict[str, Any]:
    """GRPO steps through MegatronBackend on the Qwen3 checkpoint saved by ``run_model``."""
    from relax_gym.trainer.algorithms import AlgorithmConfig
    from relax_gym.trainer.backends.base import OptimizerSettings, PolicyObjective, SequenceBatch
    from relax_gym.trainer.backends.megatron.backend import MegatronBackend

    backend = MegatronBackend(
        Path(args.workdir) / "qwen3" / "hf",
        megatron={"tensor_parallel_size": args.tp, "params_dtype": args.train_dtype},
        micro_batch_size=args.train_micro_batch,
        optimizer=OptimizerSettings(lr=1e-5),
    )
    gen = torch.Generator().manual_seed(2)
    n_seq, vocab = args.train_seqs, backend.dims.vocab_size
    lengths = torch.randint(args.seq_len // 2, args.seq_len + 1, (n_seq,), generator=gen).tolist()
    ids = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]
    masks = [[0] * (n // 4) + [1] * (n - n // 4) for n in lengths]
    advantages = [torch.full((n,), 1.0 if i % 2 else -1.0) for i, n in enumerate(lengths)]
    batch = SequenceBatch(input_ids=ids, loss_mask=masks, advantages=advantages)
    t0 = _now()
    batch.old_logprobs = backend.compute_logprobs(batch).logprobs
    logprob_s = _now() - t0
    objective = PolicyObjective(AlgorithmConfig())
    losses, times = [], []
    for _ in range(args.train_steps):
        t0 = _now()
        losses.append(backend.train_step(batch, objective)["loss"])
        times.append(_now() - t0)
    tokens = sum(lengths)
    steady = sorted(times[1:] or times)[len(times[1:] or times) // 2]
    figures = {
        "model": "qwen3-train",
        "tp": args.tp,
        "dtype": args.train_dtype,
        "seqs": n_seq,
        "tokens": tokens,
        "micro_batch": args.train_micro_batch,
        "logprob_pass_s": round(logprob_s, 3),
        "train_step_s_median": round(steady, 3),
        "train_tokens_per_s": round(tokens / steady, 1),
        "losses": [round(x, 6) for x in losses],
        "pass": bool(losses[-1] < losses[0]),
    }
    if torch.cuda.is_available():
        figures["peak_gpu_mem_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 2)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=int(os.environ.get("WORLD_SIZE", "1")))
    parser.add_argument("--models", default="qwen3,qwen3vl")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--bucket-mb", type=float, default=256.0)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--train-steps", type=int, default=4, help="GRPO steps (0: skip)")
    parser.add_argument("--train-seqs", type=int, default=16)
    parser.add_argument("--train-micro-batch", type=int, default=4)
    parser.add_argument("--train-dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument(
        "--tol",
        type=float,
        default=1e-4,
        help="max |logprob diff| accepted (exit 1 above it or on any mismatch)",
    )
    parser.add_argument(
        "--dry-run-cpu",
        action="store_true",
        help="check this script on CPU with tiny configs (test shim; no figures)",
    )
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    if args.dry_run_cpu:
        from relax_gym.trainer.backends.megatron.cpu_debug import megatron_on_cpu

        shapes = {"qwen3": TINY_QWEN3, "qwen3vl": TINY_QWEN3VL}
        args.seq_len, args.batch = min(args.seq_len, 24), min(args.batch, 2)
        args.train_seqs = min(args.train_seqs, 6)
        dist.init_process_group("gloo")
        device = torch.device("cpu")
        shim: Any = megatron_on_cpu()
    else:
        if not torch.cuda.is_available():
            raise SystemExit(
                "no CUDA device: this check needs a GPU (use --dry-run-cpu to test the script)"
            )
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        shapes = {"qwen3": QWEN3_06B, "qwen3vl": QWEN3VL_SMALL}
        dist.init_process_group("nccl")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        device = torch.device("cuda", torch.cuda.current_device())
        shim = contextlib.nullcontext()

    from relax_gym.trainer.backends.megatron.config import MegatronConfig
    from relax_gym.trainer.backends.megatron.model import destroy_model_parallel, init_model_parallel

    workdir = args.workdir
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gpu_megatron_") as default_dir, shim:
        holder = [workdir or default_dir]  # every rank uses rank 0's folder
        dist.broadcast_object_list(holder, src=0)
        args.workdir = holder[0]
        init_model_parallel(MegatronConfig(tensor_parallel_size=args.tp))
        for kind in args.models.split(","):
            figures = run_model(kind, shapes[kind], args, device)
            ok = (
                figures["roundtrip_bit_identical"]
                and figures["logprob_max_abs_diff"] <= args.tol
                and figures.get("export_reload_identical", True)
            )
            figures["pass"] = bool(ok)
            if not ok:
                failed.append(kind)
            if dist.get_rank() == 0:
                print(json.dumps(figures), flush=True)
        if args.train_steps > 0 and "qwen3" in args.models.split(","):
            destroy_model_parallel()  # the backend sets up its own groups
            figures = run_training(args)
            if not figures["pass"]:
                failed.append("qwen3-train")
            if dist.get_rank() == 0:
                print(json.dumps(figures), flush=True)
        destroy_model_parallel()
        dist.barrier()
    dist.destroy_process_group()
    if failed:
        raise SystemExit(f"gpu_megatron: check failed for {failed}")


if __name__ == "__main__":
    main()
