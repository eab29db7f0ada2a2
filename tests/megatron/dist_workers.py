"""Multi-process (gloo, 127.0.0.1) harness and the per-rank checks of the megatron tests.

``spawn(check, world_size, **kwargs)`` starts ``world_size`` fresh processes, initialises
``torch.distributed`` over gloo and Megatron's parallel groups inside the CPU shim, runs
``check(**kwargs)`` on every rank and returns each rank's result dict. Each check builds or
loads the HF reference itself, so parent and children share nothing but files.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

Result = dict[str, Any]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child(
    rank: int,
    world: int,
    port: int,
    check: Callable[..., Result],
    parallel: dict[str, int],
    kwargs: dict[str, Any],
    results: Any,
) -> None:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        from relax_gym.trainer.backends.megatron.config import MegatronConfig
        from relax_gym.trainer.backends.megatron.model import destroy_model_parallel, init_model_parallel

        from tests.megatron.cpu_shim import megatron_on_cpu

        dist.init_process_group("gloo", rank=rank, world_size=world)
        with megatron_on_cpu():
            cfg = MegatronConfig(**parallel)
            init_model_parallel(cfg)
            out = check(cfg=cfg, **kwargs)
            destroy_model_parallel()
        dist.destroy_process_group()
        results.put((rank, out, None))
    except BaseException:  # noqa: BLE001 - report any failure to the parent
        results.put((rank, None, traceback.format_exc()))


def spawn(
    check: Callable[..., Result],
    world_size: int,
    *,
    timeout: float = 150.0,
    parallel: dict[str, int] | None = None,
    **kwargs: Any,
) -> list[Result]:
    """Run ``check`` on ``world_size`` gloo ranks; return results by rank or raise."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(
            target=_child, args=(r, world_size, port, check, parallel or {}, kwargs, results)
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    collected: dict[int, Result] = {}
    errors: list[str] = []
    try:
        for _ in range(world_size):
            rank, out, err = results.get(timeout=timeout)
            if err:
                errors.append(f"rank {rank}:\n{err}")
                break
            collected[rank] = out
    except queue.Empty:
        errors.append(f"timed out after {timeout}s waiting for ranks")
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 0.1)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise AssertionError("\n".join(errors))
    return [collected[r] for r in range(world_size)]


# --------------------------------------------------------------------------------------------
# Per-rank checks (module-level so spawn can pickle them by name).


def _hf_logprobs(
    hf_model: Any, ids: torch.Tensor, **inputs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        logits = hf_model(input_ids=ids, **inputs).logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    token = logp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)[:, :-1]
    return token, entropy


