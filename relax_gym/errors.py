"""Exceptions raised by the relax_gym core.

Each one names what went wrong and what to do about it, so a user reading a traceback (or a
model reading an error observation) can act on it without opening the source.
"""

from __future__ import annotations

from typing import TypeVar

_E = TypeVar("_E", bound=BaseException)


def find_cause(exc: BaseException, kind: type[_E]) -> _E | None:
    """The ``kind`` error behind ``exc``: itself, one of its causes or contexts, or the error a
    Ray actor raised; None if there is none. Cycles are walked once.

    A ``cause`` attribute is followed before the type is checked: Ray's ``RayTaskError`` is made
    a subclass of its cause's type but its message is a remote traceback, and the user should see
    the original one-line message."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        cause = getattr(current, "cause", None)
        if isinstance(cause, BaseException):
            current = cause
            continue
        if isinstance(current, kind):
            return current
        current = current.__cause__ or current.__context__
    return None


class RelaxGymError(Exception):
    """Base class for every error relax_gym raises on purpose."""


class MediaError(RelaxGymError, ValueError):
    """An image, audio clip or video could not be read or written.

    ``source`` describes the input (a path, ``"<bytes len=123>"``, ...) and ``cause`` says why,
    so the message never needs a decoder's traceback to be understood. ``reason`` is what a
    metric counts it under: ``corrupt`` here, a budget's name in the budget refusals.
    """

    reason: str = "corrupt"

    def __init__(self, kind: str, source: str, cause: str) -> None:
        self.kind = kind
        self.source = source
        self.cause = cause
        super().__init__(f"cannot read {kind} from {source}: {cause}")


class RegistrationError(RelaxGymError):
    """An environment id is malformed, unknown, or registered inconsistently."""


class EpisodeEndedError(RelaxGymError, RuntimeError):
    """``step()`` was called after the episode terminated or was truncated."""


class ResetNeededError(RelaxGymError, RuntimeError):
    """``step()`` was called before the first ``reset()``."""


class EnvStepError(RelaxGymError, RuntimeError):
    """The environment's own code raised while stepping; the original is chained."""


class EnvCheckError(RelaxGymError, AssertionError):
    """``check_env`` found problems; ``report`` holds every check's result."""

    def __init__(self, report: object) -> None:
        self.report = report
        super().__init__(str(report))


def describe_source(src: object) -> str:
    """A short, log-safe description of a media input (never the raw bytes)."""
    if isinstance(src, (bytes, bytearray, memoryview)):
        return f"<bytes len={len(src)}>"
    if isinstance(src, str):
        if src.startswith("data:"):
            return f"<data URL len={len(src)}>"
        return repr(src) if len(src) < 200 else f"<str len={len(src)}>"
    return f"<{type(src).__name__}>"
