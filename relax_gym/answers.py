"""Reading a final answer out of model text: the one ``\\boxed{}`` matcher, and a safe integer.

Model text is untrusted input: a policy under RL pressure will find whatever makes a parser
slow or makes it raise. Everything here therefore runs in time linear in the length of the
text (one left-to-right scan, no backtracking regex, no re-scan per candidate) and never raises
on any ``str``. The shipped envs and the reward functions both read answers through this
module, so an answer the env accepts is the answer the reward grades.

The box rule (:func:`scan_boxes`):

* a box is ``\\boxed{...}`` or ``\\fbox{...}`` (whitespace may separate the command and its
  brace), or ``\\boxed 5`` (one token after a space);
* braces are matched by depth; ``\\{``, ``\\}`` and ``\\\\`` are escapes, not braces;
* a box inside a complete box is part of that box's content, except that a box holding only
  one box (``\\boxed{\\boxed{5}}``) answers with the inner content;
* the last complete box wins; a box that never closes (a reply cut off by its token limit)
  is passed over, so ``\\boxed{1} ... \\boxed{2`` answers ``1``. This is the rule the envs and
  the rewards had before they shared one matcher, kept so that scores do not move.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from relax_gym.types import clean_text

MAX_INT_DIGITS = 4000  # Python refuses int(str) past 4300 digits; no real answer is this long
MAX_JSON_DEPTH = 64  # tool arguments and answers are shallow; deeper is an attack on recursion

# The tokens that matter: a box command (with its opening brace when one follows), escapes
# (``\\{``, ``\\}``, ``\\\\`` -- so ``\\\\boxed`` is a line break and the word "boxed"), and runs
# of braces (one token per run keeps a flood of braces cheap). The regex engine skips the rest.
_TOKEN = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])(?:\s*\{)?|\\[\s\S]|\{+|\}+")
_SPACE_TOKEN = re.compile(r" +([^\s${}\\]{1,200})")
_INT = re.compile(r"[+-]?\d+")


@dataclass(slots=True)
class _Box:
    start: int  # index of the command's backslash
    begin: int  # content span [begin, end)
    end: int = -1
    stop: int = -1  # index just past the whole box (its closing brace or its token)
    inner: _Box | None = None  # set when the content is exactly one box and nothing else


@dataclass(slots=True)
class BoxScan:
    """The result of one scan: complete top-level boxes in order, where the last box that never
    closes starts, and whether the text used a box command at all (an empty, unclosed or bare
    ``\\boxed`` is still an attempt)."""

    text: str
    complete: list[_Box] = field(default_factory=list)
    last_open_start: int = -1  # -1: every box closes
    attempted: bool = False

    @property
    def boxes(self) -> list[str]:
        """Contents of every complete top-level box, stripped, in order."""
        return [_content(self.text, b) for b in self.complete]

    @property
    def last(self) -> str | None:
        """The answer: the content of the last complete top-level box; None when no box closes."""
        if not self.complete:
            return None
        return _content(self.text, self.complete[-1])


def _content(text: str, box: _Box) -> str:
    while box.inner is not None:
        box = box.inner
    return text[box.begin : box.end].strip()


def scan_boxes(text: str) -> BoxScan:
    """Find the boxes of ``text`` in one linear pass (the rule is in the module docstring).
    A value that is not a ``str`` scans as empty text."""
    scan = BoxScan(text if isinstance(text, str) else "")
    text = scan.text
    opened: list[_Box] = []  # boxes whose brace is open, outermost first
    depth: list[int] = []  # plain brace groups open inside each of them
    for m in _TOKEN.finditer(text):
        tok = m[0]
        first = tok[0]
        if first == "{":
            if opened:
                depth[-1] += len(tok)
        elif first == "}":
            if opened:
                _close_run(text, m.start(), len(tok), opened, depth, scan.complete)
        elif len(tok) == 2:  # an escape: \\{, \\}, \\\\, \\f...
            continue
        elif tok[-1] == "{":  # a box command and its brace
            scan.attempted = True
            opened.append(_Box(m.start(), m.end()))
            depth.append(0)
        else:  # a box command without a brace: "\\boxed 5", or no box at all
            scan.attempted = True
            token = _SPACE_TOKEN.match(text, m.end())
            if token is not None:  # the token holds no brace or backslash: the scan passes over it
                scan.complete.append(_Box(m.start(), token.start(1), token.end(1), token.end(1)))
    if opened:
        scan.last_open_start = opened[-1].start
    return scan


def _close_run(text: str, at: int, count: int, opened: list[_Box], depth: list[int], done: list[_Box]) -> None:
    """``count`` closing braces start at index ``at``: close plain groups, then boxes."""
    while count and opened:
        if depth[-1] >= count:
            depth[-1] -= count
            return
        count -= depth[-1] + 1
        at += depth.pop()
        box = opened.pop()
        box.end, box.stop = at, at + 1
        _adopt(text, box, done)
        at += 1


def _adopt(text: str, box: _Box, done: list[_Box]) -> None:
    """``box`` is complete: it swallows the complete boxes found inside it (each box is
    appended and dropped at most once, so this stays linear) and joins ``done``."""
    inside = 0
    child = box
    while done and done[-1].start > box.start:
        child = done.pop()
        inside += 1
    if inside == 1 and _blank(text, box.begin, child.start) and _blank(text, child.stop, box.end):
        box.inner = child
    done.append(box)


def _blank(text: str, a: int, b: int) -> bool:
    return a >= b or text[a:b].isspace()


def last_boxed(text: str) -> str | None:
    """The content of the last complete ``\\boxed{...}``/``\\fbox{...}`` (stripped), or None
    when no box closes. Linear time; never raises."""
    return scan_boxes(text).last


def find_boxed(text: str) -> list[str]:
    """Contents of every complete top-level box, in order. Linear time; never raises."""
    return scan_boxes(text).boxes


def parse_int(answer: str | None, *, max_digits: int = MAX_INT_DIGITS) -> int | None:
    """An integer answer, tolerating spaces and thousands separators (``1,024``, ``1 024``,
    ``1\\,024``); None when it is not an integer or has more than ``max_digits`` digits --
    an answer that long is not a valid answer, and ``int()`` of it would raise."""
    if not isinstance(answer, str):
        return None
    cleaned = answer.replace("\\,", "").replace(",", "").replace(" ", "").strip()
    if not _INT.fullmatch(cleaned) or len(cleaned.lstrip("+-")) > max_digits:
        return None
    try:
        return int(cleaned)
    except ValueError:  # e.g. a lowered sys.set_int_max_str_digits
        return None


def loads_json(text: str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` for model text. Raises only ``ValueError`` (``json.JSONDecodeError`` for
    bad syntax) with a one-line reason: nesting deeper than ``max_depth``, an integer over
    :data:`MAX_INT_DIGITS` digits, or text that is not a ``str``. Lone surrogates in strings
    (``"\\ud800"``) come back as U+FFFD, so the value can always be encoded as UTF-8."""
    if not isinstance(text, str):
        raise ValueError(f"expected JSON text, got {type(text).__name__}")
    try:
        value = json.loads(text, parse_int=_bounded_int)
    except RecursionError:  # the C decoder stops at the interpreter's recursion limit
        raise ValueError(f"JSON nested deeper than {max_depth} levels") from None
    return _checked(value, max_depth)


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"a JSON number has more than {MAX_INT_DIGITS} digits")
    return int(digits)


def _checked(value: Any, max_depth: int) -> Any:
    """Check the nesting depth and clean every string, iteratively (no recursion to exhaust)."""
    root = [value]
    stack: list[tuple[list[Any] | dict[str, Any], int]] = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise ValueError(f"JSON nested deeper than {max_depth} levels")
        if isinstance(node, list):
            for i, item in enumerate(node):
                if isinstance(item, str):
                    node[i] = clean_text(item)
                elif isinstance(item, (list, dict)):
                    stack.append((item, depth + 1))
        else:
            for key in list(node):
                item = node[key]
                if isinstance(item, str):
                    item = clean_text(item)
                elif isinstance(item, (list, dict)):
                    stack.append((item, depth + 1))
                clean_key = clean_text(key)
                if clean_key != key:
                    del node[key]
                node[clean_key] = item
    return root[0]


__all__ = [
    "MAX_INT_DIGITS",
    "MAX_JSON_DEPTH",
    "BoxScan",
    "find_boxed",
    "last_boxed",
    "loads_json",
    "parse_int",
    "scan_boxes",
]
