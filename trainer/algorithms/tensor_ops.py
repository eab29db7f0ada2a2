"""Masked tensor helpers the advantage and loss code share: padding may hold NaN or inf."""

from __future__ import annotations

import torch
from torch import Tensor

LOG_RATIO_CLAMP = 20.0


# =============================================================================================
# Small helpers
# =============================================================================================


def as_mask(mask: Tensor) -> Tensor:
    """A bool ``[B, T]`` mask from a bool or 0/1 tensor."""
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, T], got shape {tuple(mask.shape)}")
    return mask if mask.dtype == torch.bool else mask != 0


def upcast(x: Tensor) -> Tensor:
    """Compute in at least float32 (bf16/fp16 logprobs lose the ratio's precision)."""
    return x if x.dtype == torch.float64 else x.float()


def masked(x: Tensor, mask: Tensor, name: str) -> Tensor:
    """Check the shape, upcast, and zero padded positions (which may hold NaN/inf)."""
    if x.shape != mask.shape:
        raise ValueError(f"{name} has shape {tuple(x.shape)}, mask has {tuple(mask.shape)}")
    x = upcast(x)
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def seq_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Per-sequence mean over masked tokens, ``[B]``; 0 for a sequence with no tokens."""
    return (x * mask).sum(-1) / mask.sum(-1).clamp(min=1)
