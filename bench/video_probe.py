"""Is a video task learnable from what the model gets? Supervised probe, video vs one image.

The disc task of ``examples/colour_order_env.py`` (name the colour of a still disc, 4 colours)
is shown either as the clip (video, through ``model.video`` sampling) or as its first frame (an
image), with the disc radius chosen here. A tiny Qwen3-VL (the example's build) takes
``--steps`` SFT steps on oracle answers (batch 32, lr 3e-3, the warm-up's settings) through the
real codec and the torch backend; every 10 steps it scores the 4 answers of each held-out
episode by their logprob and reports the accuracy of the best one (chance 0.25) and the NLL of
the right one. If the image version learns and the video version does not, the video path is
at fault; if neither learns, the task is too hard for the model at that resolution.

    python bench/video_probe.py --radius 10 20              # the old easy level, as video
    python bench/video_probe.py --radius 10 20 --as-image   # the same discs as one image
    python bench/video_probe.py --radius 22 30              # the easy level now
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
COLOURS = ("blue", "green", "red", "yellow")


def _register(radius: tuple[int, int], as_image: bool) -> str:
    """A still-disc env with the given radius, showing the clip or its first frame."""
    import importlib.util

    import numpy as np
    import relax_gym
    from PIL import Image
    from relax_gym.envs._base import Task
    from relax_gym.types import ImagePart

    spec = importlib.util.spec_from_file_location("colour_order_env", ROOT / "examples" / "colour_order_env.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["colour_order_env"] = mod
    spec.loader.exec_module(mod)

    class Disc(mod.ColourOrderEnv):  # type: ignore[misc, name-defined]
        def make_task(self, level: Any) -> Task:
            task = super().make_task(mod.Level(level.colours, False, radius))
            if not as_image:
                return task
            frames = task.media[0].frames
            return Task(task.prompt, task.target, task.answer, (ImagePart(Image.fromarray(np.asarray(frames[0]))),),
                        task.details)

    env_id = "bench/DiscProbe-v0"
    relax_gym.register(env_id, entry_point=Disc, override=True)
    return env_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--radius", type=int, nargs=2, default=(22, 30), metavar=("MIN", "MAX"))
    parser.add_argument("--as-image", action="store_true", help="show the first frame as an image")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--held-out", type=int, default=48)
    parser.add_argument("--frames", type=int, default=4, help="model.video.max_frames")
    parser.add_argument("--pixels", type=int, default=4096, help="per frame / image, as the example")
    args = parser.parse_args()

    import torch
    from relax_gym.chat import ChatCodec
    from relax_gym.trainer.backends.base import NLLObjective, OptimizerSettings, SequenceBatch
    from relax_gym.trainer.backends.pytorch import TorchBackend
    from relax_gym.trainer.models.tiny import build_tiny_model
    from relax_gym.trainer.rollout import EpisodeSpec
    from relax_gym.trainer.sft import oracle_trajectory, sft_batch
    from relax_gym.video import VideoSampling

    torch.set_num_threads(2)
    torch.manual_seed(0)
    env_id = _register(tuple(args.radius), args.as_image)
    folder = Path(tempfile.mkdtemp(prefix="video_probe_"))
    path = build_tiny_model("qwen3_vl", folder / "model", tokenizer="tiny-bpe", image_min_pixels=args.pixels,
                            image_max_pixels=args.pixels)
    codec = ChatCodec.from_pretrained(path, video=VideoSampling(fps=2.0, max_frames=args.frames,
                                                                min_pixels=args.pixels, max_pixels=args.pixels))
    assert codec.vision is not None
    processor = codec.vision.image_processor
    backend = TorchBackend(path, micro_batch_size=32, optimizer=OptimizerSettings(lr=3e-3, grad_clip=1.0))

    def episodes(seeds: range) -> list[Any]:
        return [oracle_trajectory(EpisodeSpec(env_id, seed=s, env_kwargs={"difficulty": "easy"}), codec)
                for s in seeds]

    held = episodes(range(10**6, 10**6 + args.held_out))
    first = held[0]
    print(f"{'image' if args.as_image else 'video'}, radius {args.radius}: {len(first.token_ids)} tokens, "
          f"image grids {first.image_grid_thw}, video grids {first.video_grid_thw}", flush=True)
    media = sft_batch(held, processor).multimodal
    ids, masks, mm = [], [], []
    for k, t in enumerate(held):
        prompt = t.token_ids[: t.prompt_length]
        for colour in COLOURS:
            answer = codec.encode("\\boxed{" + colour + "}")
            ids.append(prompt + answer)
            masks.append([0] * len(prompt) + [1] * len(answer))
            mm.append(media[k])
    candidates = SequenceBatch(input_ids=ids, loss_mask=masks, multimodal=mm, group_ids=[str(i) for i in range(len(ids))])
    truth = torch.tensor([COLOURS.index(_answer(codec, t)) for t in held])

    def evaluate() -> tuple[float, float]:
        lps = backend.compute_logprobs(candidates).logprobs
        scores = torch.tensor([float(lp[torch.tensor(m, dtype=torch.bool)].sum()) for lp, m in zip(lps, masks)])
        scores = scores.view(-1, len(COLOURS))
        acc = float((scores.argmax(1) == truth).float().mean())
        nll = float(-torch.log_softmax(scores, 1)[torch.arange(len(truth)), truth].mean())
        return acc, nll

    start, seed = time.time(), 0
    print(f"load average {os.getloadavg()[0]:.1f}")
    print("| SFT step | held-out accuracy (best of 4 answers) | NLL of the right answer | s |")
    print("| ---: | ---: | ---: | ---: |")
    for step in range(args.steps + 1):
        if step % 10 == 0:
            acc, nll = evaluate()
            print(f"| {step} | {acc:.3f} | {nll:.3f} | {time.time() - start:.0f} |", flush=True)
        if step == args.steps:
            break
        batch = episodes(range(seed, seed + 32))
        seed += 32
        backend.train_step(sft_batch(batch, processor), NLLObjective())
    print(f"load average {os.getloadavg()[0]:.1f}")


def _answer(codec: Any, traj: Any) -> str:
    """The oracle's colour, read back from its ``\\boxed{}`` reply."""
    text = codec.decode(traj.token_ids[traj.prompt_length:])
    return text.split("{", 1)[1].split("}", 1)[0]


if __name__ == "__main__":
    main()
