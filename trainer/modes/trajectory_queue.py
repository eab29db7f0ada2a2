"""The trajectory queue: the data plane between rollout and training in the asynchronous modes.

What it guarantees:

* **Groups stay whole.** The unit that goes in and out is a :class:`QueuedGroup` -- every sample
  of one prompt (env seed) -- so GRPO statistics are always computed per group id over the whole
  group, never over whatever happened to travel together.
* **Bounded.** :meth:`TrajectoryQueue.put` waits while ``capacity`` groups are queued.
* **Exactly once.** A group id is accepted once (a second ``put`` of the same id is refused and
  counted); :meth:`~TrajectoryQueue.get_batch` removes what it hands out. The counters keep
  ``produced == trained + dropped_stale + queued`` at every instant (:meth:`~TrajectoryQueue.check`).
* **Per-sample staleness.** A sample's staleness is ``version - min(weight versions of its sampled
  tokens)``, where ``version`` is the weight version the trainer is about to train. Samples over
  ``max_staleness`` are dropped (``stale_policy="drop"``; a group whose every sample is too stale
  is evicted as soon as the version advances) or admitted and flagged for the importance
  correction (``"correct"``). Every one is counted.
* **Checkpointable.** :meth:`~TrajectoryQueue.snapshot` / :meth:`~TrajectoryQueue.restore` move the
  contents and counters through a checkpoint (:func:`groups_to_trajectories` /
  :func:`groups_from_trajectories` carry rewards in the trajectories' metadata).

Logprob workers (reference / proximal policy) annotate queued samples in place through
:meth:`~TrajectoryQueue.claim` and :meth:`~TrajectoryQueue.annotate`, off the trainer's path.

The queue is plain asyncio: the embedded runtime uses it directly; the Ray runtime hosts the same
object in an async actor.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from relax_gym.trainer.rollout import Trajectory

from relax_gym.errors import RelaxGymError

StalePolicy = Literal["drop", "correct"]
AnnotationKind = Literal["ref", "prox"]
_META_KEY = "relax_queue"


class QueueError(RelaxGymError, RuntimeError):
    """The queue was misused (duplicate group, closed queue, timeout)."""


class QueueClosed(QueueError):
    """The queue was closed while a caller waited."""


class QueueTimeout(QueueError, TimeoutError):
    """No batch became ready in time."""


# ------------------------------------------------------------------------------------------------
# samples and groups
# ------------------------------------------------------------------------------------------------
@dataclass
class QueuedSample:
    """A scored trajectory plus what workers attach to it before training."""

    traj: Trajectory
    reward: float
    components: dict[str, float] = field(default_factory=dict)
    ref_logprobs: list[float] | None = None  # reference policy, per token (0 off the mask)
    prox_logprobs: list[float] | None = None  # proximal policy, per token
    prox_version: int | None = None  # weight version the proximal logprobs were computed with

    @property
    def sample_id(self) -> str:
        return f"{self.traj.episode_id}/{self.traj.part}"

    @property
    def min_version(self) -> int:
        """The oldest weight version that sampled one of its tokens (the one staleness counts)."""
        versions = [v for v, m in zip(self.traj.weight_versions, self.traj.loss_mask, strict=True) if m]
        return min(versions) if versions else 0

    @property
    def max_version(self) -> int:
        versions = [v for v, m in zip(self.traj.weight_versions, self.traj.loss_mask, strict=True) if m]
        return max(versions) if versions else 0


@dataclass
class QueuedGroup:
    """Every kept sample of one group (same prompt / env seed), scored."""

    group_id: str
    samples: list[QueuedSample]
    seq: int = -1  # arrival order, set by the queue
    put_version: int = -1  # the trainer version when it arrived
    put_time: float = 0.0

    @property
    def min_version(self) -> int:
        return min(s.min_version for s in self.samples)

    def __len__(self) -> int:
        return len(self.samples)


@dataclass
class Batch:
    """Whole groups for one training step, with each sample's admission verdict.

    ``admitted[g][i]`` says whether sample ``i`` of group ``g`` is trained; non-admitted samples
    still count in their group's advantage statistics (their rewards are real) but carry no loss.
    """

    groups: list[QueuedGroup]
    admitted: list[list[bool]]
    staleness: list[list[int]]
    version: int
    waited_s: float = 0.0

    @property
    def num_samples(self) -> int:
        return sum(len(g) for g in self.groups)

    @property
    def num_admitted(self) -> int:
        return sum(sum(a) for a in self.admitted)

    def admitted_samples(self) -> list[QueuedSample]:
        return [s for g, a in zip(self.groups, self.admitted, strict=True) for s, ok in zip(g.samples, a, strict=True)
                if ok]


# ------------------------------------------------------------------------------------------------
# the queue
# ------------------------------------------------------------------------------------------------
class TrajectoryQueue:
    """Bounded, group-preserving, staleness-aware queue; see the module docstring."""

    def __init__(self, *, capacity: int, max_staleness: int, stale_policy: StalePolicy = "drop",
                 version: int = 0) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        self.capacity = capacity
        self.max_staleness = max_staleness
        self.stale_policy: StalePolicy = stale_policy
        self.version = version
        self._groups: dict[str, QueuedGroup] = {}
        self._seen: set[str] = set()
        self._seq = 0
        self._closed = False
        self._changed: asyncio.Condition | None = None
        self._claims: dict[AnnotationKind, dict[str, int]] = {"ref": {}, "prox": {}}
        self.counts: Counter[str] = Counter()
        self.evicted_ids: list[str] = []  # groups that left untrained (for audits)

    # -- asyncio plumbing (the condition binds to the loop that first uses the queue) ---------------
    @property
    def _cond(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def _notify(self) -> None:
        async with self._cond:
            self._cond.notify_all()

    # -- views ------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._groups)

    @property
    def queued_samples(self) -> int:
        return sum(len(g) for g in self._groups.values())

    def staleness(self, sample: QueuedSample, version: int | None = None) -> int:
        return (self.version if version is None else version) - sample.min_version

    def is_stale(self, sample: QueuedSample, version: int | None = None) -> bool:
        return self.staleness(sample, version) > self.max_staleness

    def stats(self) -> dict[str, float]:
        """Counters and levels, as ``queue/<name>`` metrics."""
        out = {f"queue/{k}": float(v) for k, v in sorted(self.counts.items())}
        out["queue/groups"] = float(len(self._groups))
        out["queue/samples"] = float(self.queued_samples)
        out["queue/version"] = float(self.version)
        return out

    def dropped_groups(self) -> int:
        """Groups that left without being trained (the producer frees their slots)."""
        return self.counts["evicted_groups"]

    def check(self) -> None:
        """Raise unless ``produced == trained + dropped_stale + queued`` (the exactly-once ledger)."""
        c = self.counts
        lhs = c["produced_samples"]
        rhs = c["trained_samples"] + c["dropped_stale_samples"] + self.queued_samples
        if lhs != rhs:
            raise QueueError(f"queue accounting broken: produced {lhs} != trained {c['trained_samples']} + "
                             f"dropped {c['dropped_stale_samples']} + queued {self.queued_samples}")

    # -- producer side ------------------------------------------------------------------------------
    def put_nowait(self, group: QueuedGroup) -> None:
        """Add a whole group now (raises :class:`QueueError` when full, closed or a duplicate)."""
        if self._closed:
            raise QueueClosed("the queue is closed")
        if not group.samples:
            raise QueueError(f"group {group.group_id!r} has no samples")
        if group.group_id in self._seen:
            self.counts["duplicate_groups_refused"] += 1
            raise QueueError(f"group {group.group_id!r} was already queued once; refusing it again")
        if len(self._groups) >= self.capacity:
            raise QueueError(f"the queue is full ({self.capacity} groups)")
        self._seen.add(group.group_id)
        group.seq = self._seq
        self._seq += 1
        group.put_version = self.version
        group.put_time = time.monotonic()
        self._groups[group.group_id] = group
        self.counts["produced_groups"] += 1
        self.counts["produced_samples"] += len(group)

    async def try_put(self, group: QueuedGroup) -> bool:
        """Add a whole group if there is room; False when the queue is full."""
        if len(self._groups) >= self.capacity and not self._closed:
            self.counts["put_waits"] += 1
            return False
        self.put_nowait(group)
        await self._notify()
        return True

    async def wait_for_space(self, *, timeout_s: float | None = None) -> bool:
        """Wait until the queue has room (or ``timeout_s`` passes); True if it has room."""
        async with self._cond:
            try:
                await asyncio.wait_for(self._cond.wait_for(lambda: len(self._groups) < self.capacity or self._closed),
                                       timeout_s)
            except TimeoutError:
                pass
            return len(self._groups) < self.capacity

    async def put(self, group: QueuedGroup, *, timeout_s: float | None = None) -> None:
        """Add a whole group, waiting while the queue is full."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        async with self._cond:
            while len(self._groups) >= self.capacity and not self._closed:
                self.counts["put_waits"] += 1
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise QueueTimeout(f"the queue stayed full ({self.capacity} groups) for {timeout_s} s")
                try:
                    await asyncio.wait_for(self._cond.wait(), remaining)
                except TimeoutError:
                    continue
            self.put_nowait(group)
            self._cond.notify_all()

    # -- trainer side -------------------------------------------------------------------------------
    def set_version(self, version: int) -> list[str]:
        """The trainer moved to ``version``: evict groups with no admissible sample left (drop
        policy). Returns the evicted group ids."""
        if version < self.version:
            raise QueueError(f"version went back from {self.version} to {version}")
        self.version = version
        evicted: list[str] = []
        if self.stale_policy == "drop":
            for gid, group in list(self._groups.items()):
                if all(self.is_stale(s) for s in group.samples):
                    del self._groups[gid]
                    self._release_claims(gid)
                    self.counts["evicted_groups"] += 1
                    self.counts["dropped_stale_samples"] += len(group)
                    evicted.append(gid)
        self.evicted_ids.extend(evicted)
        return evicted

    async def advance(self, version: int) -> list[str]:
        """:meth:`set_version` and wake waiters (space may have been freed)."""
        evicted = self.set_version(version)
        await self._notify()
        return evicted

    def _ready(self) -> list[QueuedGroup]:
        """Groups with at least one admissible sample, oldest first."""
        groups = sorted(self._groups.values(), key=lambda g: (g.min_version, g.seq))
        if self.stale_policy == "correct":
            return groups
        return [g for g in groups if any(not self.is_stale(s) for s in g.samples)]

    def take_nowait(self, n_groups: int) -> Batch | None:
        """``n_groups`` whole groups admitted at the current version, or None if not enough are ready."""
        if self.stale_policy == "drop":
            self.set_version(self.version)  # evict what can never be admitted
        ready = self._ready()
        if len(ready) < n_groups:
            return None
        chosen = ready[:n_groups]
        admitted, staleness = [], []
        for group in chosen:
            del self._groups[group.group_id]
            self._release_claims(group.group_id)
            marks = [self.staleness(s) for s in group.samples]
            ok = [m <= self.max_staleness or self.stale_policy == "correct" for m in marks]
            admitted.append(ok)
            staleness.append(marks)
            n_ok = sum(ok)
            self.counts["consumed_groups"] += 1
            self.counts["trained_samples"] += n_ok
            self.counts["dropped_stale_samples"] += len(ok) - n_ok
            if self.stale_policy == "correct":
                self.counts["corrected_stale_samples"] += sum(m > self.max_staleness for m in marks)
        return Batch(chosen, admitted, staleness, self.version)

    async def get_batch(self, n_groups: int, *, timeout_s: float | None = None) -> Batch:
        """Wait until ``n_groups`` admissible groups are queued and take them (oldest first)."""
        start = time.monotonic()
        deadline = None if timeout_s is None else start + timeout_s
        async with self._cond:
            while True:
                batch = self.take_nowait(n_groups)
                if batch is not None:
                    batch.waited_s = time.monotonic() - start
                    self._cond.notify_all()  # space for the producer
                    return batch
                if self._closed:
                    raise QueueClosed("the queue was closed while the trainer waited for a batch")
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise QueueTimeout(f"no batch of {n_groups} groups within {timeout_s} s "
                                       f"({len(self._groups)} groups queued at version {self.version})")
                try:
                    await asyncio.wait_for(self._cond.wait(), None if remaining is None else min(remaining, 5.0))
                except TimeoutError:
                    continue

    async def next_batch(self, n_groups: int, *, timeout_s: float) -> Batch | None:
        """:meth:`get_batch`, but None when nothing is ready in time (no exception to carry
        across processes: the caller checks the producer's health and asks again)."""
        try:
            return await self.get_batch(n_groups, timeout_s=timeout_s)
        except QueueTimeout:
            return None

    async def close(self) -> None:
        self._closed = True
        await self._notify()

    # -- logprob workers ----------------------------------------------------------------------------
    def _needs(self, kind: AnnotationKind, sample: QueuedSample, version: int) -> bool:
        if kind == "ref":
            return sample.ref_logprobs is None
        return sample.prox_version is None or sample.prox_version < version

    def claim(self, kind: AnnotationKind, max_groups: int, *, version: int = 0) -> list[QueuedGroup]:
        """Groups (oldest first) with samples still needing ``kind`` logprobs, not claimed by
        another worker at this version. ``version`` is the worker's weight version (prox)."""
        out: list[QueuedGroup] = []
        claims = self._claims[kind]
        for group in sorted(self._groups.values(), key=lambda g: (g.min_version, g.seq)):
            if len(out) >= max_groups:
                break
            if claims.get(group.group_id, -1) >= version and group.group_id in claims:
                continue
            if any(self._needs(kind, s, version) for s in group.samples):
                claims[group.group_id] = version
                out.append(group)
        return out

    def annotate(self, kind: AnnotationKind, group_id: str, values: dict[str, list[float]], *,
                 version: int = 0) -> int:
        """Attach per-token logprobs (``sample_id -> values``) to a queued group; returns how many
        samples took them (0 when the group was already trained: counted as late)."""
        group = self._groups.get(group_id)
        self._claims[kind].pop(group_id, None)
        if group is None:
            self.counts[f"{kind}_annotations_late"] += 1
            return 0
        done = 0
        for s in group.samples:
            row = values.get(s.sample_id)
            if row is None:
                continue
            if len(row) != len(s.traj.token_ids):
                raise QueueError(f"{kind} logprobs for {s.sample_id}: {len(row)} values for {len(s.traj.token_ids)} tokens")
            if kind == "ref":
                s.ref_logprobs = list(row)
            else:
                if s.prox_version is not None and s.prox_version > version:
                    continue
                s.prox_logprobs, s.prox_version = list(row), version
            done += 1
        self.counts[f"{kind}_annotated_samples"] += done
        return done

    def _release_claims(self, group_id: str) -> None:
        for claims in self._claims.values():
            claims.pop(group_id, None)

    # -- checkpoints --------------------------------------------------------------------------------
    def snapshot(self) -> tuple[list[QueuedGroup], dict[str, Any]]:
        """The queued groups (arrival order) and the counters, for a checkpoint."""
        groups = sorted(self._groups.values(), key=lambda g: g.seq)
        return groups, {"version": self.version, "counts": dict(self.counts), "seq": self._seq,
                        "evicted_ids": list(self.evicted_ids)}

    def restore(self, groups: list[QueuedGroup], state: dict[str, Any]) -> None:
        """Inverse of :meth:`snapshot` on an empty queue (``state`` is checked by :func:`check_queue_state`)."""
        if self._groups:
            raise QueueError("restore() needs an empty queue")
        state = check_queue_state(state)
        self.version = int(state.get("version", self.version))
        self.counts = Counter(dict(state.get("counts", {})))
        self._seq = int(state.get("seq", 0))
        self.evicted_ids = list(state.get("evicted_ids", []))
        for group in sorted(groups, key=lambda g: g.seq):
            self._groups[group.group_id] = group
            self._seen.add(group.group_id)
        self._seq = max([self._seq, *(g.seq + 1 for g in groups)])


