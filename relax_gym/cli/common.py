"""Small helpers shared by the CLI subcommands."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from relax_gym.errors import RelaxGymError


def parse_kwargs(pairs: list[str] | None) -> dict[str, Any]:
    """``["difficulty=hard", "size=5"]`` -> ``{"difficulty": "hard", "size": 5}`` (JSON values
    where they parse, strings otherwise)."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: env kwarg {pair!r} must look like key=value")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def finite_float(raw: str) -> float:
    """argparse type: a finite float (``nan``, ``inf`` and ``1e999`` are refused, since a
    non-finite temperature or timeout silently breaks sampling or never fires)."""
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{raw!r} is not a finite number")
    return value


def non_negative_float(raw: str) -> float:
    """argparse type: a finite float >= 0."""
    value = finite_float(raw)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{raw!r} must be >= 0")
    return value


def positive_float(raw: str) -> float:
    """argparse type: a finite float > 0 (timeouts, limits)."""
    value = finite_float(raw)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{raw!r} must be > 0")
    return value


def probability(raw: str) -> float:
    """argparse type: a finite float in [0, 1] (top-p, min-p)."""
    value = finite_float(raw)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{raw!r} must be in [0, 1]")
    return value


def positive_int(raw: str) -> int:
    """argparse type: an integer >= 1 (counts: episodes, attempts, concurrency)."""
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{raw!r} must be >= 1")
    return value


def fail(message: str, code: int = 1) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def user_error(exc: RelaxGymError) -> int:
    return fail(str(exc), 2)
