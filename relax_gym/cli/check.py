"""``relax-gym check ENV_ID``: run check_env and print a readable report (exit 1 on failure)."""

from __future__ import annotations

import argparse
import json

from relax_gym.checker import check_env
from relax_gym.cli.common import parse_kwargs, user_error
from relax_gym.errors import RelaxGymError
from relax_gym.registration import make


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("env_id", help="a registered id, e.g. relax/SenseCount-v0")
    parser.add_argument("--seeds", type=int, default=3, help="how many seeds to check (default 3)")
    parser.add_argument("-k", "--kwarg", action="append", metavar="KEY=VALUE", help="env constructor kwarg")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--skip-gymnasium", action="store_true", help="skip Gymnasium's own checker")


def run(args: argparse.Namespace) -> int:
    try:
        env = make(args.env_id, **parse_kwargs(args.kwarg))
    except RelaxGymError as exc:
        return user_error(exc)
    try:
        report = check_env(env, seeds=max(1, args.seeds), skip_gymnasium=args.skip_gymnasium, raise_on_failure=False)
    finally:
        env.close()
    print(json.dumps(report.to_dict(), indent=2) if args.json else report)
    return 0 if report.passed else 1
