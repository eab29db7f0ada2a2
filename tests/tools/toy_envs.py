"""Small envs used by the tool tests (the shipped envs live in envs/)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from PIL import Image, ImageDraw
from relax_gym.tools import HermesParser, Tool, ToolContext, tool

from relax_gym.core import Env
from relax_gym.types import Action, ImagePart, Message, Observation, ToolCall

COLORS = ("red", "green", "blue", "amber", "violet", "teal")
_HERMES = HermesParser()


def count_dark_blobs(image: Image.Image) -> int:
    """Connected dark regions (4-neighbourhood), so tests can check what an image shows."""
    dark = np.asarray(image.convert("L")) < 100
    seen = np.zeros_like(dark)
    blobs = 0
    for y, x in zip(*np.nonzero(dark)):
        if seen[y, x]:
            continue
        blobs += 1
        stack = [(y, x)]
        seen[y, x] = True
        while stack:
            cy, cx = stack.pop()
            for ny, nx in ((cy + 1, cx), (cy - 1, cx), (cy, cx + 1), (cy, cx - 1)):
                if 0 <= ny < dark.shape[0] and 0 <= nx < dark.shape[1] and dark[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    stack.append((ny, nx))
    return blobs


class GalleryEnv(Env):
    """Multiply the dots in the top-left corner of the image by a gallery's multiplier, which
    only the document collection knows. Needs search (text), zoom (image) and calculator."""

    modalities = ("text", "image")
    tags = ("tools", "test")
    max_turns = 1

    def __init__(self, size: int = 128) -> None:
        self.size = size
        self.color = ""
        self.multiplier = 0
        self.dots = 0
        self.documents: list[dict[str, str]] = []

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]:
        super().reset(seed=seed)
        rng = self.np_random
        self.color = str(COLORS[int(rng.integers(len(COLORS)))])
        multipliers = {c: int(rng.integers(2, 30)) for c in COLORS}
        self.multiplier = multipliers[self.color]
        self.documents = [
            {"id": f"doc-{c}", "title": f"The {c} gallery", "text": f"The multiplier of the {c} gallery is {m}."}
            for c, m in multipliers.items()
        ] + [{"id": "doc-hours", "title": "Opening hours", "text": "All galleries open at nine."}]
        self.dots = int(rng.integers(1, 6))
        image = Image.new("RGB", (self.size, self.size), "white")
        draw = ImageDraw.Draw(image)
        quarter = self.size // 2
        # tiny dots on a coarse grid inside the top-left quarter, so they never touch
        cells = rng.choice(16, size=self.dots, replace=False)
        for cell in cells:
            cx = 4 + (int(cell) % 4) * (quarter // 4)
            cy = 4 + (int(cell) // 4) * (quarter // 4)
            draw.rectangle([cx, cy, cx + 2, cy + 2], fill="black")
        prompt = (
            f"How many dots are in the top-left quarter of the image, times the multiplier of the {self.color} "
            "gallery? Find the multiplier with the search tool. Answer as \\boxed{N}."
        )
        return Observation([Message.user(prompt, ImagePart(image, id="gallery"))]), {"color": self.color}

    def step(self, action: Action | str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        text = Action.coerce(action).text
        want = f"\\boxed{{{self.dots * self.multiplier}}}"
        ok = want in text
        return Observation(), float(ok), True, False, {"success": ok}

    def oracle(self) -> Iterator[Action | str]:
        q = self.size // 2
        yield "<think>I need the multiplier first.</think>\n" + _HERMES.render(
            [ToolCall("search", {"query": f"multiplier {self.color} gallery", "k": 2})]
        )
        yield _HERMES.render([ToolCall("zoom", {"image_id": "gallery", "bbox": [0, 0, q, q], "factor": 2})])
        yield _HERMES.render([ToolCall("calculator", {"expression": f"{self.dots} * {self.multiplier}"})])
        yield f"The answer is \\boxed{{{self.dots * self.multiplier}}}."


class CounterEnv(Env):
    """Provides its own episode-bound tool (``tools()``): the model must call ``reveal`` to
    learn a secret number, then answer it. Multi-turn inner env: two answers allowed."""

    max_turns = 2

    def __init__(self) -> None:
        self.secret = 0
        self.reveals = 0

    def tools(self) -> list[Tool]:
        env = self

        @tool
        def reveal(ctx: ToolContext) -> str:
            """Reveal the secret number of this episode."""
            env.reveals += 1
            ctx.scratch["revealed"] = True
            return str(env.secret)

        return [reveal]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]:
        super().reset(seed=seed)
        self.secret = int(self.np_random.integers(100, 1000))
        self.reveals = 0
        return Observation.from_text("Call reveal, then answer with the secret number."), {}

    def step(self, action: Action | str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        ok = str(self.secret) in Action.coerce(action).text
        if ok:
            return Observation(), 1.0, True, False, {"success": True}
        return Observation.from_text("Wrong; try again."), 0.0, False, False, {"success": False}

    def oracle(self) -> Iterator[Action | str]:
        yield Action(text="", tool_calls=[ToolCall("reveal", {})])
        yield Action(text="", tool_calls=[ToolCall("submit_answer", {"answer": self.secret})])