def qwen3_check(
    cfg: Any, model_dir: str, export_dir: str, bucket_bytes: int, from_state_dict: bool = False
) -> Result:
    """Load an HF Qwen3 into Megatron; compare logprobs/entropy/grads; export and re-import."""
    from megatron.core import parallel_state as ps
    from relax_gym.trainer.backends.megatron.bridge import iter_hf_buckets, load_hf_weights, save_hf_folder
    from relax_gym.trainer.backends.megatron.config import dims_from_hf_config
    from relax_gym.trainer.backends.megatron.logprobs import next_token_logprobs, vocab_parallel_logprobs
    from relax_gym.trainer.backends.megatron.model import build_gpt_model
    from relax_gym.trainer.backends.megatron.sources import SafetensorsSource, StateDictSource
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_config = AutoConfig.from_pretrained(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    dims = dims_from_hf_config(hf_config)
    model = build_gpt_model(dims, cfg).eval()
    source = StateDictSource(hf.state_dict()) if from_state_dict else SafetensorsSource(model_dir)
    loaded = load_hf_weights(model, dims, source)

    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, dims.vocab_size, (2, 16), generator=gen)
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    ref_lp, ref_ent = _hf_logprobs(hf, ids)
    out: Result = {"loaded": loaded}
    if ps.get_pipeline_model_parallel_world_size() == 1:  # PP forward needs the schedule
        with torch.no_grad():
            logits = model(ids, positions, None)
        lp, ent = next_token_logprobs(logits, ids, with_entropy=True)
        assert ent is not None
        out["local_vocab"] = logits.shape[-1]
        out["logprob_max_diff"] = float((lp - ref_lp).abs().max())
        out["entropy_max_diff"] = float((ent - ref_ent).abs().max())
        # Backward of the vocab-parallel logprob: d(sum logp)/d(local logits) vs autograd on
        # the full logits, restricted to this rank's vocabulary slice.
        leaf = logits.detach().requires_grad_(True)
        lpg, entg = vocab_parallel_logprobs(leaf[:, :-1], ids[:, 1:], with_entropy=True)
        assert entg is not None
        (lpg.sum() + 0.5 * entg.sum()).backward()
        full = [torch.empty_like(logits) for _ in range(ps.get_tensor_model_parallel_world_size())]
        dist.all_gather(full, logits.contiguous(), group=ps.get_tensor_model_parallel_group())
        ref_leaf = torch.cat(full, dim=-1).requires_grad_(True)
        ref_logp = torch.log_softmax(ref_leaf[:, :-1], dim=-1)
        ref_obj = (
            ref_logp.gather(-1, ids[:, 1:, None]).sum() - 0.5 * (ref_logp.exp() * ref_logp).sum()
        )
        ref_obj.backward()
        rank = ps.get_tensor_model_parallel_rank()
        v = logits.shape[-1]
        ref_grad = ref_leaf.grad[..., rank * v : (rank + 1) * v]
        assert leaf.grad is not None
        out["grad_max_diff"] = float((leaf.grad - ref_grad).abs().max())

    state = hf.state_dict()
    skip = {"lm_head.weight"} if dims.tied_embeddings else set()
    seen: list[str] = []
    identical = True
    bucket_sizes: list[tuple[int, int]] = []
    for bucket in iter_hf_buckets(model, dims, bucket_bytes=bucket_bytes):
        bucket_sizes.append((len(bucket), sum(t.numel() * t.element_size() for _, t in bucket)))
        for name, tensor in bucket:
            seen.append(name)
            identical &= torch.equal(tensor, state[name]) and tensor.dtype == state[name].dtype
    out["roundtrip_identical"] = bool(identical)
    out["exported_names_match"] = sorted(seen) == sorted(set(state) - skip)
    out["no_duplicates"] = len(seen) == len(set(seen))
    out["bucket_sizes"] = bucket_sizes

    written = save_hf_folder(model, dims, hf_config, export_dir, bucket_bytes=bucket_bytes)
    dist.barrier()
    if written is not None:
        again = AutoModelForCausalLM.from_pretrained(str(written), dtype=torch.float32).eval()
        again_state = again.state_dict()
        out["export_reload_identical"] = all(
            torch.equal(again_state[k], v) for k, v in state.items()
        )
        out["export_files"] = sorted(p.name for p in Path(written).glob("*.safetensors"))

    # Bad checkpoints fail loudly and name the tensor (run last: a failed load is partial).
    from relax_gym.trainer.backends.megatron.config import MegatronBridgeError

    layer0 = f"{dims.hf_prefix}layers.0."
    missing = {k: v for k, v in state.items() if k != layer0 + "mlp.up_proj.weight"}
    wrong = dict(state, **{layer0 + "input_layernorm.weight": torch.ones(3)})
    for key, bad in (("missing_error", missing), ("shape_error", wrong)):
        try:
            load_hf_weights(model, dims, StateDictSource(bad))
            out[key] = None
        except MegatronBridgeError as exc:
            out[key] = str(exc)
    return out


