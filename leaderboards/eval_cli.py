"""``relax-gym eval``: run an agent on an env suite and score it.

    relax-gym eval --suite relax/core-v0 --agent oracle --out runs/oracle
    relax-gym eval --suite relax/core-v0 --agent openai:http://127.0.0.1:8000/v1 --model NAME \\
        --episodes 20 --attempts 4 --concurrency 32 --out runs/NAME [--resume]

Writes ``episodes.jsonl``, ``summary.json``, transcripts and media under ``--out`` and prints
the per-env scores. Exit codes: 0 done; 1 done but some episodes errored; 2 the run could not
start or was stopped (bad arguments, unreachable server, a modality the model cannot take).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from relax_gym.cli.common import (
    fail,
    non_negative_float,
    parse_kwargs,
    positive_float,
    positive_int,
    probability,
)
from relax_gym.errors import RelaxGymError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (
        "agents: random | oracle | openai:URL | sglang:URL | hf:PATH | python:module:callable\n"
        "exit codes: 0 done, 1 done with episode errors, 2 could not run / stopped"
    )
    what = parser.add_argument_group("what to evaluate")
    what.add_argument("--suite", help="a registered suite, e.g. relax/core-v0 (see `relax-gym suites`)")
    what.add_argument(
        "--env", action="append", dest="envs", metavar="ENV_ID", help="an env id (repeatable), instead of --suite"
    )
    what.add_argument(
        "--datasets", metavar="FILE.yaml",
        help="register the dataset envs of this file first ({envs: [{id, kwargs}]}; see docs/datasets.md)",
    )
    what.add_argument("--episodes", type=positive_int, help="episodes (seeds) per env (default: the suite's, or 10)")
    what.add_argument("--attempts", type=positive_int, default=1, help="attempts per episode, for pass@k / pass^k (default 1)")
    what.add_argument("--seed", type=int, help="the seed the episode seeds derive from (default: the suite's, or 0)")
    what.add_argument("--max-turns", type=positive_int, help="override every env's turn limit")
    what.add_argument("-k", "--env-kwarg", action="append", metavar="ENV_ID:KEY=VALUE", help="an env constructor kwarg")
    who = parser.add_argument_group("the agent")
    who.add_argument("--agent", required=True, help="agent spec (see below)")
    who.add_argument("--model", help="served model name (openai:) or model folder (sglang:, for its tokenizer)")
    who.add_argument("--tokenizer", help="tokenizer / chat-template folder when it is not --model (sglang:, hf:)")
    who.add_argument("--api-key", help="bearer token (default: $RELAX_GYM_API_KEY, then $OPENAI_API_KEY)")
    who.add_argument("--temperature", type=non_negative_float, default=0.0)
    who.add_argument("--top-p", type=probability, default=1.0)
    who.add_argument("--top-k", type=int, default=-1)
    who.add_argument("--min-p", type=probability, default=0.0)
    who.add_argument("--max-tokens", type=positive_int, default=512, help="max new tokens per turn (default 512)")
    who.add_argument(
        "--max-context",
        type=positive_int,
        help="sglang:/hf: the model's context in tokens (default: what the server or the model folder reports); "
        "each turn's max tokens is cut to the room left, and an episode that fills it ends as truncated",
    )
    who.add_argument(
        "--thinking",
        choices=["on", "off", "default"],
        default="default",
        help="enable_thinking for the chat template (default: the model's own default)",
    )
    who.add_argument("--sampling-seed", type=int, default=0, help="base of the per-episode sampling seeds")
    who.add_argument("--tool-parser", default="hermes", help="tool-call parser for sglang:/hf: (default hermes)")
    who.add_argument("--system-prompt", help="a system message put before every episode")
    who.add_argument("--timeout", type=positive_float, default=300.0, help="seconds per model request (default 300)")
    run = parser.add_argument_group("the run")
    run.add_argument("--out", required=True, help="output folder")
    run.add_argument("--resume", action="store_true", help="continue the run in --out, skipping finished episodes")
    run.add_argument("--concurrency", type=positive_int, default=8, help="episodes in flight (default 8)")
    run.add_argument("--baselines", help="JSON file of random/oracle baselines for envs without stored ones")
    run.add_argument("--label", help="the name shown on leaderboards (default: --model or the agent spec)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--json", action="store_true", help="print summary.json's results instead of a table")


def _env_kwargs(pairs: list[str] | None) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for pair in pairs or []:
        env_id, sep, kv = pair.rpartition(":")
        if not sep or not env_id:
            raise SystemExit(f"error: --env-kwarg {pair!r} must look like ENV_ID:KEY=VALUE")
        out.setdefault(env_id, {}).update(parse_kwargs([kv]))
    return out


def options_from_args(args: argparse.Namespace) -> Any:
    from .agents import AgentOptions

    return AgentOptions(
        model=args.model,
        tokenizer=args.tokenizer,
        api_key=args.api_key or os.environ.get("RELAX_GYM_API_KEY") or os.environ.get("OPENAI_API_KEY"),
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        max_tokens=args.max_tokens,
        thinking={"on": True, "off": False}.get(args.thinking),
        seed=args.sampling_seed,
        timeout_s=args.timeout,
        tool_parser=args.tool_parser,
        system_prompt=args.system_prompt,
        max_context=args.max_context,
    )


def format_table(summary: dict[str, Any]) -> str:
    """Per-env success and normalised score with CIs, then the suite line."""
    res = summary["results"]

    def est(e: dict[str, Any] | None) -> str:
        return "-" if not e else f"{e['value']:.3f} [{e['low']:.3f}, {e['high']:.3f}]"

    lines = [f"{'env':<28} {'success (95% CI)':<24} {'normalised (95% CI)':<24} {'n':>4} {'err':>4}"]
    for env_id, e in res["envs"].items():
        lines.append(
            f"{env_id:<28} {est(e.get('success')):<24} {est(e.get('normalised')):<24} "
            f"{e.get('episodes', 0):>4} {e.get('errors', 0):>4}"
        )
    s = res["suite"]
    lines.append(f"{'suite ' + s['name']:<28} {est(s.get('success')):<24} {est(s.get('normalised')):<24}")
    for name, g in res["modalities"].items():
        lines.append(f"{'  modality ' + name:<28} {est(g.get('success')):<24} {est(g.get('normalised')):<24}")
    c = res["counts"]
    lines.append(
        f"episodes: {c['finished']} finished, {c['errors']} errored, {c['missing']} missing "
        f"of {c['planned']}; config {summary['config_hash']}"
    )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import json

    from .agents import FatalAgentError
    from .eval_runner import run_eval

    if args.datasets:
        from relax_gym.envs import register_datasets

        try:
            register_datasets(args.datasets)
        except (RelaxGymError, ValueError, OSError) as exc:
            return fail(str(exc), 2)
    if not args.suite and not args.envs:
        return fail("give --suite or at least one --env", 2)
    if args.suite and args.envs:
        return fail("give --suite or --env, not both", 2)
    try:
        result = asyncio.run(
            run_eval(
                args.agent,
                args.out,
                options=options_from_args(args),
                suite=args.suite,
                env_ids=args.envs,
                episodes=args.episodes,
                attempts=args.attempts,
                seed=args.seed,
                max_turns=args.max_turns,
                env_kwargs=_env_kwargs(args.env_kwarg),
                concurrency=args.concurrency,
                resume=args.resume,
                progress=not args.no_progress,
                baselines_file=args.baselines,
                label=args.label,
            )
        )
    except FatalAgentError as exc:
        return fail(str(exc), 2)
    except (RelaxGymError, ValueError, OSError) as exc:
        return fail(str(exc), 2)
    for problem in result.problems:
        print(f"warning: {problem}", file=sys.stderr)
    counts = result.summary["results"]["counts"]
    if args.json:
        print(json.dumps(result.summary["results"], indent=2))
    elif counts["planned"] > counts["missing"]:
        print(format_table(result.summary))
        print(f"results in {result.out} ({result.ran} episodes run, {result.skipped} resumed)")
    if result.fatal:
        return fail(
            f"the run stopped: {result.fatal}\n(finished episodes are kept; fix the cause and rerun with --resume)", 2
        )
    return 1 if counts["errors"] else 0
