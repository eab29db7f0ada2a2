"""``relax-gym suites``: list registered evaluation suites."""

from __future__ import annotations

import argparse
import json

from relax_gym.registration import list_suites


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    suites = list_suites()
    if args.json:
        print(json.dumps([
            {"name": s.name, "env_ids": list(s.env_ids), "episodes_per_env": s.episodes_per_env,
             "seed": s.seed, "description": s.description}
            for s in suites
        ], indent=2))
        return 0
    for s in suites:
        print(f"{s.name}: {len(s.env_ids)} envs x {s.episodes_per_env} episodes (seed {s.seed})")
        for env_id in s.env_ids:
            print(f"    {env_id}")
    if not suites:
        print("no suites registered")
    return 0
