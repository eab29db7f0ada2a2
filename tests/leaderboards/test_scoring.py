"""Scoring: estimators checked against brute-force enumeration and hand computations."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from relax_gym.leaderboards.scoring import (
    Baseline,
    TaskOutcomes,
    aggregate,
    bootstrap_indices,
    group_scores,
    ks_for,
    pass_at_k,
    pass_hat_k,
    score_env,
    wilson,
)


def _brute(n: int, c: int, k: int, every: bool) -> float:
    """Over all k-subsets of n attempts (c of them successes): P(any / all succeed)."""
    attempts = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(attempts, k))
    hits = [all(s) if every else any(s) for s in subsets]
    return sum(hits) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6])
def test_pass_at_k_and_pass_hat_k_match_enumeration(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(_brute(n, c, k, every=False), abs=1e-12)
            assert pass_hat_k(n, c, k) == pytest.approx(_brute(n, c, k, every=True), abs=1e-12)


def test_pass_k_hand_values_and_bad_input() -> None:
    assert pass_at_k(4, 1, 1) == 0.25
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_hat_k(4, 2, 2) == pytest.approx(1 / 6)
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_hat_k(3, 1, 4)


def test_ks_reported() -> None:
    assert ks_for(1) == [1]
    assert ks_for(4) == [1, 2, 4]
    assert ks_for(6) == [1, 2, 4, 6]


def test_outcomes_group_by_seed_regardless_of_row_order() -> None:
    rows = [(7, True), (3, False), (7, False), (3, False), (9, True), (9, True)]
    a = TaskOutcomes.from_rows("e", rows)
    b = TaskOutcomes.from_rows("e", list(reversed(rows)))
    assert (a.seeds, a.attempts, a.successes) == (b.seeds, b.attempts, b.successes) == ([3, 7, 9], [2, 2, 2], [0, 1, 2])
    assert a.num_episodes == 6


def test_bootstrap_is_reproducible_and_per_env() -> None:
    a1 = bootstrap_indices("env/A-v0", 30)
    a2 = bootstrap_indices("env/A-v0", 30)
    b = bootstrap_indices("env/B-v0", 30)
    assert np.array_equal(a1, a2)
    assert not np.array_equal(a1, b)
    # an env's interval does not depend on what else is scored alongside it
    rng = np.random.default_rng(1)
    rows = [(s, bool(rng.random() < 0.4)) for s in range(40)]
    alone = score_env(TaskOutcomes.from_rows("env/A-v0", rows))
    score_env(TaskOutcomes.from_rows("env/B-v0", rows))
    again = score_env(TaskOutcomes.from_rows("env/A-v0", rows))
    assert alone.success == again.success


def test_interval_width_matches_the_binomial_standard_error() -> None:
    rows = [(s, s % 10 < 3) for s in range(200)]  # exactly 30 % of 200 tasks
    est = score_env(TaskOutcomes.from_rows("e", rows)).success
    assert est.value == pytest.approx(0.3)
    half = 1.96 * math.sqrt(0.3 * 0.7 / 200)  # 0.0635
    assert est.low < 0.3 < est.high
    assert (est.high - est.low) / 2 == pytest.approx(half, rel=0.15)


def test_attempts_of_one_task_are_one_cluster() -> None:
    # 10 tasks x 8 identical attempts carry the evidence of 10 tasks, not of 80 episodes
    clustered = [(s, s < 5) for s in range(10) for _ in range(8)]
    independent = [(s, s % 2 == 0) for s in range(80)]
    w_clustered = score_env(TaskOutcomes.from_rows("e", clustered)).success
    w_indep = score_env(TaskOutcomes.from_rows("e", independent)).success
    assert w_clustered.n == 10 and w_indep.n == 80
    assert (w_clustered.high - w_clustered.low) > 2 * (w_indep.high - w_indep.low)


def test_degenerate_samples_get_the_wilson_interval() -> None:
    zero = score_env(TaskOutcomes.from_rows("e", [(s, False) for s in range(20)])).success
    assert zero.value == 0.0 and zero.low == 0.0
    assert zero.high == pytest.approx(wilson(0.0, 20)[1]) and 0.15 < zero.high < 0.17
    full = score_env(TaskOutcomes.from_rows("e", [(s, True) for s in range(20)])).success
    assert full.value == 1.0 and full.high == 1.0 and 0.83 < full.low < 0.85


def test_pass_at_k_from_attempts() -> None:
    # task 0: 1 of 4 attempts succeed; task 1: 4 of 4; task 2: 0 of 4
    rows = [(0, a == 0) for a in range(4)] + [(1, True)] * 4 + [(2, False)] * 4
    score = score_env(TaskOutcomes.from_rows("e", rows))
    assert sorted(score.pass_at) == [1, 2, 4]
    assert score.pass_at[1].value == pytest.approx((0.25 + 1 + 0) / 3)
    assert score.pass_at[4].value == pytest.approx((1 + 1 + 0) / 3)
    assert score.pass_hat[4].value == pytest.approx((0 + 1 + 0) / 3)
    assert score.pass_hat[2].value == pytest.approx((0 + 1 + 0) / 3)


def test_normalised_score_and_its_interval() -> None:
    rows = [(s, s % 8 < 5) for s in range(80)]  # success 0.625
    score = score_env(TaskOutcomes.from_rows("e", rows), Baseline(random=0.25, oracle=1.0))
    assert score.normalised is not None
    assert score.normalised.value == pytest.approx(0.5)
    assert score.normalised.low == pytest.approx((score.success.low - 0.25) / 0.75)
    assert score.normalised.high == pytest.approx((score.success.high - 0.25) / 0.75)
    assert Baseline(random=1.0, oracle=1.0).normalise(0.5) is None
    no_span = score_env(TaskOutcomes.from_rows("e", rows), Baseline(random=1.0, oracle=1.0))
    assert no_span.normalised is None


def test_suite_aggregate_is_the_mean_over_envs() -> None:
    rng = np.random.default_rng(0)
    a = score_env(TaskOutcomes.from_rows("a", [(s, bool(rng.random() < 0.8)) for s in range(30)]), Baseline(0.1))
    b = score_env(TaskOutcomes.from_rows("b", [(s, bool(rng.random() < 0.3)) for s in range(30)]), Baseline(0.2))
    c = score_env(TaskOutcomes.from_rows("c", [(s, bool(rng.random() < 0.5)) for s in range(30)]))  # no baseline
    raw = aggregate([a, b], normalised=False)
    norm = aggregate([a, b], normalised=True)
    assert raw is not None and norm is not None
    assert raw.value == pytest.approx((a.success.value + b.success.value) / 2)
    assert norm.value == pytest.approx((a.normalised.value + b.normalised.value) / 2)  # type: ignore[union-attr]
    # averaging two independent envs narrows the interval relative to each one alone
    assert (raw.high - raw.low) < max(a.success.high - a.success.low, b.success.high - b.success.low)
    assert aggregate([a, b, c], normalised=True) is None  # never a mean over a silently smaller set
    groups = group_scores({"a": a, "b": b, "c": c}, {"image": ["a", "c"], "audio": ["b"], "video": []})
    assert set(groups) == {"image", "audio"}
    assert groups["image"]["normalised"] is None and groups["audio"]["normalised"] is not None
