"""``relax-gym train CONFIG [key.sub=value ...] [--resume]``: run a training config.

The config (YAML) and the overrides are validated before anything starts; a bad field exits
with status 2 and one line per problem (the dotted field, what is wrong, the allowed values).
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="training config (YAML), e.g. examples/quickstart.yaml")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value",
                        help="dotted overrides applied on top of the file, e.g. train.steps=20 train.lr=1e-5")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the latest checkpoint in the run's output_dir")
    parser.add_argument("--print-config", action="store_true", help="print the validated config and exit")


def run(args: argparse.Namespace) -> int:
    from relax_gym.trainer.config import ConfigError, load_config

    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"relax-gym train: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(config.to_yaml(), end="")
        return 0
    from relax_gym.trainer.loop import train

    try:
        summary = train(config, resume=args.resume)
    except FileNotFoundError as exc:
        print(f"relax-gym train: {exc}", file=sys.stderr)
        return 2
    first = summary.first_eval.get("success")
    final = summary.final_eval.get("success")
    line = f"done: {summary.steps} RL steps in {summary.elapsed_s / 60:.1f} min; outputs in {summary.out_dir}"
    if first is not None and final is not None:
        line += f"; held-out success {first:.2f} -> {final:.2f}"
    if summary.curves is not None:
        line += f"; curves: {summary.curves}"
    print(line)
    return 0
