"""``relax-gym leaderboard``: index eval runs in SQLite and render them as Markdown or HTML.

    relax-gym leaderboard runs/* --format html --out leaderboards/core.html
    relax-gym leaderboard --format md                       # everything in the index
    relax-gym leaderboard --make-baselines --board core --runs-dir runs/baselines \\
        [--extra-agent quickstart=hf:runs/quickstart/final] --format html --out core.html
    relax-gym leaderboard --list

Run folders given on the command line are (re-)indexed and rendered; with none, every indexed
run is rendered (optionally only one ``--suite`` / ``--board``). Folders without a
``summary.json`` are skipped with a warning, so ``runs/*`` may match other files.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

from relax_gym.cli.common import fail

from .render_md import clean_text

DEFAULT_DB = "leaderboard.sqlite"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("runs", nargs="*", metavar="RUN_DIR", help="eval output folders to index and render")
    parser.add_argument("--format", choices=["md", "html"], default="md")
    parser.add_argument("--out", help="write the page here (default: stdout)")
    parser.add_argument(
        "--db",
        default=os.environ.get("RELAX_GYM_RESULTS_DB", DEFAULT_DB),
        help=f"the SQLite results index (default: $RELAX_GYM_RESULTS_DB or ./{DEFAULT_DB})",
    )
    parser.add_argument("--no-db", action="store_true", help="render the given folders without touching the index")
    parser.add_argument("--suite", help="only runs of this suite")
    parser.add_argument("--board", help="only runs of this board's suite (see relax_gym.leaderboards.boards)")
    parser.add_argument("--title", help="page title")
    parser.add_argument("--list", action="store_true", help="list the indexed runs and exit")
    parser.add_argument("--remove", metavar="RUN_ID", action="append", help="drop a run from the index")
    base = parser.add_argument_group("baseline entries")
    base.add_argument(
        "--make-baselines",
        action="store_true",
        help="run the random and oracle agents (and --extra-agent ones) on the board's suite first",
    )
    base.add_argument("--runs-dir", default="runs/baselines", help="where baseline runs go (default runs/baselines)")
    base.add_argument(
        "--extra-agent",
        action="append",
        default=[],
        metavar="LABEL=SPEC",
        help="another baseline entry, e.g. quickstart=hf:runs/quickstart/final",
    )
    base.add_argument("--episodes", type=int, help="override the board's episodes per env")
    base.add_argument("--attempts", type=int, help="override the board's attempts")
    base.add_argument("--concurrency", type=int, default=8)


def make_baselines(
    board_name: str,
    runs_dir: str | Path,
    extra: list[str],
    *,
    episodes: int | None = None,
    attempts: int | None = None,
    concurrency: int = 8,
    progress: bool = True,
) -> list[Path]:
    """Run (or resume) the baseline entries of a board; returns their run folders."""
    from .agents import AgentOptions
    from .boards import get_board
    from .eval_runner import run_eval

    board = get_board(board_name)
    entries = [("random", "random"), ("oracle", "oracle")]
    for item in extra:
        label, sep, spec = item.partition("=")
        if not sep or not label or not spec:
            raise ValueError(f"--extra-agent {item!r} must look like LABEL=SPEC")
        entries.append((label, spec))
    out: list[Path] = []
    for label, spec in entries:
        folder = Path(runs_dir) / label
        result = asyncio.run(
            run_eval(
                spec,
                folder,
                options=AgentOptions(),
                suite=board.suite,
                episodes=episodes or board.episodes,
                attempts=attempts or board.attempts,
                concurrency=concurrency,
                resume=True,
                progress=progress,
                label=label,
            )
        )
        if result.fatal:
            raise RuntimeError(f"baseline {label} ({spec}) stopped: {result.fatal}")
        print(f"baseline {label}: {result.out} ({result.ran} episodes run, {result.skipped} resumed)", file=sys.stderr)
        out.append(folder)
    return out


def _collect(args: argparse.Namespace, runs: list[str]) -> list[dict[str, Any]]:
    from .store import ResultsStore, StoreError, load_summary

    store = None if args.no_db else ResultsStore(args.db)
    summaries: list[dict[str, Any]] = []
    for run in runs:
        if (
            Path(run).is_dir()
            and not (Path(run) / "summary.json").exists()
            and not (Path(run) / "config.json").exists()
        ):
            print(f"warning: skipping {clean_text(run)}: not an eval run folder", file=sys.stderr)
            continue
        if not Path(run).is_dir():
            continue  # e.g. runs/* matched the index file itself
        try:
            summary = load_summary(run)
        except StoreError as exc:
            print(f"warning: skipping {clean_text(exc)}", file=sys.stderr)
            continue
        rid = store.add(summary, run) if store is not None else run
        summaries.append({**summary, "_run_id": rid, "_path": str(run)})
    if not runs and store is not None:
        problems: list[str] = []
        summaries = store.summaries(problems=problems)
        for problem in problems:
            print(f"warning: skipping {clean_text(problem)}", file=sys.stderr)
    suite = args.suite
    if args.board:
        from .boards import get_board

        suite = get_board(args.board).suite
    if suite:
        summaries = [s for s in summaries if s["results"]["suite"].get("name") == suite]
    return summaries


def _list_or_remove(args: argparse.Namespace) -> None:
    from .store import ResultsStore

    store = ResultsStore(args.db)
    for rid in args.remove or []:
        print(f"{'removed' if store.remove(rid) else 'not found'}: {rid}")
    if args.list:
        for r in store.rows():
            score = "-" if r["score"] is None else f"{r['score']:.3f}"
            print(  # labels and suite names come from summaries: no terminal control sequences
                clean_text(
                    f"{r['run_id']}  {r['suite']:<18} {r['label']:<24} score {score:<6} "
                    f"{'complete' if r['complete'] else 'INCOMPLETE'}  {r['path']}"
                )
            )


def run(args: argparse.Namespace) -> int:
    from .render_html import render_html
    from .render_md import render_markdown
    from .table import build_groups

    if args.no_db and not args.runs and not args.make_baselines:
        return fail("--no-db needs run folders to render", 2)
    if args.list or args.remove:
        try:
            _list_or_remove(args)
        except sqlite3.Error as exc:
            return fail(f"{args.db}: not a usable results index ({exc})", 2)
        return 0
    runs = list(args.runs)
    if args.make_baselines:
        board = args.board or "core"
        try:
            runs += [
                str(p)
                for p in make_baselines(
                    board,
                    args.runs_dir,
                    args.extra_agent,
                    episodes=args.episodes,
                    attempts=args.attempts,
                    concurrency=args.concurrency,
                )
            ]
        except (KeyError, ValueError, RuntimeError) as exc:
            return fail(str(exc), 2)
        args.board = board
    try:
        summaries = _collect(args, runs)
    except sqlite3.Error as exc:
        return fail(f"{args.db}: not a usable results index ({exc})", 2)
    except (KeyError, OSError) as exc:
        return fail(str(exc), 2)
    if runs and not summaries:
        return fail("none of the given folders holds a valid eval run (summary.json)", 2)
    groups = build_groups(summaries)
    title = args.title
    if title is None and args.board:
        from .boards import get_board

        title = get_board(args.board).title
    title = title or "relax-gym leaderboard"
    page = render_html(groups, title=title) if args.format == "html" else render_markdown(groups, title=title)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(page, encoding="utf-8")
        print(
            f"wrote {args.out} ({sum(len(g.rows) for g in groups)} ranked runs in {len(groups)} table(s))",
            file=sys.stderr,
        )
    else:
        sys.stdout.write(page)
    return 0
