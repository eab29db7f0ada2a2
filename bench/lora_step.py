"""One GRPO train step on a real model, full fine-tuning vs LoRA: time and peak memory.

    python bench/lora_step.py --model runs/models/smollm2-135m-instruct --rounds 2

Each measurement runs in its own subprocess (so its peak RSS is its own), alternating
full, lora, full, lora... The batch is ``--rows`` sequences of ``--tokens`` random tokens, the
second half of each under the loss mask, with +-1 advantages (the shape of a GRPO batch). A
step is the backend's ``train_step``: forward, GRPO loss, backward, AdamW. The first step of each
process (AdamW state allocation) is reported apart from the median of the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time


def _child(args: argparse.Namespace) -> None:
    import torch

    from relax_gym.trainer.algorithms import AlgorithmConfig
    from relax_gym.trainer.backends.base import OptimizerSettings, PolicyObjective, SequenceBatch
    from relax_gym.trainer.backends.lora import LoraSettings, trainable_counts
    from relax_gym.trainer.backends.pytorch import TorchBackend

    torch.set_num_threads(args.threads)
    lora = LoraSettings(rank=args.rank) if args.variant == "lora" else None
    be = TorchBackend(args.model, micro_batch_size=args.rows, optimizer=OptimizerSettings(lr=1e-5), lora=lora)
    g = torch.Generator().manual_seed(0)
    ids, masks, adv = [], [], []
    for i in range(args.rows):
        ids.append(torch.randint(100, 40000, (args.tokens,), generator=g).tolist())
        mask = [0] * (args.tokens // 2) + [1] * (args.tokens - args.tokens // 2)
        masks.append(mask)
        adv.append(torch.tensor([(1.0 if i % 2 else -1.0) * m for m in mask]))
    batch = SequenceBatch(ids, masks, advantages=adv, rollout_logprobs=[torch.zeros(args.tokens)] * args.rows,
                          group_ids=[f"g{i // 2}" for i in range(args.rows)])
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        be.train_step(batch, PolicyObjective(AlgorithmConfig()))
        times.append(time.perf_counter() - start)
    trainable, total = trainable_counts(be.model)
    print(json.dumps({"variant": args.variant, "step_s": times, "trainable": trainable, "total": total,
                      "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                      "load": os.getloadavg()[0]}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3, help="steps per process")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variant", choices=["full", "lora"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        _child(args)
        return 0
    rows: dict[str, list[dict]] = {"full": [], "lora": []}
    for _ in range(args.rounds):
        for variant in ("full", "lora"):
            cmd = [sys.executable, __file__, "--variant", variant, "--model", args.model, "--rows", str(args.rows),
                   "--tokens", str(args.tokens), "--steps", str(args.steps), "--rank", str(args.rank),
                   "--threads", str(args.threads)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
            print(out, flush=True)
            rows[variant].append(json.loads(out))
    summary = {}
    for variant, runs in rows.items():
        later = [t for r in runs for t in r["step_s"][1:]]
        summary[variant] = {
            "first_step_s": round(statistics.median(r["step_s"][0] for r in runs), 1),
            "median_step_s": round(statistics.median(later), 1) if later else None,
            "peak_rss_gb": round(max(r["peak_rss_gb"] for r in runs), 2),
            "trainable": runs[0]["trainable"], "total": runs[0]["total"],
        }
    full, lora = summary["full"], summary["lora"]
    if full["median_step_s"] and lora["median_step_s"]:
        summary["lora/full step time"] = round(lora["median_step_s"] / full["median_step_s"], 2)
    summary["lora/full peak rss"] = round(lora["peak_rss_gb"] / full["peak_rss_gb"], 2)
    summary["load_avg"] = os.getloadavg()
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
