"""The supervised warm-start: oracle episodes laid out exactly as rollouts, and the SFT phase."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

import relax_gym
from relax_gym import Message, Observation
from relax_gym.chat import ChatCodec
from relax_gym.trainer.config import EnvEntry, WarmupConfig
from relax_gym.trainer.rollout.sampler import EpisodeSampler
from relax_gym.trainer.rollout import EpisodeSpec
from relax_gym.trainer.sft import OracleError, WarmupPhase, assistant_text, oracle_trajectory, sft_batch
from relax_gym.trainer.backends.pytorch import TorchBackend
from relax_gym.types import Action, ToolCall
from relax_gym.vision import image_token_count


def codec_for(model: Path) -> ChatCodec:
    return ChatCodec.from_pretrained(model, template_kwargs={"enable_thinking": False})


def spans(mask: list[int]) -> list[tuple[int, int]]:
    out, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


def test_multi_turn_tool_oracle_matches_the_rollout_layout(tiny_text_model: Path) -> None:
    codec = codec_for(tiny_text_model)
    traj = oracle_trajectory(EpisodeSpec("test/ToolOracle-v0", seed=4), codec)
    traj.validate()
    assert traj.success and len(traj.turns) == 2 and traj.reward == 1.0
    runs = spans(traj.loss_mask)
    assert len(runs) == 2  # one run of sampled tokens per assistant turn, all else mask 0
    end = codec.decode(codec.closing_glue[:1])
    first, second = (codec.decode(traj.token_ids[a:b]) for a, b in runs)
    assert first.startswith("<tool_call>") and first.endswith("</tool_call>" + end)
    assert second == traj.turns[1].assistant_text + end and "\\boxed{" in second
    # the written tool call is what the tool parser reads back
    from relax_gym.tools.parsers import get_parser

    call = get_parser("hermes").parse(traj.turns[0].assistant_text).tool_calls[0]
    assert call.name == "calculator" and "*" in call.arguments["expression"]
    # the tokens before the last answer are exactly the template's render of the conversation
    env = relax_gym.make("test/ToolOracle-v0")
    obs, _ = env.reset(seed=4)
    context = [*codec.adapt_messages(env.format_observation(obs, "hf"))[0],
               {"role": "assistant", "content": codec.assistant_prefix + traj.turns[0].assistant_text},
               *codec.adapt_messages(env.format_observation(
                   Observation([m for m in traj.messages if m.role == "tool"]), "hf"))[0]]
    drift = codec.check_drift(traj.token_ids[: runs[1][0]], context, traj.tools, policy="keep")
    assert not drift.drifted or drift.expected, drift.detail


def test_image_oracle_carries_its_pixels(tiny_vl_model: Path) -> None:
    codec = codec_for(tiny_vl_model)
    traj = oracle_trajectory(EpisodeSpec("test/Colour-v0", seed=1), codec)
    assert len(traj.images) == 1 and traj.image_grid_thw and traj.image_token_id is not None
    assert codec.vision is not None
    vis = traj.vision_inputs(codec.vision.image_processor)
    assert int(vis["mm_token_type_ids"].sum()) == image_token_count(traj.image_grid_thw[0], codec.vision.merge_size)
    batch = sft_batch([traj], codec.vision.image_processor)
    assert batch.multimodal[0]["pixel_values"].shape[0] == int(torch.tensor(traj.image_grid_thw).prod())


def test_assistant_text_renders_tool_calls_in_the_template_format(tiny_text_model: Path) -> None:
    codec = codec_for(tiny_text_model)
    assert assistant_text(codec, "plain answer") == "plain answer"
    text = assistant_text(codec, Action(text="Let me compute.", tool_calls=[ToolCall("calc", {"x": 1})]))
    assert text.startswith("Let me compute.") and '"name": "calc"' in text and text.rstrip().endswith("</tool_call>")


class NoOracle(relax_gym.Env):
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return Observation([Message.user("hi")]), {}

    def step(self, action: Any):
        return Observation(), 0.0, True, False, {"success": False}


class WrongOracle(NoOracle):
    def oracle(self):
        yield "wrong"


def test_unusable_oracles_are_clear_errors(tiny_text_model: Path) -> None:
    codec = codec_for(tiny_text_model)
    for env_id, cls, match in (("test/NoOracle-v0", NoOracle, "no oracle"),
                               ("test/WrongOracle-v0", WrongOracle, "did not succeed")):
        if env_id not in relax_gym.registry:
            relax_gym.register(env_id, entry_point=cls)
        with pytest.raises(OracleError, match=match):
            oracle_trajectory(EpisodeSpec(env_id, seed=0), codec)
    with pytest.raises(OracleError, match="max_total_tokens"):
        oracle_trajectory(EpisodeSpec("test/ToolOracle-v0", seed=0), codec, max_total_tokens=10)


def test_warmup_phase_learns_and_resumes(tiny_text_model: Path) -> None:
    codec = codec_for(tiny_text_model)
    logged: list[tuple[int, dict[str, float], str]] = []

    def make(steps: int) -> WarmupPhase:
        be = TorchBackend(tiny_text_model, micro_batch_size=8)
        sampler = EpisodeSampler([EnvEntry(id="test/Letters-v0")], seed=0, seed_start=500)
        phase = WarmupPhase(WarmupConfig(enabled=True, steps=steps, batch_size=8, lr=1e-2), be, codec, sampler,
                            None, log=lambda s, m, p: logged.append((s, m, p)))
        be.configure_optimizer(phase.settings())
        return phase

    phase = make(12)
    asyncio.run(phase.run())
    losses = [m["loss"] for _, m, _ in logged]
    assert phase.done and phase.step == 12 and losses[-1] < 0.5 * losses[0]
    assert all(p == "warmup" for _, _, p in logged)

    # stop early on the loss, and carry the phase's state over
    early = make(50)
    early.config = WarmupConfig(enabled=True, steps=50, batch_size=8, lr=1e-2, stop_at_loss=losses[len(losses) // 2])
    asyncio.run(early.run())
    assert early.done and early.step < 50
    restored = make(50)
    restored.load_state_dict(early.state_dict())
    assert restored.step == early.step and restored.done
    assert restored.sampler.state_dict() == early.sampler.state_dict()
