"""ChartZoom: read exact values off a bar chart whose labels are too small to read without zooming.

* **Task** -- a synthetic bar chart (Pillow) with a value printed above every bar and a name
  under every group; the question asks for one printed value, or a difference or total of
  several. The chart is drawn at 1280x960 and shown at 320x240, so the labels are about 3 px
  tall: legible only through the `zoom` tool, which crops the full-resolution chart (the
  "thinking with images" pattern).
* **Observation** -- one user message: the question and the chart (image id `chart`), and the
  tools `zoom(image_id, bbox)` (returns the region at up to 4x the shown resolution as a new
  image, which can be zoomed into again), `calculator(expression)` and `submit_answer(answer)`.
* **Action** -- tool calls in the model's format (Qwen3/Hermes `<tool_call>` blocks by default;
  the env takes `parser="qwen3_coder"` or `"openai"` too), then the answer: `submit_answer` with
  the number, or a reply ending in `\\boxed{N}`.
* **Reward** -- 1.0 for the right number (to 0.05), 0.1 for a well-formed wrong number, else
  0; `success` means the right number.
* **Difficulty** -- `easy`: 4-5 bars, whole numbers, the value of one bar. `medium`: 6-8
  bars, whole numbers, the difference of two bars or the total of three. `hard`: grouped
  bars (2-3 series, read the legend) over 5-7 groups, values with one decimal, one value or
  the gap between two series. Tool budget: 6 calls.

The env records where it drew every label; the oracle zooms into the groups (and the legend)
the question needs, uses the calculator for differences and totals, and submits. Tests check
that the labels are under 4 px tall in the shown chart, that a zoom returns the chart's
full-resolution pixels (also when zooming into a zoom), and that the oracle's zooms show every
label it answers from at a readable size.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image, ImageDraw
from relax_gym.tools import (
    Tool,
    ToolContext,
    ToolError,
    calculator,
    submit_answer,
    tool,
)

from relax_gym.types import Action, ImagePart

from ._base import Task
from ._draw import COLORS, font
from ._tool_task import ToolTask, ToolTaskEnv, pick

SCALE = 4  # source pixels per shown pixel
SHOWN = (320, 240)
SOURCE = (SHOWN[0] * SCALE, SHOWN[1] * SCALE)
LABEL_PX = 14  # label font size in source pixels: 3.5 px when shown
TITLE_PX = 44
MAX_ZOOM_SIDE = 768  # a zoom result larger than this is scaled down to fit
PLOT = (150, 150, SOURCE[0] - 60, SOURCE[1] - 130)  # left, top, right, bottom of the plot area
CHART_ID = "chart"
SERIES_COLORS = ("blue", "orange", "green")
Box = tuple[int, int, int, int]

CATEGORIES = {
    "months": ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"),
    "regions": ("North", "South", "East", "West", "Central", "Coast", "Hills", "Lakes", "Plains", "Delta"),
    "fruits": ("Apple", "Banana", "Cherry", "Grape", "Lemon", "Mango", "Orange", "Peach", "Pear", "Plum"),
    "teams": ("Ants", "Bears", "Crows", "Dingos", "Eagles", "Foxes", "Geckos", "Hawks", "Ibises", "Jackals"),
}
TITLES = {
    "months": "Orders per month",
    "regions": "Visitors by region",
    "fruits": "Crates sold by fruit",
    "teams": "Points scored by team",
}
SERIES_NAMES = (("2024", "2025", "2026"), ("Online", "Store", "Phone"), ("Alpha", "Beta", "Gamma"))


@dataclass(frozen=True)
class Level:
    bars: tuple[int, int]
    series: tuple[int, int]
    decimals: int
    max_value: int  # values (in units of 10^-decimals) lie in [max_value // 20, max_value]
    questions: tuple[str, ...]
    answer_range: tuple[int, int]  # the random agent guesses in here (units of 10^-decimals)


LEVELS = {
    "easy": Level((4, 5), (1, 1), 0, 999, ("value",), (10, 999)),
    "medium": Level((6, 8), (1, 1), 0, 9999, ("difference", "total"), (0, 30000)),
    "hard": Level((5, 7), (2, 3), 1, 999, ("value", "gap"), (0, 999)),
}


@dataclass
class Chart:
    """What was drawn, and where (source pixels), so the oracle and the tests can find it."""

    title: str
    categories: list[str]
    series: list[str]
    values: list[list[int]]  # [category][series], in units of 10^-decimals
    decimals: int
    value_boxes: list[list[Box]] = field(default_factory=list)
    category_boxes: list[Box] = field(default_factory=list)
    legend_box: Box | None = None

    def text(self, v: int) -> str:
        return f"{v / 10**self.decimals:.{self.decimals}f}" if self.decimals else f"{v:,}"


def _union(boxes: list[Box]) -> Box:
    return (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))


def _nice_top(v: float) -> float:
    """The smallest 1/2/5 x 10^k at or above ``v``: the axis maximum."""
    exp = 10 ** math.floor(math.log10(v))
    return next(m * exp for m in (1, 2, 2.5, 5, 10) if m * exp >= v)


def draw_chart(chart: Chart) -> Image.Image:
    """Render at source resolution, recording every label's box in ``chart``."""
    img = Image.new("RGB", SOURCE, (255, 255, 255))
    d = ImageDraw.Draw(img)
    left, top, right, bottom = PLOT
    scale_div = 10**chart.decimals
    y_max = _nice_top(max(max(row) for row in chart.values) / scale_div * 1.12)
    d.text((SOURCE[0] // 2, 60), chart.title, fill=(20, 20, 20), font=font(TITLE_PX), anchor="mm")
    for k in range(6):  # grid lines and (tiny) tick labels
        y = bottom - (bottom - top) * k / 5
        d.line((left, y, right, y), fill=(225, 225, 225), width=2)
        tick = y_max * k / 5
        d.text((left - 12, y), f"{tick:g}", fill=(90, 90, 90), font=font(LABEL_PX), anchor="rm")
    d.line((left, top, left, bottom), fill=(60, 60, 60), width=3)
    d.line((left, bottom, right, bottom), fill=(60, 60, 60), width=3)
    n_cat, n_ser = len(chart.categories), len(chart.series)
    group = (right - left) / n_cat
    bar_w = group * 0.8 / n_ser
    chart.value_boxes, chart.category_boxes = [], []
    for i, (cat, row) in enumerate(zip(chart.categories, chart.values)):
        x0 = left + group * i + group * 0.1
        boxes = []
        for j, v in enumerate(row):
            bx = x0 + bar_w * j
            h = (bottom - top) * (v / scale_div) / y_max
            d.rectangle((round(bx), round(bottom - h), round(bx + bar_w) - 4, bottom - 2), fill=COLORS[SERIES_COLORS[j]])
            anchor = (round(bx + bar_w / 2) - 2, round(bottom - h) - 8)
            d.text(anchor, chart.text(v), fill=(20, 20, 20), font=font(LABEL_PX), anchor="mb")
            boxes.append(tuple(int(c) for c in d.textbbox(anchor, chart.text(v), font=font(LABEL_PX), anchor="mb")))
        chart.value_boxes.append(boxes)  # type: ignore[arg-type]
        anchor = (round(left + group * (i + 0.5)), bottom + 30)
        d.text(anchor, cat, fill=(20, 20, 20), font=font(LABEL_PX), anchor="mm")
        chart.category_boxes.append(tuple(int(c) for c in d.textbbox(anchor, cat, font=font(LABEL_PX), anchor="mm")))  # type: ignore[arg-type]
    if n_ser > 1:  # the legend: a swatch and a name per series, in a row above the plot
        x, y = left + 20, top - 40
        parts: list[Box] = []
        for j, name in enumerate(chart.series):
            d.rectangle((x, y - 8, x + 16, y + 8), fill=COLORS[SERIES_COLORS[j]])
            tb = d.textbbox((x + 22, y), name, font=font(LABEL_PX), anchor="lm")
            d.text((x + 22, y), name, fill=(20, 20, 20), font=font(LABEL_PX), anchor="lm")
            parts.append((x, min(y - 8, int(tb[1])), int(tb[2]), max(y + 8, int(tb[3]))))
            x = int(tb[2]) + 30
        chart.legend_box = _union(parts)
    return img


def shown_box(box: Box, pad: int = 14) -> list[int]:
    """A source-pixel box, padded, as a box in the shown chart's pixels (rounded outwards)."""
    l, t, r, b = box
    return [
        max(0, (l - pad) // SCALE),
        max(0, (t - pad) // SCALE),
        min(SHOWN[0], -(-(r + pad) // SCALE)),
        min(SHOWN[1], -(-(b + pad) // SCALE)),
    ]


# ------------------------------------------------------------------------------------------------
# the zoom tool: crops the full-resolution chart
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class View:
    """Where an image the model can see sits in the source: source = origin + pixel * scale."""

    x0: float
    y0: float
    scale: float
    size: tuple[int, int]


_VIEWS = "chart_zoom:views"


@tool
async def zoom(image_id: str, bbox: tuple[int, int, int, int], ctx: ToolContext) -> ImagePart:
    """Zoom into a region of the chart (or of an earlier zoom) to see it at full resolution.

    Args:
        image_id: "chart", or the id of an image an earlier zoom returned.
        bbox: Region as [left, top, right, bottom] in pixels of that image.
    """
    env = ctx.env
    if not isinstance(env, ChartZoomTask) or env.source is None:
        raise ToolError("zoom only works inside a ChartZoom episode")
    views: dict[str, View] = ctx.scratch.setdefault(_VIEWS, {CHART_ID: View(0.0, 0.0, float(SCALE), SHOWN)})
    view = views.get(image_id)
    if view is None:
        raise ToolError(f"no image with id {image_id!r} to zoom into (image ids: {', '.join(views)})")
    l, t, r, b = bbox
    w, h = view.size
    if r <= l or b <= t:
        raise ToolError(f"bbox {list(bbox)} is empty: need left < right and top < bottom")
    l, t, r, b = max(0, l), max(0, t), min(w, r), min(h, b)
    if r <= l or b <= t:
        raise ToolError(f"bbox {list(bbox)} lies outside the image, which is {w}x{h} pixels")
    src = (
        round(view.x0 + l * view.scale), round(view.y0 + t * view.scale),
        round(view.x0 + r * view.scale), round(view.y0 + b * view.scale),
    )
    region = env.source.crop(src)
    shrink = min(1.0, MAX_ZOOM_SIDE / max(region.size))
    if shrink < 1.0:
        region = region.resize((max(1, round(region.width * shrink)), max(1, round(region.height * shrink))), Image.Resampling.BOX)
    new_id = f"zoom_{len(views)}"
    views[new_id] = View(float(src[0]), float(src[1]), (src[2] - src[0]) / region.width, region.size)
    return ImagePart(region, id=new_id)


# ------------------------------------------------------------------------------------------------
# the env
# ------------------------------------------------------------------------------------------------
class ChartZoomTask(ToolTask[Level]):
    """One chart and one question; graded on the number (to 0.05)."""

    levels = LEVELS
    modalities = ("text", "image")

    def __init__(self, difficulty: str = "easy") -> None:
        super().__init__(difficulty)
        self.source: Image.Image | None = None
        self.chart: Chart | None = None
        self.needs: dict[str, Any] = {}

    def tools(self) -> list[Tool]:
        return [zoom]

    def make_task(self, level: Level) -> Task:
        rng = self.np_random
        theme = str(pick(rng, sorted(CATEGORIES)))
        n_cat = int(rng.integers(level.bars[0], level.bars[1] + 1))
        n_ser = int(rng.integers(level.series[0], level.series[1] + 1))
        names = CATEGORIES[theme]
        start = int(rng.integers(0, len(names) - n_cat + 1))
        if theme == "months":  # consecutive months
            categories = list(names[start : start + n_cat])
        else:
            categories = [names[int(i)] for i in sorted(rng.choice(len(names), n_cat, replace=False))]
        series = list(pick(rng, SERIES_NAMES)[:n_ser]) if n_ser > 1 else ["value"]
        values = rng.choice(np.arange(level.max_value // 20, level.max_value + 1), size=n_cat * n_ser, replace=False)
        chart = Chart(TITLES[theme], categories, series, values.reshape(n_cat, n_ser).tolist(), level.decimals)
        self.source = draw_chart(chart)
        self.chart = chart
        shown = self.source.reduce(SCALE)  # a box filter: each shown pixel averages 4x4 source pixels
        question, target, needs = self._question(rng, level, chart)
        self.needs = needs
        decimals = "a number with one decimal, as printed" if level.decimals else "a whole number"
        prompt = (
            f"{question}\n\nThe chart's labels are too small to read at this size: use the zoom tool (image id "
            f"\"{CHART_ID}\", coordinates in pixels of the image) to read them. Give the answer as {decimals} with "
            "submit_answer (or reply with \\boxed{N})."
        )
        answer = chart.text(target) if level.decimals else str(target)
        return Task(prompt, target, answer, (ImagePart(shown, id=CHART_ID),), {"question": needs["kind"]})

    def _question(self, rng: np.random.Generator, level: Level, chart: Chart) -> tuple[str, int, dict[str, Any]]:
        kind = str(pick(rng, level.questions))
        n_cat, n_ser = len(chart.categories), len(chart.series)
        v = chart.values
        if kind == "value":
            i, j = int(rng.integers(n_cat)), int(rng.integers(n_ser))
            where = f"the bar of {chart.series[j]} for {chart.categories[i]}" if n_ser > 1 else f"the bar for {chart.categories[i]}"
            return f"What value is printed above {where}?", v[i][j], {"kind": kind, "cells": [(i, j)]}
        if kind == "difference":
            a, b = (int(x) for x in rng.choice(n_cat, 2, replace=False))
            a, b = (a, b) if v[a][0] > v[b][0] else (b, a)
            q = f"By how much is the value of {chart.categories[a]} larger than the value of {chart.categories[b]}?"
            return q, v[a][0] - v[b][0], {"kind": kind, "cells": [(a, 0), (b, 0)], "op": "-"}
        if kind == "total":
            picks = sorted(int(x) for x in rng.choice(n_cat, 3, replace=False))
            q = "What is the total of the values of " + ", ".join(chart.categories[i] for i in picks[:2]) + f" and {chart.categories[picks[2]]}?"
            return q, sum(v[i][0] for i in picks), {"kind": kind, "cells": [(i, 0) for i in picks], "op": "+"}
        if kind == "gap":
            i = int(rng.integers(n_cat))
            a, b = (int(x) for x in rng.choice(n_ser, 2, replace=False))
            a, b = (a, b) if v[i][a] > v[i][b] else (b, a)
            q = f"For {chart.categories[i]}, by how much is the value of {chart.series[a]} larger than the value of {chart.series[b]}?"
            return q, v[i][a] - v[i][b], {"kind": kind, "cells": [(i, a), (i, b)], "op": "-"}
        raise ValueError(f"unknown question kind {kind!r}")

    def parse_answer(self, raw: str) -> int | None:
        """The number in units of 10^-decimals (so 12.3 -> 123 on the hard level)."""
        try:
            x = float(raw.replace(",", "").strip())
        except ValueError:
            return None
        if not math.isfinite(x) or abs(x) > 1e12:
            return None
        return round(x * 10**self.level.decimals)

    def random_answer(self, rng: np.random.Generator) -> str:
        lo, hi = self.level.answer_range
        v = int(rng.integers(lo, hi + 1))
        return f"{v / 10**self.level.decimals:.{self.level.decimals}f}" if self.level.decimals else str(v)


class ChartZoomEnv(ToolTaskEnv[ChartZoomTask]):
    """Read tiny chart labels through a zoom tool that returns full-resolution crops."""

    task_cls = ChartZoomTask
    tool_budget = 6
    modalities = ("text", "image")
    tags = ("tools", "multi-turn", "vision", "charts", "zoom")

    @classmethod
    def shared_tools(cls) -> list[Tool]:
        return [calculator, submit_answer]

    def random_tool_call(self, rng: np.random.Generator) -> tuple[str, dict[str, Any]]:
        l, t = int(rng.integers(0, SHOWN[0] - 8)), int(rng.integers(0, SHOWN[1] - 8))
        r, b = int(rng.integers(l + 8, SHOWN[0] + 1)), int(rng.integers(t + 8, SHOWN[1] + 1))
        return "zoom", {"image_id": CHART_ID, "bbox": [l, t, r, b]}

    def oracle(self) -> Iterator[Action | str]:
        task = self.task_env
        chart, needs = task.chart, task.needs
        if chart is None:
            raise RuntimeError("call reset() first")
        cells = needs["cells"]
        zooms = []
        if len(chart.series) > 1:
            assert chart.legend_box is not None
            zooms.append(("zoom", {"image_id": CHART_ID, "bbox": shown_box(chart.legend_box)}))
        for i in sorted({i for i, _ in cells}):  # one zoom per group: its value labels and its name
            zooms.append(("zoom", {"image_id": CHART_ID, "bbox": shown_box(_union(chart.value_boxes[i] + [chart.category_boxes[i]]))}))
        yield self.calls(zooms)
        self.tool_texts("zoom")  # every zoom worked
        read = [chart.text(chart.values[i][j]).replace(",", "") for i, j in cells]  # what the zooms show
        if len(read) == 1:
            yield self.submit(read[0])
            return
        yield self.call("calculator", expression=f" {needs['op']} ".join(read))
        yield self.submit(self.tool_text("calculator").strip())
