"""KL estimators k1 / k2 / k3 between the policy and a reference, per token."""

from __future__ import annotations

import torch
from torch import Tensor

from relax_gym.trainer.algorithms.config import KLEstimator
from relax_gym.trainer.algorithms.tensor_ops import LOG_RATIO_CLAMP, as_mask, masked

def kl_estimate(
    logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, estimator: KLEstimator = "k3"
) -> Tensor:
    """Per-token estimate of ``KL(pi || pi_ref)`` from tokens sampled from ``pi`` ("Approximating
    KL Divergence", Schulman 2020). With ``log r = log pi_ref - log pi``:

    - ``k1 = -log r``: unbiased, high variance, can be negative (the classic in-reward penalty);
    - ``k2 = (log r)^2 / 2``: biased but low variance; its gradient is the KL's gradient;
    - ``k3 = (r - 1) - log r``: unbiased, always >= 0, low variance (GRPO's KL loss).

    Gradients flow through ``logprobs``. ``log r`` is clamped to +-LOG_RATIO_CLAMP for k3's exp.
    Returns ``[B, T]`` with zeros off the mask.
    """
    mask = as_mask(mask)
    log_r = masked(ref_logprobs, mask, "ref_logprobs") - masked(logprobs, mask, "logprobs")
    if estimator == "k1":
        kl = -log_r
    elif estimator == "k2":
        kl = 0.5 * log_r**2
    elif estimator == "k3":
        log_r = log_r.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        kl = torch.expm1(log_r) - log_r
    else:
        raise ValueError(f"unknown KL estimator {estimator!r}; allowed: 'k1', 'k2', 'k3'")
    return torch.where(mask, kl, torch.zeros_like(kl))
