"""The video check of the megatron tests: Megatron's Qwen3-VL vs the torch backend on clips.

Run in a fresh process (``dist_workers.run_isolated``) as the training loop makes the backend:
one rank, the CPU shim. The batch is laid out as the rollout lays out a Qwen3-VL video turn:
per temporal patch a time stamp (text), ``<|vision_start|>``, the merged pads, ``<|vision_end|>``;
its pixels come from ``relax_gym.video.VideoProcessor``, the trainer's own video patches.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

Result = dict[str, Any]


def _clip(frames: int, height: int, width: int, seed: int) -> np.ndarray:
    """A random clip whose frames differ (so the temporal patches differ)."""
    return np.random.default_rng(seed).integers(0, 256, (frames, height, width, 3), dtype=np.uint8)


def _video_ids(cfg: Any, grid: list[int], stamps: list[list[int]]) -> list[int]:
    """Qwen3-VL's expanded placeholder of one video: stamp + start + pads + end per frame."""
    t, h, w = grid
    merge = cfg.vision_config.spatial_merge_size
    per_frame = h * w // merge**2
    out: list[int] = [cfg.vision_start_token_id]
    for k in range(t):
        out += stamps[k] + [cfg.vision_start_token_id] + [cfg.video_token_id] * per_frame + [cfg.vision_end_token_id]
    return out + [cfg.vision_end_token_id]


def video_batch(model_dir: str) -> tuple[Any, Any]:
    """Three sequences: a 4-frame clip; an image then a 3-frame clip (odd: the last frame is
    repeated); a 2-frame clip at another size. Returns ``(SequenceBatch, hf_config)``."""
    from relax_gym.trainer.backends.base import SequenceBatch
    from relax_gym.video import VideoProcessor
    from transformers import AutoConfig
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from PIL import Image

    cfg = AutoConfig.from_pretrained(model_dir)
    vision = cfg.vision_config
    merge = vision.spatial_merge_size
    videos = VideoProcessor(patch_size=vision.patch_size, temporal_patch_size=vision.temporal_patch_size,
                            merge_size=merge)
    images = Qwen2VLImageProcessorPil(patch_size=vision.patch_size, temporal_patch_size=vision.temporal_patch_size,
                                      merge_size=merge, min_pixels=32 * 32, max_pixels=64 * 64)
    gen = torch.Generator().manual_seed(11)

    def text(n: int) -> list[int]:
        return torch.randint(0, 400, (n,), generator=gen).tolist()

    input_ids, loss_mask, multimodal = [], [], []
    specs = [((4, 64, 64), False), ((3, 64, 32), True), ((2, 32, 96), False)]
    for k, ((frames, height, width), with_image) in enumerate(specs):
        clip = _clip(frames, height, width, seed=k)
        mm = dict(videos([clip]))
        grid = mm["video_grid_thw"][0].tolist()
        prompt = text(3 + k)
        if with_image:
            pixels = np.random.default_rng(50 + k).integers(0, 256, (64, 64, 3), dtype=np.uint8)
            enc = images(images=[Image.fromarray(pixels)], return_tensors="pt")
            mm.update(pixel_values=enc["pixel_values"], image_grid_thw=enc["image_grid_thw"])
            n_pad = int(enc["image_grid_thw"].prod()) // merge**2
            prompt += [cfg.vision_start_token_id] + [cfg.image_token_id] * n_pad + [cfg.vision_end_token_id] + text(2)
        prompt += _video_ids(cfg, grid, [text(3) for _ in range(grid[0])]) + text(2)
        answer = text(5 + k)
        input_ids.append(prompt + answer)
        loss_mask.append([0] * len(prompt) + [1] * len(answer))
        multimodal.append(mm)
    batch = SequenceBatch(input_ids=input_ids, loss_mask=loss_mask, multimodal=multimodal,
                          group_ids=[str(i) for i in range(len(input_ids))])
    return batch, cfg


