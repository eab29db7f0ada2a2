"""Normalising a math answer string and reading its shape (number, set, tuple, interval,
equation), before any sympy work.

``normalize`` removes what never changes the value -- math delimiters, ``\\left``/``\\right``,
spacing commands, ``\\text{units}`` and trailing unit words, degree signs, currency signs,
thousands separators, ``\\dfrac`` -- and ``parse_node`` turns the result into a small tree:
:class:`Scalar` (with a percent flag), :class:`Seq` (ordered, with its brackets: tuples, points,
intervals), :class:`Collection` (unordered: ``\\{...\\}`` sets, bare comma lists, unions of
intervals, ``a \\pm b``) or :class:`Equation`. ``x = 3`` becomes the scalar ``3``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from relax_gym.rewards.math_extract import strip_math_delimiters

MAX_ANSWER_CHARS = 1000  # longer "answers" are compared as strings only

_DROP = re.compile(
    r"\\(?:displaystyle|textstyle|left|right|big|Big|bigg|Bigg)(?![A-Za-z])|\\[!,;:> ]|\\q?quad(?![A-Za-z])"
)
_DEGREE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ(?![A-Za-z])|\\degree(?![A-Za-z])|°")
_TEXT_CMD = re.compile(r"\\(?:text|textrm|textbf|textit|mbox|mathrm|mathbf|textnormal)\s*\{")
_UNITISH = re.compile(r"^[A-Za-z][A-Za-z\s.]*(?:\^\{?\d\}?)?$")
# a word may not be split ("(?![A-Za-z])"): without that, a long run of letters backtracks
# through every way of cutting it into four words
_TRAILING_WORDS = re.compile(r"(?<=[\d}).]) ?(?P<words>(?:[A-Za-z]{2,}(?![A-Za-z])\.? ?){1,4})(?:\^\{?\d\}?)?$")
_KEEP_WORDS = {"pi", "sqrt", "sin", "cos", "tan", "log", "ln", "exp", "infty", "inf", "oo", "and", "or", "i"}
_UNICODE = {"π": "\\pi ", "√": "\\sqrt", "∞": "\\infty ", "×": "\\times ", "·": "\\cdot ", "−": "-",
            "≤": "\\leq ", "≥": "\\geq ", "∪": "\\cup ", "±": "\\pm "}
_THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?%?$")
_THOUSANDS_SPACE = re.compile(r"^-?\d{1,3}(?: \d{3})+(?:\.\d+)?%?$")
_VARIABLE = re.compile(r"^(?:\\[A-Za-z]+|[A-Za-z]{1,12})(?:_\{?[A-Za-z0-9]+\}?)?(?:\([A-Za-z, ]*\))?'?$")


# ------------------------------------------------------------------------------------------------
# string normalisation
# ------------------------------------------------------------------------------------------------
def _braced_end(s: str, open_idx: int) -> int:
    """Index just past the ``}`` matching ``s[open_idx] == '{'``, or -1."""
    depth = 0
    i = open_idx
    while i < len(s):
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


def _replace_text_commands(s: str) -> str:
    """``\\text{...}``: unwrap the whole answer; drop a trailing unit; otherwise unwrap."""
    for _ in range(20):  # bounded: each round removes one command
        m = _TEXT_CMD.search(s)
        if not m:
            return s
        end = _braced_end(s, m.end() - 1)
        if end < 0:
            return s[: m.start()] + s[m.end() :]
        inner = s[m.end() : end - 1].strip()
        before, after = s[: m.start()].strip(), s[end:]
        unit_suffix = re.match(r"\s*(?:\^\s*\{?\d\}?)?", after)
        rest = after[unit_suffix.end() :] if unit_suffix else after
        if before and _UNITISH.match(inner) and not rest.strip() and inner.lower() not in _KEEP_WORDS:
            s = before  # "5 \text{ cm}^2" -> "5"
        elif before and _UNITISH.match(inner) and rest.lstrip().startswith((",", ")", "]", "\\}", "\\cup")):
            s = before + rest  # a unit inside a list: "(3 \text{cm}, 4 \text{cm})"
        else:
            s = s[: m.start()] + " " + inner + " " + after
    return s


def normalize(answer: str) -> str:
    """The canonical text of an answer: same value, fewer ways to write it."""
    s = strip_math_delimiters(str(answer))
    if len(s) > MAX_ANSWER_CHARS:
        return " ".join(s.split())
    s = s.replace("\n", " ")
    for uni, latex in _UNICODE.items():
        s = s.replace(uni, latex)
    s = _DROP.sub("", s)
    s = re.sub(r"\\[dt]frac(?![A-Za-z])", r"\\frac", s)
    s = re.sub(r"\\frac\s*(\w)\s*(\w)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac\s*(\{[^{}]*\})\s*(\w)", r"\\frac\1{\2}", s)
    s = re.sub(r"\\sqrt\s*(\w)", r"\\sqrt{\1}", s)
    s = _DEGREE.sub("", s)
    s = s.replace("\\%", "%").replace("\\$", "").replace("$", "")
    s = s.replace("{,}", "")
    s = re.sub(r"\\varnothing(?![A-Za-z])|^\\\{\s*\\\}$", r"\\emptyset", s)
    s = re.sub(r"\\le(?![A-Za-z])", r"\\leq", s)
    s = re.sub(r"\\ge(?![A-Za-z])", r"\\geq", s)
    s = _replace_text_commands(s)
    s = re.sub(r"\s+(?:or|and)\s+", ", ", s)
    s = re.sub(r"^\s*[A-Za-z]\s*\\in\s*", "", s)  # "x \in [0, 1]" -> "[0, 1]"
    s = " ".join(s.split())
    s = s.rstrip(".").strip()
    m = _TRAILING_WORDS.search(s)
    if m and not any(w.lower().rstrip(".") in _KEEP_WORDS for w in m.group("words").split()):
        s = s[: m.start()].strip()
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    elif _THOUSANDS_SPACE.match(s):
        s = s.replace(" ", "")
    return s


def answer_key(s: str) -> str:
    """A comparison key: no spaces; lower case for plain words ("Yes" == "yes")."""
    key = s.replace(" ", "")
    if re.fullmatch(r"[A-Za-z][A-Za-z\s\-']*", s):
        key = key.lower()
    return key


# ------------------------------------------------------------------------------------------------
# the answer's shape
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Scalar:
    """One value. ``lhs`` keeps the variable of an assignment (``y = 2x+1`` -> ``2x+1`` with
    lhs ``y``) so it can still be compared with an equation such as ``2y = 4x + 2``."""

    text: str
    percent: bool = False
    lhs: str | None = None


@dataclass(frozen=True, slots=True)
class Seq:
    """Ordered items in brackets: a tuple or point ``(1, 2)``, an interval ``[0, \\infty)``."""

    open: str
    close: str
    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Collection:
    """Unordered items: ``\\{1, 2\\}``, ``1, 2``, ``A \\cup B``, ``1 \\pm \\sqrt{2}``."""

    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Equation:
    text: str


Node = Scalar | Seq | Collection | Equation

_OPEN = "([{"
_CLOSE = ")]}"


def split_top(s: str, sep: str) -> list[str]:
    """Split ``s`` at ``sep`` where no bracket is open. Brackets may be mismatched, as in
    intervals (``(0, 1]``); ``\\{`` and ``\\}`` count as brackets too."""
    parts: list[str] = []
    depth = 0
    start = 0
    i = 0
    while i < len(s):
        if depth == 0 and s.startswith(sep, i):
            parts.append(s[start:i])
            i += len(sep)
            start = i
            continue
        c = s[i]
        if c == "\\" and i + 1 < len(s) and s[i + 1] in "{}":
            depth += 1 if s[i + 1] == "{" else -1
            i += 2
            continue
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
        i += 1
    parts.append(s[start:])
    return [p.strip() for p in parts]


def _encloses(s: str, open_len: int = 1, close_len: int = 1) -> bool:
    """True when the bracket opening at the start of ``s`` closes exactly at its end."""
    depth = 0
    inner = s[open_len : len(s) - close_len]
    i = 0
    while i < len(inner):
        c = inner[i]
        if c == "\\" and i + 1 < len(inner) and inner[i + 1] in "{}":
            depth += 1 if inner[i + 1] == "{" else -1
            i += 2
        else:
            depth += 1 if c in _OPEN else -1 if c in _CLOSE else 0
            i += 1
        if depth < 0:
            return False
    return depth == 0


def parse_node(s: str) -> Node:
    """The shape of a normalised answer."""
    s = s.strip()
    if not s or len(s) > MAX_ANSWER_CHARS:
        return Scalar(s)
    union = split_top(s, "\\cup")
    if len(union) > 1:
        return Collection(tuple(parse_node(p) for p in union))
    if s.count("\\pm") == 1 and len(split_top(s, "\\pm")) == 2:
        return Collection((parse_node(s.replace("\\pm", "+")), parse_node(s.replace("\\pm", "-"))))
    if s.startswith("\\{") and s.endswith("\\}") and _encloses(s, 2, 2):
        inner = s[2:-2].strip()
        return Collection(tuple(parse_node(p) for p in split_top(inner, ",") if p)) if inner else Collection(())
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]" and _encloses(s):
        items = split_top(s[1:-1], ",")
        if len(items) >= 2:
            return Seq(s[0], s[-1], tuple(parse_node(p) for p in items))
        if s[0] == "(" and s[-1] == ")":
            return parse_node(s[1:-1])
    items = split_top(s, ",")
    if len(items) >= 2:
        return Collection(tuple(parse_node(p) for p in items if p))
    sides = [p for p in split_top(s, "=")]
    if len(sides) >= 2 and not re.search(r"[<>!:]$", sides[0]) and all(sides):
        if all(_VARIABLE.match(p) for p in sides[:-1]):
            value = parse_node(sides[-1])  # "x = 3" -> 3; "x = y = 3" -> 3
            if isinstance(value, Scalar) and not value.percent and len(sides) == 2:
                return Scalar(value.text, lhs=sides[0])
            return value
        if len(sides) == 2:
            return Equation(s)
    if s.endswith("%"):
        return Scalar(s[:-1].strip(), percent=True)
    return Scalar(s)


__all__ = [
    "Collection",
    "Equation",
    "Node",
    "Scalar",
    "Seq",
    "answer_key",
    "normalize",
    "parse_node",
    "split_top",
]
