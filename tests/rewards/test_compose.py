"""Registry, safe invocation and weighted composition: sync/async, single/group, dict results,
failures and timeouts recorded (never a silent 0), per-env and per-row plans, metrics."""

from __future__ import annotations

import asyncio
import math
import sys
import time
import types

import numpy as np
import pytest

import relax_gym.rewards as R
from relax_gym.rewards import RewardComposer, RewardInput, RewardResult, Score, summarize


@pytest.fixture
def registered():
    """Register throw-away rewards and remove them afterwards."""
    names: list[str] = []

    def add(name: str, fn, **kw):
        R.register_reward(name, fn, override=True, **kw)
        names.append(name)

    yield add
    for n in names:
        R.unregister_reward(n)


def sample(response: str = "ok", **kw) -> RewardInput:
    return RewardInput.from_text("prompt", response, **kw)


def test_registry_resolves_names_and_module_paths(registered) -> None:
    registered("t_len", lambda s: len(s.response))
    assert R.get_reward("t_len").fn(sample("abc")) == 3
    rf = R.get_reward("relax_gym.rewards.text:exact_match")
    assert rf.fn is R.get_reward("exact_match").fn  # the decorated function carries its entry
    with pytest.raises(KeyError, match="unknown reward 'nope'"):
        R.get_reward("nope")
    with pytest.raises(KeyError, match="cannot import module"):
        R.get_reward("no_such_module_xyz:f")
    with pytest.raises(KeyError, match="has no attribute"):
        R.get_reward("relax_gym.rewards.text:missing")
    with pytest.raises(ValueError, match="already registered"):
        R.register_reward("t_len", lambda s: 0.0)
    with pytest.raises(ValueError, match="invalid reward name"):
        R.register_reward("a:b", lambda s: 0.0)


def test_decorator_forms_and_async_detection() -> None:
    @R.reward
    def t_bare(s):
        return 1.0

    @R.reward("t_async", group=True)
    async def t_group(ss):
        return [1.0 for _ in ss]

    try:
        assert R.get_reward("t_bare").is_async is False
        rf = R.get_reward("t_async")
        assert rf.is_async and rf.group
    finally:
        R.unregister_reward("t_bare")
        R.unregister_reward("t_async")


def test_module_function_path_for_unregistered_user_code() -> None:
    mod = types.ModuleType("t_user_rewards")

    def shout(s, *, bonus: float = 0.0):
        return {"upper": float(s.response.isupper()), "total": float(s.response.isupper()) + bonus}

    mod.shout = shout
    sys.modules["t_user_rewards"] = mod
    try:
        [res] = RewardComposer([{"name": "t_user_rewards:shout", "kwargs": {"bonus": 0.5}}]).score_sync([sample("HI")])
        assert res.total == 1.5
        assert res.components == {"shout": 1.5, "shout/upper": 1.0}
    finally:
        del sys.modules["t_user_rewards"]


def test_weighted_sum_with_dict_and_async_components(registered) -> None:
    async def judge(s):
        await asyncio.sleep(0.01)
        return 0.5

    registered("t_parts", lambda s: {"a": 1.0, "b": 2.0})  # no "total": the parts' sum
    registered("t_async_judge", judge)
    registered("t_bool", lambda s: True)
    composer = RewardComposer(
        [{"name": "t_parts", "weight": 0.5}, {"name": "t_async_judge", "weight": 2.0}, {"name": "t_bool", "weight": -1.0}]
    )
    [res] = composer.score_sync([sample()])
    assert res.total == pytest.approx(0.5 * 3.0 + 2.0 * 0.5 - 1.0)
    assert res.components == {"t_parts": 3.0, "t_parts/a": 1.0, "t_parts/b": 2.0, "t_async_judge": 0.5, "t_bool": 1.0}
    assert not res.failed and res.error is None


@pytest.mark.parametrize(
    ("fn", "kind", "text"),
    [
        (lambda s: 1 / 0, "exception", "ZeroDivisionError"),
        (lambda s: None, "invalid", "returned None"),
        (lambda s: math.nan, "invalid", "not finite"),
        (lambda s: "1.0", "invalid", "must be a number"),
        (lambda s: {}, "invalid", "empty dict"),
        (lambda s: {"a": "x"}, "invalid", "must be a number"),
        (lambda s: RewardResult.failure("unparseable", "judge said 'maybe'"), "unparseable", "maybe"),
    ],
)
def test_failures_are_recorded_not_zero(registered, fn, kind: str, text: str) -> None:
    registered("t_bad", fn)
    registered("t_good", lambda s: 1.0)
    [res] = RewardComposer(["t_bad", "t_good"]).score_sync([sample()])
    assert res.failed and res.total is None
    assert res.errors["t_bad"].kind == kind and text in res.errors["t_bad"].message
    assert "t_bad" not in res.components and res.components["t_good"] == 1.0
    assert res.error is not None and res.error.startswith("t_bad: ")