# ------------------------------------------------------------------------------------------------
# groups <-> trajectories (checkpoints use the trajectory JSONL format)
# ------------------------------------------------------------------------------------------------
def groups_to_trajectories(groups: list[QueuedGroup]) -> list[Trajectory]:
    """Flatten groups to trajectories whose metadata carries the queue fields (not the
    logprob annotations: workers recompute them after a restore)."""
    out = []
    for group in groups:
        for s in group.samples:
            meta = dict(s.traj.metadata)
            meta[_META_KEY] = {"group_id": group.group_id, "seq": group.seq, "put_version": group.put_version,
                               "reward": s.reward, "components": dict(s.components)}
            out.append(dataclasses.replace(s.traj, metadata=meta))
    return out


class _QueueRecord(BaseModel):
    """The queue fields a checkpointed trajectory carries in its metadata."""

    model_config = ConfigDict(extra="forbid")
    group_id: str
    seq: int = Field(ge=0)
    put_version: int
    reward: float
    components: dict[str, float] = Field(default_factory=dict)


class _QueueState(BaseModel):
    """The counters :meth:`TrajectoryQueue.snapshot` returns beside the groups."""

    model_config = ConfigDict(extra="forbid")
    version: int = 0
    counts: dict[str, int] = Field(default_factory=dict)
    seq: int = Field(0, ge=0)
    evicted_ids: list[str] = Field(default_factory=list)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    return f"{'.'.join(str(x) for x in err['loc']) or '(top)'}: {err['msg']}"


