"""Answer extraction shared by the shipped envs (the rewards package has the full matchers)."""

from __future__ import annotations

import re


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text`` (nested braces allowed), else None."""
    start = text.rfind("\\boxed{")
    while start != -1:
        i, depth = start + len("\\boxed{"), 1
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start + len("\\boxed{") : i - 1].strip()
        start = text.rfind("\\boxed{", 0, start)
    return None


_INT_RE = re.compile(r"^[+-]?\d+$")


def parse_int(answer: str | None) -> int | None:
    """An integer answer, tolerating spaces and thousands separators; None if not an integer."""
    if answer is None:
        return None
    cleaned = answer.replace(",", "").replace(" ", "").replace("\\,", "")
    return int(cleaned) if _INT_RE.match(cleaned) else None
