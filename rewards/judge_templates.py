"""GenRM judge prompts and the parsers that read their verdicts.

Three built-in templates:

* ``reference`` -- is the response correct given a reference answer? ``VERDICT: CORRECT`` /
  ``VERDICT: INCORRECT`` -> 1.0 / 0.0;
* ``rubric`` -- a 0-10 quality score against a rubric: ``SCORE: 7`` -> 0.7;
* ``pairwise`` -- which of two responses is better: ``PREFERENCE: A`` / ``B`` / ``TIE`` ->
  1.0 / 0.0 / 0.5 (the score of response A).

Parsers read the judge's *last* verdict line after dropping ``<think>...</think>`` and
Markdown emphasis, accept the common variants (``Score: 7/10``, ``\\boxed{7}``,
``**Verdict:** Correct``), and raise :class:`VerdictError` for anything else -- an unreadable
verdict is a recorded failure, never a 0.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from relax_gym.answers import find_boxed

MAX_VERDICT_CHARS = 100_000


class VerdictError(ValueError):
    """The judge's reply holds no readable verdict."""


def clean_reply(text: str) -> str:
    """The judge's answer without its reasoning block and Markdown emphasis, on one line with
    single spaces (which also keeps the verdict patterns from backtracking over long runs of
    whitespace)."""
    text = text[-MAX_VERDICT_CHARS:]
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    return " ".join(text.replace("**", "").replace("__", "").replace("`", "").split())


_VERDICT = re.compile(r"verdict\s*[:=\-]?\s*\[?\s*(correct|incorrect|wrong|right)\b", re.IGNORECASE)
# a verdict inside \boxed{} (boxes are found by the one matcher in relax_gym.answers)
_BOXED_WORD = re.compile(r"\s*(?:\\text\{\s*(correct|incorrect)\s*\}|(correct|incorrect))\s*", re.IGNORECASE)
_BARE_VERDICT = re.compile(r"^\W*(correct|incorrect)\W*$", re.IGNORECASE)


def parse_correctness(text: str) -> float:
    """``VERDICT: CORRECT`` -> 1.0, ``VERDICT: INCORRECT`` -> 0.0 (the last verdict wins)."""
    reply = clean_reply(text)
    hits = [m.group(1).lower() for m in _VERDICT.finditer(reply)] or [
        (m.group(1) or m.group(2)).lower() for b in find_boxed(reply) if (m := _BOXED_WORD.fullmatch(b))
    ]
    if not hits and _BARE_VERDICT.match(reply):
        hits = [_BARE_VERDICT.match(reply).group(1).lower()]  # type: ignore[union-attr]
    if not hits:
        raise VerdictError(f"no 'VERDICT: CORRECT|INCORRECT' in judge reply {_snippet(reply)}")
    return 1.0 if hits[-1] in ("correct", "right") else 0.0


_NUM = r"(-?\d+(?:\.\d+)?)"
_SCORE = re.compile(rf"(?:score|rating|grade)\s*(?:is|of)?\s*[:=]?\s*\[?\s*{_NUM}\s*(?:/\s*10\b|out\s+of\s+10\b)?", re.IGNORECASE)
_BOXED_NUM = re.compile(rf"\s*{_NUM}\s*(?:/\s*10)?\s*")
_BARE_NUM = re.compile(rf"^\W*{_NUM}\s*(?:/\s*10)?\W*$")


def parse_score_0_10(text: str) -> float:
    """``SCORE: 7`` (or ``Score: 7/10``, ``\\boxed{7}``, a bare ``7``) -> 0.7. Values outside
    0..10 are unreadable, not clipped."""
    reply = clean_reply(text)
    hits = [m.group(1) for m in _SCORE.finditer(reply)] or [m.group(1) for b in find_boxed(reply) if (m := _BOXED_NUM.fullmatch(b))]
    if not hits and _BARE_NUM.match(reply):
        hits = [_BARE_NUM.match(reply).group(1)]  # type: ignore[union-attr]
    if not hits:
        raise VerdictError(f"no 'SCORE: <0-10>' in judge reply {_snippet(reply)}")
    value = float(hits[-1])
    if not 0.0 <= value <= 10.0:
        raise VerdictError(f"judge score {value} is outside 0..10")
    return value / 10.0