def test_numpy_scalars_are_accepted(registered) -> None:
    registered("t_np", lambda s: np.float32(0.25))
    [res] = RewardComposer(["t_np"]).score_sync([sample()])
    assert res.total == 0.25


def test_on_failure_skip_keeps_the_sample(registered) -> None:
    registered("t_raise", lambda s: (_ for _ in ()).throw(RuntimeError("boom")))
    registered("t_one", lambda s: 1.0)
    [res] = RewardComposer([{"name": "t_raise", "on_failure": "skip"}, "t_one"]).score_sync([sample()])
    assert not res.failed and res.total == 1.0
    assert res.errors["t_raise"].kind == "exception" and "boom" in res.error


def test_sync_and_async_timeouts_do_not_block(registered) -> None:
    async def slow_async(s):
        await asyncio.sleep(30)

    def slow_sync(s):
        time.sleep(3)
        return 1.0

    registered("t_slow_async", slow_async)
    registered("t_slow_sync", slow_sync)
    composer = RewardComposer(["t_slow_async", "t_slow_sync"], timeout_s=0.3)
    start = time.perf_counter()
    results = composer.score_sync([sample() for _ in range(4)])
    assert time.perf_counter() - start < 2.0
    for res in results:
        assert res.failed
        assert res.errors["t_slow_async"].kind == "timeout"
        assert res.errors["t_slow_sync"].kind == "timeout"
    metrics = summarize(results)
    assert metrics["reward/failures/timeout"] == 8.0
    assert metrics["reward/failed"] == 4.0 and metrics["reward/failure_rate"] == 1.0


def test_sync_rewards_run_concurrently(registered, monkeypatch) -> None:
    from relax_gym.rewards import safe_call

    workers = safe_call._DaemonWorkers(limit=8)
    monkeypatch.setattr(safe_call, "WORKERS", workers)
    registered("t_quick", lambda s: 0.0)
    RewardComposer(["t_quick"]).score_sync([sample()])  # leaves one idle thread, as a busy process would
    deadline = time.monotonic() + 5
    while workers.idle != 1 and time.monotonic() < deadline:  # it turns idle just after answering
        time.sleep(0.01)
    assert workers.idle == 1
    import threading

    lock = threading.Lock()
    running = {"now": 0, "max": 0}

    def sleepy(s):
        with lock:
            running["now"] += 1
            running["max"] = max(running["max"], running["now"])
        time.sleep(0.3)
        with lock:
            running["now"] -= 1
        return 1.0

    registered("t_sleepy", sleepy)
    results = RewardComposer(["t_sleepy"]).score_sync([sample() for _ in range(8)])
    assert [r.total for r in results] == [1.0] * 8
    # overlap observed by the calls themselves (not wall time, which machine load skews)
    assert running["max"] >= 2, running


def test_group_reward_sees_whole_groups(registered) -> None:
    seen: list[list[str]] = []

    def rank_in_group(samples):
        seen.append([s.response for s in samples])
        longest = max(len(s.response) for s in samples)
        return [float(len(s.response) == longest) for s in samples]

    registered("t_rank", rank_in_group, group=True)
    batch = [
        sample("a", metadata={"group_id": 1}),
        sample("bbb", metadata={"group_id": 2}),
        sample("cc", metadata={"group_id": 1}),
        sample("d", metadata={"group_id": 2}),
        sample("alone"),
    ]
    results = RewardComposer(["t_rank"]).score_sync(batch)
    assert [r.total for r in results] == [0.0, 1.0, 1.0, 0.0, 1.0]
    assert sorted(map(sorted, seen)) == [["a", "cc"], ["alone"], ["bbb", "d"]]


def test_group_reward_with_wrong_result_count_fails_the_group(registered) -> None:
    registered("t_short", lambda ss: [1.0], group=True)
    results = RewardComposer(["t_short"]).score_sync([sample(metadata={"group_id": "g"}) for _ in range(3)])
    assert all(r.failed and r.errors["t_short"].kind == "invalid" for r in results)
    assert "must return 3 results, got 1 results" in results[0].errors["t_short"].message


def test_per_env_and_per_row_plans(registered) -> None:
    registered("t_a", lambda s: 1.0)
    registered("t_b", lambda s: 10.0)
    composer = RewardComposer.from_config(
        {"rewards": ["t_a"], "per_env": {"demo/B-v0": [{"name": "t_b", "weight": 0.5}]}}
    )
    plain, env_b, row = composer.score_sync([
        sample(),
        sample(metadata={"env_id": "demo/B-v0"}),
        sample(metadata={"env_id": "demo/B-v0", "rewards": [{"name": "t_a", "weight": 3}]}),
    ])
    assert (plain.total, env_b.total, row.total) == (1.0, 5.0, 3.0)
    assert set(env_b.components) == {"t_b"}


