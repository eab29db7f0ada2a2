"""From rollouts to a batch: group selection, advantages, mini-batches, the episode sampler."""

from __future__ import annotations

import torch

from relax_gym.rewards import RewardResult
from relax_gym.trainer.algorithms import AlgorithmConfig
from relax_gym.trainer.config import EnvEntry
from relax_gym.trainer.algorithms.batching import (
    ScoredSample,
    attach_advantages,
    reward_inputs,
    select_groups,
    split_by_groups,
    to_sequence_batch,
)
from relax_gym.trainer.rollout.sampler import EVAL_ENV_STRIDE, EpisodeSampler, eval_specs
from relax_gym.trainer.rollout import Trajectory, TurnRecord
from relax_gym.types import Message


def traj(group: str, reward: float, *, stop: str = "env_done", n: int = 3) -> Trajectory:
    return Trajectory(token_ids=list(range(1, 3 + n)), loss_mask=[0, 0] + [1] * n,
                      rollout_logprobs=[0.0, 0.0] + [-0.5] * n, weight_versions=[-1, -1] + [1] * n, prompt_length=2,
                      group_id=group, env_id="test/Letters-v0", seed=1, reward=reward, stop_reason=stop,  # type: ignore[arg-type]
                      messages=[Message.user("q"), Message.assistant("aa")],
                      turns=[TurnRecord(index=0, assistant_text="aa", num_sampled_tokens=n, finish_reason="stop",
                                        info={"success": reward > 0.5})])


def scored(group: str, reward: float | None, **kw: object) -> ScoredSample:
    t = traj(group, reward if reward is not None else 0.0, **kw)  # type: ignore[arg-type]
    result = RewardResult(total=reward, failed=reward is None)
    return ScoredSample(t, reward, result)


def test_select_groups_drops_what_cannot_train() -> None:
    samples = [scored("a", 1.0), scored("a", 0.0),  # kept
               scored("b", 1.0), scored("b", 1.0),  # zero variance
               scored("c", 1.0), scored("c", None),  # failed reward
               scored("d", 1.0), scored("d", 0.0, stop="engine_error")]  # one untrainable member
    sel = select_groups(samples, drop_zero_variance=True)
    assert [g[0].group for g in sel.kept] == ["a"]
    assert sel.dropped == {"zero_variance": 3, "reward_failed": 2, "untrainable": 1}  # d's survivor: 1 sample, constant
    sel = select_groups(samples, failed_reward="zero", drop_zero_variance=False)
    assert [g[0].group for g in sel.kept] == ["a", "b", "c", "d"] and sel.zeroed == 1
    assert [s.reward for s in sel.kept[2]] == [1.0, 0.0]


def test_reward_inputs_carry_the_episode() -> None:
    (inp,) = reward_inputs([traj("g", 0.75)])
    assert inp.response == "aa" and inp.prompt[0].text == "q" and inp.env_reward == 0.75
    assert inp.metadata["group_id"] == "g" and inp.num_response_tokens == 3 and inp.finish_reason == "stop"
    assert inp.info["success"] is True


def test_advantages_are_grpo_over_the_whole_batch() -> None:
    samples = [scored("a", 1.0), scored("a", 0.0), scored("b", 0.5, n=5), scored("b", 0.5)]
    batch = to_sequence_batch(samples, None, temperature=0.7)
    assert batch.temperature == 0.7 and batch.rollout_logprobs is not None
    metrics = attach_advantages(batch, [1.0, 0.0, 0.5, 0.5], AlgorithmConfig())
    assert batch.advantages is not None
    a0, a1, b0 = batch.advantages[0], batch.advantages[1], batch.advantages[2]
    mask0 = torch.tensor(batch.loss_mask[0], dtype=torch.bool)
    expected = 0.5 / (2**0.5 / 2 + 1e-6)  # (r - mean) / (std + eps), Bessel std of {0, 1}
    assert torch.allclose(a0[mask0], torch.full((3,), expected))
    assert torch.allclose(a1[mask0], torch.full((3,), -expected))
    assert torch.all(a0[~mask0] == 0) and torch.all(b0 == 0)  # zero-variance group: no signal
    assert metrics["adv/zero_variance_group_frac"] == 0.5


def test_mini_batches_hold_whole_groups() -> None:
    groups = ["a", "a", "b", "b", "c", "c", "d"]
    splits = split_by_groups(groups, 3)
    assert sorted(i for s in splits for i in s) == list(range(7))
    for s in splits:
        assert all(groups[i] in {groups[j] for j in s} for i in s)
        for g in {groups[i] for i in s}:
            assert all(i in s for i, x in enumerate(groups) if x == g)
    assert len(split_by_groups(groups, 10)) == 4


def test_sampler_is_resumable_and_eval_is_held_out() -> None:
    envs = [EnvEntry(id="test/Letters-v0", weight=3.0), EnvEntry(id="test/Colour-v0", kwargs={}, weight=1.0)]
    a = EpisodeSampler(envs, seed=5, seed_start=100, seed_count=1000)
    a.next(7)
    state = a.state_dict()
    expected = [(s.env_id, s.seed, s.group_id) for s in a.next(5)]
    b = EpisodeSampler(envs, seed=5, seed_start=100, seed_count=1000)
    b.load_state_dict(state)
    assert [(s.env_id, s.seed, s.group_id) for s in b.next(5)] == expected
    seeds = [s.seed for s in EpisodeSampler(envs, seed=1, seed_start=100, seed_count=1000).next(200)]
    assert all(100 <= s < 1100 for s in seeds)
    ids = [s.env_id for s in EpisodeSampler(envs, seed=1).next(400)]
    assert 0.65 < ids.count("test/Letters-v0") / 400 < 0.85  # weights respected
    ev = eval_specs(envs, 3, 1_000_000_000)
    assert [s.seed for s in ev] == [10**9, 10**9 + 1, 10**9 + 2,
                                    10**9 + EVAL_ENV_STRIDE, 10**9 + EVAL_ENV_STRIDE + 1, 10**9 + EVAL_ENV_STRIDE + 2]
    assert all(s.seed >= 10**9 for s in ev)


def test_envs_can_come_from_an_entry_point(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import pytest

    import relax_gym
    from relax_gym.trainer.config import ConfigError, config_from_dict
    from relax_gym.trainer.rollout.sampler import register_entry_points

    source = tmp_path / "my_envs.py"
    source.write_text("from tests.trainer.envs import LetterEnv as MyEnv\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path.parent))
    entries = [EnvEntry(id="user/FromFile-v0", entry_point="my_envs.py:MyEnv"),
               EnvEntry(id="user/FromModule-v0", entry_point="tests.trainer.envs:ColourEnv")]
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    try:
        register_entry_points(entries)
    finally:
        sys.path.pop(0)
    assert type(relax_gym.make("user/FromFile-v0").unwrapped).__name__ == "LetterEnv"
    assert type(relax_gym.make("user/FromModule-v0").unwrapped).__name__ == "ColourEnv"
    with pytest.raises(ConfigError, match="entry_point"):
        config_from_dict({"model": {"path": "x"}, "data": {"envs": [{"id": "a/B-v0", "entry_point": "no_colon"}]}})
    with pytest.raises(FileNotFoundError):
        register_entry_points([EnvEntry(id="user/Missing-v0", entry_point="missing.py:X")])
