"""``relax-gym envs``: list registered environments; ``relax-gym envs export``: write an env's
tasks as a Parquet dataset (the implementation lives with the envs and loads only when run)."""

from __future__ import annotations

import argparse
import importlib
import json

from relax_gym.registration import list_envs, plugin_errors
from relax_gym.types import MODALITIES


# name -> (module, help): loaded by name, so listing envs never imports the dataset reader.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "export": ("relax_gym.envs.export", "write an env's tasks (with their media) as a Parquet dataset"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--modality", choices=MODALITIES, help="only envs whose observations carry it")
    parser.add_argument("--tag", help="only envs with this tag (e.g. tools, multi-turn)")
    parser.add_argument("--namespace", help="only envs in this namespace (e.g. relax)")
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    sub = parser.add_subparsers(dest="envs_command", metavar="SUBCOMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        importlib.import_module(module).add_arguments(sub.add_parser(name, help=help_text, description=help_text))


def run(args: argparse.Namespace) -> int:
    if getattr(args, "envs_command", None):
        return int(importlib.import_module(SUBCOMMANDS[args.envs_command][0]).run(args) or 0)
    specs = list_envs(modality=args.modality, tag=args.tag, namespace=args.namespace)
    rows = [s.summary() for s in specs]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        if not rows:
            print("no environments match")
        else:
            w = max(len(r["id"]) for r in rows)
            print(f"{'ID':<{w}}  {'MODALITIES':<24} {'TURNS':>5}  ORACLE  TAGS")
            for r in rows:
                print(
                    f"{r['id']:<{w}}  {','.join(r['modalities']):<24} {r['max_turns']:>5}  "
                    f"{'yes' if r['oracle'] else 'no':<6}  {','.join(r['tags'])}"
                )
    for name, err in plugin_errors.items():
        print(f"warning: plugin {name!r} failed to load: {err}")
    return 0
