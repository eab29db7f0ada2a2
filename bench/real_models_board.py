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
           "--concurrency", str(args.concurrency), "--no-progress", "--timeout", str(args.timeout), *extra]
    for env in TEXT_ENVS + TOOL_ENVS:
        cmd += ["--env", env]
    if (out / "episodes.jsonl").is_file():
        cmd.append("--resume")
    start = time.perf_counter()
    proc = subprocess.run(cmd, check=False)
    print(f"[board] {out.name}: exit {proc.returncode} in {time.perf_counter() - start:.0f} s", flush=True)


def _reply_forms(transcript: dict[str, Any], modes: Counter[str]) -> int:
    """Count the form of each model reply: a ``<tool_call>`` tag, ``\\boxed{N}`` copied literally
    from the prompt, another ``\\boxed{...}``, or no box at all."""
    tags = 0
    for msg in transcript.get("messages") or []:
        if msg.get("role") != "assistant":
            continue
        content = msg.get("content")
        text = "".join(p.get("text", "") for p in content if isinstance(p, dict)) if isinstance(content, list) \
            else str(content or "")
        modes["replies"] += 1
        modes["replies_with_tool_call_tag"] += "<tool_call>" in text
        tags += "<tool_call>" in text
        if "\\boxed{N}" in text:
            modes["replies_boxed_N_literally"] += 1
        elif "\\boxed{" in text:
            modes["replies_boxed_other"] += 1
        else:
            modes["replies_without_box"] += 1
    return tags


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
        transcript = run / str(row.get("transcript") or "")
        tags = _reply_forms(json.loads(transcript.read_text()), modes) if transcript.is_file() else 0
        if tool_env:  # calls are written as <tool_call> text and parsed by the env (or the agent)
            modes["tool_episodes"] += 1
            if not row.get("tool_calls") and not tags:
                modes["tool_env_no_tool_call"] += 1
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


def _annotate(page: Path, args: argparse.Namespace, modes: dict[str, Any]) -> None:
    """Put how the page was made, and each run's failure modes, above the rendered tables."""
    head = [
        "<!-- generated by bench/real_models_board.py; do not edit by hand -->",
        "Generated by `python bench/real_models_board.py --model LABEL=FOLDER ... --episodes "
        f"{args.episodes} --max-turns {args.max_turns} --max-tokens {args.max_tokens}` "
        "(docs/models.md says how each model folder was imported). Real models are served by the "
        "embedded engine and played by the `sglang:` agent (greedy, our chat encoder, the folder's "
        "chat template, the `hermes` tool parser). Envs: the text suite plus the text-only tool envs "
        "of relax/tools-v0. Episode counts are small because a 2-core box decodes a 135M-270M model "
        "at 10-60 tokens/s in total: the intervals are wide. Errored episodes (request timeouts "
        "under load; for Gemma-3, conversations longer than its 512-token sliding window, which the "
        "engine refuses) count as failures and are listed in the `err` column.",
        "",
        "## Failure modes",
        "",
        "| run | episodes | success | errored | invalid actions | parse errors | tool envs without a tool call |"
        " wrong tool names | tools called | replies: no box / `\\boxed{N}` literally / other box / `<tool_call>` |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in modes.items():
        c = m["counts"]
        tools = ", ".join(f"{k} x{v}" for k, v in m["tool_names"].items()) or "none"
        head.append(f"| {name} | {c.get('episodes', 0)} | {c.get('success', 0)} | {c.get('errors', 0)} | "
                    f"{c.get('invalid_actions', 0)} | {c.get('parse_errors', 0)} | "
                    f"{c.get('tool_env_no_tool_call', 0)} / {c.get('tool_episodes', 0)} | "
                    f"{c.get('wrong_tool_name', 0)} | {tools} | {c.get('replies_without_box', 0)} / "
                    f"{c.get('replies_boxed_N_literally', 0)} / {c.get('replies_boxed_other', 0)} / "
                    f"{c.get('replies_with_tool_call_tag', 0)} of {c.get('replies', 0)} |")
    head += ["", "Tool calls are counted from the `<tool_call>` blocks in the replies (the oracle and the "
             "random agent write their calls that way too). Wrong tool names come from the "
             "structured calls the agent parsed.", ""]
    page.write_text("\n".join(head) + "\n" + page.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", default=[], metavar="LABEL=FOLDER", help="an imported model")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--max-turns", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the engine")
    parser.add_argument("--port", type=int, default=31721, help="engine port (fixed, so runs can be resumed)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per model request (a busy box queues long)")
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
        # a fixed port: the agent spec (with the URL) is part of the run's config hash, so only
        # the same URL lets --resume continue a run after the engine restarts
        engine = EmbeddedEngineProcess(folder, port=args.port, threads=args.threads, log_file=out / f"{label}-engine.log",
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
    _annotate(docs / "leaderboard.md", args, modes)
    print(json.dumps(modes, indent=2))
    print(f"load average: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
