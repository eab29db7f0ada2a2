"""The HTML leaderboard in a real browser: headless Chromium runs the page's script and paints it.

Needs Debian's ``chromium`` (``apt-get install -y chromium``; ``.ci/run`` installs it). The DOM
is dumped after the script ran (``--dump-dom``) to check the tables and their sorting -- the
``#sort=KEY:DIR`` fragment drives the same click handlers a user triggers -- and a screenshot
proves the chart's bars were painted.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image
from relax_gym.leaderboards import run_eval
from relax_gym.leaderboards.render_html import BAR, BASELINE_BAR

from relax_gym.cli.main import main

from .envs_for_tests import BASELINES

pytestmark = pytest.mark.slow

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-sync",
    "--disable-extensions",
    "--no-first-run",
    "--no-default-browser-check",
    "--metrics-recording-only",
    "--mute-audio",
    "--hide-scrollbars",
    "--virtual-time-budget=5000",
]


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("headless Chromium is needed for the browser test: apt-get install -y chromium")


class _Dom(HTMLParser):
    """Per table: header keys with their aria-sort, and the label of each body row in order."""

    def __init__(self) -> None:
        super().__init__()
        self.ready: str | None = None
        self.tables: dict[str, dict[str, object]] = {}
        self._table: str | None = None
        self._in_body = False
        self.svg_bars = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "body":
            self.ready = a.get("data-ready")
        elif tag == "table" and "sortable" in (a.get("class") or ""):
            self._table = a.get("id") or ""
            self.tables[self._table] = {"sort": {}, "labels": []}
        elif tag == "th" and self._table is not None:
            self.tables[self._table]["sort"][a.get("data-key")] = a.get("aria-sort")  # type: ignore[index]
        elif tag == "tbody":
            self._in_body = True
        elif tag == "td" and self._in_body and self._table is not None and a.get("data-key") == "label":
            self.tables[self._table]["labels"].append(a.get("data-v"))  # type: ignore[union-attr]
        elif tag == "rect" and "bar" in (a.get("class") or ""):
            self.svg_bars += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._table, self._in_body = None, False
        elif tag == "tbody":
            self._in_body = False


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("browser")
    base = root / "baselines.json"
    base.write_text(json.dumps(BASELINES))
    runs = []
    for name, spec, suite in [
        ("oracle", "oracle", "lbtest/mini-v0"),
        ("random", "random", "lbtest/mini-v0"),
        ("echo", "python:tests.leaderboards.test_eval_runner:echo_policy", "lbtest/mini-v0"),
        ("random-v1", "random", "lbtest/mini-v1"),
    ]:
        asyncio.run(
            run_eval(spec, root / name, suite=suite, attempts=2, baselines_file=base, label=name, progress=False)
        )
        runs.append(str(root / name))
    out = root / "site" / "index.html"
    assert main(["leaderboard", *runs, "--db", str(root / "lb.sqlite"), "--format", "html", "--out", str(out)]) == 0
    return out


def _dump(page: Path, fragment: str, tmp_path: Path) -> _Dom:
    cmd = [_chromium(), *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri() + fragment]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = _Dom()
    dom.feed(proc.stdout)
    return dom


def test_tables_render_and_sort_in_chromium(page: Path, tmp_path: Path) -> None:
    plain = _dump(page, "", tmp_path)
    assert plain.ready == "1", "the page's script did not run"
    assert set(plain.tables) == {"g0-table", "g0-envs", "g1-table", "g1-envs"}
    assert plain.tables["g0-table"]["labels"] == ["oracle", "echo", "random"]  # ranked by score
    assert plain.svg_bars == 4
    assert not any(plain.tables["g0-table"]["sort"].values())

    by_label = _dump(page, "#sort=label:asc", tmp_path)
    assert by_label.tables["g0-table"]["labels"] == ["echo", "oracle", "random"]
    assert by_label.tables["g0-envs"]["labels"] == ["echo", "oracle", "random"]
    assert by_label.tables["g0-table"]["sort"]["label"] == "ascending"

    # numeric columns sort descending on the first click, ascending on the second
    worst_first = _dump(page, "#sort=score:asc", tmp_path)
    assert worst_first.tables["g0-table"]["labels"] == ["random", "echo", "oracle"]
    assert worst_first.tables["g0-table"]["sort"] == {
        **{k: None for k in worst_first.tables["g0-table"]["sort"]},
        "score": "ascending",
    }
    best_first = _dump(page, "#sort=image:desc", tmp_path)
    assert best_first.tables["g0-table"]["labels"][0] == "oracle"
    assert best_first.tables["g0-table"]["sort"]["image"] == "descending"


def test_chart_bars_are_painted(page: Path, tmp_path: Path) -> None:
    shot = tmp_path / "shot.png"
    cmd = [
        _chromium(),
        *FLAGS,
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1280,2400",
        f"--screenshot={shot}",
        page.as_uri(),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    img = Image.open(shot).convert("RGB")
    colours = img.getcolors(maxcolors=1 << 20) or []
    counts = {rgb: n for n, rgb in colours}

    def rgb(hex_colour: str) -> tuple[int, int, int]:
        return tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]

    # the custom agent's bar is blue, the baselines' grey; each bar is 20 px high
    assert counts.get(rgb(BAR), 0) > 20 * 50
    assert counts.get(rgb(BASELINE_BAR), 0) > 20 * 300
