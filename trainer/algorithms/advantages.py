"""Advantages: GRPO (with or without the std, i.e. Dr.GRPO), RLOO, REINFORCE++-baseline,
KL folded into the reward and on-policy distillation; :func:`compute_advantages` picks one."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from relax_gym.trainer.algorithms.config import AlgorithmConfig, KLEstimator
from relax_gym.trainer.algorithms.kl import kl_estimate
from relax_gym.trainer.algorithms.tensor_ops import as_mask, masked

def _group_index(group_ids: Tensor | Sequence[Hashable], n: int) -> tuple[Tensor, int]:
    """Map arbitrary group ids to ``0..G-1``; returns (index ``[B]``, G)."""
    if isinstance(group_ids, Tensor):
        if group_ids.dim() != 1 or group_ids.numel() != n:
            raise ValueError(f"group_ids must be [B] with B={n}, got {tuple(group_ids.shape)}")
        uniq, index = torch.unique(group_ids, return_inverse=True)
        return index, int(uniq.numel())
    ids = list(group_ids)
    if len(ids) != n:
        raise ValueError(f"group_ids has {len(ids)} entries, rewards has {n}")
    lookup: dict[Hashable, int] = {}
    index_list = [lookup.setdefault(g, len(lookup)) for g in ids]
    return torch.tensor(index_list, dtype=torch.long), len(lookup)


@dataclass(frozen=True)
class GroupStats:
    """Per-sample view of its group: size, mean, std and whether all rewards are equal."""

    size: Tensor  # [B] number of samples in the sample's group
    mean: Tensor  # [B] group mean reward
    std: Tensor  # [B] group std (0 for singletons)
    constant: Tensor  # [B] bool: every reward in the group is identical (incl. singletons)


def group_stats(
    rewards: Tensor, group_ids: Tensor | Sequence[Hashable], *, unbiased: bool = True
) -> GroupStats:
    """Group statistics broadcast back to samples, computed in float64.

    Zero variance is detected exactly (group max == group min), not by comparing the std with
    an epsilon, so a group of identical rewards never yields rounding noise divided by eps.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be [B], got shape {tuple(rewards.shape)}")
    if not torch.isfinite(rewards).all():
        bad = torch.nonzero(~torch.isfinite(rewards)).flatten().tolist()
        raise ValueError(f"rewards must be finite; NaN/inf at indices {bad}")
    r = rewards.detach().to(torch.float64)
    index, n_groups = _group_index(group_ids, r.numel())
    index = index.to(r.device)
    zeros = torch.zeros(n_groups, dtype=torch.float64, device=r.device)
    count = zeros.index_add(0, index, torch.ones_like(r))
    mean = zeros.index_add(0, index, r) / count
    sq_dev = zeros.index_add(0, index, (r - mean[index]) ** 2)
    denom = (count - 1.0) if unbiased else count
    std = torch.where(count > 1, sq_dev / denom.clamp(min=1.0), zeros).sqrt()
    gmax = zeros.scatter_reduce(0, index, r, reduce="amax", include_self=False)
    gmin = zeros.scatter_reduce(0, index, r, reduce="amin", include_self=False)
    return GroupStats(
        size=count[index], mean=mean[index], std=std[index], constant=(gmax == gmin)[index]
    )


def zero_variance_groups(rewards: Tensor, group_ids: Tensor | Sequence[Hashable]) -> Tensor:
    """``[B]`` bool, True where the sample's group has identical rewards (no learning signal).

    Dynamic sampling (DAPO) drops these groups and samples more prompts until the batch is full.
    """
    return group_stats(rewards, group_ids).constant


# =============================================================================================
# 2. Advantages
# =============================================================================================


def _to_tokens(seq_adv: Tensor, mask: Tensor, like: Tensor) -> Tensor:
    """Broadcast ``[B]`` sequence advantages to ``[B, T]`` tokens (0 off the mask)."""
    mask = as_mask(mask)
    if mask.shape[0] != seq_adv.shape[0]:
        raise ValueError(f"mask has {mask.shape[0]} rows, rewards has {seq_adv.shape[0]}")
    dtype = torch.float64 if like.dtype == torch.float64 else torch.float32
    return seq_adv.to(device=mask.device, dtype=dtype)[:, None] * mask.to(dtype)


