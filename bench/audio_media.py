"""Measure audio preprocessing: codec and engine tokens per second, and its share of an RL step.

For clips of an audio env (default: the ``examples/audio_cpu.yaml`` env), on a tiny Qwen3-Omni
thinker built from config, it times each stage a clip goes through:

* **codec** -- ``ChatCodec.prompt`` on the env's first observation (resample to 16 kHz,
  placeholder expansion) and the lossless ``audio_data`` payload (the rollout's side);
* **engine prepare** -- the embedded engine's ``prepare_prompt`` on the request the rollout sends
  (decode the WAV, log-mel features, placeholder check);
* **engine prefill** -- one prefill forward of that prompt (audio encoder + language model);
* **trainer features** -- ``Trajectory.vision_inputs``' log-mel features, recomputed per sample.

Rounds alternate the stages (A, B, C, D, A, B, ...) and medians are reported with the load
average. With ``--run DIR`` it also reads that run's median RL step time and reports the share
of a step spent on audio preprocessing (codec + engine prepare + trainer features, times the
samples per step).

    python bench/audio_media.py --rounds 3 --run runs/audio_cpu
    python bench/audio_media.py --env relax/ToneCompare-v0 --entry-point ''   # a shipped env
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="example/PitchBand-v0")
    parser.add_argument("--entry-point", default="examples/pitch_band_env.py:PitchBandEnv",
                        help="registers --env first when it is not registered")
    parser.add_argument("--difficulty", default="easy")
    parser.add_argument("--clips", type=int, default=16, help="distinct clips per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--group", type=int, default=4, help="samples per clip (GRPO group size)")
    parser.add_argument("--run", default=None, help="a finished run of the example: report the share of its step")
    parser.add_argument("--samples-per-step", type=int, default=64)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    import relax_gym
    from relax_gym.audio import audio_payload, batch_features, collapse_audio_tokens
    from relax_gym.chat import ChatCodec
    from relax_gym.protocol import GenerateRequest
    from relax_gym.trainer.engines.model_runner import ModelRunner, SeqInput
    from relax_gym.trainer.engines.prepare import prepare_prompt
    from relax_gym.trainer.models import build_tiny_model

    folder = build_tiny_model("qwen3_omni", Path(tempfile.mkdtemp()) / "omni", tokenizer="tiny-bpe",
                              image_min_pixels=4096, image_max_pixels=4096)
    codec = ChatCodec.from_pretrained(folder, template_kwargs={"enable_thinking": False})
    runner = ModelRunner(folder)
    assert codec.audio is not None
    pad = codec.audio.audio_token_id
    if args.env not in relax_gym.registry and args.entry_point:
        from relax_gym.trainer.config import load_entry_point

        relax_gym.register(args.env, entry_point=load_entry_point(args.entry_point))
    env = relax_gym.make(args.env, difficulty=args.difficulty)

    def observations(round_: int) -> list[Any]:
        """Fresh clips every round, each ``--group`` times in a row, as a GRPO step sends them."""
        seeds = range(round_ * args.clips, (round_ + 1) * args.clips)
        return [env.format_observation(env.reset(seed=s)[0], "hf") for s in seeds for _ in range(args.group)]

    times: dict[str, list[float]] = {k: [] for k in ("codec", "engine_prepare", "engine_prefill", "trainer_features")}
    tokens: list[int] = []
    seconds = 0.0
    for round_ in range(args.rounds):
        batch = observations(round_)
        t0 = time.perf_counter()
        contexts = [codec.prompt(msgs) for msgs in batch]
        payloads = [[audio_payload(a.waveform) for a in r.audios] for r in contexts]
        times["codec"].append(time.perf_counter() - t0)
        tokens = [r.ids.count(pad) for r in contexts]
        seconds = sum(a.duration_s for r in contexts for a in r.audios)
        t0 = time.perf_counter()
        prepared = [prepare_prompt(GenerateRequest(input_ids=collapse_audio_tokens(r.ids, pad), audio_data=p), runner)
                    for r, p in zip(contexts, payloads, strict=True)]
        times["engine_prepare"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for p in prepared:
            assert p.vision is not None
            runner.prefill([SeqInput(p.input_ids, input_features=p.vision.input_features,
                                     feature_attention_mask=p.vision.feature_attention_mask)])
        times["engine_prefill"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for r in contexts:
            batch_features(codec.audio.extractor, [a.waveform for a in r.audios])
        times["trainer_features"].append(time.perf_counter() - t0)

    n = args.clips * args.group
    audio_tokens = sum(tokens)
    per_clip = {k: statistics.median(v) / n for k, v in times.items()}
    out: dict[str, Any] = {
        "env": f"{args.env} ({args.difficulty})", "audio_seconds_per_sample": round(seconds / n, 3),
        "placeholder_tokens_per_sample": audio_tokens / n, "rounds": args.rounds, "samples": n,
        "load_average": os.getloadavg(),
        "ms_per_sample": {k: round(v * 1000, 2) for k, v in per_clip.items()},
        "placeholder_tokens_per_s": {k: round(audio_tokens / statistics.median(v), 1) for k, v in times.items()},
    }
    media_s = (per_clip["codec"] + per_clip["engine_prepare"] + per_clip["trainer_features"]) * args.samples_per_step
    out["media_s_per_step"] = round(media_s, 3)
    if args.run:
        records = [json.loads(line) for line in (Path(args.run) / "metrics.jsonl").read_text().splitlines()]
        steps = sorted(r["time/step"] for r in records if r.get("phase") == "train" and "time/step" in r)
        if steps:
            median = steps[len(steps) // 2]
            out["median_rl_step_s"] = round(median, 3)
            out["media_share_of_step"] = round(media_s / median, 3)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
