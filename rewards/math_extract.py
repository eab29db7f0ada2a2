"""Finding the final answer in a model's response: ``\\boxed{...}``, then an "Answer:" line.

Everything here is linear-time string scanning (no backtracking regex over the whole
response), so a long or adversarial response cannot stall the caller.
"""

from __future__ import annotations

import re

MAX_SCAN_CHARS = 200_000  # answers are at the end; a longer response is scanned from its tail

_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
# "Answer: 5", "The final answer is 5", "#### 5" (GSM8K). Applied line by line.
_MARKER = re.compile(
    r"(?:final\s+answer|answer)\s*(?:is\s*:?|:|=)\s*(?P<a>.+)$|^\s*####\s*(?P<b>.+)$",
    re.IGNORECASE,
)


def _braced(text: str, start: int) -> tuple[str, int] | None:
    """The content of the brace group opening at ``text[start] == '{'`` and the index after it.
    Escaped characters (``\\{``, ``\\}``, ``\\\\``) do not count as braces."""
    depth = 0
    i = start
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
        i += 1
    return None


def find_boxed(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}`` / ``\\fbox{...}`` (and ``\\boxed 5``), in order."""
    text = text[-MAX_SCAN_CHARS:]
    out: list[str] = []
    i = 0
    for m in _BOX.finditer(text):
        if m.start() < i:
            continue  # a box inside a box: the outer one already holds it
        j = m.end()
        if j < len(text) and text[j] == "{":
            got = _braced(text, j)
            if got is None:
                break  # unbalanced: the rest of the text holds no complete box
            out.append(got[0].strip())
            i = got[1]
        elif j < len(text) and text[j] == " ":
            tail = re.match(r" +([^\s$]+)", text[j : j + 200])
            if tail:
                out.append(tail.group(1))
    return out


def strip_math_delimiters(s: str) -> str:
    """Remove surrounding ``$...$``, ``$$...$$``, ``\\(...\\)``, ``\\[...\\]``."""
    s = s.strip()
    changed = True
    while changed and s:
        changed = False
        for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
            if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
                s = s[len(left) : len(s) - len(right)].strip()
                changed = True
                break
    return s


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
    boxes = find_boxed(text)
    if boxes and boxes[-1]:
        return boxes[-1], "boxed"
    marked = _marker_answer(text)
    if marked:
        return strip_math_delimiters(marked), "marker"
    stripped = text.strip()
    if boxes or _BOX.search(text[-MAX_SCAN_CHARS:]):
        return None, "none"  # the model tried to box an answer but the box is empty or unclosed
    if fallback == "short" and stripped and "\n" not in stripped and len(stripped) < 200:
        return strip_math_delimiters(stripped).rstrip("."), "whole"
    return None, "none"


def extract_reference(label: object) -> str | None:
    """A dataset label as an answer string: its last ``\\boxed{}`` if it has one, else itself."""
    if label is None:
        return None
    text = label if isinstance(label, str) else str(label)
    boxes = find_boxed(text)
    return boxes[-1] if boxes else strip_math_delimiters(text)


__all__ = ["extract_answer", "extract_reference", "find_boxed", "strip_math_delimiters"]