_PREF = re.compile(r"(?:preference|preferred|better(?:\s+response)?|winner)\s*(?:is)?\s*[:=]?\s*\[?\s*(?:response\s*)?(A|B|TIE)\b", re.IGNORECASE)
_BARE_PREF = re.compile(r"^\W*(A|B|TIE)\W*$", re.IGNORECASE)


def parse_preference(text: str) -> float:
    """``PREFERENCE: A`` -> 1.0, ``B`` -> 0.0, ``TIE`` -> 0.5 (the score of response A)."""
    reply = clean_reply(text)
    hits = [m.group(1).upper() for m in _PREF.finditer(reply)]
    if not hits and _BARE_PREF.match(reply):
        hits = [_BARE_PREF.match(reply).group(1).upper()]  # type: ignore[union-attr]
    if not hits:
        raise VerdictError(f"no 'PREFERENCE: A|B|TIE' in judge reply {_snippet(reply)}")
    return {"A": 1.0, "B": 0.0, "TIE": 0.5}[hits[-1]]


def _snippet(text: str, n: int = 120) -> str:
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= n else "..." + flat[-n:])


@dataclass(frozen=True, slots=True)
class JudgeTemplate:
    """A judge prompt (``str.format`` fields: ``prompt``, ``response``, ``reference``,
    ``response_a``, ``response_b``, ``rubric``) and the parser of its verdict (-> 0..1)."""

    name: str
    system: str
    user: str
    parse: Callable[[str], float]
    needs_reference: bool = False
    pairwise: bool = False


DEFAULT_RUBRIC = (
    "Correctness (most important), completeness, clarity, and faithfulness to the question "
    "and to any images."
)

REFERENCE = JudgeTemplate(
    name="reference",
    system="You are a strict grader. You compare a response with a reference answer and decide whether the response's final answer is correct.",
    user=(
        "[Question]\n{prompt}\n\n[Reference answer]\n{reference}\n\n[Response]\n{response}\n\n"
        "Is the response's final answer equivalent to the reference answer? Ignore style and "
        "formatting. Reason briefly, then end with exactly one line: VERDICT: CORRECT or "
        "VERDICT: INCORRECT"
    ),
    parse=parse_correctness,
    needs_reference=True,
)

RUBRIC = JudgeTemplate(
    name="rubric",
    system="You are a careful evaluator. You rate responses on a 0 to 10 scale using a rubric.",
    user=(
        "[Question]\n{prompt}\n\n[Response]\n{response}\n\n[Rubric]\n{rubric}\n\n"
        "Rate the response from 0 (useless or wrong) to 10 (perfect). Reason briefly, then end "
        "with exactly one line: SCORE: <integer 0-10>"
    ),
    parse=parse_score_0_10,
)

PAIRWISE = JudgeTemplate(
    name="pairwise",
    system="You are an impartial judge. You compare two responses to the same question.",
    user=(
        "[Question]\n{prompt}\n\n[Response A]\n{response_a}\n\n[Response B]\n{response_b}\n\n"
        "[Criteria]\n{rubric}\n\nWhich response is better? The order of the responses must not "
        "influence you. Reason briefly, then end with exactly one line: PREFERENCE: A, "
        "PREFERENCE: B or PREFERENCE: TIE"
    ),
    parse=parse_preference,
    pairwise=True,
)

TEMPLATES: dict[str, JudgeTemplate] = {t.name: t for t in (REFERENCE, RUBRIC, PAIRWISE)}


def get_template(template: str | JudgeTemplate) -> JudgeTemplate:
    if isinstance(template, JudgeTemplate):
        return template
    try:
        return TEMPLATES[template]
    except KeyError:
        raise ValueError(f"unknown judge template {template!r}; built-in: {sorted(TEMPLATES)}") from None


__all__ = [
    "DEFAULT_RUBRIC",
    "JudgeTemplate",
    "PAIRWISE",
    "REFERENCE",
    "RUBRIC",
    "TEMPLATES",
    "VerdictError",
    "clean_reply",
    "get_template",
    "parse_correctness",
    "parse_preference",
    "parse_score_0_10",
]
