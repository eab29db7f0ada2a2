"""Video observations reach Qwen3-VL at every stage: codec, embedded engine, rollout, trainer.

* the codec's token ids for a turn with a video (and an image) equal the ids Qwen3-VL's own
  processor (transformers ``Qwen3VLProcessor``) builds for the same messages and frames;
* our patches equal the image processor's for a still clip (same layout the vision tower reads);
* the lossless payload decodes to exactly the frames the codec kept;
* the engine refuses bad video input with a 400 (corrupt bytes, a text model, a stray pad);
* one RL step on relax/MotionTrack-v0: the engine's logprobs (with video_data) equal a fresh
  forward of the trainer's model within 1e-4, and the step trains on pixel_values_videos.
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from relax_gym.chat import ChatCodec
from relax_gym.errors import MediaError
from relax_gym.video import VideoBudgetError, VideoProcessor, VideoSampling, sample_video, video_payload


def clip(seed: int, frames: int = 8, size: tuple[int, int] = (96, 96)) -> np.ndarray:
    return np.random.RandomState(seed).randint(0, 256, (frames, size[0], size[1], 3), dtype=np.uint8)


def codec_for(model: Path, **sampling: Any) -> ChatCodec:
    return ChatCodec.from_pretrained(model, template_kwargs={"enable_thinking": False},
                                     video=VideoSampling(**sampling) if sampling else None)


def reference_processor(codec: ChatCodec, clips: list[Any]) -> Any:
    """transformers' Qwen3VLProcessor over our tokenizer and image processor. Its video processor
    resizes and normalises through torchvision, which does not import beside the CPU torch, so
    only that one step is replaced: it returns our patches and grids with the frames' metadata;
    the placeholder text (timestamps, vision markers, pad counts), tokenization and
    mm_token_type_ids are the processor's own."""
    from transformers import BatchFeature
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    from transformers.video_utils import VideoMetadata

    assert codec.vision is not None and codec.vision.video is not None
    ours = codec.vision.video.processor

    class Patched(Qwen3VLVideoProcessor):
        def __call__(self, videos: Any, **kwargs: Any) -> BatchFeature:
            out = ours([c.frames for c in clips])
            meta = [VideoMetadata(total_num_frames=len(c.frames), fps=c.fps, frames_indices=list(range(len(c.frames))))
                    for c in clips]
            return BatchFeature({**out, "video_metadata": meta})

    video_processor = Patched(patch_size=ours.patch_size, temporal_patch_size=ours.temporal_patch_size,
                              merge_size=ours.merge_size)
    from unittest import mock

    from transformers.processing_utils import ProcessorMixin

    # the class check looks the video processor up in an auto mapping that is a placeholder
    # without torchvision; it checks only the type, so it is skipped here
    with mock.patch.object(ProcessorMixin, "check_argument_for_proper_class", lambda self, name, arg: None):
        return Qwen3VLProcessor(image_processor=codec.vision.image_processor, tokenizer=codec.tokenizer,
                                video_processor=video_processor, chat_template=codec.chat_template)


def test_codec_ids_equal_the_models_own_processor(tiny_vl_model: Path) -> None:
    codec = codec_for(tiny_vl_model, fps=2.0, max_frames=6, max_pixels=64 * 64)
    img = Image.fromarray(clip(9, 1, (64, 48))[0])
    raw = [clip(1, 16), clip(2, 5, (64, 128))]
    msgs = [{"role": "user", "content": [
        {"type": "text", "text": "Where does the ball go?"},
        {"type": "video", "video": raw[0], "fps": 8.0},
        {"type": "image", "image": img},
        {"type": "video", "video": raw[1], "fps": 2.0},
        {"type": "text", "text": "Answer in \\boxed{}."}]}]
    ours = codec.prompt(msgs)
    assert len(ours.videos) == 2 and ours.video_reduced.count("fps") == 1
    assert [v.frames.shape[0] for v in ours.videos] == [4, 5]  # 8 fps -> 2 fps; 2 fps kept
    proc = reference_processor(codec, ours.videos)
    text = codec.render(msgs, add_generation_prompt=True)
    ref = proc(text=[text], images=[img], videos=[v.frames for v in ours.videos], return_tensors="pt")
    assert ours.ids == ref["input_ids"][0].tolist()
    # the engine's preparation of the collapsed prompt (one pad per video, as sent) gives the same
    from relax_gym.video import collapse_spans
    from relax_gym.vision import VisionTokens, collapse_image_tokens, prepare_vision_inputs
    from transformers import AutoConfig

    tokens = VisionTokens.from_config(AutoConfig.from_pretrained(str(tiny_vl_model)))
    sent = collapse_image_tokens(collapse_spans(ours.ids, ours.video_spans, tokens.video_token_id),
                                 tokens.image_token_id)
    vis = prepare_vision_inputs(sent, [img], codec.vision.image_processor, tokens,
                                videos=[(v.frames, v.fps) for v in ours.videos], video=codec.vision.video,
                                encode=codec.encode)
    assert vis.input_ids == ours.ids
    assert vis.mm_token_type_ids == ref["mm_token_type_ids"][0].tolist()
    assert vis.video_grid_thw.tolist() == ours.video_grids


