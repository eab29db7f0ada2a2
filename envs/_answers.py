"""Answer extraction for the shipped envs: the core's one ``\\boxed{}`` matcher, with a length cap.

The matcher and the integer parser live in :mod:`relax_gym.answers` (shared with the rewards,
so an env and a reward read the same answer); this module adds what only envs need: an answer
longer than :data:`MAX_ANSWER_CHARS` is not an answer, so every env's own ``parse_answer``
only ever sees short text, whatever the model sends.
"""

from __future__ import annotations

from relax_gym.answers import last_boxed, parse_int

MAX_ANSWER_CHARS = 1000  # ten times the longest shipped answer (a 5x5 grid with separators, a name)


def boxed_answer(text: str) -> str | None:
    """The content of the last ``\\boxed{}`` in ``text``, or None when there is none, it never
    closes, or it is longer than :data:`MAX_ANSWER_CHARS`. Linear time; never raises."""
    raw = last_boxed(text)
    return raw if raw is not None and len(raw) <= MAX_ANSWER_CHARS else None


__all__ = ["MAX_ANSWER_CHARS", "boxed_answer", "last_boxed", "parse_int"]
