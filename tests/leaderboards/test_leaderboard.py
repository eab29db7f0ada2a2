"""Results index, grouping, Markdown / HTML rendering and the two CLIs."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
from relax_gym.leaderboards import run_eval
from relax_gym.leaderboards.boards import BOARDS, Board
from relax_gym.leaderboards.render_html import render_html
from relax_gym.leaderboards.render_md import render_markdown
from relax_gym.leaderboards.store import ResultsStore, StoreError, load_summary
from relax_gym.leaderboards.table import build_groups

from relax_gym.cli.main import main


def _run(spec: str, out: Path, **kw: Any) -> dict[str, Any]:
    kw.setdefault("progress", False)
    return asyncio.run(run_eval(spec, out, **kw)).summary


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """oracle, random and a custom agent on lbtest/mini-v0; random on mini-v1 (other env version)."""
    root = tmp_path_factory.mktemp("runs")
    base = root / "baselines.json"
    from .envs_for_tests import BASELINES

    base.write_text(json.dumps(BASELINES))
    out = {}
    for name, spec, suite in [
        ("oracle", "oracle", "lbtest/mini-v0"),
        ("random", "random", "lbtest/mini-v0"),
        ("echo", "python:tests.leaderboards.test_eval_runner:echo_policy", "lbtest/mini-v0"),
        ("random-v1", "random", "lbtest/mini-v1"),
    ]:
        _run(spec, root / name, suite=suite, attempts=2, baselines_file=base, label=name)
        out[name] = root / name
    return out


def test_store_indexes_idempotently(tmp_path: Path, runs: dict[str, Path]) -> None:
    store = ResultsStore(tmp_path / "r.sqlite")
    rid = store.add_folder(runs["oracle"])
    assert store.add_folder(runs["oracle"]) == rid  # re-indexing replaces, never duplicates
    store.add_folder(runs["random"])
    rows = store.rows()
    assert len(rows) == 2 and rows[0]["label"] == "oracle" and rows[0]["score"] == pytest.approx(1.0)
    assert sorted(s["label"] for s in store.summaries(suite="lbtest/mini-v0")) == ["oracle", "random"]
    assert store.summaries(suite="other") == []
    assert store.remove(rid) and not store.remove(rid)
    assert len(store.rows()) == 1
    with pytest.raises(StoreError, match="no summary.json"):
        load_summary(tmp_path)


def test_runs_of_different_env_versions_are_not_ranked_together(runs: dict[str, Path]) -> None:
    summaries = [{**load_summary(p), "_run_id": n} for n, p in runs.items()]
    groups = build_groups(summaries)
    by_suite = {g.suite: g for g in groups}
    assert set(by_suite) == {"lbtest/mini-v0", "lbtest/mini-v1"}
    main_group = by_suite["lbtest/mini-v0"]
    # echo solves Pick only (the other envs need the image or the tool): between the baselines
    assert [r.label for r in main_group.rows] == ["oracle", "echo", "random"]
    assert [r.rank for r in main_group.rows] == [1, 2, 3]
    assert main_group.metric == "normalised"
    assert main_group.rows[0].score.value == pytest.approx(1.0) and main_group.rows[-1].label == "random"
    assert main_group.modality_columns == ["text", "image"] and main_group.has_tools
    # same suite name, different env versions: separate tables even when the suite names match
    v1 = load_summary(runs["random-v1"])
    v1["results"]["suite"]["name"] = "lbtest/mini-v0"
    split = build_groups([load_summary(runs["oracle"]), v1])
    assert len(split) == 2 and all(len(g.rows) == 1 for g in split)
    md = render_markdown(split)
    assert "not ranked together" in md


def test_incomplete_runs_are_listed_but_not_ranked(runs: dict[str, Path]) -> None:
    partial = load_summary(runs["random"])
    partial["complete"] = False
    partial["label"] = "stopped"
    g = build_groups([load_summary(runs["oracle"]), partial])[0]
    assert [r.label for r in g.rows] == ["oracle"] and [r.label for r in g.unranked] == ["stopped"]
    assert "Unranked (incomplete runs): stopped" in render_markdown([g])


def test_markdown_has_scores_with_intervals(runs: dict[str, Path]) -> None:
    md = render_markdown(build_groups([load_summary(runs[n]) for n in ("oracle", "random")]))
    header = next(line for line in md.splitlines() if line.startswith("| # |"))
    assert header.split("|")[1:-1] == [
        " # ",
        " Model ",
        " Agent ",
        " Score ",
        " Success ",
        " text ",
        " image ",
        " tools ",
        " Episodes ",
        " Errors ",
    ]
    oracle_row = next(line for line in md.splitlines() if line.startswith("| 1 | oracle"))
    assert re.search(r"\| 1\.000 \[0\.\d{3}, 1\.000\] \|", oracle_row)
    assert "Per env" in md and "lbtest/Lookup-v0" in md


def test_html_is_self_contained_with_table_and_chart(runs: dict[str, Path]) -> None:
    page = render_html(build_groups([load_summary(p) for p in runs.values()]), title="Test <board>")
    assert "<title>Test &lt;board&gt;</title>" in page
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # nothing fetched from anywhere
    assert "@import" not in page and "url(" not in page
    assert page.count('<svg id="g') == 2 and page.count('class="bar"') == 4
    assert page.count('class="lb sortable"') == 4  # a main and a per-env table per group
    assert 'data-key="score" data-type="num"' in page


def test_eval_and_leaderboard_clis(
    tmp_path: Path, runs: dict[str, Path], capsys: pytest.CaptureFixture[str], baselines_file: Path
) -> None:
    out = tmp_path / "cli"
    code = main(
        [
            "eval",
            "--env",
            "lbtest/Pick-v0",
            "--env",
            "lbtest/Picture-v0",
            "--episodes",
            "3",
            "--agent",
            "oracle",
            "--out",
            str(out),
            "--no-progress",
            "--baselines",
            str(baselines_file),
        ]
    )
    text = capsys.readouterr().out
    assert code == 0 and "lbtest/Picture-v0" in text and "1.000 [" in text
    assert (
        main(
            [
                "eval",
                "--env",
                "lbtest/Pick-v0",
                "--episodes",
                "3",
                "--agent",
                "oracle",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        == 2
    )
    assert "--resume" in capsys.readouterr().err
    assert (
        main(
            [
                "eval",
                "--suite",
                "lbtest/flaky-v0",
                "--agent",
                "oracle",
                "--out",
                str(tmp_path / "fl"),
                "--no-progress",
                "--json",
            ]
        )
        == 1
    )  # done, with episode errors
    assert json.loads(capsys.readouterr().out)["counts"]["errors"] > 0
    assert main(["eval", "--agent", "oracle", "--out", str(tmp_path / "x")]) == 2
    # leaderboard: runs/* may match files that are not runs; the index lands in --db
    (tmp_path / "notes.txt").write_text("not a run")
    db = tmp_path / "lb.sqlite"
    page = tmp_path / "site" / "index.html"
    args = [str(p) for p in runs.values()] + [
        str(tmp_path / "notes.txt"),
        "--db",
        str(db),
        "--format",
        "html",
        "--out",
        str(page),
    ]
    assert main(["leaderboard", *args]) == 0
    assert page.read_text().count('class="bar"') == 4
    assert main(["leaderboard", "--db", str(db), "--format", "md", "--suite", "lbtest/mini-v1"]) == 0
    md = capsys.readouterr().out
    assert "## lbtest/mini-v1" in md and "lbtest/mini-v0" not in md.split("## lbtest/mini-v1")[0].split("\n", 3)[-1]
    assert main(["leaderboard", "--db", str(db), "--list"]) == 0
    assert capsys.readouterr().out.count("complete") == 4
    assert main(["leaderboard", str(tmp_path / "notes.txt"), "--no-db"]) == 2


def test_make_baselines_runs_and_indexes_random_and_oracle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(BOARDS, "lbtest", Board("lbtest", "lbtest/mini-v0", 3, 2, "test", "test board"))
    db = tmp_path / "lb.sqlite"
    argv = [
        "leaderboard",
        "--make-baselines",
        "--board",
        "lbtest",
        "--runs-dir",
        str(tmp_path / "base"),
        "--extra-agent",
        "echo=python:tests.leaderboards.test_eval_runner:echo_policy",
        "--db",
        str(db),
    ]
    assert main(argv) == 0
    md = capsys.readouterr().out
    assert re.search(r"\| 1 \| (echo|oracle) \|", md) and "| 3 | random |" in md
    assert sorted(p.name for p in (tmp_path / "base").iterdir()) == ["echo", "oracle", "random"]
    assert len(ResultsStore(db).rows()) == 3
    assert main(argv) == 0  # a second call resumes: nothing re-run, nothing duplicated
    assert len(ResultsStore(db).rows()) == 3
    assert main(["leaderboard", "--make-baselines", "--board", "nope", "--db", str(db)]) == 2