def grpo_advantages(
    rewards: Tensor,
    group_ids: Tensor | Sequence[Hashable],
    mask: Tensor,
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
    unbiased: bool = True,
) -> Tensor:
    """Group-relative advantages (GRPO, "DeepSeekMath", Shao et al. 2024).

    ``A_i = (r_i - mean_g(r)) / (std_g(r) + eps)`` with g the group of sample i.
    ``normalize_std=False`` gives Dr.GRPO ("Understanding R1-Zero-Like Training: A Critical
    Perspective", Liu et al. 2025): ``A_i = r_i - mean_g(r)``, which removes the bias towards
    groups of low reward variance (too easy or too hard prompts).

    Explicit edge cases: a group of size 1 has no baseline and gets A = 0; a group whose rewards
    are all equal gets exactly A = 0 (no eps-scaled rounding noise). Returns ``[B, T]``.
    """
    stats = group_stats(rewards, group_ids, unbiased=unbiased)
    adv = rewards.detach().to(torch.float64) - stats.mean
    if normalize_std:
        adv = adv / (stats.std + eps)
    adv = torch.where(stats.constant, torch.zeros_like(adv), adv)
    return _to_tokens(adv, mask, rewards)


def rloo_advantages(
    rewards: Tensor, group_ids: Tensor | Sequence[Hashable], mask: Tensor
) -> Tensor:
    """REINFORCE Leave-One-Out ("Back to Basics: Revisiting REINFORCE Style Optimization for
    Learning from Human Feedback in LLMs", Ahmadian et al. 2024; Kool et al. 2019).

    ``A_i = r_i - 1/(G-1) * sum_{j != i} r_j = G/(G-1) * (r_i - mean_g(r))``: an unbiased
    baseline that excludes the sample itself. A group of size 1 gets A = 0. Returns ``[B, T]``.
    """
    stats = group_stats(rewards, group_ids)
    r = rewards.detach().to(torch.float64)
    g = stats.size
    adv = torch.where(g > 1, g / (g - 1).clamp(min=1) * (r - stats.mean), torch.zeros_like(r))
    adv = torch.where(stats.constant, torch.zeros_like(adv), adv)
    return _to_tokens(adv, mask, rewards)


def reinforce_pp_baseline_advantages(
    rewards: Tensor,
    group_ids: Tensor | Sequence[Hashable],
    mask: Tensor,
    *,
    eps: float = 1e-6,
    unbiased: bool = True,
) -> Tensor:
    """REINFORCE++-baseline ("REINFORCE++: An Efficient RLHF Algorithm with Robustness to Both
    Prompt and Reward Models", Hu et al. 2025).

    ``A~_i = r_i - mean_g(r)`` then global normalisation over the whole batch:
    ``A_i = (A~_i - mean_batch(A~)) / (std_batch(A~) + eps)``. Over samples
    ``mean_batch(A~) = 0`` exactly (each group's deviations sum to zero), so this is a pure
    rescale and zero-variance and singleton groups keep A = 0. If every group has zero variance
    the whole batch gets A = 0. Call it on the full batch, never per micro-batch.
    """
    stats = group_stats(rewards, group_ids, unbiased=unbiased)
    centred = torch.where(
        stats.constant,
        torch.zeros_like(stats.mean),
        rewards.detach().to(torch.float64) - stats.mean,
    )
    if centred.numel() < 2 or bool((centred == 0).all()):
        return _to_tokens(torch.zeros_like(centred), mask, rewards)
    adv = centred / (centred.std(unbiased=unbiased) + eps)
    return _to_tokens(adv, mask, rewards)


def kl_penalized_rewards(
    rewards: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    *,
    coef: float,
    estimator: KLEstimator = "k1",
) -> Tensor:
    """KL folded into the reward (InstructGPT-style): ``r'_i = r_i - coef * sum_t kl_{i,t}``.

    ``logprobs`` are the sampling policy's (rollout/old) logprobs, ``ref_logprobs`` the frozen
    reference's, both without gradient. Returns ``[B]`` rewards for any advantage estimator.
    """
    mask = as_mask(mask)
    kl = kl_estimate(logprobs.detach(), ref_logprobs.detach(), mask, estimator)
    return rewards - coef * kl.sum(-1).to(rewards.dtype)


