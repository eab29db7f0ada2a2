"""Where the random and oracle baselines of the normalised score come from.

Shipped envs store theirs in ``relax_gym.envs`` (``baselines.json``, per env and difficulty,
measured by ``python -m relax_gym.envs.baselines``). Third-party envs, or a user who measured
their own, pass a JSON file ``{"env_id": {"random": 0.1, "oracle": 1.0}}`` (optionally keyed by
difficulty: ``{"env_id": {"easy": {"random": ...}}}``); entries there take precedence. An env
with neither has no normalised score, and the suite's normalised score is then left out rather
than averaged over fewer envs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .scoring import Baseline


class BaselineError(ValueError):
    """A baselines file that cannot be read or has the wrong shape."""


def _from_entry(entry: Any, where: str) -> Baseline:
    if not isinstance(entry, Mapping) or "random" not in entry:
        raise BaselineError(f"{where}: expected an object with 'random' (and optionally 'oracle')")
    try:
        return Baseline(random=float(entry["random"]), oracle=float(entry.get("oracle", 1.0)), source=where)
    except (TypeError, ValueError) as exc:
        raise BaselineError(f"{where}: {exc}") from None


def load_file(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BaselineError(f"cannot read baselines file {p}: {exc}") from None
    if not isinstance(data, dict):
        raise BaselineError(f"{p}: expected a JSON object keyed by env id")
    return data


def _shipped() -> dict[str, dict[str, Any]]:
    try:
        from relax_gym.envs.baselines import load_baselines
    except ImportError:
        return {}
    try:
        return load_baselines()  # type: ignore[return-value]
    except (OSError, ValueError, KeyError):
        return {}


def resolve(envs: Mapping[str, str | None], file: str | Path | None = None) -> dict[str, Baseline]:
    """Baselines for ``{env_id: difficulty}``; envs without one are absent from the result."""
    user = load_file(file) if file else {}
    shipped = _shipped()
    out: dict[str, Baseline] = {}
    for env_id, difficulty in envs.items():
        if env_id in user:
            entry = user[env_id]
            if isinstance(entry, Mapping) and "random" not in entry and difficulty in entry:
                entry = entry[difficulty]
            out[env_id] = _from_entry(entry, f"{file}[{env_id}]")
            continue
        table = shipped.get(env_id) or {}
        b = table.get(difficulty or "easy")
        if b is not None:
            out[env_id] = Baseline(
                random=float(b.random_success),
                oracle=float(b.oracle_success),
                source=f"relax_gym.envs.baselines ({difficulty or 'easy'}, {b.episodes} episodes)",
            )
    return out


__all__ = ["BaselineError", "load_file", "resolve"]
