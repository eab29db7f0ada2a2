"""``relax-gym envs``: list registered environments."""

from __future__ import annotations

import argparse
import json

from relax_gym.registration import list_envs, plugin_errors
from relax_gym.types import MODALITIES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--modality", choices=MODALITIES, help="only envs whose observations carry it")
    parser.add_argument("--tag", help="only envs with this tag (e.g. tools, multi-turn)")
    parser.add_argument("--namespace", help="only envs in this namespace (e.g. relax)")
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of a table")


def run(args: argparse.Namespace) -> int:
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
