"""The results index: every indexed run's summary in one SQLite file (the embedded default store).

Runs are keyed by their config hash and folder, so re-indexing a folder after ``--resume``
updates its row instead of duplicating it. The full ``summary.json`` is stored with the few
columns leaderboards filter and sort on, so a board renders from the database alone, even
after the run folders are gone.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .summary import SummaryError, validate_summary

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id            TEXT PRIMARY KEY,
    path              TEXT NOT NULL,
    label             TEXT NOT NULL,
    agent             TEXT NOT NULL,
    suite             TEXT NOT NULL,
    comparability_key TEXT NOT NULL,
    config_hash       TEXT NOT NULL,
    complete          INTEGER NOT NULL,
    score             REAL,
    success           REAL,
    episodes          INTEGER NOT NULL,
    errors            INTEGER NOT NULL,
    indexed_at        TEXT NOT NULL,
    summary           TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_suite ON runs (suite, comparability_key);
CREATE TABLE IF NOT EXISTS env_scores (
    run_id     TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    env_id     TEXT NOT NULL,
    success    REAL,
    normalised REAL,
    episodes   INTEGER NOT NULL,
    errors     INTEGER NOT NULL,
    PRIMARY KEY (run_id, env_id)
);
"""


MAX_SUMMARY_BYTES = 64 << 20  # a real summary is kilobytes; refuse to load anything near this


class StoreError(ValueError):
    """A run folder or summary that cannot be indexed (the message names the file)."""


def _read_bounded(path: Path) -> bytes:
    """A regular file's bytes, refusing devices and FIFOs (which could block or never end) and
    anything over MAX_SUMMARY_BYTES."""
    if path.exists() and not path.is_file():
        raise StoreError(f"{path}: not a regular file")
    with path.open("rb") as f:
        data = f.read(MAX_SUMMARY_BYTES + 1)
    if len(data) > MAX_SUMMARY_BYTES:
        raise StoreError(f"{path}: larger than the {MAX_SUMMARY_BYTES >> 20} MiB a summary may have")
    return data


def load_summary(run_dir: str | Path) -> dict[str, Any]:
    """Read and check ``RUN_DIR/summary.json``; any problem is one StoreError naming the file."""
    path = Path(run_dir) / "summary.json"
    try:
        summary = json.loads(_read_bounded(path).decode("utf-8"))
    except FileNotFoundError:
        raise StoreError(f"{run_dir}: no summary.json (not an eval run folder, or the run never started)") from None
    except (OSError, ValueError, RecursionError) as exc:  # ValueError covers bad JSON and bad UTF-8
        raise StoreError(f"{path}: unreadable ({type(exc).__name__}: {str(exc)[:200]})") from None
    try:
        return validate_summary(summary, str(path))
    except SummaryError as exc:
        raise StoreError(str(exc)) from None


def run_id(summary: dict[str, Any], path: str) -> str:
    return f"{summary['config_hash']}-{hashlib.sha256(path.encode()).hexdigest()[:8]}"


class ResultsStore:
    """A SQLite file of indexed runs."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.executescript(SCHEMA)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=30)
        try:
            db.execute("PRAGMA foreign_keys = ON")
            yield db
            db.commit()
        finally:
            db.close()

    def add(self, summary: dict[str, Any], path: str | Path) -> str:
        """Index (or re-index) one run; returns its run id."""
        where = str(Path(path).resolve())
        rid = run_id(summary, where)
        res = summary["results"]
        suite = res["suite"]
        counts = res.get("counts", {})
        with self._connect() as db:
            db.execute("DELETE FROM runs WHERE run_id = ?", (rid,))
            db.execute(
                "INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    rid,
                    where,
                    str(summary.get("label") or summary.get("agent") or ""),
                    str(summary.get("agent", "")),
                    str(suite.get("name", "custom")),
                    summary["comparability_key"],
                    summary["config_hash"],
                    int(bool(summary.get("complete"))),
                    (suite.get("normalised") or {}).get("value"),
                    (suite.get("success") or {}).get("value"),
                    int(counts.get("planned", 0)) - int(counts.get("missing", 0)),
                    int(counts.get("errors", 0)),
                    datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    json.dumps(summary, sort_keys=True),
                ),
            )
            db.executemany(
                "INSERT INTO env_scores VALUES (?,?,?,?,?,?)",
                [
                    (
                        rid,
                        env_id,
                        (e.get("success") or {}).get("value"),
                        (e.get("normalised") or {}).get("value"),
                        int(e.get("episodes", 0)),
                        int(e.get("errors", 0)),
                    )
                    for env_id, e in res["envs"].items()
                ],
            )
        return rid

    def add_folder(self, run_dir: str | Path) -> str:
        return self.add(load_summary(run_dir), run_dir)

    def remove(self, rid: str) -> bool:
        with self._connect() as db:
            return db.execute("DELETE FROM runs WHERE run_id = ?", (rid,)).rowcount > 0

    def summaries(
        self, *, suite: str | None = None, run_ids: list[str] | None = None, problems: list[str] | None = None
    ) -> list[dict[str, Any]]:
        """Stored summaries (with ``_run_id`` and ``_path`` added), oldest first. A stored row
        that no longer reads as a summary (an older or edited index) is left out and described
        in ``problems``."""
        query = "SELECT run_id, path, summary FROM runs"
        clauses, params = [], []
        if suite is not None:
            clauses.append("suite = ?")
            params.append(suite)
        if run_ids is not None:
            clauses.append(f"run_id IN ({','.join('?' * len(run_ids))})")
            params.extend(run_ids)
        if clauses:
            query += " WHERE " + " AND ".join(clauses)
        query += " ORDER BY indexed_at, run_id"
        with self._connect() as db:
            rows = db.execute(query, params).fetchall()
        out = []
        for rid, where, text in rows:
            try:
                summary = validate_summary(json.loads(text), f"{self.path} (run {rid})")
            except (SummaryError, ValueError, RecursionError) as exc:
                if problems is not None:
                    problems.append(str(exc) if isinstance(exc, SummaryError) else f"{self.path} (run {rid}): {exc}")
                continue
            out.append({**summary, "_run_id": rid, "_path": where})
        return out

    def rows(self) -> list[dict[str, Any]]:
        """The index columns of every run (for listings)."""
        with self._connect() as db:
            db.row_factory = sqlite3.Row
            return [
                dict(r)
                for r in db.execute(
                    "SELECT run_id, label, agent, suite, comparability_key, complete, score, success, episodes, "
                    "errors, path FROM runs ORDER BY suite, score DESC"
                )
            ]


__all__ = ["ResultsStore", "StoreError", "load_summary", "run_id"]