def qwen3vl_check(
    cfg: Any, model_dir: str, image_path: str, export_dir: str, bucket_bytes: int
) -> Result:
    """Load an HF Qwen3-VL into Megatron + HF vision tower; compare logprobs on an image."""
    from PIL import Image
    from relax_gym.trainer.backends.megatron.bridge import iter_hf_buckets, save_hf_folder
    from relax_gym.trainer.backends.megatron.logprobs import next_token_logprobs
    from relax_gym.trainer.backends.megatron.sources import SafetensorsSource
    from relax_gym.trainer.backends.megatron.vl import Qwen3VLMegatron, mrope_position_ids
    from transformers import AutoConfig, Qwen3VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    hf_config = AutoConfig.from_pretrained(model_dir)
    hf = Qwen3VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    vision = hf_config.vision_config
    merge = vision.spatial_merge_size
    processor = Qwen2VLImageProcessorPil(
        patch_size=vision.patch_size,
        temporal_patch_size=vision.temporal_patch_size,
        merge_size=merge,
        min_pixels=32 * 32,
        max_pixels=128 * 128,
    )
    enc = processor(images=[Image.open(image_path).convert("RGB")], return_tensors="pt")
    pixel_values, grid = enc["pixel_values"], enc["image_grid_thw"]
    n_pad = int(grid.prod()) // merge**2
    text_ids = torch.randint(0, 400, (13,), generator=torch.Generator().manual_seed(3)).tolist()
    ids = torch.tensor(
        [
            text_ids[:4]
            + [hf_config.vision_start_token_id]
            + [hf_config.image_token_id] * n_pad
            + [hf_config.vision_end_token_id]
            + text_ids[4:]
        ]
    )
    mm_types = (ids == hf_config.image_token_id).int()
    ref_lp, ref_ent = _hf_logprobs(
        hf, ids, pixel_values=pixel_values, image_grid_thw=grid, mm_token_type_ids=mm_types
    )
    hf_positions, _ = hf.model.get_rope_index(ids, mm_types, grid)

    model = Qwen3VLMegatron(hf_config, cfg).eval()
    out: Result = {"loaded": model.load_hf(SafetensorsSource(model_dir))}
    positions = mrope_position_ids(ids, hf_config.image_token_id, grid, merge)
    out["positions_match_hf"] = bool(torch.equal(positions, hf_positions))
    with torch.no_grad():
        logits = model(ids, pixel_values=pixel_values, image_grid_thw=grid)
        flat = model(
            ids,
            position_ids=torch.arange(ids.shape[1]).expand(3, 1, -1),
            pixel_values=pixel_values,
            image_grid_thw=grid,
        )
    lp, ent = next_token_logprobs(logits, ids, with_entropy=True)
    flat_lp, _ = next_token_logprobs(flat, ids)
    assert ent is not None
    out["n_image_tokens"] = n_pad
    out["logprob_max_diff"] = float((lp - ref_lp).abs().max())
    out["entropy_max_diff"] = float((ent - ref_ent).abs().max())
    out["flat_positions_diff"] = float((flat_lp - ref_lp).abs().max())

    state = hf.state_dict()
    identical = True
    seen = []
    for bucket in iter_hf_buckets(model.language_model, model.dims, bucket_bytes=bucket_bytes):
        for name, tensor in bucket:
            seen.append(name)
            identical &= torch.equal(tensor, state[name])
    for name, tensor in model.vision_hf_tensors():
        seen.append(name)
        identical &= torch.equal(tensor, state[name])
    skip = {"lm_head.weight"} if model.dims.tied_embeddings else set()
    out["roundtrip_identical"] = bool(identical)
    out["exported_names_match"] = sorted(seen) == sorted(set(state) - skip)
    written = save_hf_folder(
        model.language_model,
        model.dims,
        hf_config,
        export_dir,
        bucket_bytes=bucket_bytes,
        extra_tensors=model.vision_hf_tensors(),
    )
    dist.barrier()
    if written is not None:
        again = Qwen3VLForConditionalGeneration.from_pretrained(str(written), dtype=torch.float32)
        again_lp, _ = _hf_logprobs(
            again.eval(),
            ids,
            pixel_values=pixel_values,
            image_grid_thw=grid,
            mm_token_type_ids=mm_types,
        )
        out["export_reload_logprobs_equal"] = bool(torch.equal(again_lp, ref_lp))
    return out


# --------------------------------------------------------------------------------------------
# Backend (training) checks.


