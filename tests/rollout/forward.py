"""A fresh forward pass of the same weights over a trajectory: the train/rollout mismatch check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relax_gym.trainer.rollout import Trajectory


def load_model(path: Path) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(str(path))
    cls = AutoModelForImageTextToText if hasattr(config, "vision_config") else AutoModelForCausalLM
    return cls.from_pretrained(str(path), dtype=torch.float32).eval()


def recomputed_logprobs(model: Any, traj: Trajectory, image_processor: Any = None) -> list[float]:
    """log p(token_i | tokens_<i) for every position i >= 1 (index 0 gets 0.0), in fp32."""
    import torch

    ids = torch.tensor([traj.token_ids])
    kwargs: dict[str, Any] = {"input_ids": ids}
    if image_processor is not None:
        kwargs.update(traj.vision_inputs(image_processor))
    with torch.no_grad():
        logits = model(**kwargs).logits.float()
    logp = torch.log_softmax(logits[0, :-1], dim=-1).gather(1, ids[0, 1:, None])[:, 0]
    return [0.0, *logp.tolist()]


def max_sampled_diff(model: Any, traj: Trajectory, image_processor: Any = None) -> float:
    fresh = recomputed_logprobs(model, traj, image_processor)
    diffs = [abs(a - b) for a, b, m in zip(fresh, traj.rollout_logprobs, traj.loss_mask, strict=True) if m]
    assert diffs, "the trajectory has no sampled tokens"
    return max(diffs)
