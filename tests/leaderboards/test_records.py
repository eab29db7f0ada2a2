"""Episode rows: JSON round trip (``return`` alias) and tolerant reading."""

from __future__ import annotations

import json
from pathlib import Path

from relax_gym.leaderboards.records import (
    EpisodeRecord,
    RecordWriter,
    key_slug,
    latest_by_key,
    read_records,
    write_records_atomic,
)


def test_round_trip_uses_the_field_names_of_the_issue(tmp_path: Path) -> None:
    rec = EpisodeRecord(
        env_id="ns/E-v1",
        env_version=1,
        seed=5,
        attempt=2,
        success=True,
        **{"return": 1.5},
        reward_components={"correct": 1.0},
        media_sent={"image": 2},
        error=None,
    )
    with RecordWriter(tmp_path / "e.jsonl") as w:
        w.write(rec)
    row = json.loads((tmp_path / "e.jsonl").read_text())
    for field in (
        "env_id",
        "env_version",
        "seed",
        "attempt",
        "success",
        "return",
        "reward_components",
        "turns",
        "tool_calls",
        "invalid_actions",
        "parse_errors",
        "prompt_tokens",
        "completion_tokens",
        "wall_s",
        "error",
        "transcript",
    ):
        assert field in row, field
    back = read_records(tmp_path / "e.jsonl")
    assert back == [rec] and back[0].return_ == 1.5 and back[0].key == ("ns/E-v1", 5, 2)


def test_torn_and_garbage_lines_are_reported_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    good = EpisodeRecord(env_id="a", seed=1)
    path.write_text(good.to_json() + "\n" + '{"env_id": "a", "se' + "\n" + "[1, 2]\n" + good.to_json() + "\n")
    problems: list[str] = []
    rows = read_records(path, problems=problems)
    assert len(rows) == 2 and len(problems) == 2
    assert all("unreadable row skipped" in p for p in problems)


def test_latest_row_per_key_wins_and_atomic_rewrite(tmp_path: Path) -> None:
    first = EpisodeRecord(env_id="a", seed=1, error="boom")
    second = EpisodeRecord(env_id="a", seed=1, success=True)
    latest = latest_by_key([first, second])
    assert list(latest.values()) == [second] and second.finished and not first.finished
    path = tmp_path / "e.jsonl"
    write_records_atomic(path, [second])
    assert read_records(path) == [second]
    assert not (tmp_path / "e.jsonl.tmp").exists()


def test_key_slug_is_a_safe_relative_path() -> None:
    assert key_slug(("relax/Maze v0:x", 12, 3)) == "relax_Maze_v0_x/s12-a3"
