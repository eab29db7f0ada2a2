"""Measure the CPU quickstart: held-out success against wall-clock time.

Runs ``relax-gym train examples/quickstart.yaml`` (any overrides after ``--``), then reads the
run's ``metrics.jsonl`` and prints the curve as a Markdown table: every held-out evaluation of
the warm-up (SFT) and RL phases with its wall-clock minute, plus the start success (after the
warm-up), the time at which RL first reached the target and the final success. The same summary
is written to ``<output_dir>/bench_quickstart.json``.

    python bench/quickstart.py                       # the full run (about 10 min on 2 cores)
    python bench/quickstart.py --config examples/quickstart.yaml -- train.steps=10
    python bench/quickstart.py --from-run runs/quickstart   # only summarise an existing run
    python bench/quickstart.py --backends torch,megatron -- logging.progress=none
        # the same run on each backend, one after the other (megatron on CPU with the debug
        # shim), and one table comparing them
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def wilson_interval(success: float, episodes: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a success rate over ``episodes`` Bernoulli trials."""
    if episodes <= 0:
        return 0.0, 1.0
    centre = (success + z * z / (2 * episodes)) / (1 + z * z / episodes)
    half = z * ((success * (1 - success) / episodes + z * z / (4 * episodes * episodes)) ** 0.5) / (1 + z * z / episodes)
    return round(max(0.0, centre - half), 3), round(min(1.0, centre + half), 3)


