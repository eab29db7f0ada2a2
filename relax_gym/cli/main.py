"""``relax-gym``: one entry point, subcommands loaded on demand.

Each subcommand is a module exposing ``add_arguments(parser)`` and ``run(args) -> int``.
Only the module of the subcommand being run is imported, so ``relax-gym envs`` never pays for
torch. A subcommand whose module is not installed is hidden from the listing.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence

# name -> (module, one-line help). Later parts of the project add their rows here.
COMMANDS: dict[str, tuple[str, str]] = {
    "envs": ("relax_gym.cli.envs", "list registered environments"),
    "suites": ("relax_gym.cli.envs_suites", "list registered evaluation suites"),
    "check": ("relax_gym.cli.check", "check an environment against the API and LLM-env rules"),
    "play": ("relax_gym.cli.play", "play one episode as a human, a random agent or the oracle"),
    "tools": ("relax_gym.tools.cli", "list and run tools"),
    "engine": ("relax_gym.trainer.engine_cli", "serve a model with the embedded SGLang-protocol engine"),
    "train": ("relax_gym.trainer.train_cli", "train a model on environments (GRPO/GSPO...)"),
    "sft": ("relax_gym.trainer.sft_cli", "supervised warm-start from oracle trajectories"),
    "eval": ("relax_gym.leaderboards.eval_cli", "evaluate an agent on an env suite"),
    "leaderboard": ("relax_gym.leaderboards.leaderboard_cli", "render leaderboards from eval runs"),
    "models": ("relax_gym.trainer.models_cli", "import pretrained GGUF checkpoints (pip packages) as HF folders"),
}


def _available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="relax-gym",
        description="relax-gym: environments, evaluation and RL training for multimodal LLM agents",
    )
    parser.add_argument("--version", action="version", version=f"relax-gym {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        if not _available(module):
            continue
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == only:
            importlib.import_module(module).add_arguments(p)
    return parser


def _version() -> str:
    from relax_gym import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(only=command if command in COMMANDS else None)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(COMMANDS[args.command][0])
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `relax-gym envs | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
