"""The rollout producer: generates groups continuously, scores them and fills the queue.

It never waits for training except where the staleness bound requires it. The bound is enforced
twice:

* **Throttle (little work is wasted).** Group ``g`` of the run is destined for training step
  ``g // B`` (``B`` = groups per step), so it may start only once the engines serve weights of
  step ``g // B - max_staleness`` or later. Counting only groups that will be trained (dropped
  ones free their slot and a replacement is drawn), the gate is::

      effective_groups_started < (steps_published + max_staleness + 1) * B

  With ``max_staleness = 0`` exactly one batch is generated per weight version, from the same
  sampler draws colocate makes: colocate's on-policy behaviour.
* **Admission (the guarantee).** Groups finish out of order and episodes straddle weight
  updates, so the queue still checks every sample's token versions when the trainer takes it.

Each group runs in its own :class:`RolloutManager` with the ``rollout`` settings as they are (episode
ids derive from the run seed and the group id, sampling seeds from ``rollout.sampling_seed`` and the
group: reproducible whatever the interleaving). Finished groups are scored
by the reward workers (with retries), filtered like colocate's batches (failed episodes, failed
rewards, zero-variance groups under dynamic sampling; every drop counted) and put whole into the
queue. A group whose every episode failed on the engines (all engines down) is retried later
rather than lost.

:meth:`state_dict` records the sampler position and the groups drawn but not yet queued, so a
resumed run regenerates exactly those: no prompt is lost or drawn twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from relax_gym.chat import ChatCodec
from relax_gym.trainer.checkpoint import CheckpointError
from relax_gym.trainer.config import TrainConfig
from relax_gym.trainer.env_errors import EnvErrorRateExceeded, EnvErrorWindow
from relax_gym.trainer.algorithms.batching import ScoredSample, reward_inputs, select_groups
from relax_gym.trainer.rollout.sampler import EpisodeSampler, envs_of_suite
from relax_gym.trainer.rollout import EngineRouter, EpisodeSpec, RolloutManager, Trajectory
from relax_gym.trainer.rollout.metrics import SCALAR_STEP_COUNTERS, STEP_COUNTERS

from relax_gym.trainer.modes.trajectory_queue import QueuedGroup, QueuedSample
from relax_gym.trainer.modes.reward_workers import score_with_retries
from relax_gym.trainer.modes.roles import Role

log = logging.getLogger("relax_gym.trainer.modes")
RETRY_BACKOFF_S = 1.0


def spec_to_dict(spec: EpisodeSpec) -> dict[str, Any]:
    if spec.env_factory is not None:
        raise ValueError("episodes made from env_factory cannot be checkpointed; register the env instead")
    return {"env_id": spec.env_id, "seed": spec.seed, "options": spec.options, "env_kwargs": dict(spec.env_kwargs),
            "group_id": spec.group_id, "max_new_tokens": spec.max_new_tokens, "metadata": dict(spec.metadata)}


def spec_from_dict(data: dict[str, Any]) -> EpisodeSpec:
    return EpisodeSpec(env_id=data["env_id"], seed=data.get("seed"), options=data.get("options"),
                       env_kwargs=dict(data.get("env_kwargs") or {}), group_id=data.get("group_id"),
                       max_new_tokens=data.get("max_new_tokens"), metadata=dict(data.get("metadata") or {}))


def write_control_file(out_dir: Path, url: str, token: str) -> None:
    """``<out>/control.json``: where the elastic control API listens and its token (mode 0600)."""
    path = Path(out_dir) / "control.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"url": url, "token": token}), encoding="utf-8")
    path.chmod(0o600)


class _PendingSpec(BaseModel):
    """One group to regenerate, as :func:`spec_to_dict` writes it."""

    model_config = ConfigDict(extra="ignore")
    env_id: str = Field(min_length=1, max_length=512)
    seed: int | None = None
    options: dict[str, Any] | None = None
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    group_id: str | None = Field(None, max_length=1024)
    max_new_tokens: int | None = Field(None, ge=1)
    metadata: dict[str, Any] = Field(default_factory=dict)


class _ProducerState(BaseModel):
    """What :meth:`RolloutProducer.state_dict` writes into a checkpoint; checked on load, since
    a checkpoint is untrusted data (docs/security.md)."""

    model_config = ConfigDict(extra="forbid")
    sampler: dict[str, Any] = Field(default_factory=dict)
    pending: list[_PendingSpec] = Field(default_factory=list)
    counts: dict[str, int] = Field(default_factory=dict)
    dropped_ids: list[str] = Field(default_factory=list)


class RolloutProducer:
    """Fills the queue with scored groups; see the module docstring.

    ``router`` is shared with the trainer in the embedded runtime (``owns_pause=False``: the
    trainer's weight sync pauses it) and private to the rollout actor in the Ray runtime
    (``owns_pause=True``: :meth:`pause` / :meth:`resume` drive it).
    """

    def __init__(self, config: TrainConfig, codec: ChatCodec, router: EngineRouter, queue: Role,
                 rewards: list[Role], *, owns_pause: bool = False, model_path: str | Path | None = None) -> None:
        self.config = config
        self.model_path = model_path  # what engines launched through the control API serve first
        self.codec = codec
        self.router = router
        self.queue = queue
        self.rewards = rewards
        self.owns_pause = owns_pause
        envs = envs_of_suite(config.data.suite) if config.data.suite else list(config.data.envs)
        self.sampler = EpisodeSampler(envs, seed=config.seed, seed_start=config.data.seed_start,
                                      seed_count=config.data.seed_count, seed_order=config.data.seed_order)
        self.batch_groups = config.rollout.prompts_per_step
        self.max_staleness = config.async_rl.max_staleness
        self.max_in_flight = max(1, config.rollout.concurrency // config.rollout.group_size)
        self.steps = 0  # training steps whose weights the engines serve
        self.version = 0
        self.effective = 0  # groups started that will be (or were) trained
        self.pending: dict[str, EpisodeSpec] = {}  # drawn, not yet queued or dropped
        self._regen: list[EpisodeSpec] = []
        self.counts: Counter[str] = Counter()
        self.dropped_ids: list[str] = []  # groups dropped whole before the queue (for audits)
        self.rollout_stats: dict[str, float] = {}
        self.timeline: list[tuple[float, float, int]] = []  # (start, end, version) per finished group
        self._in_flight: dict[str, asyncio.Task[None]] = {}
        self._managers: set[RolloutManager] = set()
        self._cond: asyncio.Condition | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._next_reward = 0
        self._error: BaseException | None = None
        self._put_lock: asyncio.Lock | None = None
        self._reward_failures_in_a_row = 0
        self._fatal: BaseException | None = None
        # a step's worth of finished episodes: a group failing whole is redrawn, so a broken env
        # would otherwise keep the producer busy (and the trainer waiting) until step_timeout_s
        self.env_errors = EnvErrorWindow(config.rollout.batch_size, config.rollout.max_env_error_rate)

    # -- lifecycle ----------------------------------------------------------------------------------
    @property
    def cond(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    @property
    def put_lock(self) -> asyncio.Lock:
        if self._put_lock is None:
            self._put_lock = asyncio.Lock()
        return self._put_lock

    def load_state_dict(self, state: dict[str, Any], *, skip_groups: set[str] | frozenset[str] = frozenset()) -> None:
        """Restore the sampler and the groups to regenerate (minus ``skip_groups``: those the
        restored queue already holds)."""
        if not state:
            return
        try:
            checked = _ProducerState.model_validate(state)
            self.sampler.load_state_dict(checked.sampler)
        except (ValidationError, KeyError, TypeError, ValueError) as exc:
            first = exc.errors()[0] if isinstance(exc, ValidationError) else None
            where = ".".join(str(p) for p in first["loc"]) + ": " + first["msg"] if first else repr(exc)
            raise CheckpointError(f"rollout producer state in the checkpoint is malformed ({where})") from None
        self._regen = [spec_from_dict(p.model_dump()) for p in checked.pending if p.group_id not in skip_groups]
        self.counts = Counter(checked.counts)
        self.dropped_ids = list(checked.dropped_ids)
        self.counts["regenerated_groups"] += len(self._regen)

    def state_dict(self) -> dict[str, Any]:
        pending = list(self.pending.values()) + [s for s in self._regen if s.group not in self.pending]
        return {"sampler": self.sampler.state_dict(), "pending": [spec_to_dict(s) for s in pending],
                "counts": dict(self.counts), "dropped_ids": list(self.dropped_ids)}

    async def start(self, *, version: int, steps: int, effective: int) -> None:
        """Begin producing for training step ``steps`` at weight ``version``; ``effective`` is the
        number of groups already trained, queued or pending (0 for a fresh run)."""
        self.version, self.steps, self.effective = version, steps, effective
        self._stopping = False
        self._loop_task = asyncio.create_task(self._loop(), name="rollout-producer")

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Stop drawing, abort in-flight episodes (they stay pending: a resume regenerates them)."""
        self._stopping = True
        async with self.cond:
            self.cond.notify_all()
        await asyncio.gather(*(m.stop() for m in list(self._managers)), return_exceptions=True)
        tasks = [t for t in [self._loop_task, *self._in_flight.values()] if t is not None]
        if tasks:
            _done, late = await asyncio.wait(tasks, timeout=timeout_s)
            for t in late:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self._loop_task = None

    # -- weight updates -------------------------------------------------------------------------------
    async def pause(self) -> None:
        """Before a weight update: pause the engines (in-flight segments return partial)."""
        if self.owns_pause:
            await self.router.pause("abort")

    async def resume(self, version: int, steps: int, released_groups: int = 0) -> None:
        """After a weight update: record the version, open the gate for step ``steps``,
        free the slots of ``released_groups`` evicted groups, continue generation."""
        self.version, self.steps = version, steps
        self.effective -= released_groups
        self.counts["released_groups"] += released_groups
        self.router.set_current_weights(version, served=True)  # joiners are brought to it
        if self.owns_pause:
            await self.router.resume()
        async with self.cond:
            self.cond.notify_all()

    # -- the loop -----------------------------------------------------------------------------------
    def _may_start(self) -> bool:
        if len(self._in_flight) >= self.max_in_flight:
            return False
        if self._regen:  # already counted in `effective`
            return True
        return self.effective < (self.steps + self.max_staleness + 1) * self.batch_groups

    async def _loop(self) -> None:
        try:
            while not self._stopping:
                async with self.cond:
                    await self.cond.wait_for(lambda: self._stopping or self._may_start())
                    if self._stopping:
                        return
                    if self._regen:
                        spec = self._regen.pop(0)
                    else:
                        spec = self.sampler.next(1, tag="a:")[0]
                        self.effective += 1
                        self.counts["drawn_groups"] += 1
                    self.pending[spec.group] = spec
                    self._in_flight[spec.group] = asyncio.create_task(self._run_group(spec), name=f"group-{spec.group}")
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # surfaced by stats()/check()
            self._error = exc
            log.exception("the rollout producer stopped")

    async def _run_group(self, spec: EpisodeSpec) -> None:
        start = time.time()
        version = self.version
        try:
            # episode ids depend only on the run seed and the group id, whatever order groups
            # interleave in (the sampling seeds derive from rollout.sampling_seed and the group)
            manager = RolloutManager(self.router, self.codec, self.config.rollout,
                                     run_id=f"{self.config.seed}-{spec.group}")
            self._managers.add(manager)
            try:
                trajs = await manager.generate([spec])
            finally:
                self._managers.discard(manager)
                for k, v in manager.metrics.snapshot().items():
                    if isinstance(v, (int, float)):
                        self.rollout_stats[k] = self.rollout_stats.get(k, 0.0) + v
            if self._stopping:
                return  # stays pending; a resume regenerates it
            if trajs and all(t.stop_reason in ("engine_error", "aborted") for t in trajs):
                self.counts["groups_retried_engine_down"] += 1
                await asyncio.sleep(RETRY_BACKOFF_S)
                async with self.cond:
                    self._regen.append(spec)
                return
            if await self._env_errors_exceeded(trajs):
                return  # stays pending; check() raises for the trainer
            await self._finish_group(spec, trajs)
            self.timeline.append((start, time.time(), version))
            if len(self.timeline) > 20000:
                del self.timeline[:10000]
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("group %s failed in the producer", spec.group)
            self.counts["group_internal_errors"] += 1
            self._error = exc
            async with self.cond:
                self._regen.append(spec)
        finally:
            self._in_flight.pop(spec.group, None)
            async with self.cond:
                self.cond.notify_all()

    async def _env_errors_exceeded(self, trajs: list[Trajectory]) -> bool:
        """Record the group's episodes; past ``rollout.max_env_error_rate`` over the last step's
        worth of them, stop producing (the run stops with :class:`EnvErrorRateExceeded`)."""
        self.env_errors.add(trajs)
        try:
            self.env_errors.check(f"rollout (the last {self.env_errors.size} finished episodes)", require_full=True)
        except EnvErrorRateExceeded as exc:
            self.counts["env_error_stop"] += 1
            self._fatal = exc
            self._stopping = True
            async with self.cond:
                self.cond.notify_all()
            return True
        return False

    async def _finish_group(self, spec: EpisodeSpec, trajs: list[Trajectory]) -> None:
        c = self.config
        results = await score_with_retries(self.rewards, reward_inputs(trajs), retries=c.async_rl.reward_retries,
                                           counts=self.counts, start=self._next_reward)
        self._next_reward += 1
        if results and all(r.failed and "worker" in r.errors for r in results):
            self._reward_failures_in_a_row += 1
            if self._reward_failures_in_a_row >= max(8, 2 * self.max_in_flight):
                self._fatal = RuntimeError(
                    f"the reward workers failed {self._reward_failures_in_a_row} calls in a row "
                    f"(last: {results[0].error}); stopping the rollout rather than dropping every group")
                self._stopping = True
                async with self.cond:
                    self.cond.notify_all()
                return
        else:
            self._reward_failures_in_a_row = 0
        scored = [ScoredSample(t, r.total, r) for t, r in zip(trajs, results, strict=True)]
        sel = select_groups(scored, failed_reward=c.rewards.failed,
                            drop_zero_variance=c.train.dynamic_sampling.enabled)
        kept = [s for g in sel.kept for s in g]
        group = QueuedGroup(spec.group, [
            QueuedSample(s.traj, float(s.reward if s.reward is not None else 0.0),
                         dict(s.result.components) if s.result is not None else {})
            for s in kept])
        while True:
            # counting, queueing and leaving `pending` happen together under the lock that
            # checkpoint_state() holds, so a checkpoint sees the group in exactly one place
            async with self.put_lock:
                if kept and not await self.queue.try_put(group):
                    queued = False
                else:
                    queued = True
                    self._account(spec, trajs, sel, group if kept else None)
            if queued or self._stopping:
                return  # when stopping, the group stays pending: a resume regenerates it
            await self.queue.wait_for_space(timeout_s=1.0)

    def _account(self, spec: EpisodeSpec, trajs: list[Trajectory], sel: Any, group: QueuedGroup | None) -> None:
        self.counts["produced_groups"] += 1
        self.counts["produced_samples"] += len(trajs)
        for reason, n in sel.dropped.items():
            self.counts[f"dropped_samples/{reason}"] += n
            self.counts["dropped_samples"] += n
        if sel.zeroed:
            self.counts["reward_failed_scored_zero"] += sel.zeroed
        self.pending.pop(spec.group, None)
        if group is None:
            self.effective -= 1  # frees the slot: a replacement is drawn
            self.counts["dropped_groups"] += 1
            self.dropped_ids.append(spec.group)
        else:
            self.counts["queued_groups"] += 1
            self.counts["queued_samples"] += len(group)

    async def checkpoint_state(self) -> tuple[dict[str, Any], tuple[list[QueuedGroup], dict[str, Any]]]:
        """This producer's state and the queue's snapshot, taken together (no group is in
        flight between them)."""
        async with self.put_lock:
            state = self.state_dict()
            snapshot = await self.queue.snapshot()
        return state, snapshot

    # -- views ----------------------------------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        out = {f"producer/{k}": float(v) for k, v in sorted(self.counts.items())}
        out["producer/in_flight_groups"] = float(len(self._in_flight))
        out["producer/pending_groups"] = float(len(self.pending) + len(self._regen))
        out["producer/effective_groups"] = float(self.effective)
        for k in ("sampled_tokens", "requests", *SCALAR_STEP_COUNTERS):
            out[f"rollout/{k}_total"] = float(self.rollout_stats.get(k, 0))
        for k, v in self.rollout_stats.items():  # per-kind counts: engine_errors/<type>, drift/<kind>
            if k.split("/", 1)[0] in STEP_COUNTERS and "/" in k:
                out[f"rollout/{k}_total"] = float(v)
        return out

    def take_timeline(self) -> list[tuple[float, float, int]]:
        out, self.timeline = self.timeline, []
        return out

    def healthy(self) -> bool:
        return self._fatal is None and self._loop_task is not None and not self._loop_task.done()

    def check(self) -> None:
        """Raise when production has stopped for good (the trainer would wait forever)."""
        if isinstance(self._fatal, EnvErrorRateExceeded):
            raise self._fatal
        if self._fatal is not None:
            raise RuntimeError(f"rollout production stopped: {self._fatal}") from self._fatal
        if self._error is not None and (self._loop_task is None or self._loop_task.done()):
            raise RuntimeError(f"the rollout producer failed: {self._error}") from self._error

    async def engines(self) -> list[dict[str, Any]]:
        return self.router.list_engines()

    async def add_engine(self, url: str, engine_id: str | None = None) -> dict[str, Any]:
        handle = await self.router.add_engine(url, engine_id=engine_id)
        return handle.status()

    async def remove_engine(self, engine_id: str, timeout_s: float | None = None) -> None:
        await self.router.remove_engine(engine_id, drain=True, wait=True, timeout_s=timeout_s)

    # -- router and control API (the Ray runtime's rollout actor owns its router) -------------------
    async def open_router(self) -> None:
        await self.router.start()

    async def start_control(self, port: int, token: str | None, out_dir: str) -> str:
        """Serve the elastic control API on 127.0.0.1 against this producer's router; writes
        ``<out>/control.json`` (url + token, mode 0600). Returns the URL."""
        from relax_gym.trainer.rollout import ControlServer

        self._launcher = None
        if self.model_path is not None and self.config.engine.kind != "external" and self.router.api_key:
            from relax_gym.trainer.engines.fleet import ScaleOutLauncher

            self._launcher = ScaleOutLauncher(self.config.engine, self.model_path, out_dir,
                                              api_key=self.router.api_key, seed=self.config.seed)
        self._control = await ControlServer(self.router, token=token, port=port, launcher=self._launcher).start()
        write_control_file(Path(out_dir), self._control.url, self._control.token)
        return str(self._control.url)

    async def close(self) -> None:
        await self.stop()
        control = getattr(self, "_control", None)
        if control is not None:
            await control.stop()
            self._control = None
        launcher = getattr(self, "_launcher", None)
        if launcher is not None:  # engines launched through the API end with the run
            self._launcher = None
            await launcher.close()
        if self.owns_pause:
            with contextlib.suppress(Exception):
                await self.router.close()


__all__ = ["RolloutProducer", "spec_from_dict", "spec_to_dict", "write_control_file"]
