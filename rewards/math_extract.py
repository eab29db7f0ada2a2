"""Finding the final answer in a model's response: ``\\boxed{...}``, then an "Answer:" line.

Boxes are read by the core's one matcher (:mod:`relax_gym.answers`, shared with the envs, so
a reward grades the answer the env saw). Everything here is linear-time string scanning (no
backtracking regex over the whole response), so a long or adversarial response cannot stall
the caller.
"""

from __future__ import annotations

import re

from relax_gym.answers import find_boxed, last_boxed, scan_boxes

MAX_SCAN_CHARS = 200_000  # "Answer:" lines are at the end; a longer response is searched in its tail

# "Answer: 5", "The final answer is 5", "#### 5" (GSM8K). Applied line by line.
_MARKER = re.compile(
    r"(?:final\s+answer|answer)\s*(?:is\s*:?|:|=)\s*(?P<a>.+)$|^\s*####\s*(?P<b>.+)$",
    re.IGNORECASE,
)
_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))


def strip_math_delimiters(s: str) -> str:
    """Remove surrounding ``$...$``, ``$$...$$``, ``\\(...\\)``, ``\\[...\\]`` (repeatedly).
    Works on indices and slices once, so ``"$" * n`` costs O(n), not O(n^2)."""
    lo, hi = 0, len(s)
    changed = True
    while changed:
        while lo < hi and s[lo].isspace():
            lo += 1
        while hi > lo and s[hi - 1].isspace():
            hi -= 1
        changed = False
        for left, right in _DELIMITERS:
            if hi - lo >= len(left) + len(right) and s.startswith(left, lo, hi) and s.endswith(right, lo, hi):
                lo, hi = lo + len(left), hi - len(right)
                changed = True
                break
    return s[lo:hi]


def _marker_answer(text: str) -> str | None:
    for line in reversed(text[-MAX_SCAN_CHARS:].splitlines()):
        if len(line) > 2000:
            continue
        matches = list(_MARKER.finditer(line))
        if matches:
            m = matches[-1]
            ans = (m.group("a") or m.group("b") or "").strip()
            # "Answer: $x = 3$." -> the math inside the first $...$ when there is one
            inline = re.search(r"\$([^$]+)\$", ans)
            if inline:
                ans = inline.group(1)
            ans = ans.rstrip(" .")
            if ans:
                return ans
    return None


def extract_answer(text: str, *, fallback: str = "short") -> tuple[str | None, str]:
    """The model's final answer and how it was found: ``boxed``, ``marker`` (an "Answer:" or
    "####" line), ``whole`` (with ``fallback="short"``: a one-line response under 200 chars),
    or ``(None, "none")``. With several boxes the last one wins."""
    if fallback not in ("short", "none"):
        raise ValueError("fallback must be 'short' or 'none'")
    if not isinstance(text, str):
        return None, "none"
    scan = scan_boxes(text)
    boxed = scan.last
    if boxed:
        return boxed, "boxed"
    marked = _marker_answer(text)
    if marked:
        return strip_math_delimiters(marked), "marker"
    stripped = text.strip()
    if scan.attempted:
        return None, "none"  # the model tried to box an answer but the box is empty or unclosed
    if fallback == "short" and stripped and "\n" not in stripped and len(stripped) < 200:
        return strip_math_delimiters(stripped).rstrip("."), "whole"
    return None, "none"


def extract_reference(label: object) -> str | None:
    """A dataset label as an answer string: its last ``\\boxed{}`` if it has one, else itself."""
    if label is None:
        return None
    text = label if isinstance(label, str) else str(label)
    boxed = last_boxed(text)
    return boxed if boxed is not None else strip_math_delimiters(text)


__all__ = ["extract_answer", "extract_reference", "find_boxed", "strip_math_delimiters"]
