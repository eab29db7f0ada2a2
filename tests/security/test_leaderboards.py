"""Leaderboard pages and summaries as attack surface.

Everything a run's ``summary.json`` says (label, agent, suite, env ids, comparability key) and the
page title reach the rendered Markdown and HTML; those must come out as literal text. A malformed
``summary.json`` (or index row) must cost one warning naming it, never a traceback, and must not
hide the valid runs beside it. Every check goes through ``relax-gym leaderboard`` in a subprocess.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

PAYLOADS = {
    "label": "<script>alert(1)</script>|x\n## injected heading\r\n| a | b |",
    "agent": "<img src=x onerror=alert(2)>`code` [click](javascript:alert(3))",
    "suite": "evil/<b>suite</b> ![img](javascript:alert(4)) *bold* _i_ ~~s~~ &amp; \u202eevil",
    "env": "env/<svg onload=alert(5)>|v0",
    "key": "key`</code><script>alert(6)</script>",
}
TITLE = "</script><!--<script>alert(7)</script> <a href='javascript:alert(8)'>t</a>"


def _estimate(value: float) -> dict[str, Any]:
    return {"value": value, "low": max(0.0, value - 0.1), "high": min(1.0, value + 0.1), "n": 4}


def make_summary(label: str, *, env: str = "lb/Pick-v0", suite: str = "lb/mini-v0", key: str = "k1",
                 agent: str = "random", value: float = 0.5) -> dict[str, Any]:
    """A summary.json as the eval runner writes it (the fields leaderboards read)."""
    return {
        "schema": 1,
        "complete": True,
        "agent": agent,
        "label": label,
        "config": {"agent": {"spec": agent}},
        "config_hash": f"h{abs(hash((label, env, key))) % 10**8}",
        "comparability_key": key,
        "versions": {},
        "results": {
            "suite": {"name": suite, "success": _estimate(value), "normalised": None, "envs": 1, "baselines": []},
            "envs": {env: {"version": 0, "success": _estimate(value), "normalised": None, "episodes": 4, "errors": 0}},
            "modalities": {"text": {"envs": [env], "success": _estimate(value), "normalised": None}},
            "tool_use": {"envs": [], "success": None, "normalised": None},
            "counts": {"planned": 4, "finished": 4, "errors": 0, "missing": 0},
        },
        "run": {},
    }


def write_run(root: Path, name: str, content: str | bytes | dict[str, Any]) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    path = folder / "summary.json"
    if isinstance(content, dict):
        path.write_text(json.dumps(content), encoding="utf-8")
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return folder


def leaderboard(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "relax_gym.cli.main", "leaderboard", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


def evil_run(tmp_path: Path) -> Path:
    return write_run(
        tmp_path,
        "evil",
        make_summary(PAYLOADS["label"], env=PAYLOADS["env"], suite=PAYLOADS["suite"], key=PAYLOADS["key"],
                     agent=PAYLOADS["agent"]),
    )


class _Tags(HTMLParser):
    """Every start tag and attribute of an HTML document, and its text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse_html(page: str) -> _Tags:
    parser = _Tags()
    parser.feed(page)
    parser.close()
    return parser


def assert_no_active_content(tags: _Tags, *, scripts: int) -> None:
    names = [t for t, _ in tags.tags]
    assert names.count("script") == scripts, names
    assert not {"img", "a", "iframe", "object", "embed", "b", "link", "base", "form"} & set(names), names
    assert names.count("style") <= 1, names  # the page's own CSS
    assert names.count("svg") <= 1, names  # the bar chart
    for tag, attrs in tags.tags:
        for attr, value in attrs.items():
            assert not attr.startswith("on"), (tag, attr)
            assert attr not in ("href", "src", "srcdoc", "formaction"), (tag, attr)
            assert "javascript:" not in (value or "").lower() or attr.startswith("data-"), (tag, attr, value)


def test_markdown_shows_user_strings_as_literal_text(tmp_path: Path) -> None:
    run = evil_run(tmp_path)
    out = leaderboard(run, "--no-db", "--format", "md", "--title", TITLE)
    assert out.returncode == 0, out.stderr
    md = out.stdout
    # no raw HTML but the <code> elements the renderer writes itself
    assert "<" not in re.sub(r"</?code>", "", md), md
    assert "\u202e" not in md
    # newlines and pipes in a label neither end the row nor add cells or headings
    lines = md.splitlines()
    assert not [line for line in lines if line.startswith("## injected")]
    assert sum(line.startswith("# ") for line in lines) == 1 and sum(line.startswith("## ") for line in lines) == 1
    for table in re.findall(r"((?:^\|.*\|$\n?)+)", md, flags=re.M):
        rows = table.strip().splitlines()
        widths = {len(re.findall(r"(?<!\\)\|", row)) for row in rows}
        assert len(widths) == 1, rows
    assert "`" not in md.replace("\\`", "")  # no code span can start or end
    markdown_it = pytest.importorskip("markdown_it")
    rendered = markdown_it.MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(md)
    tags = parse_html(rendered)
    assert_no_active_content(tags, scripts=0)
    assert {t for t, _ in tags.tags} <= {"h1", "h2", "p", "table", "thead", "tbody", "tr", "th", "td", "code",
                                           "blockquote", "br"}
    text = "".join(tags.text)
    for fragment in ("<script>alert(1)</script>", "<img src=x onerror=alert(2)>", "[click](javascript:alert(3))",
                     "<svg onload=alert(5)>", "*bold* _i_ ~~s~~ &amp;"):
        assert fragment in text  # shown, not dropped