def grpo_batch(vocab: int, seed: int = 0) -> Any:
    """A fixed GRPO-style batch: 2 groups of 3 variable-length answers, +-1 advantages."""
    from relax_gym.trainer.backends.base import SequenceBatch

    gen = torch.Generator().manual_seed(seed)
    input_ids, loss_mask, advantages, groups = [], [], [], []
    for g in range(2):
        prompt = torch.randint(0, vocab, (5 + g,), generator=gen).tolist()
        for k, adv in enumerate((1.0, -1.0, 0.5)):
            answer = torch.randint(0, vocab, (4 + 3 * k + g,), generator=gen).tolist()
            input_ids.append(prompt + answer)
            loss_mask.append([0] * len(prompt) + [1] * len(answer))
            advantages.append(torch.full((len(prompt) + len(answer),), adv))
            groups.append(str(g))
    return SequenceBatch(
        input_ids=input_ids, loss_mask=loss_mask, advantages=advantages, group_ids=groups
    )


def backend_check(
    cfg: Any,
    model_dir: str,
    work_dir: str,
    steps: int,
    lr: float,
    micro_batch_size: int,
    compare_torch: bool,
) -> Result:
    """GRPO steps on MegatronBackend: packing vs HF, loss down, DP sync, save/load/continue."""
    import dataclasses

    from megatron.core import parallel_state as ps
    from relax_gym.trainer.algorithms import AlgorithmConfig
    from relax_gym.trainer.backends.base import OptimizerSettings, PolicyObjective
    from relax_gym.trainer.backends.megatron.backend import MegatronBackend
    from transformers import AutoModelForCausalLM

    settings = OptimizerSettings(lr=lr, grad_clip=None)
    backend = MegatronBackend(
        model_dir,
        megatron=cfg,
        micro_batch_size=micro_batch_size,
        logprob_micro_batch_size=micro_batch_size,
        optimizer=settings,
    )
    batch = grpo_batch(backend.dims.vocab_size)
    out: Result = {"dp": ps.get_data_parallel_world_size()}

    # Packed logprobs == HF logprobs of each sequence run alone.
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    first = backend.compute_logprobs(batch, entropy=True)
    diffs = []
    for i, ids in enumerate(batch.input_ids):
        t = torch.tensor([ids])
        ref_lp, ref_ent = _hf_logprobs(hf, t)
        mask = torch.tensor(batch.loss_mask[i][1:], dtype=torch.float32)
        diffs.append(float(((first.logprobs[i][1:] - ref_lp[0]) * mask).abs().max()))
        assert first.entropies is not None
        diffs.append(float(((first.entropies[i][1:] - ref_ent[0]) * mask).abs().max()))
        diffs.append(
            float((first.logprobs[i] * (1 - torch.tensor(batch.loss_mask[i]))).abs().max())
        )
    out["packed_vs_hf_max_diff"] = max(diffs)

    batch.old_logprobs = first.logprobs
    objective = PolicyObjective(AlgorithmConfig())
    losses, norms = [], []
    for step in range(steps):
        if step == steps - 1:
            backend.save_state(Path(work_dir) / "state")
        m = backend.train_step(batch, objective)
        losses.append(m["loss"])
        norms.append(m["grad_norm"])
    out["losses"], out["grad_norms"], out["version"] = losses, norms, backend.version

    # Data-parallel replicas hold identical parameters.
    flat = torch.cat([p.detach().reshape(-1).float() for p in backend.ddp.parameters()])
    if out["dp"] > 1:
        copies = [torch.empty_like(flat) for _ in range(out["dp"])]
        dist.all_gather(copies, flat, group=ps.get_data_parallel_group())
        out["dp_param_max_diff"] = max(float((c - copies[0]).abs().max()) for c in copies)

    # Resume: load the state saved before the last step, redo it: same loss, same weights.
    backend.load_state(Path(work_dir) / "state")
    out["resumed_version"] = backend.version
    out["resumed_loss"] = backend.train_step(batch, objective)["loss"]
    flat_again = torch.cat([p.detach().reshape(-1).float() for p in backend.ddp.parameters()])
    out["resumed_param_max_diff"] = float((flat_again - flat).abs().max())

    # The trained weights export to an HF folder that reproduces the Megatron logprobs.
    trained = backend.compute_logprobs(batch)
    saved = backend.save_pretrained(Path(work_dir) / "hf_out")
    dist.barrier()
    again = AutoModelForCausalLM.from_pretrained(str(saved), dtype=torch.float32).eval()
    export_diff = 0.0
    for i, ids in enumerate(batch.input_ids):
        ref_lp, _ = _hf_logprobs(again, torch.tensor([ids]))
        mask = torch.tensor(batch.loss_mask[i][1:], dtype=torch.float32)
        export_diff = max(
            export_diff, float(((trained.logprobs[i][1:] - ref_lp[0]) * mask).abs().max())
        )
    out["export_logprob_max_diff"] = export_diff

    if compare_torch and dist.get_rank() == 0:
        # The plain-torch backend on the same weights and batch (one micro-batch, one rank).
        from relax_gym.trainer.backends.pytorch import TorchBackend

        ref = TorchBackend(model_dir, micro_batch_size=len(batch), optimizer=settings)
        ref_batch = dataclasses.replace(batch)
        ref_losses, ref_norms = [], []
        for _ in range(2):
            m = ref.train_step(ref_batch, objective)
            ref_losses.append(m["loss"])
            ref_norms.append(m["grad_norm"])
        out["torch_losses"], out["torch_grad_norms"] = ref_losses, ref_norms
    return out


