"""Text rule rewards: exact, normalised and regex match, token F1, multiple choice.

Each compares the model's answer -- the whole response, or with ``extract="answer"`` the
``\\boxed{}`` / "Answer:" part (see :func:`~relax_gym.rewards.extract_answer`) -- against
``sample.label``, which may be one string or a list of acceptable strings (the best match
counts).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

from relax_gym.rewards.math_extract import extract_answer
from relax_gym.rewards.registry import Score, reward
from relax_gym.rewards.types import RewardError, RewardInput

try:  # `regex` releases the GIL while matching and supports a timeout; stdlib `re` does neither
    import regex as _regex
except ImportError:  # pragma: no cover - exercised only where `regex` is missing
    _regex = None

_REGEX_ERRORS: tuple[type[Exception], ...] = (re.error, ValueError) + ((_regex.error,) if _regex else ())
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.IGNORECASE)
_PUNCT = str.maketrans("", "", string.punctuation)


def answer_text(sample: RewardInput, extract: str) -> str | None:
    """The part of the response to compare: ``"none"`` the whole response, ``"answer"`` the
    extracted final answer (None when there is none)."""
    if extract == "none":
        return sample.response
    if extract == "answer":
        return extract_answer(sample.response, fallback="short")[0]
    raise RewardError("config", f"extract must be 'none' or 'answer', got {extract!r}")


def labels(sample: RewardInput, what: str) -> list[str]:
    """``sample.label`` as a non-empty list of strings."""
    label = sample.label
    if label is None:
        raise RewardError("config", f"{what} needs sample.label (the reference)")
    if isinstance(label, str):
        return [label]
    if isinstance(label, Sequence) and label and all(isinstance(x, str) for x in label):
        return list(label)
    if isinstance(label, (int, float)) and not isinstance(label, bool):
        return [str(label)]
    raise RewardError("config", f"{what}: label must be a string or a list of strings, got {type(label).__name__}")


def normalize_text(s: str) -> str:
    """SQuAD-style: lower case, no punctuation, no articles, single spaces."""
    s = s.lower().translate(_PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


@reward("exact_match")
def exact_match(sample: RewardInput, *, extract: str = "none", strip: bool = True) -> Score:
    """1.0 when the answer equals a label character for character (after ``strip()`` by default)."""
    got = answer_text(sample, extract)
    if got is None:
        return Score(0.0, details={"extracted": None})
    got = got.strip() if strip else got
    ok = any(got == (ref.strip() if strip else ref) for ref in labels(sample, "exact_match"))
    return Score(float(ok), details={"extracted": got} if extract != "none" else {})


@reward("normalized_match")
def normalized_match(sample: RewardInput, *, extract: str = "answer") -> Score:
    """1.0 when the answer equals a label after SQuAD normalisation (case, punctuation,
    articles, whitespace)."""
    got = answer_text(sample, extract)
    if got is None:
        return Score(0.0, details={"extracted": None})
    norm = normalize_text(got)
    ok = any(norm == normalize_text(ref) for ref in labels(sample, "normalized_match"))
    return Score(float(ok), details={"extracted": got})


@reward("regex_match")
def regex_match(
    sample: RewardInput,
    *,
    pattern: str | None = None,
    mode: str = "search",
    ignore_case: bool = False,
    extract: str = "none",
    timeout_s: float = 1.0,
) -> Score:
    """1.0 when ``pattern`` (default: the label, read as a regex) matches the answer;
    ``mode`` is ``search`` (anywhere) or ``fullmatch``. Matching is bounded by ``timeout_s``
    (with the ``regex`` package), so a catastrophic pattern fails instead of hanging."""
    if mode not in ("search", "fullmatch"):
        raise RewardError("config", f"mode must be 'search' or 'fullmatch', got {mode!r}")
    pats = [pattern] if pattern is not None else labels(sample, "regex_match")
    got = answer_text(sample, extract)
    if got is None:
        return Score(0.0, details={"extracted": None})
    flags = re.IGNORECASE if ignore_case else 0
    for pat in pats:
        try:
            if _regex is not None:
                compiled = _regex.compile(pat, flags=_regex.IGNORECASE if ignore_case else 0)
                hit = getattr(compiled, mode)(got, timeout=timeout_s)
            else:
                hit = getattr(re.compile(pat, flags), mode)(got)
        except TimeoutError:
            raise RewardError("timeout", f"regex {pat!r} ran past {timeout_s} s") from None
        except _REGEX_ERRORS as exc:
            raise RewardError("config", f"invalid regex {pat!r}: {exc}") from None
        if hit:
            return Score(1.0, details={"pattern": pat})
    return Score(0.0)


def f1_tokens(prediction: str, reference: str) -> float:
    """SQuAD token F1 between two strings after :func:`normalize_text`."""
    pred, ref = normalize_text(prediction).split(), normalize_text(reference).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


@reward("token_f1")
def token_f1(sample: RewardInput, *, extract: str = "answer") -> Score:
    """SQuAD token F1 (0..1) of the answer against the best label."""
    got = answer_text(sample, extract)
    if got is None:
        return Score(0.0, details={"extracted": None})
    return Score(max(f1_tokens(got, ref) for ref in labels(sample, "token_f1")), details={"extracted": got})


# ------------------------------------------------------------------------------------------------
# multiple choice
# ------------------------------------------------------------------------------------------------
_LETTER_ONLY = re.compile(r"^\(?\s*([A-Za-z])\s*\)?\s*[.:)]?$")  # "B", "(b)", "B."
_LETTER_LEAD = re.compile(r"^(?:\(\s*([A-Z])\s*\)|([A-Z])[.:)])\s")  # "(B) red", "B. red", "B) red"
_ANSWER_LETTER = re.compile(r"(?i:answer|option|choice)\s*(?i:is)?\s*:?\s*\(?\s*([A-Z])\s*\)?(?![A-Za-z])")
_PAREN_LETTER = re.compile(r"\(([A-Z])\)")


def _choices(sample: RewardInput, choices: Sequence[str] | None) -> list[str]:
    found = choices if choices is not None else sample.metadata.get("choices")
    if found is None:
        return []
    if not isinstance(found, Sequence) or isinstance(found, str) or not all(isinstance(c, str) for c in found):
        raise RewardError("config", "choices must be a list of option texts")
    return list(found)


def _letter_of(text: str, options: list[str], valid: str) -> str | None:
    """A letter from a short answer: ``B``, ``(b)``, ``B.``, ``(B) text``, ``B) text``, or an
    option's text. A lower-case letter counts only on its own ("a triangle" is not option A)."""
    text = " ".join(text.split())[:1000]  # single spaces: the patterns cannot backtrack on runs
    m = _LETTER_ONLY.match(text)
    if m and m.group(1).upper() in valid:
        return m.group(1).upper()
    m = _LETTER_LEAD.match(text)
    if m and (m.group(1) or m.group(2)) in valid:
        return m.group(1) or m.group(2)
    norm = normalize_text(text)
    for i, opt in enumerate(options):
        if norm and norm == normalize_text(opt):
            return valid[i]
    return None