def test_still_clip_patches_equal_the_image_processors(tiny_vl_model: Path) -> None:
    codec = codec_for(tiny_vl_model)
    assert codec.vision is not None
    frame = clip(3, 1, (64, 64))[0]
    image = codec.vision.image_processor(images=[Image.fromarray(frame)], return_tensors="np")
    video = VideoProcessor.from_image_processor(codec.vision.image_processor)([np.stack([frame, frame])])
    assert video["video_grid_thw"].tolist() == image["image_grid_thw"].tolist()
    np.testing.assert_allclose(video["pixel_values_videos"].numpy(), image["pixel_values"], atol=1e-6, rtol=0)


def test_sampling_budget_and_lossless_payload() -> None:
    sampled = sample_video(clip(4, 40, (120, 90)), 10.0, VideoSampling(fps=4.0, max_frames=6, max_pixels=64 * 64))
    assert sampled.frames.shape[0] == 6 and sampled.frames.shape[1] % 32 == 0 and sampled.frames.shape[2] % 32 == 0
    assert sampled.frames.shape[1] * sampled.frames.shape[2] <= 64 * 64
    assert set(sampled.reduced) == {"fps", "frames", "resolution"}
    from relax_gym.media import load_video

    frames, fps = load_video(video_payload(sampled.frames, sampled.fps))
    assert np.array_equal(frames, sampled.frames) and fps == pytest.approx(sampled.fps)
    with pytest.raises(VideoBudgetError) as err:
        sample_video(clip(5, 30, (32, 32)), 1.0, VideoSampling(max_source_seconds=10.0))
    assert err.value.reason == "duration"
    with pytest.raises(VideoBudgetError) as err:
        sample_video(clip(5, 30, (32, 32)), 30.0, VideoSampling(max_source_frames=20))
    assert err.value.reason == "frames"
    with pytest.raises(MediaError):
        sample_video(np.zeros((3, 32, 32), dtype=np.uint8), 2.0, VideoSampling())


def test_engine_prepares_video_and_refuses_bad_input(tiny_vl_model: Path, tiny_text_model: Path) -> None:
    from relax_gym.protocol import GenerateRequest
    from relax_gym.trainer.engines.model_runner import ModelRunner
    from relax_gym.trainer.engines.prepare import BadRequest, prepare_prompt

    codec = codec_for(tiny_vl_model)
    rendered = codec.prompt([{"role": "user", "content": [{"type": "video", "video": clip(6, 8), "fps": 4.0},
                                                          {"type": "text", "text": "hi"}]}])
    runner = ModelRunner(tiny_vl_model)
    assert runner.video_support is not None
    vid = runner.video_support.video_token_id
    payload = video_payload(rendered.videos[0].frames, rendered.videos[0].fps)
    from relax_gym.video import collapse_spans

    sent = collapse_spans(rendered.ids, rendered.video_spans, vid)
    for ids in (sent, rendered.ids):  # one pad, or already expanded: both accepted
        prepared = prepare_prompt(GenerateRequest(input_ids=ids, video_data=[payload]), runner)
        assert prepared.input_ids == rendered.ids and prepared.vision is not None
        assert prepared.vision.video_grid_thw.tolist() == rendered.video_grids
    bad = [
        (GenerateRequest(input_ids=sent, video_data=["data:video/mp4;base64," + base64.b64encode(b"\0" * 300).decode()]),
         r"video_data\[0\]: corrupt"),
        (GenerateRequest(input_ids=sent), "placeholder"),
        (GenerateRequest(input_ids=sent, video_data=[payload, payload]), "video"),
    ]
    for req, words in bad:
        with pytest.raises(BadRequest, match=words):
            prepare_prompt(req, runner)
    text_runner = ModelRunner(tiny_text_model)
    with pytest.raises(BadRequest, match="takes no video"):
        prepare_prompt(GenerateRequest(input_ids=[1, 2, 3], video_data=[payload]), text_runner)


