"""Policy losses, KL estimators, train/rollout mismatch correction and the global-batch
loss normaliser: :func:`compute_policy_loss` assembles one micro-batch's loss and metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from relax_gym.trainer.algorithms.config import AlgorithmConfig, ISLevel, LossAggMode
from relax_gym.trainer.algorithms.kl import kl_estimate
from relax_gym.trainer.algorithms.tensor_ops import LOG_RATIO_CLAMP, as_mask, masked, seq_mean

# =============================================================================================
# 4. Train/rollout mismatch correction
# =============================================================================================


def importance_log_weights(
    old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, level: ISLevel = "token"
) -> Tensor:
    """Log IS weights ``log pi_old - log pi_rollout``, ``[B, T]``, no gradient.

    ``pi_old`` is the trainer's proximal policy (its own recompute of the logprobs),
    ``pi_rollout`` the behaviour policy that sampled (the inference engine; possibly stale).
    ``level="sequence"`` puts the sequence's summed log weight (the product of the token ratios)
    on every token; ``"geometric"`` puts its mean (the geometric mean of the token ratios).
    """
    mask = as_mask(mask)
    log_w = masked(old_logprobs.detach(), mask, "old_logprobs") - masked(
        rollout_logprobs.detach(), mask, "rollout_logprobs"
    )
    if level == "sequence":
        log_w = log_w.sum(-1, keepdim=True).expand_as(log_w)
    elif level == "geometric":
        log_w = seq_mean(log_w, mask)[:, None].expand_as(log_w)
    elif level != "token":
        raise ValueError(f"unknown IS level {level!r}; allowed: 'token', 'sequence', 'geometric'")
    return torch.where(mask, log_w, torch.zeros_like(log_w))


@dataclass(frozen=True)
class ISWeights:
    """IS weights to multiply the token losses by, and which tokens they changed."""

    weights: Tensor  # [B, T], detached; 0 on dropped tokens
    raw: Tensor  # [B, T] untruncated weights exp(log_w)
    truncated: Tensor  # [B, T] bool: weight lowered to the cap (TIS)
    dropped: Tensor  # [B, T] bool: token removed from the loss (MIS / decoupled cap)


def truncated_is_weights(log_w: Tensor, mask: Tensor, cap: float = 2.0) -> ISWeights:
    """Truncated importance sampling (TIS; "Your Efficient RL Framework Secretly Brings You
    Off-Policy RL Training", Yao et al. 2025): ``w = min(pi_old / pi_rollout, C)``.

    The loss of every token is multiplied by ``w``, correcting for the engine sampling from a
    slightly different distribution than the trainer computes, with variance bounded by C.
    """
    mask = as_mask(mask)
    raw = torch.exp(log_w.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)).detach()
    truncated = mask & (raw > cap)
    weights = torch.where(mask, raw.clamp(max=cap), torch.zeros_like(raw))
    return ISWeights(weights, raw, truncated, torch.zeros_like(mask))


def masked_is_weights(
    log_w: Tensor, mask: Tensor, low: float | None = 0.5, high: float | None = 2.0
) -> ISWeights:
    """Masked importance sampling (MIS; "When Speed Kills Stability: Demystifying RL Collapse
    from the Training-Inference Mismatch", Liu et al. 2025): ``w = rho`` if
    ``low <= rho <= high`` else 0 (the token, or with a sequence-level ``log_w`` the whole
    sequence, is dropped from the gradient instead of being truncated). ``None`` = no bound.

    Dropped tokens still count in the global normaliser, so the normaliser stays a property of
    the batch's masks and the micro-batch split cannot change the loss.
    """
    mask = as_mask(mask)
    raw = torch.exp(log_w.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)).detach()
    keep = mask.clone()
    if low is not None:
        keep &= raw >= low
    if high is not None:
        keep &= raw <= high
    weights = torch.where(keep, raw, torch.zeros_like(raw))
    return ISWeights(weights, raw, torch.zeros_like(mask), mask & ~keep)


def rollout_correction_weights(
    config: AlgorithmConfig, old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor
) -> ISWeights:
    """The configured correction between the proximal/old policy and the behaviour policy.

    - ``tis``: :func:`truncated_is_weights` with ``tis_cap``;
    - ``mis``: :func:`masked_is_weights` with ``[mis_low, mis_high]``;
    - ``decoupled``: the decoupled PPO objective ("AReaL: A Large-Scale Asynchronous
      Reinforcement Learning System for Language Reasoning", Fu et al. 2025; Hilton et al.
      2022): the surrogate clips against the *proximal* policy (pass it as ``old_logprobs``)
      and every token is weighted by the untruncated ``pi_prox / pi_behav``; tokens whose weight
      exceeds ``decoupled_cap`` are dropped.
    """
    log_w = importance_log_weights(old_logprobs, rollout_logprobs, mask, config.rollout_is_level)
    mode = config.rollout_correction
    if mode == "tis":
        return truncated_is_weights(log_w, mask, config.tis_cap)
    if mode == "mis":
        return masked_is_weights(log_w, mask, config.mis_low, config.mis_high)
    if mode == "decoupled":
        return masked_is_weights(log_w, mask, None, config.decoupled_cap)
    raise ValueError(f"rollout_correction {mode!r} has no weights; allowed: tis, mis, decoupled")


# =============================================================================================
# 5. Loss aggregation and the global normaliser
# =============================================================================================


@dataclass(frozen=True)
class LossNormalizer:
    """Denominators of the loss, fixed from the WHOLE batch of one optimizer step.

    Build it once from the step's full mask (across all micro-batches, and all data-parallel
    ranks: sum their counts), then pass it to every micro-batch's loss call. Each micro-batch
    loss divides by these global counts, so summing micro-batch losses (plain gradient
    accumulation, no ``/ n_micro``) gives exactly the full-batch loss however the batch is cut.
    With DDP averaging gradients over R ranks, multiply each rank's loss by R.

    With ``l`` the token losses, ``m`` the mask, ``N`` the global number of sequences that have
    at least one loss token and ``n_i = sum_t m_{i,t}``:

    - ``token-mean``:              ``sum_{i,t} m l / sum_{i,t} m``  (DAPO; long answers weigh more)
    - ``seq-mean-token-mean``:     ``1/N sum_i (sum_t m l / n_i)``  (GRPO / GSPO papers)
    - ``seq-mean-token-sum``:      ``1/N sum_i sum_t m l``
    - ``seq-mean-token-sum-norm``: ``1/(N L) sum_i sum_t m l``, L a constant (Dr.GRPO: the
      generation budget), so no length bias and a stable scale across steps.

    ``n_i`` is local to a sequence, and micro-batches cut between sequences, never inside one.
    An empty batch (no loss tokens) yields a loss of 0.
    """

    mode: LossAggMode
    num_tokens: float
    num_seqs: float
    norm_length: float

    @classmethod
    def from_mask(
        cls,
        mask: Tensor,
        config: AlgorithmConfig | None = None,
        *,
        mode: LossAggMode | None = None,
        norm_length: int | None = None,
    ) -> LossNormalizer:
        """Count tokens and sequences of the full batch's ``[B, T]`` mask.

        ``mode`` / ``norm_length`` default to the config's ``loss_agg_mode`` /
        ``loss_norm_length``; the norm length falls back to the mask's width T.
        """
        mask = as_mask(mask)
        cfg = config or AlgorithmConfig()
        mode = mode or cfg.loss_agg_mode
        length = norm_length or cfg.loss_norm_length or mask.shape[-1]
        per_seq = mask.sum(-1)
        return cls(
            mode=mode,
            num_tokens=float(per_seq.sum()),
            num_seqs=float((per_seq > 0).sum()),
            norm_length=float(length),
        )

    def aggregate(self, values: Tensor, mask: Tensor) -> Tensor:
        """One scalar from ``[B, T]`` token values of (part of) the batch, per :attr:`mode`."""
        mask = as_mask(mask)
        v = masked(values, mask, "values")
        if self.mode == "token-mean":
            return v.sum() / max(self.num_tokens, 1.0)
        seq_sum = v.sum(-1)
        if self.mode == "seq-mean-token-mean":
            seq_val = seq_sum / mask.sum(-1).clamp(min=1)
        elif self.mode == "seq-mean-token-sum":
            seq_val = seq_sum
        elif self.mode == "seq-mean-token-sum-norm":
            seq_val = seq_sum / self.norm_length
        else:
            raise ValueError(f"unknown loss_agg_mode {self.mode!r}")
        return seq_val.sum() / max(self.num_seqs, 1.0)

    def token_mean(self, values: Tensor, mask: Tensor) -> Tensor:
        """This part's share of the global token mean: ``sum m v / global token count``.

        Used for metrics, so summing micro-batch metrics gives the full-batch mean.
        """
        mask = as_mask(mask)
        return masked(values, mask, "values").sum() / max(self.num_tokens, 1.0)


# =============================================================================================
# 6. Policy losses
# =============================================================================================


@dataclass(frozen=True)
class PolicyLossTerms:
    """Per-token loss ``[B, T]`` (unreduced, not yet IS-weighted) and where clipping acted."""

    loss: Tensor
    clipped_low: Tensor | None = None  # bool [B, T]
    clipped_high: Tensor | None = None
    clipped_dual: Tensor | None = None
    extra: dict[str, Tensor] = field(default_factory=dict)  # [B, T] per-token diagnostics


def _log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    return (
        masked(logprobs, mask, "logprobs") - masked(old_logprobs.detach(), mask, "old_logprobs")
    ).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _token_ratio(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """The bool mask, the token ratio ``exp(log pi - log pi_old)`` and the detached advantages,
    each zeroed off the mask: what every token-level surrogate starts from."""
    mask = as_mask(mask)
    ratio = torch.exp(_log_ratio(logprobs, old_logprobs, mask))
    return mask, ratio, masked(advantages.detach(), mask, "advantages")


def _clipped_surrogate(
    ratio: Tensor, adv: Tensor, low: float, high: float
) -> tuple[Tensor, Tensor, Tensor]:
    """``max(-A r, -A clip(r, 1-low, 1+high))`` and the bool maps of the two clipped regions."""
    loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - low, 1.0 + high))
    return loss, (adv < 0) & (ratio < 1.0 - low), (adv > 0) & (ratio > 1.0 + high)


def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = 3.0,
) -> PolicyLossTerms:
    """PPO-clip ("Proximal Policy Optimization Algorithms", Schulman et al. 2017) with DAPO's
    decoupled clip-higher ("DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
    Yu et al. 2025) and dual-clip ("Mastering Complex Control in MOBA Games with Deep
    Reinforcement Learning", Ye et al. 2020).

    ``r = exp(log pi - log pi_old)``,
    ``l = max(-A r, -A clip(r, 1-eps_low, 1+eps_high))``, and for ``A < 0`` with dual-clip
    ``l = min(l, -c A)``: a token with negative advantage and a huge ratio contributes a bounded
    loss (and no gradient) instead of an unbounded one.

    Regions (zero gradient): ``A>0, r>1+eps_high`` (high); ``A<0, r<1-eps_low`` (low);
    ``A<0, r>c`` (dual).
    """
    mask, ratio, adv = _token_ratio(logprobs, old_logprobs, advantages, mask)
    loss, low, high = _clipped_surrogate(ratio, adv, clip_low, clip_high)
    dual = torch.zeros_like(mask)
    if dual_clip is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -adv * dual_clip), loss)
        dual = (adv < 0) & (ratio > dual_clip)
    return PolicyLossTerms(loss, low & mask, high & mask, dual & mask, {"ratio": ratio})


def gspo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    token_level: bool = False,
) -> PolicyLossTerms:
    """GSPO ("Group Sequence Policy Optimization", Zheng et al. 2025).

    Sequence ratio, length-normalised: ``s_i = (pi(y_i)/pi_old(y_i))^(1/|y_i|)
    = exp(1/|y_i| sum_t (log pi - log pi_old))`` -- the geometric mean of the token ratios.
    ``l_i = max(-A_i s_i, -A_i clip(s_i, 1-eps_low, 1+eps_high))`` with ``A_i`` the sequence's
    advantage (masked mean of the token advantages); ``l_i`` is placed on each of the sequence's
    tokens, so ``seq-mean-token-mean`` aggregation gives the paper's ``1/G sum_i l_i``.

    ``token_level=True`` is GSPO-token: ``s_{i,t} = sg[s_i] * pi(y_t) / sg[pi(y_t)]`` has the
    value of ``s_i`` but the gradient ``s_i grad log pi(y_t)``, and token advantages ``A_{i,t}``
    may differ within a sequence. With equal token advantages it matches GSPO in value and
    gradient under ``seq-mean-token-mean``.
    """
    mask = as_mask(mask)
    log_ratio = _log_ratio(logprobs, old_logprobs, mask)
    log_s = seq_mean(log_ratio, mask)  # [B]
    adv = masked(advantages.detach(), mask, "advantages")
    if token_level:
        lp = masked(logprobs, mask, "logprobs")
        log_s_tok = log_s.detach()[:, None] + lp - lp.detach()
        ratio = torch.exp(log_s_tok.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        loss, low, high = _clipped_surrogate(ratio, adv, clip_low, clip_high)
    else:
        s = torch.exp(log_s.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        seq_adv = seq_mean(adv, mask)
        seq_loss, seq_low, seq_high = _clipped_surrogate(s, seq_adv, clip_low, clip_high)
        loss = seq_loss[:, None].expand_as(adv)
        low, high = seq_low[:, None].expand_as(mask), seq_high[:, None].expand_as(mask)
        ratio = s[:, None].expand_as(adv)
    return PolicyLossTerms(loss, low & mask, high & mask, None, {"ratio": ratio})


def sapo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> PolicyLossTerms:
    """SAPO ("Soft Adaptive Policy Optimization", Gao et al. 2025): a smooth gate instead of
    the hard clip.

    ``f(r) = 4/tau * sigmoid(tau (r - 1))``, ``l = -f(r) A``, ``tau = tau_pos`` if ``A > 0`` else
    ``tau_neg``. The gradient is ``w(r) A grad r`` with ``w = 4 sigmoid(x)(1 - sigmoid(x))``,
    ``x = tau (r - 1)``: ``w(1) = 1`` (exactly the policy gradient on-policy) and ``w`` decays
    smoothly as the token drifts off-policy, faster for negative advantages (tau_neg > tau_pos).
    The per-token gate weight ``w`` is returned as the ``gate_weight`` diagnostic.
    """
    mask, ratio, adv = _token_ratio(logprobs, old_logprobs, advantages, mask)
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0))
    loss = -(4.0 / tau) * gate * adv
    weight = (4.0 * gate * (1.0 - gate)).detach()
    return PolicyLossTerms(loss, extra={"ratio": ratio, "gate_weight": weight})


def cispo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 1.0,
    clip_high: float = 0.28,
) -> PolicyLossTerms:
    """CISPO ("MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention",
    MiniMax 2025): clip the IS weight, not the update.

    ``l = -sg(clip(r, 1-eps_low, 1+eps_high)) * A * log pi(y_t)``. Every token keeps a gradient
    (``-w A grad log pi``), including the rare low-probability "fork" tokens that PPO's clip
    would silence. Regions where the weight was clipped are reported as low / high.
    """
    mask, ratio, adv = _token_ratio(logprobs, old_logprobs, advantages, mask)
    weight = ratio.detach().clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = -weight * adv * masked(logprobs, mask, "logprobs")
    low = mask & (ratio < 1.0 - clip_low)
    high = mask & (ratio > 1.0 + clip_high)
    return PolicyLossTerms(loss, low, high, None, {"ratio": ratio})


def policy_loss_terms(
    config: AlgorithmConfig,
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
) -> PolicyLossTerms:
    """Dispatch to the configured surrogate with the config's hyperparameters."""
    name = config.policy_loss
    args = (logprobs, old_logprobs, advantages, mask)
    if name == "ppo":
        return ppo_clip_loss(*args, clip_low=config.clip_low, clip_high=config.clip_high, dual_clip=config.dual_clip)
    if name in ("gspo", "gspo_token"):
        return gspo_loss(*args, clip_low=config.gspo_clip_low, clip_high=config.gspo_clip_high,
                         token_level=name == "gspo_token")
    if name == "sapo":
        return sapo_loss(*args, tau_pos=config.sapo_tau_pos, tau_neg=config.sapo_tau_neg)
    if name == "cispo":
        return cispo_loss(*args, clip_low=config.cispo_clip_low, clip_high=config.cispo_clip_high)
    raise ValueError(f"unknown policy_loss {name!r}; allowed: ppo, gspo, gspo_token, sapo, cispo")


@dataclass(frozen=True)
class LossOutput:
    """The micro-batch loss to ``backward()`` and its metrics (detached 0-dim tensors).

    Metric names ending in ``_max`` / ``_min`` merge by max / min; all others are this
    micro-batch's share of a full-batch quantity and merge by sum (see :func:`merge_metrics`).
    """

    loss: Tensor
    metrics: dict[str, Tensor]


@dataclass(frozen=True)
class _MetricShares:
    """Turns ``[b, T]`` token values into micro-batch metrics that merge into full-batch ones:
    :meth:`share` (this part of the global token mean) and :meth:`extreme` (max / min over the
    loss tokens; None when the micro-batch has none, so the metric is left out)."""

    normalizer: LossNormalizer
    mask: Tensor
    dtype: torch.dtype

    def share(self, x: Tensor) -> Tensor:
        return self.normalizer.token_mean(x.detach().to(self.dtype), self.mask)

    def extreme(self, x: Tensor, which: str) -> Tensor | None:
        if not self.mask.any():
            return None
        values = x.detach()[self.mask]
        return values.max() if which == "max" else values.min()


def _check_loss_inputs(
    config: AlgorithmConfig,
    normalizer: LossNormalizer,
    rollout_logprobs: Tensor | None,
    ref_logprobs: Tensor | None,
    entropies: Tensor | None,
) -> None:
    """Refuse a call that lacks what the config's terms need (before any work)."""
    if normalizer.mode != config.loss_agg_mode:
        raise ValueError(
            f"normalizer mode {normalizer.mode!r} differs from loss_agg_mode "
            f"{config.loss_agg_mode!r}; build it with LossNormalizer.from_mask(mask, config)"
        )
    if config.rollout_correction != "none" and rollout_logprobs is None:
        raise ValueError(
            f"rollout_correction={config.rollout_correction!r} needs rollout_logprobs "
            "(the inference engine's logprobs of the sampled tokens)"
        )
    if config.kl_loss_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_loss_coef > 0 needs ref_logprobs (the reference policy's logprobs)")
    if config.entropy_coef > 0 and entropies is None:
        raise ValueError("entropy_coef > 0 needs entropies (per-token entropy of the policy)")


def _put(metrics: dict[str, Tensor], name: str, value: Tensor | None) -> None:
    if value is not None:
        metrics[name] = value


def _rollout_metrics_and_weights(
    config: AlgorithmConfig, old_logprobs: Tensor, rollout_logprobs: Tensor, m: _MetricShares
) -> tuple[Tensor | None, dict[str, Tensor]]:
    """The train/rollout gap, and the rollout-correction weights (None without a correction)
    with their metrics."""
    mask = m.mask
    gap = (
        masked(old_logprobs.detach(), mask, "old_logprobs")
        - masked(rollout_logprobs.detach(), mask, "rollout_logprobs")
    ).abs()
    metrics = {"rollout_gap_mean": m.share(gap)}
    _put(metrics, "rollout_gap_max", m.extreme(gap, "max"))
    if config.rollout_correction == "none":
        return None, metrics
    isw = rollout_correction_weights(config, old_logprobs, rollout_logprobs, mask)
    metrics["is_weight_mean"] = m.share(isw.raw)
    metrics["is_truncated_frac"] = m.share(isw.truncated.float())
    metrics["is_dropped_frac"] = m.share(isw.dropped.float())
    _put(metrics, "is_weight_min", m.extreme(isw.raw, "min"))
    _put(metrics, "is_weight_max", m.extreme(isw.raw, "max"))
    return isw.weights, metrics


def _surrogate_metrics(
    terms: PolicyLossTerms, logprobs: Tensor, old_logprobs: Tensor, m: _MetricShares
) -> dict[str, Tensor]:
    """Clip fractions, the ratio, the approximate KL(pi_old || pi) and SAPO's gate weight."""
    metrics: dict[str, Tensor] = {}
    for name, region in (
        ("clipfrac_low", terms.clipped_low),
        ("clipfrac_high", terms.clipped_high),
        ("clipfrac_dual", terms.clipped_dual),
    ):
        if region is not None:
            metrics[name] = m.share(region.float())
    ratio = terms.extra["ratio"]
    metrics["ratio_mean"] = m.share(ratio)
    _put(metrics, "ratio_max", m.extreme(ratio, "max"))
    metrics["approx_kl"] = m.share(kl_estimate(old_logprobs.detach(), logprobs.detach(), m.mask, "k3"))
    if "gate_weight" in terms.extra:
        metrics["sapo_gate_weight_mean"] = m.share(terms.extra["gate_weight"])
    return metrics


def _kl_term(
    config: AlgorithmConfig, logprobs: Tensor, ref_logprobs: Tensor | None, m: _MetricShares
) -> tuple[Tensor | None, dict[str, Tensor]]:
    """``kl_loss_coef * agg(kl(pi, pi_ref))`` (None when off) and the KL metrics."""
    if ref_logprobs is None:
        return None, {}
    kl = kl_estimate(logprobs, ref_logprobs.detach(), m.mask, config.kl_loss_estimator)
    metrics = {"kl_ref": m.share(kl)}
    if config.kl_loss_coef <= 0:
        return None, metrics
    kl_loss = m.normalizer.aggregate(kl, m.mask)
    metrics["kl_loss"] = kl_loss.detach()
    return config.kl_loss_coef * kl_loss, metrics


def _entropy_bonus(
    config: AlgorithmConfig, entropies: Tensor | None, m: _MetricShares
) -> tuple[Tensor | None, dict[str, Tensor]]:
    """``entropy_coef * agg(H)`` (None when off), to subtract from the loss, and its metric."""
    if entropies is None:
        return None, {}
    metrics = {"entropy": m.share(entropies)}
    if config.entropy_coef <= 0:
        return None, metrics
    return config.entropy_coef * m.normalizer.aggregate(entropies, m.mask), metrics


def compute_policy_loss(
    config: AlgorithmConfig,
    *,
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    normalizer: LossNormalizer,
    rollout_logprobs: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    entropies: Tensor | None = None,
) -> LossOutput:
    """Total loss of one micro-batch: surrogate (IS-corrected) + KL term - entropy bonus.

    ``loss = agg(w * l_policy) + kl_loss_coef * agg(kl(pi, pi_ref)) - entropy_coef * agg(H)``

    where ``agg`` is ``normalizer.aggregate`` and ``w`` the rollout-correction weights (1 when
    ``rollout_correction == "none"``).

    Args:
        logprobs: ``[b, T]`` current policy, with gradient.
        old_logprobs: ``[b, T]`` proximal/old policy the surrogate clips against (the trainer's
            recompute; for strictly on-policy single-update training it may be
            ``logprobs.detach()``).
        advantages: ``[b, T]`` from :func:`compute_advantages` (rows of this micro-batch).
        mask: ``[b, T]`` loss mask.
        normalizer: built once from the full batch with :meth:`LossNormalizer.from_mask`.
        rollout_logprobs: ``[b, T]`` behaviour (engine) logprobs; needed by any correction, and
            when given the train/rollout gap is reported.
        ref_logprobs: ``[b, T]`` reference policy, needed when ``kl_loss_coef > 0``; when given
            the KL is reported.
        entropies: ``[b, T]`` per-token entropy of the current policy, needed when
            ``entropy_coef > 0``; when given its mean is reported.

    Metrics: ``loss``, ``pg_loss``, ``clipfrac_low/high/dual`` (fraction of loss tokens in each
    clipped region), ``approx_kl`` (k3 of KL(pi_old || pi)), ``ratio_mean``, ``ratio_max``;
    with rollout logprobs ``rollout_gap_mean`` / ``rollout_gap_max`` (|log pi_old - log
    pi_rollout|); with a correction ``is_weight_mean/min/max`` (raw weights),
    ``is_truncated_frac``, ``is_dropped_frac``; ``kl_ref``, ``kl_loss``; ``entropy``; SAPO adds
    ``sapo_gate_weight_mean``.
    """
    mask = as_mask(mask)
    _check_loss_inputs(config, normalizer, rollout_logprobs, ref_logprobs, entropies)
    terms = policy_loss_terms(config, logprobs, old_logprobs, advantages, mask)
    token_loss = terms.loss
    m = _MetricShares(normalizer, mask, token_loss.dtype)
    metrics: dict[str, Tensor] = {}
    if rollout_logprobs is not None:
        is_weights, metrics = _rollout_metrics_and_weights(config, old_logprobs, rollout_logprobs, m)
        if is_weights is not None:
            token_loss = token_loss * is_weights.to(token_loss.dtype)
    loss = pg_loss = normalizer.aggregate(token_loss, mask)
    metrics["pg_loss"] = pg_loss.detach()
    metrics.update(_surrogate_metrics(terms, logprobs, old_logprobs, m))
    kl_term, kl_metrics = _kl_term(config, logprobs, ref_logprobs, m)
    metrics.update(kl_metrics)
    if kl_term is not None:
        loss = loss + kl_term
    bonus, entropy_metrics = _entropy_bonus(config, entropies, m)
    metrics.update(entropy_metrics)
    if bonus is not None:
        loss = loss - bonus
    metrics["loss"] = loss.detach()
    return LossOutput(loss=loss, metrics=metrics)


# =============================================================================================
# 7. Metrics across micro-batches
# =============================================================================================


def merge_metrics(acc: dict[str, Tensor], new: dict[str, Tensor]) -> dict[str, Tensor]:
    """Combine two micro-batches' metrics: ``*_max`` by max, ``*_min`` by min, others by sum.

    Starting from ``{}`` and merging every micro-batch of a step yields the full-batch metrics.
    """
    out = dict(acc)
    for name, value in new.items():
        value = value.detach()
        if name not in out:
            out[name] = value
        elif name.endswith("_max"):
            out[name] = torch.maximum(out[name], value)
        elif name.endswith("_min"):
            out[name] = torch.minimum(out[name], value)
        else:
            out[name] = out[name] + value
    return out