def distillation_advantages(
    advantages: Tensor,
    student_logprobs: Tensor,
    teacher_logprobs: Tensor,
    mask: Tensor,
    *,
    coef: float = 1.0,
) -> Tensor:
    """On-policy distillation ("On-Policy Distillation", Thinking Machines 2025; GKD, Agarwal
    et al. 2024): the per-token reverse KL to a teacher becomes a dense negative reward.

    ``A'_{i,t} = A_{i,t} - coef * (log pi_student(y_t) - log pi_teacher(y_t))`` on the student's
    own samples; the single-sample estimate of ``KL(pi_student || pi_teacher)``. With zero RL
    advantage this is pure distillation. Student logprobs are the rollout ones (no gradient).
    """
    mask = as_mask(mask)
    reverse_kl = masked(student_logprobs.detach(), mask, "student_logprobs") - masked(
        teacher_logprobs.detach(), mask, "teacher_logprobs"
    )
    return advantages - coef * reverse_kl.to(advantages.dtype)


@dataclass(frozen=True)
class AdvantageOutput:
    """Token advantages ``[B, T]`` plus batch metrics (floats, for logging)."""

    advantages: Tensor
    metrics: dict[str, float] = field(default_factory=dict)


def compute_advantages(
    config: AlgorithmConfig,
    rewards: Tensor,
    group_ids: Tensor | Sequence[Hashable],
    mask: Tensor,
    *,
    logprobs: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    teacher_logprobs: Tensor | None = None,
) -> AdvantageOutput:
    """Advantages for a whole batch as the config says, in this order:

    1. fold the reference KL into the reward (``kl_reward_coef > 0``; needs ``logprobs``, the
       rollout policy's, and ``ref_logprobs``);
    2. the configured group estimator;
    3. subtract the teacher's reverse KL (``distill_coef > 0``; needs ``logprobs`` and
       ``teacher_logprobs``).
    """
    mask = as_mask(mask)
    metrics: dict[str, float] = {
        "reward_mean": float(rewards.double().mean()),
        # on the raw rewards: the KL penalty would make almost every group non-constant
        "zero_variance_group_frac": float(zero_variance_groups(rewards, group_ids).double().mean()),
    }
    if config.kl_reward_coef > 0:
        if logprobs is None or ref_logprobs is None:
            raise ValueError("kl_reward_coef > 0 needs logprobs and ref_logprobs")
        penalized = kl_penalized_rewards(
            rewards.double(),
            logprobs,
            ref_logprobs,
            mask,
            coef=config.kl_reward_coef,
            estimator=config.kl_reward_estimator,
        )
        metrics["kl_reward_penalty_mean"] = float((rewards.double() - penalized).mean())
        rewards = penalized
    est = config.advantage_estimator
    if est in ("grpo", "dr_grpo"):
        adv = grpo_advantages(
            rewards,
            group_ids,
            mask,
            normalize_std=est == "grpo",
            eps=config.adv_eps,
            unbiased=config.std_unbiased,
        )
    elif est == "rloo":
        adv = rloo_advantages(rewards, group_ids, mask)
    else:
        adv = reinforce_pp_baseline_advantages(
            rewards, group_ids, mask, eps=config.adv_eps, unbiased=config.std_unbiased
        )
    if config.distill_coef > 0:
        if logprobs is None or teacher_logprobs is None:
            raise ValueError("distill_coef > 0 needs logprobs and teacher_logprobs")
        adv = distillation_advantages(
            adv, logprobs, teacher_logprobs, mask, coef=config.distill_coef
        )
        reverse_kl = masked(logprobs.detach(), mask, "logprobs") - masked(
            teacher_logprobs.detach(), mask, "teacher_logprobs"
        )
        metrics["distill_reverse_kl"] = float(reverse_kl.sum() / mask.sum().clamp(min=1))
    return AdvantageOutput(advantages=adv, metrics=metrics)
