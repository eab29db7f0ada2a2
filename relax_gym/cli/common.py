"""Small helpers shared by the CLI subcommands."""

from __future__ import annotations

import json
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


def fail(message: str, code: int = 1) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def user_error(exc: RelaxGymError) -> int:
    return fail(str(exc), 2)
