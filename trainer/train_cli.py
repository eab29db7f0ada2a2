"""``relax-gym train CONFIG [key.sub=value ...] [--resume [STEP]]``: run a training config, any mode.

The config (YAML) and the overrides are validated before anything starts; a bad field exits
with status 2 and one line per problem (the dotted field, what is wrong, the allowed values).
The config's ``mode`` picks the runner: ``colocate`` runs the training core's loop
(:mod:`relax_gym.trainer.modes.colocate`), ``fully_async`` and ``hybrid`` run the asynchronous runner
(:mod:`relax_gym.trainer.modes.async_runner`, on the embedded or the Ray runtime per ``async_rl.runtime``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from relax_gym.trainer.config import TrainConfig
    from relax_gym.trainer.modes.training_run import RunSummary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="training config (YAML), e.g. examples/quickstart.yaml")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value",
                        help="dotted overrides applied on top of the file, e.g. train.steps=20 train.lr=1e-5 "
                        "mode=fully_async async_rl.max_staleness=2")
    parser.add_argument("--resume", nargs="?", const=True, default=False, metavar="STEP",
                        help="continue from a checkpoint in the run's output_dir: without STEP the newest one "
                        "that passes its checks, else STEP (an RL step number, a checkpoint name such as "
                        "warmup_000010, or a path)")
    parser.add_argument("--print-config", action="store_true", help="print the validated config and exit")


def train(config: TrainConfig, *, resume: bool | str = False) -> RunSummary:
    """Run ``config`` to the end with the runner of its ``mode`` (blocking)."""
    if config.is_async:
        from relax_gym.trainer.modes.async_runner import train as async_train

        return async_train(config, resume=resume)
    from relax_gym.trainer.modes.colocate import train as colocate_train

    return colocate_train(config, resume=resume)


def _override_after_resume(args: argparse.Namespace) -> None:
    """``--resume key=value`` took an override for its STEP: hand it back to the overrides."""
    if isinstance(args.resume, str) and "=" in args.resume:
        args.overrides.append(args.resume)
        args.resume = True


def exit_code_of_failed_run(command: str, exc: Exception) -> int | None:
    """The exit status of a run that raised ``exc``, after one line on stderr: 2 for a missing
    file, a bad config, a bad checkpoint or a backend that cannot start here (BackendSetupError),
    3 (``env_errors.EXIT_CODE``) for the env error-rate stop, also when a Ray actor raised them;
    None for anything else (a bug: let it propagate)."""
    from relax_gym.trainer.checkpoint import find_checkpoint_error
    from relax_gym.trainer.config import ConfigError
    from relax_gym.trainer.env_errors import EXIT_CODE, find_env_error_stop

    bad: Exception | None = find_checkpoint_error(exc)
    if bad is None and isinstance(exc, (FileNotFoundError, ConfigError)):
        bad = exc
    if bad is None:
        from relax_gym.errors import find_cause
        from relax_gym.trainer.backends import BackendSetupError

        bad = find_cause(exc, BackendSetupError)
    if bad is not None:
        print(f"relax-gym {command}: {bad}", file=sys.stderr)
        return 2
    stop = find_env_error_stop(exc)
    if stop is None:
        return None
    print(f"relax-gym {command}: stopped: {stop}", file=sys.stderr)
    return EXIT_CODE


def run_to_end(command: str, start: Callable[[], RunSummary]) -> RunSummary | int:
    """``start()``'s summary, or the exit status of its failure (:func:`exit_code_of_failed_run`)."""
    try:
        return start()
    except Exception as exc:
        code = exit_code_of_failed_run(command, exc)
        if code is None:
            raise
        return code


def held_out_change(summary: RunSummary) -> str:
    """``"; held-out success 0.10 -> 0.60"`` for the run's first and final evaluation, or ""."""
    first = summary.first_eval.get("success")
    final = summary.final_eval.get("success")
    if first is None or final is None:
        return ""
    return f"; held-out success {first:.2f} -> {final:.2f}"


def launched_ranks() -> tuple[int, int] | None:
    """(world size, rank) under a multi-process launcher (torchrun), else None."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return (world, int(os.environ.get("RANK", "0"))) if world > 1 else None


def follower(config: TrainConfig) -> int:
    """A megatron rank > 0: replay rank 0's backend calls until it stops."""
    import torch

    from relax_gym.trainer.backends.megatron.spmd import follow

    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        return follow(config.megatron)
    except Exception as exc:
        code = exit_code_of_failed_run("train", exc)
        if code is None:
            raise
        return code


def run(args: argparse.Namespace) -> int:
    _override_after_resume(args)
    from relax_gym.trainer.config import ConfigError, check_envs, load_config

    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"relax-gym train: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(config.to_yaml(), end="")
        return 0
    launched = launched_ranks()
    if launched is not None:
        world, rank = launched
        if config.backend != "megatron":
            print(f"relax-gym train: {world} processes were launched (WORLD_SIZE={world}) but backend "
                  f"{config.backend!r} runs in one process; use backend=megatron or start one process",
                  file=sys.stderr)
            return 2
        if rank != 0:  # megatron SPMD: rank 0 runs the loop, this rank replays its backend calls
            return follower(config)
    try:
        check_envs(config)  # before any model loads, engine starts or Ray cluster comes up
    except ConfigError as exc:
        print(f"relax-gym train: config error: {exc}", file=sys.stderr)
        return 2
    summary = run_to_end("train", lambda: train(config, resume=args.resume))
    if isinstance(summary, int):
        return summary
    line = f"done ({config.mode}): {summary.steps} RL steps in {summary.elapsed_s / 60:.1f} min; outputs in {summary.out_dir}"
    line += held_out_change(summary)
    if summary.curves is not None:
        line += f"; curves: {summary.curves}"
    print(line)
    return 0


__all__ = ["add_arguments", "run", "train"]
