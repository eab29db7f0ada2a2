"""``relax-gym train`` for every mode: ``python -m relax_gym.trainer.modes CONFIG [key=value ...] [--resume]``.

Same arguments and exit codes as the training core's ``relax-gym train``; the config may select
``mode: fully_async`` or ``mode: hybrid`` and carry an ``async_rl:`` section. Colocate configs run
the training core's loop unchanged.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="training config (YAML)")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value",
                        help="dotted overrides, e.g. mode=fully_async async_rl.max_staleness=2")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in output_dir")
    parser.add_argument("--print-config", action="store_true", help="print the validated config and exit")


def run(args: argparse.Namespace) -> int:
    from relax_gym.trainer.config import ConfigError

    from .config import load_modes_config

    try:
        config = load_modes_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"relax-gym train: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(config.to_yaml(), end="")
        return 0
    from .runner import train

    try:
        summary = train(config, resume=args.resume)
    except FileNotFoundError as exc:
        print(f"relax-gym train: {exc}", file=sys.stderr)
        return 2
    first = summary.first_eval.get("success")
    final = summary.final_eval.get("success")
    line = f"done ({config.mode}): {summary.steps} RL steps in {summary.elapsed_s / 60:.1f} min; outputs in {summary.out_dir}"
    if first is not None and final is not None:
        line += f"; held-out success {first:.2f} -> {final:.2f}"
    print(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m relax_gym.trainer.modes", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


__all__ = ["add_arguments", "main", "run"]