def test_config_pairing_a_video_env_with_a_text_model_fails(tmp_path: Path) -> None:
    from relax_gym.trainer.config import ConfigError, check_envs, config_from_dict

    data: dict[str, Any] = {"output_dir": str(tmp_path), "model": {"build": {"kind": "qwen3", "tokenizer": "tiny-bpe"}},
                            "data": {"envs": [{"id": "relax/MotionTrack-v0", "kwargs": {"difficulty": "easy"}}]}}
    with pytest.raises(ConfigError, match=r"data\.envs\.0: env relax/MotionTrack-v0 shows video.*qwen3"):
        check_envs(config_from_dict(data, []))
    data["model"]["build"]["kind"] = "qwen3_vl"
    check_envs(config_from_dict(data, []))


@pytest.mark.slow  # about 35 s: an engine process, a rollout and a step
def test_rl_step_on_video_engine_equals_trainer(tiny_vl_model: Path, tmp_path: Path) -> None:
    from relax_gym.trainer.engines.in_process import engine_client
    from relax_gym.trainer.algorithms.batching import to_sequence_batch
    from relax_gym.trainer.config import config_from_dict
    from relax_gym.trainer.modes.colocate import Trainer
    from relax_gym.trainer.rollout.teacher import teacher_logprobs

    config = config_from_dict({
        "run_name": "v", "output_dir": str(tmp_path / "run"), "seed": 1, "deterministic": True, "threads": 1,
        "model": {"path": str(tiny_vl_model), "video": {"fps": 2.0, "max_frames": 4, "max_pixels": 64 * 64}},
        "engine": {"threads": 1, "startup_timeout_s": 240},
        "data": {"envs": [{"id": "relax/MotionTrack-v0", "kwargs": {"difficulty": "easy"}}]},
        "rollout": {"group_size": 2, "prompts_per_step": 2, "max_new_tokens": 6, "concurrency": 4},
        "algorithm": {"loss_agg_mode": "seq-mean-token-mean"},
        "train": {"steps": 1, "lr": 0.01, "micro_batch_size": 4},
        "eval": {"every": 0, "episodes": 2, "at_start": False},
        "checkpoint": {"every": 0},
        "logging": {"progress": "none", "tensorboard": False, "plot": False},
    }, [])

    async def scenario() -> None:
        trainer = Trainer(config)
        await trainer.start()
        try:
            m = await trainer.rl_step(1)
            trajs = [s.traj for s in trainer.last_samples]
            assert trajs and all(t.videos and t.video_grid_thw for t in trajs)
            assert all(t.videos[0].frames.shape[0] == 4 for t in trajs)  # 16 frames at 8 fps -> 2 fps
            # the rollout's logprobs came from the same weights and pixels the trainer saw
            assert m["train/rollout_gap_max"] < 1e-4
            client = engine_client(trainer.fleet.urls[0], api_key=trainer.fleet.api_key)
            try:
                engine = await teacher_logprobs(client, trajs)
            finally:
                await client.aclose()
            batch = to_sequence_batch(trainer.last_samples, trainer.processor)
            assert all("pixel_values_videos" in mm for mm in batch.multimodal)
            ours = trainer.backend.compute_logprobs(batch).logprobs
            for t, e, o in zip(trajs, engine, ours, strict=True):
                mask = torch.tensor(t.loss_mask, dtype=torch.bool)
                torch.testing.assert_close(e[mask], o[mask], atol=1e-4, rtol=0)
            # training reaches the vision tower through the video patches
            from relax_gym.trainer.backends.base import NLLObjective

            before = {n: p.detach().clone() for n, p in trainer.backend.model.named_parameters() if "visual" in n}
            assert trainer.backend.train_step(batch, NLLObjective())["grad_norm"] > 0
            moved = [n for n, p in trainer.backend.model.named_parameters()
                     if n in before and not torch.equal(p, before[n])]
            assert len(moved) > len(before) // 2
        finally:
            await trainer.close()

    asyncio.run(scenario())
