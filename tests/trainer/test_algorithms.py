"""Hand-computed checks of relax_gym.trainer.algorithms.

Every expected number below is derived by hand in the comment next to it (float64 inputs, so
the comparisons are tight). The micro-batch tests check the one property the training loop
relies on: summed micro-batch losses, gradients and metrics equal the full batch's.
"""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError
from relax_gym.trainer.algorithms import (
    AlgorithmConfig,
    LossNormalizer,
    compute_advantages,
    compute_policy_loss,
    distillation_advantages,
    grpo_advantages,
    gspo_loss,
    importance_log_weights,
    kl_estimate,
    kl_penalized_rewards,
    masked_is_weights,
    merge_metrics,
    ppo_clip_loss,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
    rollout_correction_weights,
    sapo_loss,
    truncated_is_weights,
    zero_variance_groups,
)

F64 = torch.float64
OLD = math.log(0.5)  # an arbitrary old logprob; ratios are set relative to it


def tensor(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


def close(actual, expected, tol=1e-9):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=F64), torch.as_tensor(expected, dtype=F64), rtol=tol, atol=tol
    )


def logprobs_with_ratio(ratios) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs leaf with grad, old_logprobs) such that exp(logprobs - old) == ratios."""
    r = tensor(ratios)
    old = torch.full_like(r, OLD)
    return (old + torch.log(r)).detach().requires_grad_(True), old


def full_mask(shape) -> torch.Tensor:
    return torch.ones(shape, dtype=torch.bool)


# =============================================================================================
# Config
# =============================================================================================


def test_defaults_follow_the_papers():
    c = AlgorithmConfig()
    assert (c.clip_low, c.clip_high) == (0.2, 0.28)  # PPO / DAPO clip-higher
    assert (c.gspo_clip_low, c.gspo_clip_high) == (3e-4, 4e-4)  # GSPO
    assert (c.sapo_tau_pos, c.sapo_tau_neg) == (1.0, 1.05)  # SAPO
    assert c.dual_clip == 3.0 and c.tis_cap == 2.0


@pytest.mark.parametrize(
    ("kwargs", "fragments"),
    [
        ({"loss_agg_mode": "mean"}, ["loss_agg_mode", "'token-mean'", "'seq-mean-token-sum-norm'"]),
        ({"policy_loss": "grpo"}, ["policy_loss", "'ppo'", "'gspo_token'", "'cispo'"]),
        ({"advantage_estimator": "gae"}, ["advantage_estimator", "'rloo'"]),
        ({"rollout_correction": "is"}, ["rollout_correction", "'tis'", "'mis'", "'decoupled'"]),
        ({"clip_low": 1.5}, ["clip_low", "less than 1"]),
        ({"dual_clip": 1.1}, ["dual_clip", "1 + clip_high"]),
        ({"mis_low": 3.0}, ["mis_low", "mis_high"]),
        ({"clip_hi": 0.3}, ["clip_hi", "Extra inputs are not permitted"]),
    ],
)
def test_bad_config_names_field_and_allowed_values(kwargs, fragments):
    with pytest.raises(ValidationError) as err:
        AlgorithmConfig(**kwargs)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_dual_clip_can_be_disabled():
    assert AlgorithmConfig(dual_clip=None).dual_clip is None


# =============================================================================================
# Advantages
# =============================================================================================

# Two groups interleaved by position: group "a" = rows 0, 2, 4 with rewards 1, 0, 2;
# group "b" = rows 1, 3, 5 with rewards 4, 8, 6.
REWARDS = tensor([1.0, 4.0, 0.0, 8.0, 2.0, 6.0])
IDS = torch.tensor([0, 1, 0, 1, 0, 1])
MASK6 = torch.tensor(
    [[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [0, 0, 0], [1, 1, 1]], dtype=torch.bool
)


def test_grpo_groups_by_id_not_position():
    # a: mean 1, unbiased std sqrt((0+1+1)/2) = 1  -> (r-1)/1 = 0, -1, 1
    # b: mean 6, unbiased std sqrt((4+4+0)/2) = 2  -> (r-6)/2 = -1, 1, 0
    adv = grpo_advantages(REWARDS, IDS, MASK6, eps=1e-6)
    deviation = tensor([0.0, -2.0, -1.0, 2.0, 1.0, 0.0])  # r - group mean
    expected = deviation / (1.0 + 1e-6)
    expected[[1, 3, 5]] = deviation[[1, 3, 5]] / (2.0 + 1e-6)
    assert adv.shape == (6, 3) and adv.dtype == F64
    close(adv, expected[:, None] * MASK6)
    assert (adv[~MASK6] == 0).all()  # broadcast only onto response tokens
    # the same rewards with the groups stored contiguously give the same per-sample values
    perm = torch.tensor([0, 2, 4, 1, 3, 5])
    close(grpo_advantages(REWARDS[perm], IDS[perm], MASK6[perm]), adv[perm])


def test_dr_grpo_drops_the_std():
    # r - group mean: a: 0, -1, 1; b: -2, 2, 0
    adv = grpo_advantages(REWARDS, IDS, full_mask((6, 1)), normalize_std=False)
    close(adv[:, 0], [0.0, -2.0, -1.0, 2.0, 1.0, 0.0])


def test_grpo_population_std_and_string_ids():
    # group x: [0, 2], mean 1: unbiased std sqrt(2) -> -+1/sqrt(2); population std 1 -> -+1
    rewards, ids, m = tensor([0.0, 2.0]), ["x", "x"], full_mask((2, 1))
    close(grpo_advantages(rewards, ids, m, eps=0.0)[:, 0], [-(0.5**0.5), 0.5**0.5])
    close(grpo_advantages(rewards, ids, m, eps=0.0, unbiased=False)[:, 0], [-1.0, 1.0])


def test_singleton_and_zero_variance_groups_get_exactly_zero():
    # 0.1+0.1+0.1 != 0.3 in floating point: without the explicit rule, (r - mean) / eps would
    # turn rounding noise (~1e-17 / 1e-6) into a nonzero advantage.
    rewards = tensor([0.1, 0.1, 0.1, 5.0, 1.0, 0.0])
    ids = ["same", "same", "same", "alone", "mixed", "mixed"]
    m = full_mask((6, 2))
    for adv in (
        grpo_advantages(rewards, ids, m),
        grpo_advantages(rewards, ids, m, normalize_std=False),
        rloo_advantages(rewards, ids, m),
        reinforce_pp_baseline_advantages(rewards, ids, m),
    ):
        assert torch.equal(adv[:4], torch.zeros(4, 2, dtype=F64))
        assert (adv[4] > 0).all() and (adv[5] < 0).all()
    assert zero_variance_groups(rewards, ids).tolist() == [True, True, True, True, False, False]


def test_rloo_leave_one_out_baseline():
    # a [1, 0, 2]: 1-(0+2)/2 = 0; 0-(1+2)/2 = -1.5; 2-(1+0)/2 = 1.5
    # b [4, 8]:    4-8 = -4; 8-4 = 4.   singleton [3]: 0
    rewards = tensor([1.0, 4.0, 0.0, 8.0, 2.0, 3.0])
    ids = torch.tensor([0, 1, 0, 1, 0, 7])
    adv = rloo_advantages(rewards, ids, full_mask((6, 1)))
    close(adv[:, 0], [0.0, -4.0, -1.5, 4.0, 1.5, 0.0])


def test_reinforce_pp_baseline_uses_batch_std():
    # centred: a [1,0,2] -> 0,-1,1; b [4,8] -> -2,2; singleton -> 0
    # batch: [0,-1,-2,2,1,0] mean 0, unbiased std sqrt((1+4+4+1)/5) = sqrt(2)
    rewards = tensor([1.0, 4.0, 0.0, 8.0, 2.0, 3.0])
    ids = torch.tensor([0, 1, 0, 1, 0, 7])
    adv = reinforce_pp_baseline_advantages(rewards, ids, full_mask((6, 1)), eps=0.0)
    close(adv[:, 0], tensor([0.0, -2.0, -1.0, 2.0, 1.0, 0.0]) / math.sqrt(2.0))
    constant = reinforce_pp_baseline_advantages(
        tensor([1.0, 1.0, 2.0]), [0, 0, 1], full_mask((3, 1))
    )
    assert torch.equal(constant, torch.zeros(3, 1, dtype=F64))


def test_advantage_inputs_are_validated():
    with pytest.raises(ValueError, match="finite"):
        grpo_advantages(tensor([1.0, float("nan")]), [0, 0], full_mask((2, 1)))
    with pytest.raises(ValueError, match="group_ids"):
        grpo_advantages(tensor([1.0, 2.0]), [0], full_mask((2, 1)))


def test_kl_in_reward_and_distillation_in_advantage():
    # KL in reward, k1 = logp - ref per token, summed: row0 (-1 - -2) + (-1 - -1.5) = 1.5,
    # row1 (-3 - -3) + (-2 - -1) = -1   -> r' = [1 - 0.1*1.5, 0 - 0.1*(-1)] = [0.85, 0.1]
    logp = tensor([[-1.0, -1.0], [-3.0, -2.0]])
    ref = tensor([[-2.0, -1.5], [-3.0, -1.0]])
    m = full_mask((2, 2))
    close(kl_penalized_rewards(tensor([1.0, 0.0]), logp, ref, m, coef=0.1), [0.85, 0.1])
    # distillation: reverse KL = student - teacher = [0.5, -1]; A' = A - 0.5 * kl
    adv = tensor([[1.0, 1.0]])
    out = distillation_advantages(
        adv, tensor([[-1.0, -2.0]]), tensor([[-1.5, -1.0]]), full_mask((1, 2)), coef=0.5
    )
    close(out, [[0.75, 1.5]])


def test_compute_advantages_pipeline():
    # dr_grpo on the KL-penalised rewards: [0.85, 0.1] in one group, mean 0.475 -> +-0.375;
    # then distillation with coef 1 subtracts student - teacher (teacher == ref here)
    logp = tensor([[-1.0, -1.0], [-3.0, -2.0]])
    ref = tensor([[-2.0, -1.5], [-3.0, -1.0]])
    cfg = AlgorithmConfig(advantage_estimator="dr_grpo", kl_reward_coef=0.1, distill_coef=1.0)
    out = compute_advantages(
        cfg,
        tensor([1.0, 0.0]),
        [0, 0],
        full_mask((2, 2)),
        logprobs=logp,
        ref_logprobs=ref,
        teacher_logprobs=ref,
    )
    close(out.advantages, [[0.375 - 1.0, 0.375 - 0.5], [-0.375 - 0.0, -0.375 + 1.0]])
    assert out.metrics["zero_variance_group_frac"] == 0.0
    close(out.metrics["kl_reward_penalty_mean"], (0.15 - 0.1) / 2)
    with pytest.raises(ValueError, match="teacher_logprobs"):
        compute_advantages(
            cfg, tensor([1.0, 0.0]), [0, 0], full_mask((2, 2)), logprobs=logp, ref_logprobs=ref
        )


# =============================================================================================
# KL estimators
# =============================================================================================


def test_kl_estimators_by_hand():
    # token 0: pi = 0.5, ref = 0.25 -> log r = log(ref/pi) = -ln 2
    #   k1 = ln 2, k2 = (ln 2)^2 / 2, k3 = (0.5 - 1) + ln 2
    # token 1: pi = 0.25, ref = 0.5 -> log r = ln 2
    #   k1 = -ln 2, k2 = (ln 2)^2 / 2, k3 = (2 - 1) - ln 2
    ln2 = math.log(2.0)
    logp = tensor([[math.log(0.5), math.log(0.25)]])
    ref = tensor([[math.log(0.25), math.log(0.5)]])
    m = full_mask((1, 2))
    close(kl_estimate(logp, ref, m, "k1"), [[ln2, -ln2]])
    close(kl_estimate(logp, ref, m, "k2"), [[ln2**2 / 2, ln2**2 / 2]])
    close(kl_estimate(logp, ref, m, "k3"), [[ln2 - 0.5, 1 - ln2]])
    # k2's gradient w.r.t. log pi is (log pi - log ref): [ln 2, -ln 2]
    leaf = logp.clone().requires_grad_(True)
    kl_estimate(leaf, ref, m, "k2").sum().backward()
    close(leaf.grad, [[ln2, -ln2]])


# =============================================================================================
# Policy losses
# =============================================================================================


def test_ppo_clip_every_region():
    # (ratio, A) -> loss l = max(-A r, -A clip(r, 0.8, 1.28)), dual min(l, -3A) for A < 0
    ratios = [1.1, 1.5, 0.5, 0.5, 1.5, 4.0, 1.2, 2.0]
    adv = tensor([[1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -2.0, 0.0]])
    # 1.1,+1: inside          -> -1.1,  grad d/dlogp = -A r = -1.1
    # 1.5,+1: high clip       -> -1.28, grad 0
    # 0.5,+1: pessimistic side-> -0.5,  grad -0.5 (PPO never clips r<1 when A>0)
    # 0.5,-1: low clip        ->  0.8,  grad 0
    # 1.5,-1: inside (< c)    ->  1.5,  grad 1.5
    # 4.0,-1: dual clip       ->  3.0,  grad 0
    # 1.2,-2: inside          ->  2.4,  grad 2.4
    # 2.0, 0: zero advantage  ->  0,    grad 0
    logp, old = logprobs_with_ratio([ratios])
    m = full_mask((1, 8))
    terms = ppo_clip_loss(logp, old, adv, m, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    close(terms.loss, [[-1.1, -1.28, -0.5, 0.8, 1.5, 3.0, 2.4, 0.0]])
    assert terms.clipped_high.tolist() == [[False, True] + [False] * 6]
    assert terms.clipped_low.tolist() == [[False] * 3 + [True] + [False] * 4]
    assert terms.clipped_dual.tolist() == [[False] * 5 + [True, False, False]]
    terms.loss.sum().backward()
    close(logp.grad, [[-1.1, 0.0, -0.5, 0.0, 1.5, 0.0, 2.4, 0.0]])

    # through compute_policy_loss with token-mean: sum = 4.82 over 8 tokens
    logp2, old2 = logprobs_with_ratio([ratios])
    cfg = AlgorithmConfig()
    out = compute_policy_loss(
        cfg,
        logprobs=logp2,
        old_logprobs=old2,
        advantages=adv,
        mask=m,
        normalizer=LossNormalizer.from_mask(m, cfg),
    )
    close(out.loss, 4.82 / 8)
    for name in ("clipfrac_low", "clipfrac_high", "clipfrac_dual"):
        close(out.metrics[name], 1 / 8)
    close(out.metrics["ratio_max"], 4.0)

    # without dual-clip the (4.0, -1) token is unbounded: loss 4, gradient 4
    logp3, old3 = logprobs_with_ratio([[4.0]])
    no_dual = ppo_clip_loss(logp3, old3, tensor([[-1.0]]), full_mask((1, 1)), dual_clip=None)
    no_dual.loss.sum().backward()
    close(no_dual.loss, [[4.0]])
    close(logp3.grad, [[4.0]])


def test_gspo_ratio_is_geometric_mean_of_token_ratios():
    # token ratios 2, 0.5, 1.5 -> s = (2 * 0.5 * 1.5)^(1/3) = 1.5^(1/3); the 4th position is
    # padding holding NaN, which must not leak into anything.
    s = 1.5 ** (1 / 3)
    logp, old = logprobs_with_ratio([[2.0, 0.5, 1.5, 1.0]])
    with torch.no_grad():
        logp[0, 3] = float("nan")
    m = torch.tensor([[True, True, True, False]])
    # wide clip so the ratio is inside: A = +1 -> l_i = -s on each token, grad d(-s)/dlogp_t = -s/3
    terms = gspo_loss(logp, old, tensor([[1.0, 1.0, 1.0, 0.0]]), m, clip_low=0.9, clip_high=1.0)
    close(terms.extra["ratio"][0, :3], [s, s, s])
    close(terms.loss[0, :3], [-s, -s, -s])
    terms.loss[0, 0].backward()
    close(logp.grad, [[-s / 3, -s / 3, -s / 3, 0.0]])

    # paper clip 3e-4 / 4e-4: s = 1.1447 > 1.0004 -> for A > 0 loss -1.0004, no gradient;
    # for A < 0 the unclipped branch s is larger -> loss s
    logp2, old2 = logprobs_with_ratio([[2.0, 0.5, 1.5]])
    pos = gspo_loss(logp2, old2, tensor([[1.0] * 3]), full_mask((1, 3)))
    neg = gspo_loss(logp2, old2, tensor([[-1.0] * 3]), full_mask((1, 3)))
    close(pos.loss, [[-1.0004] * 3])
    assert pos.clipped_high.all() and not pos.clipped_low.any()
    close(neg.loss, [[s] * 3])
    pos.loss[0, 0].backward()
    close(logp2.grad, [[0.0, 0.0, 0.0]])


def test_gspo_token_matches_gspo_with_sequence_advantages():
    torch.manual_seed(0)
    b, t = 5, 6
    mask = torch.rand(b, t) > 0.3
    mask[:, 0] = True
    old = -torch.rand(b, t, dtype=F64) * 3
    # sequence log-ratios straddle the 3e-4 / 4e-4 band: row 0 clips high (A>0), row 1 clips
    # low (A<0), the others stay inside or on the pessimistic side
    offset = tensor([6e-4, -6e-4, 1e-4, 6e-4, -6e-4])[:, None]
    base = (old + offset + torch.randn(b, t, dtype=F64) * 5e-5).detach()
    adv = tensor([1.0, -1.0, 0.7, -2.0, 1.5])[:, None].expand(b, t) * mask
    cfg_seq = AlgorithmConfig(policy_loss="gspo", loss_agg_mode="seq-mean-token-mean")
    cfg_tok = cfg_seq.model_copy(update={"policy_loss": "gspo_token"})
    norm = LossNormalizer.from_mask(mask, cfg_seq)
    results = []
    for cfg in (cfg_seq, cfg_tok):
        logp = base.clone().requires_grad_(True)
        out = compute_policy_loss(
            cfg, logprobs=logp, old_logprobs=old, advantages=adv, mask=mask, normalizer=norm
        )
        out.loss.backward()
        results.append(
            (
                out.loss.detach(),
                logp.grad,
                out.metrics["clipfrac_high"] + out.metrics["clipfrac_low"],
            )
        )
    close(results[0][0], results[1][0], tol=1e-12)
    close(results[0][1], results[1][1], tol=1e-12)
    close(results[0][2], results[1][2])
    assert 0 < float(results[0][2]) < 1  # the band really was straddled


def test_sapo_gradient_at_ratio_one_is_the_policy_gradient():
    torch.manual_seed(1)
    old = -torch.rand(3, 4, dtype=F64) * 2
    adv = torch.randn(3, 4, dtype=F64)
    m = full_mask((3, 4))
    logp = old.clone().requires_grad_(True)  # on-policy: r = 1 everywhere
    sapo_loss(logp, old, adv, m, tau_pos=1.0, tau_neg=1.05).loss.sum().backward()
    ref = old.clone().requires_grad_(True)
    (-(adv * ref)).sum().backward()  # vanilla policy gradient: -A log pi
    close(logp.grad, ref.grad, tol=1e-12)
    close(logp.grad, -adv, tol=1e-12)


def test_sapo_soft_gate_off_policy_by_hand():
    # r = 2. A = +1, tau = 1:    x = 1,    loss = -4 sigmoid(1),
    #        grad = -A * 4 sig(x)(1-sig(x)) * r = -8 sig(1)(1 - sig(1))
    # A = -1, tau = 1.05: x = 1.05, loss = +(4/1.05) sigmoid(1.05), grad = +8 sig(1.05)(1-sig(1.05))
    def sig(x):
        return 1 / (1 + math.exp(-x))

    logp, old = logprobs_with_ratio([[2.0, 2.0]])
    terms = sapo_loss(logp, old, tensor([[1.0, -1.0]]), full_mask((1, 2)))
    close(terms.loss, [[-4 * sig(1.0), 4 / 1.05 * sig(1.05)]])
    terms.loss.sum().backward()
    close(logp.grad, [[-8 * sig(1.0) * (1 - sig(1.0)), 8 * sig(1.05) * (1 - sig(1.05))]])
    close(
        terms.extra["gate_weight"],
        [[4 * sig(1.0) * (1 - sig(1.0)), 4 * sig(1.05) * (1 - sig(1.05))]],
    )


def test_cispo_clips_the_weight_not_the_gradient():
    # ratios 0.5, 1, 2 with A = +1: w = clip(r, 0, 1.28) = 0.5, 1, 1.28 (stop-gradient)
    # loss = -w A log pi ; grad = -w A  (the r = 2 token still learns, scaled by 1.28)
    logp, old = logprobs_with_ratio([[0.5, 1.0, 2.0]])
    m = full_mask((1, 3))
    cfg = AlgorithmConfig(policy_loss="cispo", loss_agg_mode="seq-mean-token-sum")
    out = compute_policy_loss(
        cfg,
        logprobs=logp,
        old_logprobs=old,
        advantages=tensor([[1.0] * 3]),
        mask=m,
        normalizer=LossNormalizer.from_mask(m, cfg),
    )
    lp = logp.detach()
    close(out.loss, -(0.5 * lp[0, 0] + 1.0 * lp[0, 1] + 1.28 * lp[0, 2]))
    out.loss.backward()
    close(logp.grad, [[-0.5, -1.0, -1.28]])
    close(out.metrics["clipfrac_high"], 1 / 3)
    close(out.metrics["clipfrac_low"], 0.0)


# =============================================================================================
# Train/rollout mismatch correction
# =============================================================================================


def test_tis_caps_weights_at_two():
    # pi_old / pi_rollout = 0.5, 1, 3, 10 -> min(w, 2) = 0.5, 1, 2, 2
    m = full_mask((1, 4))
    log_w = torch.log(tensor([[0.5, 1.0, 3.0, 10.0]]))
    isw = truncated_is_weights(log_w, m, cap=2.0)
    close(isw.weights, [[0.5, 1.0, 2.0, 2.0]])
    assert isw.truncated.tolist() == [[False, False, True, True]]
    assert not isw.dropped.any()

    # in the loss: on-policy PPO (r = 1), A = 1 -> token loss -1, weighted token-mean
    # = -(0.5 + 1 + 2 + 2) / 4 = -1.375, grad = -w / 4
    old = torch.full((1, 4), OLD, dtype=F64)
    rollout = old - log_w
    logp = old.clone().requires_grad_(True)
    cfg = AlgorithmConfig(rollout_correction="tis")
    out = compute_policy_loss(
        cfg,
        logprobs=logp,
        old_logprobs=old,
        advantages=tensor([[1.0] * 4]),
        mask=m,
        normalizer=LossNormalizer.from_mask(m, cfg),
        rollout_logprobs=rollout,
    )
    close(out.loss, -1.375)
    out.loss.backward()
    close(logp.grad, [[-0.5 / 4, -1 / 4, -2 / 4, -2 / 4]])
    close(out.metrics["is_truncated_frac"], 0.5)
    close(out.metrics["is_weight_max"], 10.0)
    close(out.metrics["is_weight_min"], 0.5)
    # train/rollout gap |log w|: mean (ln2 + 0 + ln3 + ln10) / 4, max ln 10
    close(out.metrics["rollout_gap_mean"], (math.log(2) + math.log(3) + math.log(10)) / 4)
    close(out.metrics["rollout_gap_max"], math.log(10))


def test_tis_sequence_and_geometric_levels():
    # one sequence, token ratios 1.5 and 2: product 3 -> capped to 2 on both tokens;
    # geometric mean sqrt(3) = 1.732 < 2 -> kept
    m = full_mask((1, 2))
    old = torch.zeros(1, 2, dtype=F64)
    rollout = -torch.log(tensor([[1.5, 2.0]]))
    seq = truncated_is_weights(importance_log_weights(old, rollout, m, "sequence"), m, 2.0)
    geo = truncated_is_weights(importance_log_weights(old, rollout, m, "geometric"), m, 2.0)
    close(seq.weights, [[2.0, 2.0]])
    close(geo.weights, [[math.sqrt(3.0)] * 2])


def test_mis_masks_tokens_and_sequences_outside_bounds():
    # token level: ratios 0.4, 0.5, 1, 2, 2.5 in [0.5, 2] -> 0, 0.5, 1, 2, 0
    m = full_mask((1, 5))
    isw = masked_is_weights(torch.log(tensor([[0.4, 0.5, 1.0, 2.0, 2.5]])), m, 0.5, 2.0)
    close(isw.weights, [[0.0, 0.5, 1.0, 2.0, 0.0]])
    assert isw.dropped.tolist() == [[True, False, False, False, True]]
    # sequence level: row 0 ratios 1.5, 1.5 -> 2.25 > 2: whole sequence dropped;
    # row 1 ratios 1.2, 0.9 -> 1.08: both tokens weighted 1.08
    cfg = AlgorithmConfig(rollout_correction="mis", rollout_is_level="sequence")
    old = torch.zeros(2, 2, dtype=F64)
    rollout = -torch.log(tensor([[1.5, 1.5], [1.2, 0.9]]))
    w = rollout_correction_weights(cfg, old, rollout, full_mask((2, 2)))
    close(w.weights, [[0.0, 0.0], [1.08, 1.08]])
    assert w.dropped.tolist() == [[True, True], [False, False]]


def test_decoupled_objective_clips_against_proximal_and_weights_by_behaviour():
    # pi_prox / pi_behav = 1.5 and 4 (untruncated); r = pi / pi_prox = 1.1 and 1.5, A = 1:
    # token 0: w * -1.1 = -1.65; token 1: r clipped at 1.28 against the PROXIMAL policy,
    # w * -1.28 = -5.12 (no gradient). token-mean: (-1.65 - 5.12) / 2
    m = full_mask((1, 2))
    logp, prox = logprobs_with_ratio([[1.1, 1.5]])
    behav = prox - torch.log(tensor([[1.5, 4.0]]))
    cfg = AlgorithmConfig(rollout_correction="decoupled")
    out = compute_policy_loss(
        cfg,
        logprobs=logp,
        old_logprobs=prox,
        advantages=tensor([[1.0, 1.0]]),
        mask=m,
        normalizer=LossNormalizer.from_mask(m, cfg),
        rollout_logprobs=behav,
    )
    close(out.loss, (-1.65 - 5.12) / 2)
    out.loss.backward()
    close(logp.grad, [[-1.5 * 1.1 / 2, 0.0]])
    # with a cap of 3 the weight-4 token is dropped: loss -1.65 / 2
    capped = cfg.model_copy(update={"decoupled_cap": 3.0})
    out = compute_policy_loss(
        capped,
        logprobs=logp,
        old_logprobs=prox,
        advantages=tensor([[1.0, 1.0]]),
        mask=m,
        normalizer=LossNormalizer.from_mask(m, capped),
        rollout_logprobs=behav,
    )
    close(out.loss, -1.65 / 2)
    close(out.metrics["is_dropped_frac"], 0.5)


def test_correction_without_rollout_logprobs_is_a_clear_error():
    m = full_mask((1, 2))
    cfg = AlgorithmConfig(rollout_correction="tis")
    lp = torch.zeros(1, 2, dtype=F64)
    with pytest.raises(ValueError, match="rollout_logprobs"):
        compute_policy_loss(
            cfg,
            logprobs=lp,
            old_logprobs=lp,
            advantages=lp,
            mask=m,
            normalizer=LossNormalizer.from_mask(m, cfg),
        )


# =============================================================================================
# Aggregation, KL / entropy terms, robustness
# =============================================================================================


def test_aggregation_modes_by_hand():
    # row 0: tokens 1, 2, 3 (n=3); row 1: token 4 (n=1); row 2: no tokens (not counted)
    values = tensor([[1.0, 2.0, 3.0], [4.0, 99.0, 99.0], [99.0, 99.0, 99.0]])
    m = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    expected = {
        "token-mean": 10 / 4,
        "seq-mean-token-mean": (6 / 3 + 4 / 1) / 2,
        "seq-mean-token-sum": (6 + 4) / 2,
        "seq-mean-token-sum-norm": (6 + 4) / (2 * 3),  # L defaults to the padded width 3
    }
    for mode, value in expected.items():
        norm = LossNormalizer.from_mask(m, mode=mode)
        close(norm.aggregate(values, m), value)
    dr = LossNormalizer.from_mask(
        m, AlgorithmConfig(loss_agg_mode="seq-mean-token-sum-norm", loss_norm_length=10)
    )
    close(dr.aggregate(values, m), 10 / 20)
    empty = LossNormalizer.from_mask(torch.zeros(2, 3), mode="token-mean")
    close(empty.aggregate(values[:2], torch.zeros(2, 3)), 0.0)


def test_kl_loss_and_entropy_terms():
    # on-policy, A = 0 -> pg 0; pi = 0.5, ref = 0.25 -> k3 = ln2 - 0.5 per token;
    # loss = 0.1 * k3 - 0.01 * entropy(2.0)
    m = full_mask((2, 3))
    logp = torch.full((2, 3), math.log(0.5), dtype=F64, requires_grad=True)
    ref = torch.full((2, 3), math.log(0.25), dtype=F64)
    cfg = AlgorithmConfig(kl_loss_coef=0.1, entropy_coef=0.01)
    out = compute_policy_loss(
        cfg,
        logprobs=logp,
        old_logprobs=logp.detach(),
        advantages=torch.zeros(2, 3, dtype=F64),
        mask=m,
        normalizer=LossNormalizer.from_mask(m, cfg),
        ref_logprobs=ref,
        entropies=torch.full((2, 3), 2.0, dtype=F64),
    )
    k3 = math.log(2) - 0.5
    close(out.loss, 0.1 * k3 - 0.02)
    close(out.metrics["kl_ref"], k3)
    close(out.metrics["entropy"], 2.0)
    close(out.metrics["approx_kl"], 0.0)
    with pytest.raises(ValueError, match="ref_logprobs"):
        compute_policy_loss(
            cfg,
            logprobs=logp,
            old_logprobs=logp.detach(),
            advantages=torch.zeros(2, 3, dtype=F64),
            mask=m,
            normalizer=LossNormalizer.from_mask(m, cfg),
        )


def test_approx_kl_is_k3_between_old_and_new():
    # r = pi/pi_old = 2 and 0.5: k3 = (r - 1) - ln r = 1 - ln2 and -0.5 + ln2; mean = 0.25
    logp, old = logprobs_with_ratio([[2.0, 0.5]])
    m = full_mask((1, 2))
    cfg = AlgorithmConfig()
    out = compute_policy_loss(
        cfg,
        logprobs=logp,
        old_logprobs=old,
        advantages=tensor([[0.0, 0.0]]),
        mask=m,
        normalizer=LossNormalizer.from_mask(m, cfg),
    )
    close(out.metrics["approx_kl"], 0.25)


@pytest.mark.parametrize("loss", ["ppo", "gspo", "gspo_token", "sapo", "cispo"])
def test_padding_garbage_never_reaches_loss_or_gradient(loss):
    m = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    nan = float("nan")
    logp = tensor([[-1.0, -2.0, nan], [-0.5, float("-inf"), nan]]).requires_grad_(True)
    old = tensor([[-1.1, -1.9, float("inf")], [-0.4, nan, nan]])
    adv = tensor([[1.0, 1.0, nan], [-1.0, nan, nan]])
    cfg = AlgorithmConfig(policy_loss=loss, rollout_correction="tis")
    out = compute_policy_loss(
        cfg,
        logprobs=logp,
        old_logprobs=old,
        advantages=adv,
        mask=m,
        normalizer=LossNormalizer.from_mask(m, cfg),
        rollout_logprobs=old,
    )
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert torch.isfinite(logp.grad).all() and (logp.grad[~m] == 0).all()
    assert all(torch.isfinite(v) for v in out.metrics.values())


def test_shape_and_normalizer_mismatch_are_clear_errors():
    m = full_mask((2, 3))
    cfg = AlgorithmConfig()
    z = torch.zeros(2, 3, dtype=F64)
    with pytest.raises(ValueError, match="advantages has shape"):
        compute_policy_loss(
            cfg,
            logprobs=z,
            old_logprobs=z,
            advantages=z[:, :2],
            mask=m,
            normalizer=LossNormalizer.from_mask(m, cfg),
        )
    with pytest.raises(ValueError, match="loss_agg_mode"):
        compute_policy_loss(
            cfg,
            logprobs=z,
            old_logprobs=z,
            advantages=z,
            mask=m,
            normalizer=LossNormalizer.from_mask(m, mode="seq-mean-token-sum"),
        )


# =============================================================================================
# Micro-batch invariance
# =============================================================================================

SPLITS = {
    "whole": [8],
    "singles": [1] * 8,
    "halves": [4, 4],
    "uneven": [1, 3, 4],
    "lopsided": [7, 1],
    "shuffled-uneven": [3, 2, 3],
}
AGG_MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
VARIANTS = {
    "ppo": {"policy_loss": "ppo"},
    "gspo": {"policy_loss": "gspo"},
    "gspo_token": {"policy_loss": "gspo_token"},
    "sapo": {"policy_loss": "sapo"},
    "cispo": {"policy_loss": "cispo"},
    "ppo+tis+kl+entropy": {"rollout_correction": "tis", "kl_loss_coef": 0.05, "entropy_coef": 0.01},
    "gspo+mis-sequence": {
        "policy_loss": "gspo",
        "rollout_correction": "mis",
        "rollout_is_level": "sequence",
        "mis_low": 0.9,
        "mis_high": 1.1,
    },
    "sapo+decoupled-geometric": {
        "policy_loss": "sapo",
        "rollout_correction": "decoupled",
        "rollout_is_level": "geometric",
        "decoupled_cap": 1.05,
    },
}


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    b, t = 8, 9
    lengths = torch.tensor([9, 1, 5, 0, 7, 3, 9, 2])  # uneven, one sequence without tokens
    mask = torch.arange(t)[None, :] < lengths[:, None]
    old = -torch.rand(b, t, generator=g, dtype=F64) * 2
    new = old + torch.randn(b, t, generator=g, dtype=F64) * 0.3  # ratios hit every region
    rollout = old + torch.randn(b, t, generator=g, dtype=F64) * 0.1
    ref = old + torch.randn(b, t, generator=g, dtype=F64) * 0.2
    ent = torch.rand(b, t, generator=g, dtype=F64)
    rewards = torch.randint(0, 2, (b,), generator=g).to(F64)
    adv = grpo_advantages(rewards, [0, 1, 0, 1, 2, 2, 3, 3], mask)
    return dict(mask=mask, old=old, new=new, rollout=rollout, ref=ref, ent=ent, adv=adv)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("mode", AGG_MODES)
def test_micro_batch_split_does_not_change_loss_gradient_or_metrics(variant, mode):
    data = _batch()
    cfg = AlgorithmConfig(loss_agg_mode=mode, loss_norm_length=12, **VARIANTS[variant])
    norm = LossNormalizer.from_mask(data["mask"], cfg)  # once, over the whole batch

    def run(order: torch.Tensor, sizes: list[int]):
        logp = data["new"].clone().requires_grad_(True)
        total, metrics = torch.zeros((), dtype=F64), {}
        for rows in torch.split(order, sizes):
            out = compute_policy_loss(
                cfg,
                logprobs=logp[rows],
                old_logprobs=data["old"][rows],
                advantages=data["adv"][rows],
                mask=data["mask"][rows],
                normalizer=norm,
                rollout_logprobs=data["rollout"][rows],
                ref_logprobs=data["ref"][rows],
                entropies=data["ent"][rows],
            )
            out.loss.backward()
            total = total + out.loss.detach()
            metrics = merge_metrics(metrics, out.metrics)
        return total, logp.grad, metrics

    full_loss, full_grad, full_metrics = run(torch.arange(8), [8])
    assert full_grad.abs().sum() > 0
    for name, sizes in SPLITS.items():
        order = (
            torch.randperm(8, generator=torch.Generator().manual_seed(3))
            if "shuffled" in name
            else torch.arange(8)
        )
        loss, grad, metrics = run(order, sizes)
        close(loss, full_loss, tol=1e-12)
        close(grad, full_grad, tol=1e-12)
        assert metrics.keys() == full_metrics.keys()
        for key in metrics:
            if key not in ("loss", "pg_loss", "kl_loss"):  # sums of shares, checked via loss
                close(metrics[key], full_metrics[key], tol=1e-12)
        close(metrics["loss"], full_loss, tol=1e-12)


def test_per_micro_batch_normaliser_would_break_invariance():
    # the counter-example that motivates LossNormalizer: normalising each micro-batch by its
    # own token count (then averaging micro-batches) changes the loss with the split
    data = _batch()
    cfg = AlgorithmConfig()
    whole = compute_policy_loss(
        cfg,
        logprobs=data["new"],
        old_logprobs=data["old"],
        advantages=data["adv"],
        mask=data["mask"],
        normalizer=LossNormalizer.from_mask(data["mask"], cfg),
    ).loss
    parts = []
    for rows in torch.split(torch.arange(8), [1, 3, 4]):
        local = LossNormalizer.from_mask(data["mask"][rows], cfg)
        parts.append(
            compute_policy_loss(
                cfg,
                logprobs=data["new"][rows],
                old_logprobs=data["old"][rows],
                advantages=data["adv"][rows],
                mask=data["mask"][rows],
                normalizer=local,
            ).loss
        )
    assert abs(float(sum(parts) / 3) - float(whole)) > 1e-4
