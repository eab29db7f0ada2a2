from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import relax_gym
from relax_gym import (
    Action,
    EnvStepError,
    EpisodeEndedError,
    Message,
    Observation,
    ResetNeededError,
)
from tests.core.envs_for_tests import GuessEnv


@pytest.fixture
def guess_id():
    env_id = "test/Guess-v0"
    relax_gym.register(env_id, GuessEnv, kwargs={"high": 10}, max_turns=3)
    yield env_id
    relax_gym.deregister(env_id)


def test_custom_env_registered_made_checked_played(guess_id, capsys) -> None:
    env = relax_gym.make(guess_id)
    assert isinstance(env, relax_gym.Env) and isinstance(env.unwrapped, GuessEnv)
    assert env.spec.id == guess_id and env.max_turns == 3 and env.has_oracle
    report = relax_gym.check_env(env, seeds=4)
    assert report.passed, str(report)
    from relax_gym.cli.main import main

    assert main(["play", guess_id, "--agent", "oracle", "--seed", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out == {**out, "env_id": guess_id, "seed": 5, "success": True, "turns": 1}


def test_guard_enforces_episode_protocol(guess_id) -> None:
    env = relax_gym.make(guess_id)
    with pytest.raises(ResetNeededError, match="call reset"):
        env.step("1")
    env.reset(seed=0)
    target = env.unwrapped.target
    wrong = 1 if target != 1 else 2
    obs, reward, term, trunc, info = env.step(str(wrong))
    assert (reward, term, trunc) == (0.0, False, False)
    assert info["turn"] == 1 and info["success"] is False and info["reward_components"] == {"env": 0.0}
    env.step(str(wrong))
    obs, reward, term, trunc, info = env.step(str(wrong))
    assert trunc and not term and info["truncation"] == "max_turns"
    with pytest.raises(EpisodeEndedError, match="was truncated at turn 3"):
        env.step(str(target))
    env.reset(seed=0)
    _, reward, term, _, info = env.step(Action(text=str(target)))
    assert term and reward == 1.0 and info["success"] is True


def test_make_max_turns_override_and_kwargs(guess_id) -> None:
    env = relax_gym.make(guess_id, max_turns=1, high=3)
    assert env.max_turns == 1 and env.unwrapped.high == 3
    assert env.spec.kwargs == {"high": 3}
    env.reset(seed=1)
    _, _, term, trunc, _ = env.step("nope")
    assert trunc and not term


class _BadEnv(relax_gym.Env):
    def __init__(self, mode: str) -> None:
        self.mode = mode

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.mode == "reset_type":
            return "not an observation", {}
        return Observation([Message.user("hi")]), {}

    def step(self, action):
        if self.mode == "raise":
            raise KeyError("boom")
        if self.mode == "nan":
            return Observation(), float("nan"), True, False, {}
        if self.mode == "success_str":
            return Observation(), 1.0, True, False, {"success": "yes"}
        return "bad"


@pytest.mark.parametrize(
    "mode, message",
    [
        ("raise", "step\\(\\) raised KeyError: 'boom'"),
        ("nan", "reward is nan"),
        ("success_str", "info\\['success'\\] must be a bool"),
        ("tuple", "must return \\(obs, reward, terminated, truncated, info\\)"),
    ],
)
def test_guard_names_broken_env_outputs(mode, message) -> None:
    env = relax_gym.EpisodeGuard(_BadEnv(mode))
    env.reset(seed=0)
    with pytest.raises(EnvStepError, match=message):
        env.step("x")


def test_guard_rejects_bad_reset() -> None:
    env = relax_gym.EpisodeGuard(_BadEnv("reset_type"))
    with pytest.raises(EnvStepError, match="expected \\(Observation, dict\\)"):
        env.reset()


def test_format_observation_three_styles() -> None:
    env = relax_gym.make("relax/SenseCount-v0")
    obs, _ = env.reset(seed=3)
    openai = env.format_observation(obs, "openai")
    parts = openai[0]["content"]
    assert [p["type"] for p in parts] == ["text", "image_url", "input_audio", "video_url"]
    assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,")
    assert parts[2]["input_audio"]["format"] == "wav"
    assert parts[3]["video_url"]["url"].startswith("data:video/mp4;base64,")
    json.dumps(openai)
    hf = env.format_observation(obs, "hf")[0]["content"]
    assert [p["type"] for p in hf] == ["text", "image", "audio", "video"]
    assert hf[1]["image"].size == (128, 128) and hf[3]["video"].ndim == 4
    text = env.format_observation(obs, "text")[0]["content"]
    assert "[image image: 128x128]" in text and "[audio audio:" in text and "[video video:" in text
    with pytest.raises(ValueError, match="unknown observation style"):
        env.format_observation(obs, "xml")  # type: ignore[arg-type]


def test_tool_messages_render_for_openai_and_hf() -> None:
    from relax_gym import ToolCall
    from relax_gym.formatting import format_messages

    msgs = [
        Message.assistant("calling", tool_calls=[ToolCall("calc", {"e": "1+1"}, "c0")]),
        Message.tool("2", tool_call_id="c0", name="calc"),
    ]
    oa = format_messages(msgs, "openai")
    assert oa[0]["tool_calls"][0]["function"] == {"name": "calc", "arguments": '{"e": "1+1"}'}
    assert oa[1] == {"role": "tool", "content": "2", "tool_call_id": "c0", "name": "calc"}
    hf = format_messages(msgs, "hf")
    assert hf[0]["tool_calls"][0]["function"]["arguments"] == {"e": "1+1"}


def test_async_reset_and_step(guess_id) -> None:
    env = relax_gym.make(guess_id)

    async def episode() -> tuple[float, dict[str, Any]]:
        await env.areset(seed=2)
        _, reward, _, _, info = await env.astep(str(env.unwrapped.target))
        return reward, info

    reward, info = asyncio.run(episode())
    assert reward == 1.0 and info["success"]


def test_env_randomness_is_per_instance(guess_id) -> None:
    import numpy as np

    a, b = relax_gym.make(guess_id), relax_gym.make(guess_id)
    np.random.seed(0)
    a.reset(seed=11)
    np.random.seed(999)
    b.reset(seed=11)
    assert a.unwrapped.target == b.unwrapped.target
