"""TrajectoryQueue: whole groups, per-sample staleness, exactly-once, bounds, checkpoints, annotations."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch
from relax_gym.trainer.algorithms import AlgorithmConfig
from relax_gym.trainer.algorithms.batching import ScoredSample, attach_advantages, to_sequence_batch
from relax_gym.trainer.modes.trajectory_queue import (
    QueuedGroup,
    QueuedSample,
    QueueError,
    QueueTimeout,
    TrajectoryQueue,
    groups_from_trajectories,
    groups_to_trajectories,
)
from relax_gym.trainer.rollout import Trajectory, load_jsonl, save_jsonl


def make_traj(episode: str, versions: list[int], *, prompt: int = 3, group: str = "g") -> Trajectory:
    """A trajectory whose sampled tokens carry ``versions`` (one token per entry)."""
    n = prompt + len(versions)
    return Trajectory(
        token_ids=[5 + (i % 7) for i in range(n)], loss_mask=[0] * prompt + [1] * len(versions),
        rollout_logprobs=[0.0] * prompt + [-0.5] * len(versions), weight_versions=[-1] * prompt + list(versions),
        prompt_length=prompt, episode_id=episode, group_id=group, env_id="t/Env-v0", seed=1,
    )


def make_group(gid: str, versions: list[list[int]], rewards: list[float] | None = None) -> QueuedGroup:
    rewards = rewards or [float(i) for i in range(len(versions))]
    return QueuedGroup(gid, [QueuedSample(make_traj(f"{gid}-{i}", v, group=gid), r)
                             for i, (v, r) in enumerate(zip(versions, rewards, strict=True))])


def test_min_version_counts_only_sampled_tokens() -> None:
    s = QueuedSample(make_traj("e", [4, 4, 5]), 1.0)
    assert (s.min_version, s.max_version) == (4, 5)


async def test_groups_come_out_whole_and_once() -> None:
    q = TrajectoryQueue(capacity=8, max_staleness=0)
    for k in range(3):
        await q.put(make_group(f"g{k}", [[0, 0], [0], [0, 0, 0]]))
    batch = await q.get_batch(2, timeout_s=1)
    assert [len(g) for g in batch.groups] == [3, 3]
    assert all(all(a) for a in batch.admitted)
    rest = await q.get_batch(1, timeout_s=1)
    ids = [g.group_id for g in batch.groups + rest.groups]
    assert sorted(ids) == ["g0", "g1", "g2"]
    with pytest.raises(QueueTimeout):
        await q.get_batch(1, timeout_s=0.05)
    with pytest.raises(QueueError, match="already queued once"):
        q.put_nowait(make_group("g1", [[0]]))
    assert q.counts["duplicate_groups_refused"] == 1
    q.check()


def test_per_sample_staleness_admission_and_eviction() -> None:
    q = TrajectoryQueue(capacity=8, max_staleness=1, version=3)
    # sample 0 fully at v3, sample 1 straddles v1..v3 (min 1), sample 2 at v2
    q.put_nowait(make_group("mixed", [[3, 3], [1, 2, 3], [2, 2]]))
    q.put_nowait(make_group("old", [[0, 1], [1]]))
    q.put_nowait(make_group("new", [[3], [3]]))
    batch = q.take_nowait(2)
    assert batch is not None
    by_id = {g.group_id: (a, s) for g, a, s in zip(batch.groups, batch.admitted, batch.staleness, strict=True)}
    assert by_id["mixed"] == ([True, False, True], [0, 2, 1])  # admitted iff 3 - min(versions) <= 1
    assert "old" not in by_id  # nothing admissible: evicted before it could be chosen
    assert q.counts["evicted_groups"] == 1 and q.counts["dropped_stale_samples"] == 2 + 1  # old (2) + mixed's one
    assert q.counts["trained_samples"] == 2 + 2
    q.check()
    # advancing the version evicts what can never be trained
    q.put_nowait(make_group("later", [[3]]))
    assert q.set_version(5) == ["later"]
    assert q.dropped_groups() == 2
    q.check()


def test_correct_policy_admits_stale_samples_and_counts_them() -> None:
    q = TrajectoryQueue(capacity=4, max_staleness=0, stale_policy="correct", version=2)
    q.put_nowait(make_group("g", [[2], [0, 2], [1]]))
    batch = q.take_nowait(1)
    assert batch is not None and batch.admitted == [[True, True, True]]
    assert batch.staleness == [[0, 2, 1]]
    assert q.counts["corrected_stale_samples"] == 2 and q.counts["dropped_stale_samples"] == 0


async def test_put_waits_while_full_then_proceeds() -> None:
    q = TrajectoryQueue(capacity=2, max_staleness=0)
    await q.put(make_group("a", [[0]]))
    await q.put(make_group("b", [[0]]))
    blocked = asyncio.create_task(q.put(make_group("c", [[0]])))
    await asyncio.sleep(0.05)
    assert not blocked.done() and len(q) == 2
    await q.get_batch(1, timeout_s=1)
    await asyncio.wait_for(blocked, 1)
    assert len(q) == 2 and q.counts["put_waits"] >= 1
    with pytest.raises(QueueTimeout):
        await q.put(make_group("d", [[0]]), timeout_s=0.05)


async def test_exactly_once_under_concurrent_producers_and_version_changes() -> None:
    """Random interleaving: 4 producers, a trainer advancing versions; every sample is either
    trained once, dropped as stale once, or still queued -- never twice, never lost."""
    rng = random.Random(7)
    q = TrajectoryQueue(capacity=6, max_staleness=1)
    produced: set[str] = set()
    trained: list[str] = []

    async def producer(p: int) -> None:
        for k in range(15):
            v = q.version
            versions = [[max(0, v - rng.randint(0, 2))] * rng.randint(1, 3) for _ in range(rng.randint(1, 4))]
            group = make_group(f"p{p}-{k}", versions)
            produced.update(s.sample_id for s in group.samples)
            await q.put(group, timeout_s=10)
            await asyncio.sleep(rng.random() * 0.002)

    async def trainer() -> None:
        while True:
            try:
                batch = await q.get_batch(2, timeout_s=0.3)
            except QueueTimeout:
                return
            trained.extend(s.sample_id for s in batch.admitted_samples())
            for marks, ok in zip(batch.staleness, batch.admitted, strict=True):
                assert all(m <= 1 for m, a in zip(marks, ok, strict=True) if a)
            await q.advance(q.version + 1)
            q.check()

    await asyncio.gather(trainer(), *(producer(p) for p in range(4)))
    assert len(trained) == len(set(trained))
    left = {s.sample_id for g in q.snapshot()[0] for s in g.samples}
    c = q.counts
    assert c["produced_samples"] == len(produced) == c["trained_samples"] + c["dropped_stale_samples"] + len(left)
    assert c["trained_samples"] == len(trained)
    assert set(trained) <= produced and not (set(trained) & left)


def test_grpo_statistics_are_per_group_whatever_travels_together() -> None:
    """Relax once normalised across groups of a transfer batch; ours are per group id."""
    a = make_group("a", [[0, 0]] * 4, rewards=[0.0, 1.0, 1.0, 0.0])
    b = make_group("b", [[0, 0]] * 4, rewards=[10.0, 30.0, 20.0, 40.0])
    config = AlgorithmConfig(advantage_estimator="grpo")

    def advantages(groups: list[QueuedGroup]) -> dict[str, float]:
        samples = [s for g in groups for s in g.samples]
        batch = to_sequence_batch([ScoredSample(s.traj, s.reward) for s in samples], None)
        attach_advantages(batch, [s.reward for s in samples], config)
        assert batch.advantages is not None
        return {s.sample_id: float(adv[torch.tensor(s.traj.loss_mask, dtype=torch.bool)].mean())
                for s, adv in zip(samples, batch.advantages, strict=True)}

    together = advantages([a, b])
    assert together == pytest.approx({**advantages([a]), **advantages([b])}, abs=1e-6)
    assert sum(together[f"b-{i}/0"] for i in range(4)) == pytest.approx(0.0, abs=1e-6)  # centred within b
    assert max(abs(together[f"a-{i}/0"]) for i in range(4)) < 1.0  # not drowned by b's scale


def test_snapshot_round_trips_through_a_checkpoint_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    q = TrajectoryQueue(capacity=8, max_staleness=2, version=4)
    q.put_nowait(make_group("x", [[3, 4], [2]], rewards=[0.25, 0.75]))
    q.put_nowait(make_group("y", [[4]], rewards=[1.0]))
    q.take_nowait(0)
    groups, state = q.snapshot()
    path = save_jsonl(groups_to_trajectories(groups), tmp_path / "buffer.jsonl")
    restored = groups_from_trajectories(load_jsonl(path))
    assert "relax_queue" not in restored[0].samples[0].traj.metadata
    q2 = TrajectoryQueue(capacity=8, max_staleness=2)
    q2.restore(restored, state)
    assert q2.version == 4 and q2.counts == q.counts and len(q2) == 2
    assert [(s.sample_id, s.reward, s.min_version) for g in restored for s in g.samples] == [
        ("x-0/0", 0.25, 3), ("x-1/0", 0.75, 2), ("y-0/0", 1.0, 4)]
    with pytest.raises(QueueError):
        q2.put_nowait(make_group("x", [[4]]))  # still exactly once after a restore
    batch = q2.take_nowait(2)
    assert batch is not None and batch.num_admitted == 3
    q2.check()


def test_logprob_annotations_claim_and_versions() -> None:
    q = TrajectoryQueue(capacity=4, max_staleness=3, version=2)
    q.put_nowait(make_group("g", [[2], [2, 2]]))
    claimed = q.claim("ref", 4)
    assert [g.group_id for g in claimed] == ["g"]
    assert q.claim("ref", 4) == []  # claimed already
    rows = {s.sample_id: [0.0] * len(s.traj.token_ids) for s in claimed[0].samples}
    assert q.annotate("ref", "g", rows) == 2
    assert q.claim("ref", 4) == []  # nothing left to do
    # proximal: annotated at version 2, needed again once the worker has version 3
    assert q.claim("prox", 4, version=2)[0].group_id == "g"
    q.annotate("prox", "g", rows, version=2)
    assert q.claim("prox", 4, version=2) == []
    assert q.claim("prox", 4, version=3)[0].group_id == "g"
    with pytest.raises(QueueError, match="values for"):
        q.annotate("ref", "g", {"g-0/0": [0.0]})
    q.take_nowait(1)
    assert q.annotate("prox", "g", rows, version=3) == 0 and q.counts["prox_annotations_late"] == 1
