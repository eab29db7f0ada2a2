"""``summary.json``: a run's config, versions and per-env / per-suite scores.

The summary is a pure function of the config, the episode rows (sorted by key) and the
baselines: a resumed run and an uninterrupted one with the same rows produce the same
``results``. Timing, which differs between any two runs, is kept apart under ``run``.
"""

from __future__ import annotations

import platform
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from importlib import metadata
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .config import EvalConfig
from .records import EpisodeRecord, sorted_records
from .scoring import Baseline, EnvScore, TaskOutcomes, aggregate, group_scores, score_env

SUMMARY_SCHEMA = 1
MODALITY_GROUPS: tuple[str, ...] = ("text", "image", "audio", "video")
TOOL_TAG = "tools"


def library_versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "platform": sys.platform}
    for dist in ("relax-gym", "numpy", "gymnasium", "pillow", "httpx", "pydantic"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


def modality_groups(config: EvalConfig) -> dict[str, list[str]]:
    """``text``: text-only envs; ``image`` / ``audio`` / ``video``: envs that show that modality."""
    groups: dict[str, list[str]] = {}
    for e in config.envs:
        mods = set(e.modalities)
        if mods <= {"text"}:
            groups.setdefault("text", []).append(e.env_id)
        for m in ("image", "audio", "video"):
            if m in mods:
                groups.setdefault(m, []).append(e.env_id)
    return {k: groups[k] for k in MODALITY_GROUPS if k in groups}


def _env_stats(rows: list[EpisodeRecord]) -> dict[str, Any]:
    n = max(len(rows), 1)
    components: Counter[str] = Counter()
    media: Counter[str] = Counter()
    for r in rows:
        components.update(r.reward_components)
        media.update(r.media_sent)
    return {
        "return_mean": _r(sum(r.return_ for r in rows) / n),
        "reward_components_mean": {k: _r(v / n) for k, v in sorted(components.items())},
        "turns_mean": _r(sum(r.turns for r in rows) / n),
        "tool_calls": sum(r.tool_calls for r in rows),
        "invalid_actions": sum(r.invalid_actions for r in rows),
        "parse_errors": sum(r.parse_errors for r in rows),
        "media_errors": sum(r.media_errors for r in rows),
        "context_exhausted": sum(r.context_exhausted for r in rows),
        "prompt_tokens": sum(r.prompt_tokens for r in rows),
        "completion_tokens": sum(r.completion_tokens for r in rows),
        "media_sent": dict(sorted(media.items())),
        "truncated": sum(r.truncated for r in rows),
        "errors": sum(r.error is not None for r in rows),
        "error_types": dict(sorted(Counter(r.error_type or "error" for r in rows if r.error).items())),
    }


def _model_name(agent: Mapping[str, Any]) -> str | None:
    model = agent.get("model")
    return str(model) if model and model != "default" else None


def _r(x: float) -> float:
    return float(f"{x:.12g}")


def build_summary(
    config: EvalConfig,
    records: Iterable[EpisodeRecord],
    baselines: Mapping[str, Baseline],
    *,
    versions: Mapping[str, str] | None = None,
    run: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Score the rows of the planned episodes (others are ignored) into the summary dict."""
    planned = {key for key, _ in config.keys()}
    rows = [r for r in sorted_records(records) if r.key in planned]
    scores, envs_out = _score_envs(config, rows, baselines)
    results = {
        "suite": _suite_scores(config, scores, baselines),
        "envs": envs_out,
        "modalities": group_scores(scores, modality_groups(config)),
        "tool_use": _tool_use(config, rows, scores),
        "counts": _counts(rows, len(planned)),
    }
    complete = len(rows) == len(planned)
    return {
        "schema": SUMMARY_SCHEMA,
        "complete": complete,
        "agent": config.agent.get("spec", ""),
        "label": config.extra.get("label") or _model_name(config.agent) or config.agent.get("spec", ""),
        "config": config.to_dict(),
        "config_hash": config.hash(),
        "comparability_key": config.comparability_key(),
        "versions": {**library_versions(), **dict(versions or {})},
        "results": results,
        "run": dict(run or {}),
    }


def _score_envs(
    config: EvalConfig, rows: list[EpisodeRecord], baselines: Mapping[str, Baseline]
) -> tuple[dict[str, EnvScore], dict[str, Any]]:
    """(the score of each env with rows, the summary entry of every planned env)."""
    by_env: dict[str, list[EpisodeRecord]] = {e.env_id: [] for e in config.envs}
    for r in rows:
        by_env[r.env_id].append(r)
    scores: dict[str, EnvScore] = {}
    envs_out: dict[str, Any] = {}
    for e in config.envs:
        env_rows = by_env[e.env_id]
        entry: dict[str, Any] = {
            "version": e.version,
            "difficulty": e.difficulty,
            "kwargs": e.kwargs,
            "modalities": list(e.modalities),
            "tags": list(e.tags),
        }
        if env_rows:
            # an errored episode scores as a failure: it is counted under "errors", never dropped
            outcomes = TaskOutcomes.from_rows(e.env_id, ((r.seed, r.success and r.error is None) for r in env_rows))
            scores[e.env_id] = score_env(outcomes, baselines.get(e.env_id))
            entry.update(scores[e.env_id].to_dict())
        else:
            entry.update({"success": None, "normalised": None, "episodes": 0})
        entry.update(_env_stats(env_rows))
        envs_out[e.env_id] = entry
    return scores, envs_out


def _suite_scores(config: EvalConfig, scores: dict[str, EnvScore], baselines: Mapping[str, Baseline]) -> dict[str, Any]:
    """The suite's aggregate scores: None until every env has been scored."""
    all_scored = [scores[e.env_id] for e in config.envs if e.env_id in scores]
    every_env = len(all_scored) == len(config.envs)
    suite_success = aggregate(all_scored, normalised=False) if every_env else None
    suite_norm = aggregate(all_scored, normalised=True) if every_env else None
    return {
        "name": config.suite or "custom",
        "success": suite_success.to_dict() if suite_success else None,
        "normalised": suite_norm.to_dict() if suite_norm else None,
        "envs": len(config.envs),
        "baselines": sorted(baselines),
    }


def _tool_use(config: EvalConfig, rows: list[EpisodeRecord], scores: dict[str, EnvScore]) -> dict[str, Any]:
    tool_envs = [e.env_id for e in config.envs if TOOL_TAG in e.tags]
    group = group_scores(scores, {"tools": tool_envs}).get("tools")
    return {
        **(group or {"envs": [], "success": None, "normalised": None}),
        "tool_calls": sum(r.tool_calls for r in rows),
        "episodes_with_tool_calls": sum(r.tool_calls > 0 for r in rows),
    }


def _counts(rows: list[EpisodeRecord], planned: int) -> dict[str, Any]:
    errors = sum(r.error is not None for r in rows)
    return {
        "planned": planned,
        "finished": len(rows) - errors,
        "errors": errors,
        "missing": planned - len(rows),
        "error_types": dict(sorted(Counter(r.error_type or "error" for r in rows if r.error).items())),
    }


# ------------------------------------------------------------------------------------------------
# reading summaries back: the fields leaderboards use, checked before anything renders them
# ------------------------------------------------------------------------------------------------
MAX_TEXT = 500  # characters in a label, agent, suite name, env id or key
MAX_COUNT = 10**12  # episodes, errors, versions
MAX_SCORE = 1e6  # |score|: success rates are in [0, 1], normalised scores near it


class SummaryError(ValueError):
    """A summary that leaderboards cannot use; the message names the source and the field."""


def _short_text(value: str) -> str:
    if len(value) > MAX_TEXT:
        raise ValueError(f"longer than {MAX_TEXT} characters")
    return value


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class _Estimate(_Part):
    value: float = Field(ge=-MAX_SCORE, le=MAX_SCORE)
    low: float = Field(ge=-MAX_SCORE, le=MAX_SCORE)
    high: float = Field(ge=-MAX_SCORE, le=MAX_SCORE)
    n: int = Field(0, ge=0, le=MAX_COUNT)


class _Scores(_Part):
    success: _Estimate | None = None
    normalised: _Estimate | None = None


class _SuiteResult(_Scores):
    name: str = "custom"

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _short_text(value)


class _EnvResult(_Scores):
    version: int | None = Field(None, ge=0, le=MAX_COUNT)
    episodes: int = Field(0, ge=0, le=MAX_COUNT)
    errors: int = Field(0, ge=0, le=MAX_COUNT)


class _GroupResult(_Scores):
    envs: list[str] = Field(default_factory=list)


class _Counts(_Part):
    planned: int = Field(0, ge=0, le=MAX_COUNT)
    missing: int = Field(0, ge=0, le=MAX_COUNT)
    errors: int = Field(0, ge=0, le=MAX_COUNT)


class _Results(_Part):
    suite: _SuiteResult
    envs: dict[str, _EnvResult]
    modalities: dict[str, _GroupResult] = Field(default_factory=dict)
    tool_use: _GroupResult | None = None
    counts: _Counts = Field(default_factory=_Counts)

    @field_validator("envs")
    @classmethod
    def _env_ids(cls, envs: dict[str, _EnvResult]) -> dict[str, _EnvResult]:
        if not envs:
            raise ValueError("no envs")
        for env_id in envs:
            _short_text(env_id)
        return envs


class _Summary(_Part):
    config_hash: str = Field(min_length=1)
    comparability_key: str = Field(min_length=1)
    config: dict[str, Any]
    results: _Results
    complete: bool = False
    agent: str = ""
    label: str | None = None

    @field_validator("config_hash", "comparability_key", "agent", "label")
    @classmethod
    def _texts(cls, value: str | None) -> str | None:
        return value if value is None else _short_text(value)


def validate_summary(data: Any, source: str) -> dict[str, Any]:
    """Check ``data`` (a parsed ``summary.json``) has what leaderboards read, with sane types
    and finite, bounded numbers; returns it with defaults filled in. Raises SummaryError naming
    ``source`` and the first offending fields, never a traceback further down."""
    if not isinstance(data, dict):
        raise SummaryError(f"{source}: not a relax-gym summary (a JSON {type(data).__name__}, not an object)")
    try:
        return _Summary.model_validate(data).model_dump()
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or '<top>'}: {e['msg']}" for e in exc.errors(include_url=False)[:3]
        )
        raise SummaryError(f"{source}: not a valid relax-gym summary ({problems})") from None


__all__ = [
    "MODALITY_GROUPS",
    "SUMMARY_SCHEMA",
    "SummaryError",
    "build_summary",
    "library_versions",
    "modality_groups",
    "validate_summary",
]
