"""``relax-gym play ENV_ID``: run one episode and show it.

The transcript goes to stdout and every image, audio clip and video to ``--media-dir``
(``transcript.json`` is written there too). Agents: ``human`` (you type each action; a line
ending in a backslash continues onto the next line), ``random`` (the env's random baseline) and
``oracle``. With ``--json`` a single JSON object summarises the episode.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from relax_gym.cli.common import fail, parse_kwargs, user_error
from relax_gym.errors import RelaxGymError
from relax_gym.registration import make
from relax_gym.transcript import MediaWriter, message_to_record, render_transcript_line
from relax_gym.types import Action, Message, Observation


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("env_id")
    parser.add_argument("--agent", choices=["human", "random", "oracle"], default="human")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--media-dir", help="where to save media and transcript.json (default: a new temp dir)")
    parser.add_argument("--max-turns", type=int, help="override the env's turn limit")
    parser.add_argument("-k", "--kwarg", action="append", metavar="KEY=VALUE", help="env constructor kwarg")
    parser.add_argument("--json", action="store_true", help="print one JSON summary instead of the transcript")


def _human_policy() -> Callable[[Observation], Action | str]:
    def ask(_: Observation) -> str:
        lines: list[str] = []
        while True:
            try:
                line = input("> " if not lines else ". ")
            except EOFError:
                return "\n".join(lines)
            if line.endswith("\\"):
                lines.append(line[:-1])
                continue
            lines.append(line)
            return "\n".join(lines)

    return ask


def run(args: argparse.Namespace) -> int:
    try:
        env = make(args.env_id, max_turns=args.max_turns, **parse_kwargs(args.kwarg))
    except RelaxGymError as exc:
        return user_error(exc)
    if args.agent == "oracle" and not env.has_oracle:
        return fail(f"{args.env_id} has no oracle")
    media_dir = Path(args.media_dir) if args.media_dir else Path(tempfile.mkdtemp(prefix="relax-play-"))
    writer = MediaWriter(media_dir)
    transcript: list[dict[str, Any]] = []
    quiet = args.json

    def show(messages: list[Message]) -> None:
        for msg in messages:
            rec = message_to_record(msg, writer)
            transcript.append(rec)
            if not quiet:
                print(render_transcript_line(rec))

    try:
        obs, _ = env.reset(seed=args.seed)
        if obs.tools and not quiet:
            print("tools: " + ", ".join(t.name for t in obs.tools))
        show(obs.messages)
        # a stream independent of the env's own (seeded with the same number)
        rng = np.random.default_rng([args.seed, 1])
        oracle_actions: Iterator[Action | str] | None = iter(env.oracle()) if args.agent == "oracle" else None
        human = _human_policy() if args.agent == "human" else None
        total, turns, success, info = 0.0, 0, False, {}
        while True:
            if oracle_actions is not None:
                action: Action | str = next(oracle_actions, "")
            elif human is not None:
                action = human(obs)
            else:
                action = env.random_action(rng)
            text = action.text if isinstance(action, Action) else action
            show([Message.assistant(text)])
            obs, reward, terminated, truncated, info = env.step(action)
            total += reward
            turns += 1
            show(obs.messages)
            if not quiet:
                print(f"  (turn {turns}: reward {reward:+.3f}{', terminated' if terminated else ''}{', truncated' if truncated else ''})")
            if terminated or truncated:
                success = bool(info.get("success"))
                break
    except RelaxGymError as exc:
        return user_error(exc)
    finally:
        env.close()
    (media_dir / "transcript.json").write_text(json.dumps(transcript, indent=2))
    summary = {
        "env_id": args.env_id,
        "seed": args.seed,
        "agent": args.agent,
        "success": success,
        "return": total,
        "turns": turns,
        "reward_components": info.get("reward_components", {}),
        "media_dir": str(media_dir),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"\nsuccess={success} return={total:.3f} turns={turns} media and transcript in {media_dir}")
    sys.stdout.flush()
    return 0
