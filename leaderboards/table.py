"""From run summaries to leaderboard tables: group comparable runs, pick the metric, rank.

Runs are ranked together only when they evaluated the same suite on the same envs (ids,
versions, kwargs, difficulty, turn limits) -- the summary's ``comparability_key``. Runs that
differ get their own table, with a note saying so; incomplete runs (stopped before every
episode ran) are listed but not ranked. The metric is the normalised score when every run of
a table has one (all envs had baselines), else the raw success rate.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

MODALITY_ORDER = ("text", "image", "audio", "video")


@dataclass(frozen=True)
class Cell:
    """A score with its 95% CI (``value`` None when there is no score)."""

    value: float | None
    low: float | None = None
    high: float | None = None

    @classmethod
    def of(cls, est: dict[str, Any] | None) -> Cell:
        if not est:
            return cls(None)
        return cls(float(est["value"]), float(est["low"]), float(est["high"]))

    def text(self, digits: int = 3) -> str:
        if self.value is None:
            return "–"
        if self.low is None or self.high is None:
            return f"{self.value:.{digits}f}"
        return f"{self.value:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


@dataclass
class Row:
    label: str
    agent: str
    run_id: str
    config_hash: str
    score: Cell
    success: Cell
    modalities: dict[str, Cell]
    tools: Cell | None
    envs: dict[str, Cell]
    episodes: int
    errors: int
    complete: bool
    rank: int = 0


@dataclass
class Group:
    suite: str
    key: str
    envs: list[str]
    env_versions: dict[str, str]
    metric: str  # "normalised" or "success"
    modality_columns: list[str]
    has_tools: bool
    rows: list[Row] = field(default_factory=list)
    unranked: list[Row] = field(default_factory=list)

    @property
    def metric_label(self) -> str:
        return "normalised score" if self.metric == "normalised" else "success rate"


def _row(summary: dict[str, Any], metric: str) -> Row:
    res = summary["results"]
    suite = res["suite"]
    counts = res.get("counts", {})
    pick = "normalised" if metric == "normalised" else "success"
    tool = res.get("tool_use") or {}
    return Row(
        label=str(summary.get("label") or summary.get("agent") or "?"),
        agent=str(summary.get("agent", "")),
        run_id=str(summary.get("_run_id") or summary["config_hash"]),
        config_hash=str(summary["config_hash"]),
        score=Cell.of(suite.get(pick)),
        success=Cell.of(suite.get("success")),
        modalities={m: Cell.of(g.get(pick)) for m, g in res.get("modalities", {}).items()},
        tools=Cell.of(tool.get(pick)) if tool.get("envs") else None,
        envs={env_id: Cell.of(e.get(pick)) for env_id, e in res["envs"].items()},
        episodes=int(counts.get("planned", 0)) - int(counts.get("missing", 0)),
        errors=int(counts.get("errors", 0)),
        complete=bool(summary.get("complete")),
    )


def build_groups(summaries: Iterable[dict[str, Any]]) -> list[Group]:
    """One ranked group per (suite, comparability key), suites in name order."""
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for s in summaries:
        suite = s["results"]["suite"].get("name", "custom")
        by_key.setdefault((suite, s["comparability_key"]), []).append(s)
    groups: list[Group] = []
    for (suite, key), members in sorted(by_key.items(), key=lambda kv: (kv[0][0], -len(kv[1]), kv[0][1])):
        complete = [m for m in members if m.get("complete")]
        ranked_source = complete or members
        metric = (
            "normalised" if complete and all(m["results"]["suite"].get("normalised") for m in complete) else "success"
        )
        first = members[0]
        envs = list(first["results"]["envs"])
        modality_cols = [m for m in MODALITY_ORDER if any(m in s["results"].get("modalities", {}) for s in members)]
        g = Group(
            suite=suite,
            key=key,
            envs=envs,
            env_versions={
                e: f"v{v['version']}" if v.get("version") is not None else "-"
                for e, v in first["results"]["envs"].items()
            },
            metric=metric,
            modality_columns=modality_cols,
            has_tools=any((s["results"].get("tool_use") or {}).get("envs") for s in members),
        )
        rows = [_row(m, metric) for m in ranked_source if m.get("complete")]
        rows.sort(key=lambda r: (-(r.score.value if r.score.value is not None else float("-inf")), r.label))
        rank = 0
        prev: float | None = None
        for i, r in enumerate(rows, 1):
            if r.score.value != prev:
                rank, prev = i, r.score.value
            r.rank = rank
        g.rows = rows
        g.unranked = [_row(m, metric) for m in members if not m.get("complete")]
        groups.append(g)
    return groups


def split_notes(groups: list[Group]) -> list[str]:
    """Human-readable notes on why runs of one suite sit in separate tables."""
    notes = []
    suites: dict[str, list[Group]] = {}
    for g in groups:
        suites.setdefault(g.suite, []).append(g)
    for suite, gs in suites.items():
        if len(gs) > 1:
            notes.append(
                f"{suite}: {len(gs)} tables -- their runs used different env versions or settings "
                "and are not ranked together"
            )
    return notes


__all__ = ["Cell", "Group", "MODALITY_ORDER", "Row", "build_groups", "split_notes"]
