"""Audio observations reach the Qwen3-Omni thinker at every stage: codec, engine, rollout, trainer.

Default (fast, no model): the placeholder count rule equals transformers', the payload is
lossless, bad clips raise a MediaError with a counted reason, placeholders expand and collapse,
and a config pairing an audio env with a model that cannot hear (or the thinker with megatron)
fails at validation. Slow (a tiny thinker is built, about 10 s):

* the codec's token ids for a turn with two clips and an image equal the ids transformers' own
  ``Qwen3OmniMoeProcessor`` builds for the same messages, and our per-clip features equal its;
* the embedded engine takes ``audio_data`` (one pad or the expanded run) and refuses bad input
  with a 400 (corrupt bytes, a clip count that does not fit, a model that cannot hear);
* one RL step on relax/ToneCompare-v0: the engine's logprobs (with audio_data) equal a fresh
  forward of the trainer's model within 1e-4 fp32, and the step trains the audio encoder.
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from relax_gym.audio import (
    AudioBudgetError,
    AudioInputError,
    AudioSampling,
    audio_payload,
    audio_token_count,
    canonical_waveform,
    collapse_audio_tokens,
    decode_audio_item,
    expand_audio_tokens,
)
from relax_gym.errors import MediaError


def tone(hz: float, seconds: float, sr: int = 16000) -> np.ndarray:
    return (0.3 * np.sin(2 * np.pi * hz * np.arange(int(seconds * sr)) / sr)).astype(np.float32)


def test_token_count_rule_equals_transformers() -> None:
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import _get_feat_extract_output_lengths

    for frames in (1, 7, 99, 100, 101, 150, 250, 999, 3000):
        assert audio_token_count(frames) == int(_get_feat_extract_output_lengths(torch.tensor(frames))), frames
    assert audio_token_count(100) == 13  # one second


def test_payload_is_lossless_and_bad_clips_are_refused_with_a_reason() -> None:
    wave = canonical_waveform(tone(440, 0.7, 22050), 22050, AudioSampling())  # resampled to 16 kHz
    assert wave.dtype == np.float32 and abs(wave.size - 0.7 * 16000) <= 2
    back = decode_audio_item(audio_payload(wave), max_bytes=1 << 20, max_seconds=10)
    assert np.array_equal(back, wave)  # float32 WAV: the engine hears exactly what the trainer keeps
    with pytest.raises(AudioBudgetError) as err:
        canonical_waveform(tone(440, 3.0), 16000, AudioSampling(max_seconds=2.0))
    assert err.value.reason == "duration"
    with pytest.raises(MediaError, match="NaN"):
        canonical_waveform(np.array([0.1, np.nan] * 800, dtype=np.float32), 16000, AudioSampling())
    corrupt = "data:audio/wav;base64," + base64.b64encode(b"RIFF\x10\x00\x00\x00WAVEjunk" * 8).decode()
    for item, words in ((corrupt, "audio"), ("https://example.com/a.wav", "not fetched"), ("", "non-empty")):
        with pytest.raises(MediaError, match=words):
            decode_audio_item(item, max_bytes=1 << 20, max_seconds=10)
    with pytest.raises(MediaError, match="exceed"):  # the duration is read from the header
        decode_audio_item(audio_payload(tone(300, 3.0)), max_bytes=1 << 20, max_seconds=2)


def test_placeholders_expand_from_one_pad_or_the_run_and_collapse() -> None:
    pad = 9
    ids = [1, 8, pad, 7, 2, 8, pad, 7]
    out, spans = expand_audio_tokens(ids, [3, 2], pad)
    assert out == [1, 8, pad, pad, pad, 7, 2, 8, pad, pad, 7] and spans == [(2, 5), (8, 10)]
    assert expand_audio_tokens(out, [3, 2], pad)[0] == out  # already expanded: kept
    assert collapse_audio_tokens(out, pad) == ids
    with pytest.raises(AudioInputError, match="1 audio clip"):
        expand_audio_tokens(ids, [3], pad)
    with pytest.raises(AudioInputError, match="fits neither"):
        expand_audio_tokens([pad, pad], [3], pad)


def test_config_pairing_an_audio_env_with_a_model_that_cannot_hear_fails(tmp_path: Path) -> None:
    from relax_gym.trainer.config import ConfigError, check_envs, config_from_dict

    data: dict[str, Any] = {"output_dir": str(tmp_path), "model": {"build": {"kind": "qwen3_vl", "tokenizer": "tiny-bpe"}},
                            "data": {"envs": [{"id": "relax/ToneCompare-v0", "kwargs": {"difficulty": "easy"}}]}}
    with pytest.raises(ConfigError, match=r"data\.envs\.0: env relax/ToneCompare-v0 shows audio.*qwen3_vl.*qwen3_omni"):
        check_envs(config_from_dict(data, []))
    data["model"]["build"]["kind"] = "qwen3_omni"
    check_envs(config_from_dict(data, []))
    # the thinker hears but sees no video yet: a video env is still refused, naming both
    data["data"]["envs"] = [{"id": "relax/MotionTrack-v0", "kwargs": {"difficulty": "easy"}}]
    with pytest.raises(ConfigError, match=r"relax/MotionTrack-v0 shows video.*qwen3_omni"):
        check_envs(config_from_dict(data, []))
    data["data"]["envs"] = [{"id": "relax/ToneCompare-v0"}]
    with pytest.raises(ConfigError, match=r"Qwen3-Omni thinker.*megatron.*mixture-of-experts.*audio encoder"):
        config_from_dict({**data, "backend": "megatron"}, [])


# -- with a tiny thinker (slow) ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_omni_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from relax_gym.trainer.models import build_tiny_model

    return build_tiny_model("qwen3_omni", tmp_path_factory.mktemp("trainer-qwen3-omni"), seed=0,
                            tokenizer="tiny-bpe", image_max_pixels=64 * 64)


def omni_messages() -> tuple[list[dict[str, Any]], list[np.ndarray], Any]:
    from PIL import Image

    rng = np.random.default_rng(0)
    a, b = tone(440, 1.25), (0.2 * rng.standard_normal(37_000)).astype(np.float32)
    img = Image.fromarray(rng.integers(0, 255, (64, 48, 3), dtype=np.uint8))
    content = [{"type": "text", "text": "Listen "}, {"type": "audio", "audio": a, "sampling_rate": 16000},
               {"type": "image", "image": img}, {"type": "text", "text": " and "},
               {"type": "audio", "audio": b, "sampling_rate": 16000}, {"type": "text", "text": "?"}]
    return [{"role": "user", "content": content}], [a, b], img


@pytest.mark.slow
def test_codec_ids_equal_the_models_own_processor(tiny_omni_model: Path) -> None:
    from unittest import mock

    from transformers import Qwen3OmniMoeProcessor
    from transformers.processing_utils import ProcessorMixin

    from relax_gym.audio import clip_features
    from relax_gym.chat import ChatCodec

    codec = ChatCodec.from_pretrained(tiny_omni_model, template_kwargs={"enable_thinking": False})
    assert codec.takes("audio") and codec.takes("image") and not codec.takes("video")
    messages, waves, img = omni_messages()
    rendered = codec.prompt(messages)
    assert codec.audio is not None and codec.vision is not None
    # the processor's class check looks its (absent, torchvision-only) video processor up in an
    # auto mapping that is a placeholder without torchvision; only that type check is skipped
    with mock.patch.object(ProcessorMixin, "check_argument_for_proper_class", lambda self, name, arg: None):
        proc = Qwen3OmniMoeProcessor(image_processor=codec.vision.image_processor, video_processor=None,
                                     feature_extractor=codec.audio.extractor, tokenizer=codec.tokenizer)
    ref = proc(text=[rendered.text], audio=waves, images=[img], return_tensors="np")
    assert rendered.ids == ref["input_ids"][0].tolist()
    counts = [audio_token_count(int(n)) for n in ref["feature_attention_mask"].sum(-1)]
    assert rendered.ids.count(codec.audio.audio_token_id) == sum(counts) and len(rendered.audios) == 2
    # features: the longest clip (no batch padding) equals the processor's exactly
    longest = int(np.argmax([w.size for w in waves]))
    ours = clip_features(codec.audio.extractor, waves[longest])
    np.testing.assert_array_equal(ours, ref["input_features"][longest][:, : ours.shape[1]])


@pytest.mark.slow
def test_engine_prepares_audio_and_refuses_bad_input(tiny_omni_model: Path, tmp_path: Path) -> None:
    from relax_gym.chat import ChatCodec, ChatContext
    from relax_gym.protocol import GenerateRequest
    from relax_gym.trainer.engines.model_runner import ModelRunner
    from relax_gym.trainer.engines.prepare import BadRequest, InputLimits, check_raw_generate, prepare_prompt
    from relax_gym.trainer.models import build_tiny_model

    codec = ChatCodec.from_pretrained(tiny_omni_model)
    chat = ChatContext(codec, [{"role": "user", "content": [{"type": "audio", "audio": tone(523, 0.9, 8000),
                                                              "sampling_rate": 8000},
                                                             {"type": "text", "text": "which?"}]}])
    runner = ModelRunner(tiny_omni_model)
    assert runner.audio_support is not None and codec.audio is not None
    pad = codec.audio.audio_token_id
    sent = collapse_audio_tokens(chat.ids, pad)
    assert sent.count(pad) == 1 and len(chat.audio_payloads) == 1
    for ids in (sent, chat.ids):  # one pad, or already expanded: both accepted
        prepared = prepare_prompt(GenerateRequest(input_ids=ids, audio_data=chat.audio_payloads), runner)
        assert prepared.input_ids == chat.ids and prepared.vision is not None and prepared.vision.num_audios == 1
    corrupt = "data:audio/wav;base64," + base64.b64encode(b"\0" * 300).decode()
    for req, words in [
        (GenerateRequest(input_ids=sent, audio_data=[corrupt]), r"audio_data\[0\]"),
        (GenerateRequest(input_ids=sent), "placeholder"),
        (GenerateRequest(input_ids=sent, audio_data=chat.audio_payloads * 2), "2 audio clip"),
    ]:
        with pytest.raises(BadRequest, match=words):
            prepare_prompt(req, runner)
    with pytest.raises(BadRequest, match="at most 8"):
        check_raw_generate({"input_ids": sent, "audio_data": chat.audio_payloads * 9}, runner, InputLimits())
    text_runner = ModelRunner(build_tiny_model("qwen3", tmp_path / "text", tokenizer="tiny-bpe"))
    with pytest.raises(BadRequest, match="takes no audio"):
        prepare_prompt(GenerateRequest(input_ids=[1, 2, 3], audio_data=chat.audio_payloads), text_runner)


@pytest.mark.slow  # about 40 s: an engine process, a rollout and a step
def test_rl_step_on_audio_engine_equals_trainer(tiny_omni_model: Path, tmp_path: Path) -> None:
    from relax_gym.trainer.algorithms.batching import to_sequence_batch
    from relax_gym.trainer.config import config_from_dict
    from relax_gym.trainer.engines.in_process import engine_client
    from relax_gym.trainer.modes.colocate import Trainer
    from relax_gym.trainer.rollout.teacher import teacher_logprobs

    config = config_from_dict({
        "run_name": "a", "output_dir": str(tmp_path / "run"), "seed": 1, "deterministic": True, "threads": 1,
        "model": {"path": str(tiny_omni_model)},
        "engine": {"threads": 1, "startup_timeout_s": 240},
        "data": {"envs": [{"id": "relax/ToneCompare-v0", "kwargs": {"difficulty": "hard"}}]},
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
            assert trajs and all(t.audios and t.audio_token_id is not None for t in trajs)
            # the rollout's logprobs came from the same weights and samples the trainer saw
            assert m["train/rollout_gap_max"] < 1e-4
            client = engine_client(trainer.fleet.urls[0], api_key=trainer.fleet.api_key)
            try:
                engine = await teacher_logprobs(client, trajs)
            finally:
                await client.aclose()
            batch = to_sequence_batch(trainer.last_samples, trainer.processor)
            assert all("input_features" in mm for mm in batch.multimodal)
            ours = trainer.backend.compute_logprobs(batch).logprobs
            for t, e, o in zip(trajs, engine, ours, strict=True):
                mask = torch.tensor(t.loss_mask, dtype=torch.bool)
                torch.testing.assert_close(e[mask], o[mask], atol=1e-4, rtol=0)
            # training reaches the audio encoder through the features
            from relax_gym.trainer.backends.base import NLLObjective

            before = {n: p.detach().clone() for n, p in trainer.backend.model.named_parameters() if "audio_tower" in n}
            assert trainer.backend.train_step(batch, NLLObjective())["grad_norm"] > 0
            moved = [n for n, p in trainer.backend.model.named_parameters()
                     if n in before and not torch.equal(p, before[n])]
            assert len(moved) > len(before) // 2
        finally:
            await trainer.close()

    asyncio.run(scenario())


@pytest.mark.slow
def test_a_corrupt_or_over_budget_clip_becomes_an_error_observation_counted(tiny_omni_model: Path) -> None:
    import relax_gym
    from relax_gym.chat import ChatCodec
    from relax_gym.trainer.engines.in_process import InProcessEngine
    from relax_gym.trainer.rollout import EngineRouter, EpisodeSpec, RolloutConfig, RolloutManager
    from relax_gym.trainer.rollout.media_metrics import media_metrics
    from relax_gym.types import AudioPart, Message, Observation

    class BadAudioEnv(relax_gym.Env):  # seed 0: a corrupt clip; seed 1: one over max_seconds
        modalities = ("text", "audio")

        def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
            super().reset(seed=seed)
            wave = np.full(1600, np.nan, dtype=np.float32) if seed == 0 else tone(300, 31.0)
            return Observation([Message.user("Which?", AudioPart(wave, 16000), AudioPart(tone(440, 0.5), 16000))]), {}

        def step(self, action: Any) -> Any:
            return Observation(), 1.0, True, False, {}

    codec = ChatCodec.from_pretrained(tiny_omni_model)

    async def scenario() -> list[Any]:
        with InProcessEngine(tiny_omni_model) as engine:
            async with EngineRouter([engine.url]) as router:
                manager = RolloutManager(router, codec, RolloutConfig(max_new_tokens=4, group_size=1))
                trajs = await manager.generate([EpisodeSpec("test/BadAudio", seed=s, env_factory=BadAudioEnv)
                                                for s in (0, 1)])
                return [trajs, manager.metrics]

    trajs, metrics = asyncio.run(scenario())
    assert [(t.stop_reason, t.error) for t in trajs] == [("env_done", None)] * 2
    assert [len(t.audios) for t in trajs] == [1, 1]  # the good clip beside the bad one was heard
    texts = [codec.decode(t.token_ids) for t in trajs]
    assert "[audio could not be used: audio holds NaN" in texts[0] and "exceed max_seconds" in texts[1]
    assert metrics.media_errors == {"corrupt": 1, "duration": 1}
    assert [t.metadata["media_errors"] for t in trajs] == [["corrupt"], ["duration"]]
    assert media_metrics(trajs)["rollout/media_errors"] == 2.0