def _isolated_child(
    check: Callable[..., Result], env: dict[str, str], kwargs: dict[str, Any], results: Any
) -> None:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    os.environ.update(env)
    try:
        results.put((0, check(**kwargs), None))
    except BaseException:  # noqa: BLE001 - report any failure to the parent
        results.put((0, None, traceback.format_exc()))


def run_isolated(
    check: Callable[..., Result], *, env: dict[str, str], timeout: float = 150.0, **kwargs: Any
) -> Result:
    """Run ``check`` in one fresh process with ``env`` set and nothing initialised for it."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    proc = ctx.Process(target=_isolated_child, args=(check, env, kwargs, results))
    proc.start()
    try:
        _, out, err = results.get(timeout=timeout)
    except queue.Empty:
        out, err = None, f"timed out after {timeout}s"
    finally:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join()
    if err:
        raise AssertionError(err)
    return out


def vl_backend_check(model_dir: str, image_paths: list[str], work_dir: str) -> Result:
    """Single process, as the training loop makes it: Qwen3-VL batch with images, packed."""
    from PIL import Image
    from relax_gym.trainer.backends.base import NLLObjective, OptimizerSettings, SequenceBatch
    from relax_gym.trainer.backends.megatron.backend import MegatronBackend
    from transformers import AutoConfig, Qwen3VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    hf_config = AutoConfig.from_pretrained(model_dir)
    vision = hf_config.vision_config
    merge = vision.spatial_merge_size
    processor = Qwen2VLImageProcessorPil(
        patch_size=vision.patch_size,
        temporal_patch_size=vision.temporal_patch_size,
        merge_size=merge,
        min_pixels=32 * 32,
        max_pixels=128 * 128,
    )
    gen = torch.Generator().manual_seed(5)
    input_ids, loss_mask, multimodal = [], [], []
    for k, path in enumerate([*image_paths, None]):
        prompt = torch.randint(0, 400, (3 + k,), generator=gen).tolist()
        answer = torch.randint(0, 400, (5 + 2 * k,), generator=gen).tolist()
        mm: dict[str, torch.Tensor] = {}
        if path is not None:
            enc = processor(images=[Image.open(path).convert("RGB")], return_tensors="pt")
            mm = {"pixel_values": enc["pixel_values"], "image_grid_thw": enc["image_grid_thw"]}
            n_pad = int(enc["image_grid_thw"].prod()) // merge**2
            prompt = (
                prompt[:2]
                + [hf_config.vision_start_token_id]
                + [hf_config.image_token_id] * n_pad
                + [hf_config.vision_end_token_id]
                + prompt[2:]
            )
        input_ids.append(prompt + answer)
        loss_mask.append([0] * len(prompt) + [1] * len(answer))
        multimodal.append(mm)
    batch = SequenceBatch(input_ids=input_ids, loss_mask=loss_mask, multimodal=multimodal)

    backend = MegatronBackend(
        model_dir, micro_batch_size=len(batch), optimizer=OptimizerSettings(lr=1e-3)
    )
    hf = Qwen3VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    diffs = {}
    for layout in ("packed", "padded", "auto"):  # both exact layouts of a micro-batch
        backend.cfg.micro_batch_layout = layout
        got = backend.compute_logprobs(batch)
        diff = 0.0
        for i, ids in enumerate(input_ids):
            t = torch.tensor([ids])
            extra: dict[str, Any] = dict(multimodal[i])
            if extra:
                extra["mm_token_type_ids"] = (t == hf_config.image_token_id).int()
            ref_lp, _ = _hf_logprobs(hf, t, **extra)
            mask = torch.tensor(loss_mask[i][1:], dtype=torch.float32)
            diff = max(diff, float(((got.logprobs[i][1:] - ref_lp[0]) * mask).abs().max()))
        diffs[layout] = diff
    losses = [backend.train_step(batch, NLLObjective())["loss"] for _ in range(3)]
    saved = backend.save_pretrained(Path(work_dir) / "hf_out")
    again = Qwen3VLForConditionalGeneration.from_pretrained(str(saved), dtype=torch.float32)
    after = backend.compute_logprobs(batch)
    t = torch.tensor([input_ids[0]])
    extra = dict(multimodal[0], mm_token_type_ids=(t == hf_config.image_token_id).int())
    ref_lp, _ = _hf_logprobs(again.eval(), t, **extra)
    mask = torch.tensor(loss_mask[0][1:], dtype=torch.float32)
    return {
        "image_tokens": [sum(1 for x in ids if x == hf_config.image_token_id) for ids in input_ids],
        "packed_vs_hf_max_diff": diffs["packed"],
        "padded_vs_hf_max_diff": diffs["padded"],
        "auto_vs_hf_max_diff": diffs["auto"],
        "losses": losses,
        "version": backend.version,
        "export_logprob_max_diff": float(((after.logprobs[0][1:] - ref_lp[0]) * mask).abs().max()),
        "world_size": dist.get_world_size(),
    }


def bf16_backend_check(model_dir: str, work_dir: str) -> Result:
    """bf16 parameters (fp32 main weights in Megatron's optimizer): steps, save, resume."""
    from relax_gym.trainer.algorithms import AlgorithmConfig
    from relax_gym.trainer.backends.base import OptimizerSettings, PolicyObjective
    from relax_gym.trainer.backends.megatron.backend import MegatronBackend

    backend = MegatronBackend(
        model_dir,
        megatron={"params_dtype": "bfloat16"},
        micro_batch_size=3,
        optimizer=OptimizerSettings(lr=1e-3),
    )
    batch = grpo_batch(backend.dims.vocab_size)
    batch.old_logprobs = backend.compute_logprobs(batch).logprobs
    objective = PolicyObjective(AlgorithmConfig())
    losses = [backend.train_step(batch, objective)["loss"] for _ in range(2)]
    backend.save_state(Path(work_dir) / "state")
    losses.append(backend.train_step(batch, objective)["loss"])
    backend.load_state(Path(work_dir) / "state")
    return {
        "dtypes": sorted({str(p.dtype) for p in backend.ddp.parameters()}),
        "losses": losses,
        "resumed_loss": backend.train_step(batch, objective)["loss"],
    }


def update_policy_check(model_dir: str) -> Result:
    """One RL step through update_policy on MegatronBackend and on TorchBackend, same weights,
    same samples, same reference: two mini-batches with the proximal recompute and a KL term."""
    import asyncio

    from relax_gym.trainer.algorithms import AlgorithmConfig
    from relax_gym.trainer.algorithms.batching import ScoredSample
    from relax_gym.trainer.algorithms.update import recomputed_by, update_policy
    from relax_gym.trainer.backends.base import OptimizerSettings
    from relax_gym.trainer.backends.megatron.backend import MegatronBackend
    from relax_gym.trainer.backends.pytorch import TorchBackend
    from relax_gym.trainer.rollout import Trajectory

    gen = torch.Generator().manual_seed(0)
    samples = []
    for g in range(2):
        prompt = torch.randint(1, 100, (5 + g,), generator=gen).tolist()
        for k, reward in enumerate((1.0, 0.0, 0.5)):
            answer = torch.randint(1, 100, (4 + 3 * k + g,), generator=gen).tolist()
            traj = Trajectory(token_ids=prompt + answer, loss_mask=[0] * len(prompt) + [1] * len(answer),
                              rollout_logprobs=[0.0] * len(prompt) + [-2.0] * len(answer),
                              weight_versions=[-1] * len(prompt) + [0] * len(answer), prompt_length=len(prompt),
                              group_id=str(g), stop_reason="env_done")
            samples.append(ScoredSample(traj, reward))
    config = AlgorithmConfig(kl_loss_coef=0.05)
    settings = OptimizerSettings(lr=1e-3, grad_clip=None)
    reference = TorchBackend(model_dir, micro_batch_size=6)
    out: Result = {}
    backends = {"megatron": MegatronBackend(model_dir, micro_batch_size=2, optimizer=settings),
                "torch": TorchBackend(model_dir, micro_batch_size=2, optimizer=settings)}
    for name, backend in backends.items():
        update = asyncio.run(update_policy(backend, config, samples, mini_batches=2,
                                           reference=recomputed_by(reference)))
        out[name] = {k: v for k, v in update.metrics.items() if k.startswith("train/")}
        out[name]["version"] = backend.version
    return out


#: one config per policy loss of trainer/algorithms/losses.py, each with a KL term, an entropy
#: bonus and a rollout correction, so every term of compute_policy_loss is in the comparison
PARITY_CONFIGS: dict[str, dict[str, Any]] = {
    "grpo_ppo": {"policy_loss": "ppo"},
    "gspo": {"policy_loss": "gspo", "loss_agg_mode": "seq-mean-token-mean"},
    "gspo_token": {"policy_loss": "gspo_token", "loss_agg_mode": "seq-mean-token-mean"},
    "sapo": {"policy_loss": "sapo"},
    "cispo": {"policy_loss": "cispo"},
    "dr_grpo_sum_norm": {"policy_loss": "ppo", "loss_agg_mode": "seq-mean-token-sum-norm"},
}


def loss_parity_check(model_dir: str) -> Result:
    """One identical train_step per loss on TorchBackend and MegatronBackend (TP=1), same
    weights and batch: loss, grad norm and the loss's metrics. lr=0 keeps the weights equal
    across the configs (the gradient is computed as usual)."""
    from relax_gym.trainer.algorithms import AlgorithmConfig
    from relax_gym.trainer.backends.base import OptimizerSettings, PolicyObjective
    from relax_gym.trainer.backends.megatron.backend import MegatronBackend
    from relax_gym.trainer.backends.pytorch import TorchBackend

    settings = OptimizerSettings(lr=0.0, grad_clip=None)
    torch_backend = TorchBackend(model_dir, micro_batch_size=6, optimizer=settings)
    megatron = MegatronBackend(model_dir, micro_batch_size=2, optimizer=settings)
    batch = grpo_batch(vocab=100)
    current = torch_backend.compute_logprobs(batch).logprobs
    gen = torch.Generator().manual_seed(3)

    def near(rows: list[torch.Tensor], scale: float) -> list[torch.Tensor]:
        return [r + scale * torch.randn(r.shape, generator=gen) for r in rows]

    batch.old_logprobs = near(current, 0.05)  # ratios off 1: clipping and gates take part
    batch.rollout_logprobs = near(current, 0.1)
    batch.ref_logprobs = near(current, 0.2)
    out: Result = {}
    for name, extra in PARITY_CONFIGS.items():
        config = AlgorithmConfig(kl_loss_coef=0.05, entropy_coef=0.01, rollout_correction="tis",
                                 **extra)
        objective = PolicyObjective(config)
        out[name] = {
            "torch": torch_backend.train_step(batch, objective),
            "megatron": megatron.train_step(batch, objective),
        }
    return out