def test_html_shows_user_strings_as_literal_text(tmp_path: Path) -> None:
    run = evil_run(tmp_path)
    page_file = tmp_path / "page.html"
    out = leaderboard(run, "--no-db", "--format", "html", "--title", TITLE, "--out", page_file)
    assert out.returncode == 0, out.stderr
    page = page_file.read_text(encoding="utf-8")
    assert "<!--" not in page  # a comment opener in a script block would swallow the next </script>
    assert "\u202e" not in page
    assert page.count("<script") == 2 and page.count("</script>") == 2
    tags = parse_html(page)
    assert_no_active_content(tags, scripts=2)
    meta = re.search(r'<script type="application/json" id="lb-meta">(.*?)</script>', page, flags=re.S)
    assert meta is not None and json.loads(meta.group(1))["title"] == TITLE
    text = "".join(tags.text)
    assert "<script>alert(1)</script>" in text and "<img src=x onerror=alert(2)>" in text


BAD_SUMMARIES: dict[str, str | bytes | dict[str, Any]] = {
    "not-json": "{this is not json",
    "a-list": "[1, 2, 3]",
    "a-string": json.dumps("config_hash comparability_key results config"),
    "missing-fields": {"config_hash": "abc"},
    "wrong-types": {**make_summary("w"), "results": {"suite": [], "envs": "lb/Pick-v0"}},
    "nan": json.dumps(make_summary("n")).replace('"value": 0.5', '"value": NaN', 1),
    "infinity": json.dumps(make_summary("i")).replace('"value": 0.5', '"value": 1e999', 1),
    "huge-int": json.dumps(make_summary("h")).replace('"planned": 4', '"planned": ' + "9" * 40, 1),
    "too-many-digits": json.dumps(make_summary("d")).replace('"planned": 4', '"planned": ' + "9" * 5000, 1),
    "deep": "[" * 200_000 + "]" * 200_000,
    "not-utf8": b'{"label": "\xff\xfe"}',
    "label-object": {**make_summary("x"), "label": {"nested": ["<script>"]}},
    "no-envs": {**make_summary("e"), "results": {**make_summary("e")["results"], "envs": {}}},
}


def bad_runs(root: Path) -> list[Path]:
    runs = [write_run(root, name, content) for name, content in BAD_SUMMARIES.items()]
    as_dir = root / "summary-is-a-folder"
    (as_dir / "summary.json").mkdir(parents=True)
    runs.append(as_dir)
    fifo = root / "summary-is-a-fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "summary.json")  # reading it would block forever
    runs.append(fifo)
    return runs


@pytest.mark.parametrize("index", ["no-db", "db"])
def test_each_malformed_summary_is_one_warning_and_the_good_run_still_renders(tmp_path: Path, index: str) -> None:
    good = write_run(tmp_path, "good", make_summary("good-model", value=0.75))
    bad = bad_runs(tmp_path / "bad")
    db_args = ["--no-db"] if index == "no-db" else ["--db", tmp_path / "index.sqlite"]
    out = leaderboard(good, *bad, *db_args, "--format", "md")
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr and "good-model" in out.stdout
    warnings = out.stderr.strip().splitlines()
    assert len(warnings) == len(bad), out.stderr
    for run in bad:  # one line per bad run, naming its file
        assert sum(str(run) in line for line in warnings) == 1, (run, out.stderr)
    assert all(line.startswith("warning: skipping ") and len(line) < 600 for line in warnings)


def test_only_malformed_summaries_fail_with_one_line(tmp_path: Path) -> None:
    bad = bad_runs(tmp_path / "bad")
    out = leaderboard(*bad, "--db", tmp_path / "index.sqlite", "--format", "html")
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and out.stdout == ""
    assert out.stderr.strip().splitlines()[-1].startswith("error: none of the given folders")


def test_a_corrupt_index_is_one_line_and_a_tampered_row_is_skipped(tmp_path: Path) -> None:
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database" * 100)
    for args in (["--format", "md"], ["--list"]):
        out = leaderboard("--db", junk, *args)
        assert out.returncode == 2 and "Traceback" not in out.stderr
        assert out.stderr.strip().splitlines() == [out.stderr.strip()] and str(junk) in out.stderr

    db = tmp_path / "index.sqlite"
    good = write_run(tmp_path, "good", make_summary("good-model"))
    other = write_run(tmp_path, "other", make_summary("\x1b]0;pwned\x07other-model\x1b[2J"))
    assert leaderboard(good, other, "--db", db).returncode == 0
    with sqlite3.connect(db) as conn:  # an edited (or older) index: one row no longer a summary
        conn.execute("UPDATE runs SET summary = ? WHERE label = ?", ('{"results": NaN}', "good-model"))
    out = leaderboard("--db", db, "--format", "md")
    assert out.returncode == 0 and "Traceback" not in out.stderr
    assert "other-model" in out.stdout and "good-model" not in out.stdout
    assert len(out.stderr.strip().splitlines()) == 1 and str(db) in out.stderr
    listing = leaderboard("--db", db, "--list")
    assert listing.returncode == 0 and "\x1b" not in listing.stdout and "\x07" not in listing.stdout
