"""The trajectory schema: invariants, derived views, and the JSONL + media round trip."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from relax_gym.chat import DriftReport
from relax_gym.trainer.rollout import (
    Trajectory,
    TrajectoryError,
    TurnRecord,
    load_jsonl,
    save_jsonl,
)
from relax_gym.trainer.rollout.trajectory import json_safe

from relax_gym import ImagePart, Message, ToolCall

IMAGE_TOKEN = 7


def _image(seed: int, size: tuple[int, int] = (20, 12)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8), "RGB")


def make_traj(**overrides: object) -> Trajectory:
    """prompt(3, one image of 2 pads) + sampled(2) + glue(1) + observation(2) + sampled(2)."""
    img = _image(0)
    fields: dict[str, object] = dict(  # noqa: C408 -- keyword form reads like the schema
        token_ids=[1, IMAGE_TOKEN, IMAGE_TOKEN, 10, 11, 2, 3, 4, 12, 13],
        loss_mask=[0, 0, 0, 1, 1, 0, 0, 0, 1, 1],
        rollout_logprobs=[0.0, 0.0, 0.0, -0.5, -1.25, 0.0, 0.0, 0.0, -0.125, -2.0],
        weight_versions=[-1, -1, -1, 3, 3, -1, -1, -1, 3, 4],
        prompt_length=3,
        episode_id="run-0", group_id="env#5", sample_index=1, env_id="demo/Env-v0", seed=5,
        reward=1.5, reward_components={"answer": 1.0, "format": 0.5}, success=True, stop_reason="env_done",
        turns=[TurnRecord(index=0, assistant_text="<tool_call>x</tool_call>", num_sampled_tokens=2,
                          finish_reason="stop", tool_calls=[ToolCall("calc", {"e": "1+1"}, "c0")],
                          observation_text="2", reward=0.0, engine_ids=["e0"], weight_versions=[3],
                          tool_latency_s=0.01, info={"turn": 1}),
               TurnRecord(index=1, assistant_text="done", num_sampled_tokens=2, finish_reason="length",
                          reward=1.5, terminated=True, weight_versions=[3, 4], resumes=1)],
        messages=[Message.user("look", ImagePart(img, id="img0")), Message.assistant("ok"), Message.tool("2", tool_call_id="c0")],
        tools=[{"type": "function", "function": {"name": "calc", "description": "", "parameters": {}}}],
        images=[ImagePart(img, id="img0")], image_grid_thw=[[1, 2, 4]], image_token_id=IMAGE_TOKEN,
        drift=DriftReport(kind="none"), metadata={"note": "x"},
    )
    fields.update(overrides)
    return Trajectory(**fields)  # type: ignore[arg-type]


def test_views_and_validate() -> None:
    t = make_traj()
    t.validate()
    assert t.num_sampled_tokens == 4
    assert t.sampled_spans() == [(3, 5), (8, 10)]
    assert t.mm_token_type_ids == [0, 1, 1, 0, 0, 0, 0, 0, 0, 0]
    assert t.weight_version_mix == {3: 3, 4: 1}
    assert t.trainable


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"loss_mask": [0] * 9}, "loss_mask has 9"),
        ({"rollout_logprobs": [0.0, 0.0, 0.0, -0.5, -1.25, -0.1, 0.0, 0.0, -0.125, -2.0]}, "masked but has logprob"),
        ({"weight_versions": [-1, -1, -1, 3, 3, -1, -1, -1, 3, -1]}, "weight version -1"),
        ({"prompt_length": 4}, "prompt holds tokens with loss_mask 1"),
        ({"rollout_logprobs": [0.0, 0.0, 0.0, 0.5, -1.25, 0.0, 0.0, 0.0, -0.125, -2.0]}, "logprob 0.5"),
        ({"stop_reason": "bored"}, "unknown stop reason"),
        ({"image_grid_thw": []}, "image placeholder runs"),
    ],
)
def test_validate_rejects_broken_invariants(change: dict[str, object], message: str) -> None:
    with pytest.raises(TrajectoryError, match=message):
        make_traj(**change).validate()


def test_trainable_follows_stop_reason_and_drift() -> None:
    assert not make_traj(stop_reason="engine_error").trainable
    assert not make_traj(stop_reason="aborted").trainable
    assert make_traj(stop_reason="max_tokens").trainable
    assert not make_traj(drift=DriftReport(kind="template", expected=False)).trainable
    assert make_traj(drift=DriftReport(kind="think_dropped", expected=True)).trainable
    empty = make_traj(token_ids=[1], loss_mask=[0], rollout_logprobs=[0.0], weight_versions=[-1], prompt_length=1,
                      images=[], image_grid_thw=[], image_token_id=None)
    assert not empty.trainable


def test_jsonl_round_trip_with_media(tmp_path: Path) -> None:
    a = make_traj()
    b = make_traj(episode_id="run-1", sample_index=2, images=[ImagePart(_image(1), id="img1")],
                  messages=[Message.user("x", ImagePart(_image(1), id="img1"))])
    path = save_jsonl([a, b], tmp_path / "out" / "rollouts.jsonl")
    media = tmp_path / "out" / "rollouts.jsonl.media"
    # each distinct image is stored once even though messages and images both reference it
    assert sorted(p.suffix for p in media.iterdir()) == [".png", ".png"]
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["schema_version"] == 1
    back = load_jsonl(path)
    assert [t.episode_id for t in back] == ["run-0", "run-1"]
    for orig, got in zip([a, b], back, strict=True):
        assert got.token_ids == orig.token_ids
        assert got.loss_mask == orig.loss_mask
        assert got.rollout_logprobs == orig.rollout_logprobs
        assert got.weight_versions == orig.weight_versions
        assert got.images == orig.images  # pixel-exact (PNG is lossless)
        assert got.messages == orig.messages
        assert got.turns == orig.turns
        assert got.drift == orig.drift
        assert (got.reward, got.reward_components, got.success, got.stop_reason) == (
            orig.reward, orig.reward_components, orig.success, orig.stop_reason)
        assert (got.group_id, got.sample_index, got.env_id, got.seed, got.tools, got.metadata) == (
            orig.group_id, orig.sample_index, orig.env_id, orig.seed, orig.tools, orig.metadata)


def test_video_frames_and_audio_clips_round_trip_exactly(tmp_path: Path) -> None:
    """Clips are saved as exact .npy (the trainer recomputes features from what the engine saw),
    once per distinct content."""
    from relax_gym import AudioPart, VideoPart

    rng = np.random.default_rng(0)
    clip = VideoPart(rng.integers(0, 256, size=(4, 8, 8, 3), dtype=np.uint8), fps=2.0)
    tone = AudioPart(rng.uniform(-1, 1, size=1600).astype(np.float32), sample_rate=16000)
    media = {"videos": [clip], "video_grid_thw": [[2, 4, 4]], "video_token_id": 99, "audios": [tone], "audio_token_id": 98}
    a = make_traj(**media)
    b = make_traj(episode_id="run-1", **media)
    path = save_jsonl([a, b], tmp_path / "r.jsonl")
    names = sorted(p.name for p in (tmp_path / "r.jsonl.media").iterdir())
    assert sum(n.startswith("frames-") for n in names) == 1 and sum(n.startswith("audio-") for n in names) == 1
    for got in load_jsonl(path):
        assert np.array_equal(got.videos[0].frames, clip.frames) and got.videos[0].fps == 2.0
        assert np.array_equal(got.audios[0].waveform, tone.waveform)
    with pytest.raises(TrajectoryError, match="pass a MediaWriter"):
        make_traj(**media).to_record()


def test_media_needs_a_writer_and_bad_records_are_clear(tmp_path: Path) -> None:
    with pytest.raises(TrajectoryError, match="MediaWriter"):
        make_traj().to_record()
    path = tmp_path / "bad.jsonl"
    path.write_text('{"schema_version": 1, "token_ids": [1]}\nnot json\n')
    with pytest.raises(TrajectoryError, match=r"bad.jsonl:1: malformed trajectory record"):
        load_jsonl(path)
    path.write_text('{"schema_version": 99}\n')
    with pytest.raises(TrajectoryError, match="schema version 99"):
        load_jsonl(path)


def test_json_safe_never_fails() -> None:
    out = json_safe({"a": np.float32(1.5), "b": float("nan"), "c": object(), 3: [np.int64(2), (1, "x")]})
    json.dumps(out)
    assert out["a"] == 1.5 and out["b"] == "nan" and out["3"] == [2, [1, "x"]]
