"""RL algorithms for language models: advantages, policy losses, KL terms, off-policy correction.

Everything here is a pure function over torch tensors: no model, no optimizer, no device or
backend assumptions, so the plain-torch and megatron-core backends compute bit-identical losses.
The module reads top to bottom, CleanRL style:

1. :class:`AlgorithmConfig` -- every hyperparameter, its paper default and its meaning (in
   :mod:`.config`, which imports no torch, so validating a training config stays light).
2. Advantages -- GRPO (with or without the std, i.e. Dr.GRPO), RLOO, REINFORCE++-baseline,
   KL folded into the reward, on-policy distillation; :func:`compute_advantages` picks one.
3. KL estimators k1 / k2 / k3 (:func:`kl_estimate`).
4. Train/rollout mismatch correction: TIS, MIS and the decoupled (AReaL) objective.
5. Loss aggregation and the global-batch :class:`LossNormalizer`.
6. Policy losses -- PPO-clip (clip-higher, dual-clip), GSPO, GSPO-token, SAPO, CISPO;
   :func:`compute_policy_loss` assembles loss + KL + entropy + metrics for one micro-batch.
7. Metric merging across micro-batches (:func:`merge_metrics`).

Tensor conventions (B sequences, T response positions, right or left padded):

- ``logprobs`` / ``old_logprobs`` / ``rollout_logprobs`` / ``ref_logprobs``: ``[B, T]`` float,
  log-probability of the *sampled* token at each position.
- ``mask``: ``[B, T]`` bool or 0/1, 1 on tokens the model generated and is trained on (env and
  tool tokens of a multi-turn episode are 0). Padded positions may hold any value, even NaN or
  inf: inputs are zeroed there before use, so garbage never reaches the loss or the gradient.
- ``rewards``: ``[B]`` one scalar per sequence; ``group_ids``: ``[B]`` the prompt / env-seed
  each sample belongs to. Groups are found by id, never by position, so a batch may interleave
  or shuffle groups freely.
- ``advantages``: ``[B, T]`` (sequence advantages broadcast to tokens by the mask).

Typical use in a training step::

    cfg = AlgorithmConfig(policy_loss="gspo", loss_agg_mode="seq-mean-token-mean")
    adv = compute_advantages(cfg, rewards, group_ids, mask).advantages
    norm = LossNormalizer.from_mask(mask, cfg)          # once, over the WHOLE step's batch
    metrics = {}
    for mb in micro_batches:                             # any split, even uneven
        out = compute_policy_loss(cfg, logprobs=model(mb), old_logprobs=mb.old,
                                  advantages=adv[mb.rows], mask=mask[mb.rows],
                                  normalizer=norm, rollout_logprobs=mb.rollout)
        out.loss.backward()                              # no division by the micro-batch count
        metrics = merge_metrics(metrics, out.metrics)
    optimizer.step()

The sum of the micro-batch losses equals the full-batch loss exactly (see
:class:`LossNormalizer`), and merged metrics equal the full-batch metrics.
"""

from relax_gym.lazy_exports import lazy_exports

# Names load on first use, so ``relax_gym.trainer.algorithms.config`` (the torch-free
# ``algorithm:`` section) can be imported by config validation without importing torch.
__getattr__, __all__ = lazy_exports(__name__, {
    "tensor_ops": ["LOG_RATIO_CLAMP"],
    "config": [
        "AdvantageEstimator", "AlgorithmConfig", "ISLevel", "KLEstimator", "LossAggMode",
        "PolicyLoss", "RolloutCorrection",
    ],
    "advantages": [
        "GroupStats", "group_stats", "zero_variance_groups", "grpo_advantages",
        "rloo_advantages", "reinforce_pp_baseline_advantages", "kl_penalized_rewards",
        "distillation_advantages", "AdvantageOutput", "compute_advantages",
    ],
    "kl": ["kl_estimate"],
    "losses": [
        "importance_log_weights", "ISWeights", "truncated_is_weights", "masked_is_weights",
        "rollout_correction_weights", "LossNormalizer", "PolicyLossTerms", "ppo_clip_loss",
        "gspo_loss", "sapo_loss", "cispo_loss", "policy_loss_terms", "LossOutput",
        "compute_policy_loss", "merge_metrics",
    ],
})
