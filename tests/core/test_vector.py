from __future__ import annotations

import asyncio

import numpy as np
import pytest

import relax_gym
from relax_gym import EpisodeEndedError


@pytest.fixture(scope="module")
def guess_id():
    env_id = "vec/Guess-v0"
    relax_gym.register(env_id, "tests.core.envs_for_tests:GuessEnv", max_turns=3)
    yield env_id
    relax_gym.deregister(env_id)


@pytest.mark.parametrize("mode", ["sync", "thread", "process"])
def test_make_vec_modes_agree(guess_id, mode) -> None:
    with relax_gym.make_vec(guess_id, 3, mode=mode, high=10) as vec:
        obs, infos = vec.reset(seed=100)
        assert len(obs) == 3 and all(isinstance(o, relax_gym.Observation) for o in obs)
        obs, rewards, term, trunc, infos = vec.step(["1", "2", None])
        assert obs[2] is None and infos[2] == {"skipped": True}
        assert rewards.dtype == np.float64 and term.shape == (3,)
        # compare with single envs seeded the same way
        for i in range(2):
            single = relax_gym.make(guess_id)
            single.reset(seed=100 + i)
            _, r, t, _, _ = single.step(str(i + 1))
            assert (rewards[i], term[i]) == (r, t)
        obs_one, _ = vec.reset_at(1, seed=5)
        assert obs_one.text.startswith("Guess a number")


def test_process_mode_propagates_env_errors(guess_id) -> None:
    with relax_gym.make_vec(guess_id, 2, mode="process") as vec:
        vec.reset(seed=0)
        vec.step(["x", "x"])
        vec.step(["x", "x"])
        vec.step(["x", "x"])  # truncated at max_turns
        with pytest.raises(EpisodeEndedError):
            vec.step(["1", None])


def test_make_vec_validates_arguments(guess_id) -> None:
    with pytest.raises(ValueError, match="num_envs"):
        relax_gym.make_vec(guess_id, 0)
    with pytest.raises(ValueError, match="unknown vector mode"):
        relax_gym.make_vec(guess_id, 1, mode="gpu")  # type: ignore[arg-type]
    with relax_gym.make_vec(guess_id, 2) as vec:
        with pytest.raises(ValueError, match="expected 2 actions"):
            vec.reset(seed=0)
            vec.step(["1"])
        with pytest.raises(ValueError, match="expected 2 seeds"):
            vec.reset(seed=[1, 2, 3])


def test_async_env_pool_bounds_instances(guess_id) -> None:
    pool = relax_gym.AsyncEnvPool(guess_id, size=3)
    active = 0
    peak = 0

    async def episode(seed: int) -> bool:
        nonlocal active, peak
        async with pool.episode() as env:
            active += 1
            peak = max(peak, active)
            await env.areset(seed=seed)
            _, _, _, _, info = await env.astep(str(env.unwrapped.target))
            await asyncio.sleep(0.01)
            active -= 1
            return info["success"]

    async def run_all() -> list[bool]:
        return await asyncio.gather(*(episode(s) for s in range(12)))

    results = asyncio.run(run_all())
    assert all(results) and pool.created == 3 and peak == 3
    pool.close()
