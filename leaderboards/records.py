"""The rows an evaluation writes: one :class:`EpisodeRecord` per episode in ``episodes.jsonl``.

An episode is identified by its key ``(env_id, seed, attempt)``; the same key always replays the
same task (the seed) and the same agent randomness (the attempt), which is what makes ``--resume``
and reruns comparable. Reading is tolerant: a torn last line (the process was killed mid-write)
is reported and skipped, never fatal, so a resumed run simply redoes that episode.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

EpisodeKeyTuple = tuple[str, int, int]


class EpisodeRecord(BaseModel):
    """One evaluated episode, as written to ``episodes.jsonl``."""

    model_config = ConfigDict(populate_by_name=True, extra="allow")

    env_id: str
    env_version: int | None = None
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    seed: int
    index: int = 0
    attempt: int = 0
    agent: str = ""
    success: bool = False
    return_: float = Field(0.0, alias="return")
    reward_components: dict[str, float] = Field(default_factory=dict)
    turns: int = 0
    terminated: bool = False
    truncated: bool = False
    context_exhausted: bool = False  # truncated because the conversation filled the model's context
    tool_calls: int = 0
    invalid_actions: int = 0
    parse_errors: int = 0
    media_errors: int = 0  # corrupt or over-budget clips replaced by an error text
    prompt_tokens: int = 0
    completion_tokens: int = 0
    media_sent: dict[str, int] = Field(default_factory=dict)
    wall_s: float = 0.0
    error: str | None = None
    error_type: str | None = None
    transcript: str | None = None

    @property
    def key(self) -> EpisodeKeyTuple:
        return (self.env_id, self.seed, self.attempt)

    @property
    def finished(self) -> bool:
        """A finished episode ran to its end without an error (``--resume`` keeps it)."""
        return self.error is None

    def to_json(self) -> str:
        return json.dumps(self.model_dump(by_alias=True, mode="json"), ensure_ascii=False, sort_keys=True)


def key_slug(key: EpisodeKeyTuple) -> str:
    """A file-name-safe name for an episode key (used for its transcript)."""
    env_id, seed, attempt = key
    return f"{re.sub(r'[^A-Za-z0-9._-]+', '_', env_id)}/s{seed}-a{attempt}"


def read_records(
    path: str | Path, *, problems: list[str] | None = None, bad_lines: list[str] | None = None
) -> list[EpisodeRecord]:
    """Read ``episodes.jsonl``; bad lines are described in ``problems`` and kept verbatim in
    ``bad_lines`` (when given) instead of raising."""
    p = Path(path)
    if not p.exists():
        return []
    out: list[EpisodeRecord] = []
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(EpisodeRecord.model_validate(json.loads(line)))
            except (ValueError, TypeError) as exc:
                if problems is not None:
                    problems.append(f"{p}:{lineno}: unreadable row skipped ({type(exc).__name__})")
                if bad_lines is not None:
                    bad_lines.append(line.rstrip("\n"))
    return out


def latest_by_key(records: Iterable[EpisodeRecord]) -> dict[EpisodeKeyTuple, EpisodeRecord]:
    """The last row written for each key (a retried episode supersedes its earlier error)."""
    out: dict[EpisodeKeyTuple, EpisodeRecord] = {}
    for r in records:
        out[r.key] = r
    return out


def sorted_records(records: Iterable[EpisodeRecord]) -> list[EpisodeRecord]:
    return sorted(records, key=lambda r: r.key)


def write_records_atomic(path: str | Path, records: Iterable[EpisodeRecord]) -> None:
    """Rewrite a JSONL file through a temporary file, so a crash leaves the old one intact."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(r.to_json() + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)


class RecordWriter:
    """Appends rows to ``episodes.jsonl`` one line at a time, flushed, so progress survives a kill."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._f = self.path.open("a", encoding="utf-8")

    def write(self, record: EpisodeRecord) -> None:
        self._f.write(record.to_json() + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    with Path(path).open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


__all__ = [
    "EpisodeKeyTuple",
    "EpisodeRecord",
    "RecordWriter",
    "key_slug",
    "latest_by_key",
    "read_records",
    "sorted_records",
    "write_records_atomic",
]