def summarize(out_dir: Path, target: float) -> dict[str, Any]:
    from relax_gym.trainer.observability import read_metrics

    records = read_metrics(out_dir / "metrics.jsonl")
    warm = [r for r in records if r["phase"] == "warmup_eval"]
    evals = [r for r in records if r["phase"] == "eval"]
    train = [r for r in records if r["phase"] == "train"]
    sft = [r for r in records if r["phase"] == "warmup"]
    rl_start = evals[0] if evals else None
    reached = next((r for r in evals if r["success"] >= target), None)
    step_times = [r["time/step"] for r in train if "time/step" in r]
    start_ci = wilson_interval(rl_start["success"], int(rl_start.get("episodes", 0))) if rl_start else None
    final_ci = wilson_interval(evals[-1]["success"], int(evals[-1].get("episodes", 0))) if evals else None
    breakdown = {}
    for key in ("rollout", "reward", "logprob", "train", "sync"):
        values = [r.get(f"time/{key}", 0.0) for r in train]
        if values:
            breakdown[key] = sorted(values)[len(values) // 2]
    return {
        "out_dir": str(out_dir),
        "sft_steps": len(sft),
        "rl_steps": len(train),
        "warmup_evals": [(round(r["elapsed_s"] / 60, 2), r["step"], r["success"]) for r in warm],
        "rl_evals": [(round(r["elapsed_s"] / 60, 2), r["step"], r["success"]) for r in evals],
        "success_at_rl_start": rl_start["success"] if rl_start else None,
        "target": target,
        "target_reached_at_min": round(reached["elapsed_s"] / 60, 2) if reached else None,
        "target_reached_at_step": reached["step"] if reached else None,
        "final_success": evals[-1]["success"] if evals else None,
        # 95% Wilson intervals of the first and last held-out evals (episodes x envs trials)
        "ci95_at_rl_start": start_ci,
        "ci95_final": final_ci,
        "intervals_overlap": final_ci[0] <= start_ci[1] if start_ci and final_ci else None,
        "total_min": round(records[-1]["elapsed_s"] / 60, 2) if records else None,
        "median_rl_step_s": sorted(step_times)[len(step_times) // 2] if step_times else None,
        "median_phase_s": breakdown,
        "machine": f"{platform.machine()} {os.cpu_count()} logical CPUs, Python {platform.python_version()}",
    }


def markdown(summary: dict[str, Any]) -> str:
    lines = ["| phase | step | wall-clock min | held-out success |", "| --- | ---: | ---: | ---: |"]
    for minute, step, success in summary["warmup_evals"]:
        lines.append(f"| warm-up (SFT) | {step} | {minute:.2f} | {success:.3f} |")
    for minute, step, success in summary["rl_evals"]:
        lines.append(f"| RL | {step} | {minute:.2f} | {success:.3f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "examples" / "quickstart.yaml"))
    parser.add_argument("--target", type=float, default=0.9, help="success the RL phase should reach")
    parser.add_argument("--from-run", default=None, help="summarise this finished run instead of training")
    parser.add_argument("--backends", default=None,
                        help="comma-separated backends to run in turn (e.g. torch,megatron) and compare")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides for the run (after --)")
    args = parser.parse_args()
    if args.backends:
        return compare_backends(args)
    if args.from_run:
        out_dir = Path(args.from_run)
    else:
        from relax_gym.trainer.config import load_config

        config = load_config(args.config, args.overrides)
        out_dir = config.out_dir
        start = time.perf_counter()
        cmd = [sys.executable, "-m", "relax_gym.cli.main", "train", args.config, *args.overrides]
        print("running:", " ".join(cmd), flush=True)
        code = subprocess.call(cmd)
        print(f"exit code {code} after {(time.perf_counter() - start) / 60:.1f} min", flush=True)
        if code != 0:
            return code
    summary = summarize(out_dir, args.target)
    (out_dir / "bench_quickstart.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    print(markdown(summary))
    print(json.dumps({k: v for k, v in summary.items() if k not in ("warmup_evals", "rl_evals")}, indent=2))
    return 0


def run_backend(config_path: str, overrides: list[str], backend: str) -> tuple[int, float, Path]:
    """One training run on ``backend`` in its own output folder: (exit code, wall s, folder)."""
    from relax_gym.trainer.config import load_config

    config = load_config(config_path, overrides)
    out_dir = Path(str(config.out_dir) + f"_{backend}")
    env = dict(os.environ)
    if backend == "megatron":
        import torch

        if not torch.cuda.is_available():
            env["RELAX_MEGATRON_CPU_SHIM"] = "1"  # megatron-core on a CPU-only torch
    cmd = [sys.executable, "-m", "relax_gym.cli.main", "train", config_path, *overrides,
           f"backend={backend}", f"output_dir={out_dir}"]
    print("running:", " ".join(cmd), flush=True)
    start = time.perf_counter()
    code = subprocess.call(cmd, env=env)
    wall = time.perf_counter() - start
    print(f"{backend}: exit code {code} after {wall / 60:.1f} min", flush=True)
    return code, wall, out_dir


def compare_backends(args: argparse.Namespace) -> int:
    """The same run on each backend in turn, and one comparison table."""
    rows = ["| backend | wall-clock min | SFT steps | success at RL start | RL step of target | "
            "min to target | final success | median RL step s (train phase s) |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    failed = 0
    for backend in args.backends.split(","):
        code, wall, out_dir = run_backend(args.config, args.overrides, backend)
        if code != 0:
            failed = code
            rows.append(f"| {backend} | {wall / 60:.2f} | failed (exit {code}) | | | | | |")
            continue
        summary = summarize(out_dir, args.target)
        summary["wall_min"] = round(wall / 60, 2)
        (out_dir / "bench_quickstart.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
        print(markdown(summary), flush=True)
        train_s = summary["median_phase_s"].get("train")
        rows.append(
            f"| {backend} | {wall / 60:.2f} | {summary['sft_steps']} | {summary['success_at_rl_start']} | "
            f"{summary['target_reached_at_step']} | {summary['target_reached_at_min']} | "
            f"{summary['final_success']} | {summary['median_rl_step_s']:.2f} ({train_s:.2f}) |"
        )
    print("\n".join(rows))
    return failed


if __name__ == "__main__":
    sys.exit(main())