def _rel_diff(got: list[torch.Tensor], ref: list[torch.Tensor], mask: list[list[int]]) -> float:
    """Largest ``|got - ref| / max(1, |ref|)`` over the loss-mask tokens."""
    worst = 0.0
    for g, r, m in zip(got, ref, mask, strict=True):
        keep = torch.tensor(m, dtype=torch.bool)
        worst = max(worst, float(((g - r).abs() / r.abs().clamp(min=1.0))[keep].max()))
    return worst


def video_backend_check(model_dir: str) -> Result:
    """Megatron vs torch backend on the video batch: positions, logprobs, one training step."""
    from relax_gym.trainer.backends.base import NLLObjective, OptimizerSettings
    from relax_gym.trainer.backends.megatron.backend import MegatronBackend
    from relax_gym.trainer.backends.megatron.vl import mrope_position_ids
    from relax_gym.trainer.backends.pytorch import TorchBackend
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    batch, cfg = video_batch(model_dir)
    merge = cfg.vision_config.spatial_merge_size
    out: Result = {
        "video_tokens": [sum(1 for t in ids if t == cfg.video_token_id) for ids in batch.input_ids],
        "image_tokens": [sum(1 for t in ids if t == cfg.image_token_id) for ids in batch.input_ids],
    }

    # Positions: ours == transformers' get_rope_index on every sequence; treating the video
    # pads as text (the negative control) does not.
    hf_model = Qwen3VLModel(cfg)
    same, control_differs = True, True
    for ids, mm in zip(batch.input_ids, batch.multimodal, strict=True):
        t = torch.tensor([ids])
        types = (t == cfg.image_token_id).int() + 2 * (t == cfg.video_token_id).int()
        ref, _ = hf_model.get_rope_index(t, types, mm.get("image_grid_thw"), mm.get("video_grid_thw"))
        ours = mrope_position_ids(t, cfg.image_token_id, mm.get("image_grid_thw"), merge,
                                  video_token_id=cfg.video_token_id, video_grid_thw=mm.get("video_grid_thw"))
        as_text = mrope_position_ids(t, cfg.image_token_id, mm.get("image_grid_thw"), merge)
        same &= bool(torch.equal(ours, ref))
        control_differs &= not torch.equal(as_text, ref)
    out["positions_match_hf"], out["positions_control_differs"] = same, control_differs

    settings = OptimizerSettings(lr=1e-3, grad_clip=None)
    torch_be = TorchBackend(model_dir, micro_batch_size=len(batch), optimizer=settings)
    megatron = MegatronBackend(model_dir, micro_batch_size=len(batch), optimizer=settings)
    ref = torch_be.compute_logprobs(batch, entropy=True)
    for layout in ("packed", "padded"):  # both exact layouts of a micro-batch
        megatron.cfg.micro_batch_layout = layout
        got = megatron.compute_logprobs(batch, entropy=True)
        assert got.entropies is not None and ref.entropies is not None
        out[f"{layout}_logprob_rel_diff"] = _rel_diff(got.logprobs, ref.logprobs, batch.loss_mask)
        out[f"{layout}_entropy_rel_diff"] = _rel_diff(got.entropies, ref.entropies, batch.loss_mask)
    megatron.cfg.micro_batch_layout = "packed"

    # One training step on each backend from the same weights: same loss and gradient norm;
    # the vision tower trains on megatron too.
    visual = megatron.module.visual
    before = {n: p.detach().clone() for n, p in visual.named_parameters()}
    m_meg = megatron.train_step(batch, NLLObjective())
    m_ref = torch_be.train_step(batch, NLLObjective())
    out["loss"], out["torch_loss"] = m_meg["loss"], m_ref["loss"]
    out["grad_norm"], out["torch_grad_norm"] = m_meg["grad_norm"], m_ref["grad_norm"]
    moved = [not torch.equal(before[n], p.detach()) for n, p in visual.named_parameters()]
    out["vision_params_moved"] = sum(moved) / len(moved)
    after_meg = megatron.compute_logprobs(batch)
    after_ref = torch_be.compute_logprobs(batch)
    out["after_step_logprob_rel_diff"] = _rel_diff(after_meg.logprobs, after_ref.logprobs, batch.loss_mask)
    out["second_loss"] = megatron.train_step(batch, NLLObjective())["loss"]
    return out