def check_queue_state(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` (from a checkpoint) checked field by field; raises :class:`QueueError`."""
    if not state:
        return {}
    try:
        return _QueueState.model_validate(state).model_dump(exclude_unset=True)
    except ValidationError as exc:
        raise QueueError(f"queue state {_first_error(exc)}") from None


def groups_from_trajectories(trajectories: list[Trajectory]) -> list[QueuedGroup]:
    """Inverse of :func:`groups_to_trajectories`; a malformed queue record is a :class:`QueueError`."""
    groups: dict[str, QueuedGroup] = {}
    for traj in trajectories:
        meta = dict(traj.metadata)
        raw = meta.pop(_META_KEY, None)
        if not isinstance(raw, dict):
            raise QueueError(f"trajectory {traj.episode_id} carries no queue record; not a queue checkpoint")
        try:
            info = _QueueRecord.model_validate(raw)
        except ValidationError as exc:
            raise QueueError(f"trajectory {traj.episode_id}: queue record {_first_error(exc)}") from None
        clean = dataclasses.replace(traj, metadata=meta)
        group = groups.get(info.group_id)
        if group is None:
            group = groups[info.group_id] = QueuedGroup(info.group_id, [], seq=info.seq, put_version=info.put_version)
        group.samples.append(QueuedSample(clean, info.reward, dict(info.components)))
    return sorted(groups.values(), key=lambda g: g.seq)


__all__ = [
    "AnnotationKind",
    "Batch",
    "QueueClosed",
    "QueueError",
    "QueueTimeout",
    "QueuedGroup",
    "QueuedSample",
    "StalePolicy",
    "TrajectoryQueue",
    "check_queue_state",
    "groups_from_trajectories",
    "groups_to_trajectories",
]
