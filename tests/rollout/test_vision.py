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
