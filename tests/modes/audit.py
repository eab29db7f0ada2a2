"""Audit a finished async run from its files alone: the ledger (what each step trained), the
final checkpoint (what was still queued or pending, and the producer's and queue's counters)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relax_gym.trainer.checkpoint import latest_checkpoint
from relax_gym.trainer.modes.learner import read_ledger
from relax_gym.trainer.modes.trajectory_queue import groups_from_trajectories
from relax_gym.trainer.rollout import load_jsonl


@dataclass
class Audit:
    ledger: list[dict[str, Any]]
    trained: list[str]  # sample ids, in training order
    trained_groups: list[str]
    producer: dict[str, Any]
    queue: dict[str, Any]
    leftover_groups: list[str]  # still queued at the end
    leftover_samples: int
    pending_groups: list[str]  # drawn, not finished at the end

    @property
    def produced_samples(self) -> int:
        return int(self.producer["counts"].get("produced_samples", 0))

    @property
    def dropped_samples(self) -> int:
        """Dropped before the queue (failed episodes/rewards, zero variance) or for staleness."""
        return int(self.producer["counts"].get("dropped_samples", 0)) + int(
            self.queue["counts"].get("dropped_stale_samples", 0))


def draw_number(group_id: str) -> int:
    match = re.match(r"a:(\d+):", group_id)
    assert match, f"unexpected group id {group_id!r}"
    return int(match.group(1))


def audit_run(out: Path, max_staleness: int) -> Audit:
    """Check the exactly-once and staleness invariants of a finished run; returns the figures."""
    ledger = read_ledger(out)
    folder = latest_checkpoint(out)
    assert folder is not None, "the run left no checkpoint"
    state = json.loads((folder / "trainer_state.json").read_text())
    extra = state["extra"]["async"]
    producer, queue = extra["producer"], extra["queue"]
    groups = groups_from_trajectories(load_jsonl(folder / "buffer.jsonl")) if (folder / "buffer.jsonl").is_file() else []
    trained = [sid for r in ledger for sid in r["trained"]]
    trained_groups = [g for r in ledger for g in r["groups"]]
    a = Audit(ledger, trained, trained_groups, producer, queue, [g.group_id for g in groups],
              sum(len(g) for g in groups), [p["group_id"] for p in producer["pending"]])
    # steps are consecutive and each trains under the version the staleness refers to
    assert [r["step"] for r in ledger] == list(range(1, len(ledger) + 1))
    for r in ledger:
        for st, oldest in zip(r["staleness"], r["min_versions"], strict=True):
            assert st == r["version"] - oldest, r
            assert 0 <= st <= max_staleness, f"step {r['step']} trained a sample {st} versions old"
    # exactly once: no sample or group trained twice ...
    assert len(trained) == len(set(trained))
    assert len(trained_groups) == len(set(trained_groups))
    # ... every drawn group is in exactly one place ...
    places = [trained_groups, queue["evicted_ids"], producer["dropped_ids"], a.leftover_groups, a.pending_groups]
    everywhere = [g for place in places for g in place]
    assert len(everywhere) == len(set(everywhere)), "a group is in two places"
    drawn = state["sampler"]["drawn"]
    assert sorted(draw_number(g) for g in everywhere) == list(range(1, drawn + 1)), "a drawn group went missing"
    # ... and trained samples == produced - dropped (- what is still queued)
    assert len(trained) == a.produced_samples - a.dropped_samples - a.leftover_samples
    assert int(queue["counts"].get("trained_samples", 0)) == len(trained)
    return a
