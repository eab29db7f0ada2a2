"""``relax-gym sft CONFIG [key.sub=value ...] [--out DIR] [--resume]``: supervised warm-start only.

Runs the ``warmup:`` section of a training config (oracle trajectories of the config's envs,
held-out evaluation, early stop) without the RL phase, and writes the model as an HF folder
(``--out``, default ``<output_dir>/sft_model``) that ``model.path`` of a later run, or an engine,
can load.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="training config (YAML) whose warmup: section to run")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="dotted overrides, e.g. warmup.steps=50")
    parser.add_argument("--out", default=None, help="HF folder for the fine-tuned model (default <output_dir>/sft_model)")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")


def run(args: argparse.Namespace) -> int:
    from relax_gym.trainer.config import ConfigError, check_envs, load_config

    overrides = ["warmup.enabled=true", *args.overrides]
    try:
        config = load_config(args.config, overrides)
        if args.out is None:
            from pathlib import Path

            out = str(Path(config.out_dir) / "sft_model")
        else:
            out = args.out
        config = load_config(args.config, [*overrides, f"warmup.save_to={out}"])
        check_envs(config)  # a bad env id or kwarg fails before the model loads
    except ConfigError as exc:
        print(f"relax-gym sft: {exc}", file=sys.stderr)
        return 2
    from relax_gym.trainer.modes.colocate import train
    from relax_gym.trainer.train_cli import held_out_change, run_to_end

    summary = run_to_end("sft", lambda: train(config, resume=args.resume, rl=False))
    if isinstance(summary, int):
        return summary
    print(f"SFT done; model written to {out}{held_out_change(summary)}")
    return 0
