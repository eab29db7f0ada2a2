"""Math answer equivalence: is the model's final answer the same value as the reference?

Pipeline, cheapest first:

1. extract the answer (last ``\\boxed{}``, else an "Answer:" line, else a short one-line reply);
2. normalise both sides (:mod:`.math_normalize`) and compare the strings;
3. read each side's shape (scalar, percent, tuple/interval, set/list/union, equation) and
   compare structurally: sets and unions ignore order, tuples and intervals do not (bracket
   types must match), ``x = 3`` is ``3``;
4. compare scalars: plain numbers and ``\\frac{p}{q}`` exactly in Python, anything else in a
   sympy worker process (:mod:`.sympy_pool`) with a hard timeout: ``simplify(a - b) == 0``, a
   numeric check for constants, random-point checks for expressions with symbols.

A percentage ``p%`` matches ``p`` and ``p/100``. Numbers match within ``rel_tol`` (relative).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from relax_gym.rewards.math_extract import extract_answer, extract_reference
from relax_gym.rewards.math_normalize import (
    MAX_ANSWER_CHARS,
    Collection,
    Equation,
    Node,
    Scalar,
    Seq,
    answer_key,
    normalize,
    parse_node,
)
from relax_gym.rewards.registry import Score, reward
from relax_gym.rewards.sympy_pool import SympyConfigError, SympyError, SympyPool, SympyTimeout, default_pool
from relax_gym.rewards.types import RewardError, RewardInput

MAX_SET_SIZE = 24  # larger sets are compared by their normalised strings only

_NUMBER = r"-?(?:\d+(?:\.\d*)?|\.\d+)"
_PLAIN_NUMBER = re.compile(rf"^{_NUMBER}$")
_FRACTION = re.compile(rf"^(?P<sign>-?)\s*(?:\\frac\{{(?P<a>{_NUMBER})\}}\{{(?P<b>{_NUMBER})\}}|(?P<c>{_NUMBER})\s*/\s*(?P<d>{_NUMBER}))$")
_WORDY = re.compile(r"[A-Za-z]{4,}")


@dataclass(slots=True)
class Equivalence:
    """The verdict and how it was reached (for logs)."""

    equal: bool
    method: str
    pred: str = ""
    ref: str = ""
    unparsed: list[str] = field(default_factory=list)


def _as_fraction(s: str) -> Fraction | None:
    s = s.replace(" ", "")
    if len(s) > 60:
        return None
    if _PLAIN_NUMBER.match(s):
        return Fraction(s)
    m = _FRACTION.match(s)
    if not m:
        return None
    a, b = (m.group("a"), m.group("b")) if m.group("a") is not None else (m.group("c"), m.group("d"))
    den = Fraction(b)
    if den == 0:
        return None
    value = Fraction(a) / den
    return -value if m.group("sign") else value


def _close(a: Fraction, b: Fraction, rel_tol: float) -> bool:
    if a == b:
        return True
    return abs(a - b) <= Fraction(rel_tol) * max(abs(a), abs(b))


def _fast_scalar(a: str, b: str, rel_tol: float) -> bool | None:
    """A verdict without sympy when one is certain, else None. An answer longer than
    ``MAX_ANSWER_CHARS`` never reaches sympy: only its exact string comparison counts."""
    if answer_key(a) == answer_key(b):
        return True
    if max(len(a), len(b)) > MAX_ANSWER_CHARS:
        return False
    fa, fb = _as_fraction(a), _as_fraction(b)
    if fa is not None and fb is not None:
        return _close(fa, fb, rel_tol)
    if "\\" not in a + b and not re.search(r"\d", a + b) and (_WORDY.search(a) or _WORDY.search(b)):
        return False  # plain words ("Monday", "yes") that differ as strings
    return None


def _scalar_forms(x: Scalar) -> list[str]:
    return [x.text] if not x.percent else [x.text, f"\\frac{{{x.text}}}{{100}}"]


def _scalar_pairs(p: Scalar, r: Scalar) -> list[tuple[str, str]]:
    """Candidate pairs: ``p%`` vs ``r`` tries ``p`` and ``p/100`` against ``r``."""
    if p.percent == r.percent:
        return [(p.text, r.text)]
    return [(a, b) for a in _scalar_forms(p) for b in _scalar_forms(r)]


def _unwrap(node: Node) -> Node:
    while isinstance(node, Collection) and len(node.items) == 1:
        node = node.items[0]
    return node


def _align(p: Node, r: Node) -> tuple[Node, Node]:
    """Unwrap one-element sets; an assignment facing an equation becomes an equation again."""
    p, r = _unwrap(p), _unwrap(r)
    if isinstance(p, Equation) and isinstance(r, Scalar) and r.lhs is not None:
        r = Equation(f"{r.lhs} = {r.text}")
    elif isinstance(r, Equation) and isinstance(p, Scalar) and p.lhs is not None:
        p = Equation(f"{p.lhs} = {p.text}")
    return p, r


def _collect(p: Node, r: Node, scalars: set[tuple[str, str]], equations: set[tuple[str, str]]) -> None:
    """Every scalar / equation comparison that ``_compare`` may ask for."""
    p, r = _align(p, r)
    if isinstance(p, Scalar) and isinstance(r, Scalar):
        scalars.update(_scalar_pairs(p, r))
    elif isinstance(p, Equation) and isinstance(r, Equation):
        equations.add((p.text, r.text))
    elif isinstance(p, Seq) and isinstance(r, Seq):
        if (p.open, p.close, len(p.items)) == (r.open, r.close, len(r.items)):
            for a, b in zip(p.items, r.items):
                _collect(a, b, scalars, equations)
    elif isinstance(p, Collection) and isinstance(r, Collection):
        if len(p.items) == len(r.items) <= MAX_SET_SIZE:
            for a in p.items:
                for b in r.items:
                    _collect(a, b, scalars, equations)


def _compare(p: Node, r: Node, table: dict[tuple[str, str, str], bool]) -> bool:
    p, r = _align(p, r)
    if isinstance(p, Scalar) and isinstance(r, Scalar):
        if p.lhs is not None and r.lhs is not None and answer_key(p.lhs) != answer_key(r.lhs):
            return False  # "x = 1" is not "y = 1"
        return any(table.get(("s", a, b), False) for a, b in _scalar_pairs(p, r))
    if isinstance(p, Equation) and isinstance(r, Equation):
        return table.get(("e", p.text, r.text), False)
    if isinstance(p, Seq) and isinstance(r, Seq):
        return (p.open, p.close, len(p.items)) == (r.open, r.close, len(r.items)) and all(
            _compare(a, b, table) for a, b in zip(p.items, r.items)
        )
    if isinstance(p, Collection) and isinstance(r, Collection):
        if len(p.items) != len(r.items) or len(p.items) > MAX_SET_SIZE:
            return False
        return _perfect_matching([[_compare(a, b, table) for b in r.items] for a in p.items])
    return False


def _perfect_matching(ok: list[list[bool]]) -> bool:
    """Whether every row can be paired with a distinct column it matches (Kuhn's algorithm)."""
    n = len(ok)
    match_col: list[int] = [-1] * n

    def augment(row: int, seen: list[bool]) -> bool:
        for col in range(n):
            if ok[row][col] and not seen[col]:
                seen[col] = True
                if match_col[col] < 0 or augment(match_col[col], seen):
                    match_col[col] = row
                    return True
        return False

    return all(augment(row, [False] * n) for row in range(n))


def math_equal(
    pred: str,
    ref: str,
    *,
    rel_tol: float = 1e-6,
    timeout_s: float = 5.0,
    pool: SympyPool | None = None,
) -> Equivalence:
    """Compare two answer strings. Raises :class:`SympyTimeout` when the sympy check runs past
    ``timeout_s`` and :class:`SympyError` when the worker fails; never hangs."""
    np_, nr = normalize(pred), normalize(ref)
    if answer_key(np_) == answer_key(nr):
        return Equivalence(True, "string", np_, nr)
    p, r = parse_node(np_), parse_node(nr)
    scalars: set[tuple[str, str]] = set()
    equations: set[tuple[str, str]] = set()
    _collect(p, r, scalars, equations)
    table: dict[tuple[str, str, str], bool] = {}
    todo: list[tuple[str, str]] = []
    for a, b in sorted(scalars):
        fast = _fast_scalar(a, b, rel_tol)
        if fast is None:
            todo.append((a, b))
        else:
            table[("s", a, b)] = fast
    unparsed: list[str] = []
    method = "structure"
    if todo or equations:
        pool = pool or default_pool()
        for op, tag, pairs in (("scalars", "s", todo), ("equations", "e", sorted(equations))):
            if not pairs:
                continue
            method = "sympy"
            reply = pool.call({"op": op, "pairs": pairs, "rel_tol": rel_tol}, timeout_s)
            for (a, b), verdict, err in zip(pairs, reply["result"], reply.get("errors") or [None] * len(pairs)):
                table[(tag, a, b)] = bool(verdict)
                if verdict is None and err:
                    unparsed.append(f"{a!r} vs {b!r}: {err}")
    return Equivalence(_compare(p, r, table), method, np_, nr, unparsed)


@reward("math_equiv")
def math_equiv(
    sample: RewardInput,
    *,
    rel_tol: float = 1e-6,
    timeout_s: float = 5.0,
    fallback: str = "short",
) -> Score:
    """1.0 when the final answer (``\\boxed{}`` / "Answer:") equals ``sample.label`` as math, else 0.0.

    No extractable answer scores 0.0 (``details["how"] == "none"``). A sympy check that runs
    past ``timeout_s`` is a recorded ``timeout`` failure, not a 0.
    """
    ref = extract_reference(sample.label)
    if ref is None or not ref.strip():
        raise RewardError("config", "math_equiv needs sample.label (the reference answer)")
    pred, how = extract_answer(sample.response, fallback=fallback)
    details: dict[str, Any] = {"extracted": pred, "how": how, "reference": ref}
    if pred is None:
        return Score(0.0, details=details)
    try:
        verdict = math_equal(pred, ref, rel_tol=rel_tol, timeout_s=timeout_s)
    except SympyTimeout as exc:
        raise RewardError("timeout", str(exc), details) from None
    except SympyConfigError as exc:
        raise RewardError("config", str(exc), details) from None
    except SympyError as exc:
        raise RewardError("exception", f"sympy worker: {exc}", details) from None
    details.update(method=verdict.method)
    if verdict.unparsed:
        details["unparsed"] = verdict.unparsed
    return Score(float(verdict.equal), details=details)


__all__ = ["Equivalence", "math_equal", "math_equiv"]
