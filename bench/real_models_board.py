"""Rank imported real models beside the random and oracle agents on the text + tool envs.

One command builds docs/leaderboard.md and docs/leaderboard.html:

    python bench/real_models_board.py --model smollm2=runs/models/smollm2-135m-instruct \\
        --episodes 10 --out runs/real-board

Each model folder (``relax-gym models import ...``) is served by the embedded engine on
127.0.0.1 and evaluated with the ``sglang:`` agent: token-in, our chat encoder, the folder's chat
template and the ``hermes`` tool parser -- what training uses. Every entry runs the same envs,
episodes, seed, turn limit and token budget, so the board ranks them together. A text-only
model cannot attempt image envs, so the tool envs here are the text ones of relax/tools-v0.

Failure modes are counted from each run's transcripts (``failure_modes`` below) and written
under the table: parse errors, invalid actions, episodes with no tool call on a tool env, tool
names the env does not offer.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

TEXT_ENVS = ["relax/ArithmeticWord-v0", "relax/Mastermind-v0", "relax/GridMaze-v0", "relax/Sokoban-v0"]
TOOL_ENVS = ["relax/CalcArithmetic-v0", "relax/ShopDB-v0", "relax/PyPuzzle-v0", "relax/DocSearch-v0"]


def _eval(agent: str, out: Path, args: argparse.Namespace, *extra: str) -> None:
    if (out / "summary.json").is_file():
        print(f"[board] {out.name}: already done", flush=True)
        return
    cmd = [sys.executable, "-m", "relax_gym.cli.main", "eval", "--agent", agent, "--out", str(out),
           "--episodes", str(args.episodes), "--max-turns", str(args.max_turns), "--max-tokens", str(args.max_tokens),
           "--concurrency", str(args.concurrency), "--no-progress", "--timeout", "900", *extra]
    for env in TEXT_ENVS + TOOL_ENVS:
        cmd += ["--env", env]
    if (out / "episodes.jsonl").is_file():
        cmd.append("--resume")
    start = time.perf_counter()
    proc = subprocess.run(cmd, check=False)
    print(f"[board] {out.name}: exit {proc.returncode} in {time.perf_counter() - start:.0f} s", flush=True)


def failure_modes(run: Path) -> dict[str, Any]:
    """Counts over a run's episodes of what went wrong, from episodes.jsonl and the transcripts."""
    rows = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines() if line.strip()]
    modes: Counter[str] = Counter()
    tool_names: Counter[str] = Counter()
    for row in rows:
        tool_env = row["env_id"] in TOOL_ENVS
        modes["episodes"] += 1
        modes["success"] += bool(row.get("success"))
        modes["parse_errors"] += int(row.get("parse_errors") or 0)
        modes["invalid_actions"] += int(row.get("invalid_actions") or 0)
        modes["errors"] += bool(row.get("error"))
        if tool_env:
            modes["tool_episodes"] += 1
            if not row.get("tool_calls"):
                modes["tool_env_no_tool_call"] += 1
        transcript = run / str(row.get("transcript") or "")
        if transcript.is_file() and tool_env:
            data = json.loads(transcript.read_text())
            offered = {t.get("name") or t.get("function", {}).get("name") for t in data.get("tools") or []}
            for msg in data.get("messages") or []:
                for call in msg.get("tool_calls") or []:
                    name = (call.get("function") or call).get("name")
                    tool_names[str(name)] += 1
                    if offered and name not in offered:
                        modes["wrong_tool_name"] += 1
    return {"counts": dict(modes), "tool_names": dict(tool_names.most_common(8))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", default=[], metavar="LABEL=FOLDER", help="an imported model")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--max-turns", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the engine")
    parser.add_argument("--out", default="runs/real-board")
    parser.add_argument("--docs", default="docs", help="where leaderboard.md / .html go")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _eval("random", out / "random", args, "--label", "random")
    _eval("oracle", out / "oracle", args, "--label", "oracle")
    for item in args.model:
        label, _, folder = item.partition("=")
        from relax_gym.trainer.engines.launch import EmbeddedEngineProcess

        if (out / label / "summary.json").is_file():
            continue
        engine = EmbeddedEngineProcess(folder, threads=args.threads, log_file=out / f"{label}-engine.log",
                                       startup_timeout_s=900)
        engine.start()
        try:
            _eval(f"sglang:{engine.url}", out / label, args, "--model", folder, "--label", label,
                  "--temperature", "0")
        finally:
            engine.stop()
    modes = {run.name: failure_modes(run) for run in sorted(out.iterdir()) if (run / "episodes.jsonl").is_file()}
    (out / "failure_modes.json").write_text(json.dumps(modes, indent=2) + "\n")
    docs = Path(args.docs)
    db = out / "board.sqlite"
    runs = [str(p) for p in sorted(out.iterdir()) if (p / "summary.json").is_file()]
    for fmt, name in (("md", "leaderboard.md"), ("html", "leaderboard.html")):
        subprocess.run([sys.executable, "-m", "relax_gym.cli.main", "leaderboard", *runs, "--db", str(db),
                        "--format", fmt, "--out", str(docs / name), "--title",
                        "relax-gym: real pretrained models vs random and oracle (text + text tool envs)"], check=True)
    print(json.dumps(modes, indent=2))
    print(f"load average: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
