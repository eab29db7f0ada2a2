"""Measure video preprocessing: codec and engine tokens per second, and its share of an RL step.

For clips of a video env (default: the ``examples/video_cpu.yaml`` env and sampling), on a tiny Qwen3-VL built from config, it times each stage a clip goes through:

* **codec** -- ``ChatCodec.prompt`` on the env's first observation: frame sampling and resize,
  placeholder expansion, and the lossless ``video_data`` payload (the rollout's side);
* **engine prepare** -- the embedded engine's ``prepare_prompt`` on the request the rollout sends
  (decode the payload, patches, placeholder check);
* **engine prefill** -- one prefill forward of that prompt (vision tower + language model);
* **trainer patches** -- ``Trajectory.vision_inputs``' video patches, recomputed per sample.

Rounds alternate the stages (A, B, C, D, A, B, ...) and medians are reported with the load
average. With ``--run DIR`` it also reads that run's median RL step time and reports the share
of a step spent on media preprocessing (codec + engine prepare + trainer patches, times the
samples per step).

    python bench/media.py --rounds 5 --run runs/video_cpu
    python bench/media.py --env relax/MotionTrack-v0 --max-pixels 9216   # a shipped env
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
    parser.add_argument("--env", default="example/ColourOrder-v0")
    parser.add_argument("--entry-point", default="examples/colour_order_env.py:ColourOrderEnv",
                        help="registers --env first when it is not registered")
    parser.add_argument("--difficulty", default="easy")
    parser.add_argument("--fps", type=float, default=2.0)
    parser.add_argument("--max-frames", type=int, default=4)
    parser.add_argument("--max-pixels", type=int, default=64 * 64)
    parser.add_argument("--clips", type=int, default=16, help="distinct clips per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--group", type=int, default=4, help="samples per clip (GRPO group size)")
    parser.add_argument("--run", default=None, help="a finished run of the example: report the share of its step")
    parser.add_argument("--samples-per-step", type=int, default=64)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    import relax_gym
    from relax_gym.chat import ChatCodec
    from relax_gym.protocol import GenerateRequest
    from relax_gym.trainer.engines.model_runner import ModelRunner, SeqInput
    from relax_gym.trainer.engines.prepare import prepare_prompt
    from relax_gym.trainer.models import build_tiny_model
    from relax_gym.video import VideoProcessor, VideoSampling, collapse_spans, video_payload

    folder = build_tiny_model("qwen3_vl", Path(tempfile.mkdtemp()) / "vl", tokenizer="tiny-bpe",
                              image_min_pixels=4096, image_max_pixels=4096)
    sampling = VideoSampling(fps=args.fps, max_frames=args.max_frames, min_pixels=min(4096, args.max_pixels),
                             max_pixels=args.max_pixels)
    codec = ChatCodec.from_pretrained(folder, template_kwargs={"enable_thinking": False}, video=sampling)
    runner = ModelRunner(folder)
    assert codec.vision is not None and codec.vision.video is not None
    vid = codec.vision.video.video_token_id
    processor = VideoProcessor.from_image_processor(codec.vision.image_processor)
    if args.env not in relax_gym.registry and args.entry_point:
        from relax_gym.trainer.config import load_entry_point

        relax_gym.register(args.env, entry_point=load_entry_point(args.entry_point))
    env = relax_gym.make(args.env, difficulty=args.difficulty)

    def observations(round_: int) -> list[Any]:
        """Fresh clips every round, each ``--group`` times in a row, as a GRPO step sends them
        (so the content caches hit as often as in a run, and never across rounds)."""
        seeds = range(round_ * args.clips, (round_ + 1) * args.clips)
        return [env.format_observation(env.reset(seed=s)[0], "hf") for s in seeds for _ in range(args.group)]

    times: dict[str, list[float]] = {k: [] for k in ("codec", "engine_prepare", "engine_prefill", "trainer_patches")}
    tokens: list[int] = []
    for round_ in range(args.rounds):
        batch = observations(round_)
        t0 = time.perf_counter()
        contexts = [codec.prompt(msgs) for msgs in batch]
        payloads = [[video_payload(v.frames, v.fps) for v in r.videos] for r in contexts]
        times["codec"].append(time.perf_counter() - t0)
        tokens = [sum(e - s for s, e in r.video_spans) for r in contexts]
        t0 = time.perf_counter()
        prepared = [prepare_prompt(GenerateRequest(input_ids=collapse_spans(r.ids, r.video_spans, vid),
                                                   video_data=p), runner) for r, p in zip(contexts, payloads, strict=True)]
        times["engine_prepare"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for p in prepared:
            assert p.vision is not None
            runner.prefill([SeqInput(p.input_ids, mm_token_type_ids=p.vision.mm_token_type_ids,
                                     pixel_values_videos=p.vision.pixel_values_videos,
                                     video_grid_thw=p.vision.video_grid_thw)])
        times["engine_prefill"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for r in contexts:
            processor([v.frames for v in r.videos])
        times["trainer_patches"].append(time.perf_counter() - t0)

    n = args.clips * args.group
    video_tokens = sum(tokens)
    per_clip = {k: statistics.median(v) / n for k, v in times.items()}
    out: dict[str, Any] = {
        "env": f"{args.env} ({args.difficulty})", "sampling": {k: getattr(sampling, k) for k in ("fps", "max_frames", "max_pixels")},
        "placeholder_tokens_per_sample": video_tokens / n, "rounds": args.rounds, "samples": n,
        "load_average": os.getloadavg(),
        "ms_per_sample": {k: round(v * 1000, 2) for k, v in per_clip.items()},
        "placeholder_tokens_per_s": {k: round(video_tokens / statistics.median(v), 1) for k, v in times.items()},
    }
    media_s = (per_clip["codec"] + per_clip["engine_prepare"] + per_clip["trainer_patches"]) * args.samples_per_step
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