def test_bad_row_config_fails_only_that_sample(registered) -> None:
    registered("t_a", lambda s: 1.0)
    good, bad = RewardComposer(["t_a"]).score_sync([sample(), sample(metadata={"rewards": ["no_such_reward"]})])
    assert good.total == 1.0
    assert bad.failed and bad.errors["config"].kind == "config" and "no_such_reward" in bad.error


def test_config_errors_are_raised_up_front() -> None:
    with pytest.raises(KeyError):
        RewardComposer(["no_such_reward"])
    with pytest.raises(ValueError, match="duplicate"):
        RewardComposer(["exact_match", "exact_match"])
    with pytest.raises(ValueError):
        RewardComposer([{"name": "exact_match", "wieght": 1}])  # typo caught by pydantic
    with pytest.raises(ValueError, match="unknown reward config keys"):
        RewardComposer.from_config({"rewards": ["exact_match"], "extra": 1})
    # the same reward twice under distinct component names is fine
    RewardComposer(["exact_match", {"name": "exact_match", "component": "em2", "kwargs": {"strip": False}}])


def test_metrics_show_each_component_mean(registered) -> None:
    registered("t_half", lambda s: float(s.response == "yes"))
    registered("t_flaky", lambda s: 1.0 if s.response == "yes" else 1 / 0)
    composer = RewardComposer(["t_half", {"name": "t_flaky", "on_failure": "skip", "weight": 2.0}])
    results = composer.score_sync([sample("yes"), sample("no"), sample("yes"), sample("no")])
    m = summarize(results)
    assert m["reward/t_half/mean"] == 0.5
    assert m["reward/t_flaky/mean"] == 1.0 and m["reward/t_flaky/count"] == 2.0
    assert m["reward/t_flaky/failed"] == 2.0 and m["reward/failures/exception"] == 2.0
    assert m["reward/mean"] == pytest.approx((3 + 0 + 3 + 0) / 4)
    assert m["reward/failed"] == 0.0
    composer.score_sync([sample("yes")])
    assert composer.stats.summary()["reward/count"] == 5.0


def test_evaluate_reward_and_env_components() -> None:
    s = sample(info={"success": True, "reward_components": {"correct": 1.0, "format": 0.2}}, env_reward=1.2)
    res = R.evaluate_reward("env", s)
    assert res.total == pytest.approx(1.2)
    assert res.components == {"env": 1.2, "env/correct": 1.0, "env/format": 0.2}
    assert R.evaluate_reward("env_success", s).total == 1.0
    missing = R.evaluate_reward("env", sample())
    assert missing.failed and missing.errors["env"].kind == "invalid"


async def test_async_api_inside_a_running_loop(registered) -> None:
    registered("t_a", lambda s: 1.0)
    composer = RewardComposer(["t_a"])
    assert (await composer.score_one(sample())).total == 1.0
    with pytest.raises(RuntimeError, match="running event loop"):
        composer.score_sync([sample()])


def test_score_object_carries_details(registered) -> None:
    registered("t_score", lambda s: Score(0.7, parts={"x": 0.1}, details={"why": "because"}))
    [res] = RewardComposer(["t_score"]).score_sync([sample()])
    assert res.total == 0.7 and res.components["t_score/x"] == 0.1
    assert res.details["t_score"] == {"why": "because"}
    assert res.to_dict()["details"]["t_score"]["why"] == "because"


def test_stuck_reward_threads_are_capped(registered, monkeypatch) -> None:
    from relax_gym.rewards import safe_call

    workers = safe_call._DaemonWorkers(limit=2)
    monkeypatch.setattr(safe_call, "WORKERS", workers)

    def hang(s):
        time.sleep(3.0)
        return 1.0

    registered("t_hang", hang)
    # 0.5 s leaves a loaded machine time to start both calls (one not started is skipped, not stuck)
    composer = RewardComposer(["t_hang"], timeout_s=0.5)
    first = composer.score_sync([sample(), sample()])
    assert all(r.errors["t_hang"].kind == "timeout" for r in first)
    assert workers.stuck == 2
    [refused] = composer.score_sync([sample()])
    assert refused.errors["t_hang"].kind == "unavailable" and "stuck" in refused.errors["t_hang"].message
    deadline = time.monotonic() + 10
    while workers.stuck and time.monotonic() < deadline:  # the hung calls return after 3 s
        time.sleep(0.05)
    assert workers.stuck == 0
    registered("t_fast", lambda s: 2.0)
    assert RewardComposer(["t_fast"]).score_sync([sample()])[0].total == 2.0