@reward("multiple_choice")
def multiple_choice(sample: RewardInput, *, choices: Sequence[str] | None = None) -> Score:
    """1.0 when the chosen option equals the label. The label is a letter (``"B"``) or an
    option's text; options come from ``choices`` or ``sample.metadata["choices"]``. The model
    may answer with a letter (``B``, ``(B)``, ``\\boxed{B}``, "the answer is B") or the
    option's text."""
    options = _choices(sample, choices)
    valid = string.ascii_uppercase[: len(options)] if options else string.ascii_uppercase[:10]
    ref_label = labels(sample, "multiple_choice")[0]
    ref = _letter_of(ref_label, options, valid)
    if ref is None:
        raise RewardError("config", f"label {ref_label!r} is neither a letter in {valid} nor one of the options")
    extracted, how = extract_answer(sample.response, fallback="short")
    got = _letter_of(extracted, options, valid) if extracted else None
    if got is None:
        tail = " ".join(sample.response[-5000:].split())
        hits = [m.group(1) for m in _ANSWER_LETTER.finditer(tail)]
        hits = [h for h in hits if h in valid]
        if hits:
            got = hits[-1]
        else:
            parens = {m.group(1) for m in _PAREN_LETTER.finditer(tail) if m.group(1) in valid}
            got = parens.pop() if len(parens) == 1 else None
    return Score(float(got == ref), details={"chosen": got, "reference": ref, "how": how})


__all__ = [
    "answer_text",
    "exact_match",
    "f1_tokens",
    "labels",
    "multiple_choice",
    "normalize_text",
    "normalized_match",
    "regex_match",
    "token_f1",
]
