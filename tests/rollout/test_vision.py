"""An image episode on a tiny Qwen3-VL through the embedded engine: images accumulate in
conversation order (each exactly once per request), pads are expanded per image, and the
engine's logprobs match a fresh forward pass with the same pixel values."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from relax_gym.chat import ChatCodec
from relax_gym.trainer.rollout import (
    EngineRouter,
    EpisodeSpec,
    RolloutConfig,
    RolloutManager,
    load_jsonl,
    save_jsonl,
)

from relax_gym import ImagePart
from relax_gym.vision import image_token_count

from .envs import ImageTurnsEnv
from .forward import load_model, max_sampled_diff


async def test_image_episode(vl_engine: Any, tiny_qwen3_vl: Path, tmp_path: Path) -> None:
    codec = ChatCodec.from_pretrained(tiny_qwen3_vl)
    assert codec.vision is not None
    specs = [EpisodeSpec("test/ImageTurns", seed=s, env_factory=lambda: ImageTurnsEnv(turns=3)) for s in (0, 1)]
    async with EngineRouter([vl_engine.url]) as router:
        manager = RolloutManager(router, codec, RolloutConfig(max_new_tokens=8, concurrency=2, group_size=1))
        trajs = await manager.generate(specs)
    model = load_model(tiny_qwen3_vl)
    worst = 0.0
    for traj, spec in zip(trajs, specs, strict=True):
        traj.validate()
        assert traj.stop_reason == "env_done" and len(traj.turns) == 3 and traj.drift.kind == "none"
        # the images of the three observations, in conversation order, each once
        env = ImageTurnsEnv(turns=3)
        obs, _ = env.reset(seed=spec.seed)
        shown = [p.image for p in obs.parts(ImagePart)]
        for _ in range(2):
            obs, *_ = env.step("x")
            shown += [p.image for p in obs.parts(ImagePart)]
        assert [p.image.tobytes() for p in traj.images] == [im.tobytes() for im in shown]
        assert traj.image_grid_thw == codec.vision.grids(shown)
        assert len({tuple(g) for g in traj.image_grid_thw}) == 3  # three different patch grids
        # pads expanded per image: one run per image, each of its patch count
        merge = codec.vision.merge_size  # type: ignore[union-attr]
        assert sum(traj.mm_token_type_ids) == sum(image_token_count(g, merge) for g in traj.image_grid_thw)
        assert all(m == 0 for m, t in zip(traj.loss_mask, traj.mm_token_type_ids) if t)
        worst = max(worst, max_sampled_diff(model, traj, codec.vision.image_processor))
    # replay: the JSONL + media round trip rebuilds the same forward-pass inputs
    (back,) = load_jsonl(save_jsonl(trajs[:1], tmp_path / "vl.jsonl"))
    assert back.token_ids == trajs[0].token_ids and back.image_grid_thw == trajs[0].image_grid_thw
    assert max_sampled_diff(model, back, codec.vision.image_processor) == max_sampled_diff(
        model, trajs[0], codec.vision.image_processor)
    print(f"\nQwen3-VL max |engine logprob - fresh forward logprob| (fp32): {worst:.2e}")
    assert worst < 1e-4
    assert manager.metrics.engine_prompt_mismatch == 0  # the engine saw exactly our expanded ids
    # with a 512-token vocabulary the random model sometimes emits a vision marker: such a segment
    # is cut before it, so image pads only ever sit at real images (validate() checked the runs)
    assert all(t not in codec.vision.reserved_ids for traj in trajs for t, m in zip(traj.token_ids, traj.loss_mask) if m)


async def test_sampled_vision_markers_are_cut(vl_engine: Any, tiny_qwen3_vl: Path) -> None:
    """Reserve most of the small vocabulary so the model surely hits a reserved id: every segment
    stops there and keeps only the exact prefix sampled before it."""
    codec = ChatCodec.from_pretrained(tiny_qwen3_vl)
    assert codec.vision is not None
    codec.vision = dataclasses.replace(codec.vision, reserved_ids=codec.vision.reserved_ids | frozenset(range(400)))
    specs = [EpisodeSpec("test/ImageTurns", seed=0, env_factory=lambda: ImageTurnsEnv(turns=2))]
    async with EngineRouter([vl_engine.url]) as router:
        manager = RolloutManager(router, codec, RolloutConfig(max_new_tokens=16, group_size=1))
        (traj,) = await manager.generate(specs)
    traj.validate()
    assert traj.stop_reason == "env_done" and manager.metrics.reserved_tokens_cut >= 1
    assert all(t not in codec.vision.reserved_ids for t, m in zip(traj.token_ids, traj.loss_mask) if m)
    assert all(t.finish_reason == "stop" for t in traj.turns)


async def test_a_clip_over_budget_becomes_an_error_observation_and_the_episode_goes_on(
        vl_engine: Any, tiny_qwen3_vl: Path) -> None:
    """A clip the codec refuses (over the source-frame budget, then over the duration budget) is
    replaced by a text the model reads, counted by reason; the good clip beside it and the rest
    of the episode go on."""
    import numpy as np

    import relax_gym
    from relax_gym.trainer.rollout.media_metrics import media_metrics
    from relax_gym.types import Message, Observation, VideoPart
    from relax_gym.video import VideoSampling

    rng = np.random.default_rng(0)
    good = rng.integers(0, 255, (4, 64, 64, 3), dtype=np.uint8)

    class LongClipEnv(relax_gym.Env):
        modalities = ("text", "video")

        def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
            super().reset(seed=seed)
            self.turn = 0
            too_many = rng.integers(0, 255, (16, 64, 64, 3), dtype=np.uint8)
            return Observation([Message.user("Watch:", VideoPart(too_many, 8.0), VideoPart(good, 2.0), "Colour?")]), {}

        def step(self, action: Any) -> Any:
            self.turn += 1
            too_long = rng.integers(0, 255, (6, 64, 64, 3), dtype=np.uint8)  # 6 s at 1 fps
            return Observation([Message.user("Again:", VideoPart(too_long, 1.0))]), 0.5, self.turn >= 2, False, {}

    codec = ChatCodec.from_pretrained(tiny_qwen3_vl, video=VideoSampling(max_source_frames=8, max_source_seconds=5))
    async with EngineRouter([vl_engine.url]) as router:
        manager = RolloutManager(router, codec, RolloutConfig(max_new_tokens=4, group_size=1, max_turns=4))
        (traj,) = await manager.generate([EpisodeSpec("test/LongClip", seed=0, env_factory=LongClipEnv)])
    traj.validate()
    assert (traj.stop_reason, traj.error, len(traj.turns)) == ("env_done", None, 2)
    assert len(traj.videos) == 1  # the good clip reached the model
    text = codec.decode(traj.token_ids)
    assert text.count("[video could not be used:") == 2
    assert "16 frames exceed the budget of 8" in text and "6.0 s exceed the budget of 5 s" in text
    assert manager.metrics.media_errors == {"frames": 1, "duration": 1}
    assert traj.metadata["media_errors"] == ["frames", "duration"]
    assert media_metrics([traj])["rollout/media_errors"] == 2.0
