"""The ``algorithm:`` section of a training config: every RL hyperparameter, no tensors.

Kept apart from :mod:`.algorithms` (the tensor functions that read it) so that the training
config can embed it without importing torch: validating a config is a CPU-light step that runs
before any model is loaded. :mod:`.algorithms` re-exports everything here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

AdvantageEstimator = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"]
PolicyLoss = Literal["ppo", "gspo", "gspo_token", "sapo", "cispo"]
LossAggMode = Literal[
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
]
KLEstimator = Literal["k1", "k2", "k3"]
RolloutCorrection = Literal["none", "tis", "mis", "decoupled"]
ISLevel = Literal["token", "sequence", "geometric"]


# =============================================================================================
# The config
# =============================================================================================


class AlgorithmConfig(BaseModel):
    """Every algorithm hyperparameter, with the paper's default beside it.

    The training config embeds this model (``algorithm:`` section). Unknown keys are rejected,
    so a typo fails before any work starts, with an error naming the field.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # inf/nan coefs poison the loss

    # --- advantages ----------------------------------------------------------------------
    advantage_estimator: AdvantageEstimator = Field(
        default="grpo",
        description="grpo: (r-mean)/(std+eps) per group (DeepSeekMath). dr_grpo: r-mean, no "
        "std (Dr.GRPO). rloo: r minus the mean of the other samples (RLOO). "
        "reinforce_pp_baseline: r-mean per group, divided by the batch std (REINFORCE++).",
    )
    adv_eps: float = Field(
        default=1e-6,
        gt=0,
        description="Added to the std before dividing (grpo, reinforce_pp_baseline).",
    )
    std_unbiased: bool = Field(
        default=True,
        description="Bessel-corrected std (n-1), as torch.std; False uses the population std.",
    )

    # --- policy loss -------------------------------------------------------------------------
    policy_loss: PolicyLoss = Field(
        default="ppo", description="Which surrogate objective to optimise."
    )
    clip_low: float = Field(
        default=0.2, gt=0, lt=1, description="PPO ratio lower bound 1-clip_low (PPO, DAPO)."
    )
    clip_high: float = Field(
        default=0.28,
        gt=0,
        description="PPO ratio upper bound 1+clip_high; 0.28 is DAPO's clip-higher.",
    )
    dual_clip: float | None = Field(
        default=3.0,
        gt=1,
        description="Dual-clip constant c (Ye et al. 2020): for A<0 the loss is capped at -c*A. "
        "None disables it.",
    )
    gspo_clip_low: float = Field(
        default=3e-4, gt=0, lt=1, description="GSPO sequence-ratio lower bound 1-eps (GSPO paper)."
    )
    gspo_clip_high: float = Field(
        default=4e-4, gt=0, description="GSPO sequence-ratio upper bound 1+eps (GSPO paper)."
    )
    sapo_tau_pos: float = Field(
        default=1.0, gt=0, description="SAPO gate temperature for tokens with positive advantage."
    )
    sapo_tau_neg: float = Field(
        default=1.05,
        gt=0,
        description="SAPO gate temperature for A<=0; larger than tau_pos so negative updates "
        "decay faster off-policy (SAPO paper).",
    )
    cispo_clip_low: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="CISPO IS-weight lower bound 1-eps_low; 1.0 means no lower bound, as in "
        "MiniMax-M1.",
    )
    cispo_clip_high: float = Field(
        default=0.28,
        gt=0,
        description="CISPO IS-weight upper bound 1+eps_high (MiniMax-M1 tunes only this one).",
    )

    # --- aggregation ----------------------------------------------------------------------
    loss_agg_mode: LossAggMode = Field(
        default="token-mean",
        description="How token losses become one number; see LossNormalizer. GSPO's paper uses "
        "seq-mean-token-mean, Dr.GRPO uses seq-mean-token-sum-norm.",
    )
    loss_norm_length: int | None = Field(
        default=None,
        ge=1,
        description="Constant L of seq-mean-token-sum-norm (Dr.GRPO): set it to the generation "
        "budget (max_new_tokens). None uses the padded response length of the batch.",
    )

    # --- KL to a reference policy ---------------------------------------------------------------
    kl_loss_coef: float = Field(
        default=0.0,
        ge=0,
        description="beta of the KL-to-reference loss term (GRPO uses 0.04); 0 = off.",
    )
    kl_loss_estimator: KLEstimator = Field(
        default="k3", description="Estimator for the KL loss term (GRPO uses k3)."
    )
    kl_reward_coef: float = Field(
        default=0.0,
        ge=0,
        description="beta of the KL penalty folded into the reward: r - beta*sum_t kl_t; 0 = off.",
    )
    kl_reward_estimator: KLEstimator = Field(
        default="k1", description="Estimator for the in-reward KL penalty (PPO-RLHF uses k1)."
    )

    # --- on-policy distillation -----------------------------------------------------------
    distill_coef: float = Field(
        default=0.0,
        ge=0,
        description="Coefficient of the per-token reverse KL to a teacher subtracted from the "
        "advantage; 0 = off.",
    )

    # --- entropy ------------------------------------------------------------------------------
    entropy_coef: float = Field(
        default=0.0, ge=0, description="Entropy bonus: loss -= coef * aggregated entropy; 0 = off."
    )

    # --- train/rollout mismatch correction ------------------------------------------------------
    rollout_correction: RolloutCorrection = Field(
        default="none",
        description="Weight the loss by pi_old/pi_rollout. tis: truncate at tis_cap (TIS). "
        "mis: zero weights outside [mis_low, mis_high] (MIS). decoupled: untruncated weight, "
        "tokens above decoupled_cap dropped (AReaL's decoupled PPO).",
    )
    rollout_is_level: ISLevel = Field(
        default="token",
        description="token: one weight per token. sequence: product over the sequence. "
        "geometric: geometric mean over the sequence (length-normalised).",
    )
    tis_cap: float = Field(default=2.0, gt=0, description="TIS truncation cap C (Yao et al. 2025).")
    mis_low: float = Field(default=0.5, ge=0, description="MIS lower bound on the IS weight.")
    mis_high: float = Field(default=2.0, gt=0, description="MIS upper bound on the IS weight.")
    decoupled_cap: float | None = Field(
        default=None,
        gt=0,
        description="Decoupled objective: drop tokens whose behaviour IS weight exceeds this; "
        "None keeps all.",
    )

    @property
    def needs_reference(self) -> bool:
        """A KL term (in the loss or folded into the reward) needs the reference policy's logprobs."""
        return self.kl_loss_coef > 0 or self.kl_reward_coef > 0

    @model_validator(mode="after")
    def _check_ranges(self) -> AlgorithmConfig:
        if self.mis_low >= self.mis_high:
            raise ValueError(
                f"mis_low ({self.mis_low}) must be smaller than mis_high ({self.mis_high})"
            )
        if self.dual_clip is not None and self.dual_clip <= 1.0 + self.clip_high:
            raise ValueError(
                f"dual_clip ({self.dual_clip}) must exceed 1 + clip_high ({1.0 + self.clip_high}); "
                "use dual_clip: null to disable dual-clip"
            )
        return self


__all__ = [
    "AdvantageEstimator",
    "AlgorithmConfig",
    "ISLevel",
    "KLEstimator",
    "LossAggMode",
    "PolicyLoss",
    "RolloutCorrection",
]
