"""The trainer role of the asynchronous modes: train on queued batches, publish weights.

:class:`Learner` is a :class:`~relax_gym.trainer.modes.training_run.TrainingRun` (the set-up, warm-up
SFT, evaluation, checkpoints, metrics and logging every mode shares) whose RL step trains on a
:class:`~.trajectory_queue.Batch` of whole groups taken from the queue instead of generating its
own, and publishes the new weights while the producer keeps generating. Per step:

1. **logprob** -- tensors for every sample of the batch's groups; advantages over the *whole*
   groups (samples that the staleness check refused still count in their group's statistics but
   carry no loss); reference logprobs from the reference worker's annotations (or computed here:
   hybrid mode, or a sample the worker did not reach); proximal logprobs when the step makes
   more than one update, from the proximal worker when its version is recent enough
   (``async_rl.prox_max_lag``), else computed here;
2. **train** -- the same mini-batch x epoch updates as colocate on the admitted samples. The
   decoupled / TIS corrections compare the behaviour logprobs (the engine's, per token, each
   from the weight version recorded on the token) with the proximal ones. Steps 1 and 2 are
   colocate's :func:`~relax_gym.trainer.algorithms.update.update_policy`, given the admitted
   rows and the two logprob sources above;
3. **ledger** -- one line per step in ``<out>/ledger.jsonl``: the trained sample ids, the refused
   ones, and each sample's staleness, so exactly-once and the staleness bound can be audited
   from the run's files.

Publishing (:meth:`Learner.publish`) goes through the one
:class:`~relax_gym.trainer.weights.publisher.WeightPublisher` (the transport ``engine.sync``
names: in-memory tensors, disk, or the distributed broadcast), keeping a CPU snapshot of the
published weights for engines that join while the next step trains.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from relax_gym.trainer.algorithms.batching import ScoredSample
from relax_gym.trainer.algorithms.update import update_policy
from relax_gym.trainer.backends.base import SequenceBatch
from relax_gym.trainer.checkpoint import CheckpointError, Resume, save_checkpoint
from relax_gym.trainer.config import TrainConfig
from relax_gym.trainer.modes.training_run import TrainingRun, prepare_model
from relax_gym.trainer.observability import PhaseTimer, plot_curves

from relax_gym.trainer.modes.trajectory_queue import Batch, QueuedGroup, QueuedSample, QueueError, check_queue_state, groups_from_trajectories, groups_to_trajectories
from relax_gym.trainer.rollout import EngineRouter
from relax_gym.trainer.rollout.media_metrics import media_metrics
from relax_gym.trainer.rollout.tool_metrics import tool_metrics
from relax_gym.trainer.weights.publisher import WeightPublisher

log = logging.getLogger("relax_gym.trainer.modes")
LEDGER = "ledger.jsonl"


def read_ledger(out_dir: str | Path) -> list[dict[str, Any]]:
    """The per-step records of trained and refused samples (see the module docstring)."""
    path = Path(out_dir) / LEDGER
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


class Learner(TrainingRun):
    """The trainer role; see the module docstring. ``engine_urls`` are engines someone else
    started (the Ray runtime's engine actors); without them the learner starts the configured
    engines itself (the embedded runtime)."""

    config: TrainConfig

    def __init__(self, config: TrainConfig, *, resume: Resume = False, engine_urls: list[str] | None = None,
                 api_key: str | None = None, inline_logprobs: bool | None = None) -> None:
        super().__init__(config, resume=resume, rl=True)
        self.engine_urls = list(engine_urls) if engine_urls is not None else None
        self.given_api_key = api_key
        self.inline_logprobs = config.mode == "hybrid" if inline_logprobs is None else inline_logprobs
        self.train_intervals: list[tuple[float, float, int]] = []
        self._versioned = -1  # the backend.version that state.weight_version names
        self._pending: tuple[int, int, list[tuple[str, torch.Tensor]]] | None = None  # (version, backend v, weights)
        self._publish_lock: asyncio.Lock | None = None
        self._opened = False
        self.restored_from: str | None = None

    # ============================================================================================
    # engines and weights
    # ============================================================================================
    async def _start_engines(self) -> None:
        c = self.config
        if self.engine_urls is not None:
            self.fleet = None  # type: ignore[assignment]
            urls, api_key = list(self.engine_urls), self.given_api_key
        else:
            from relax_gym.trainer.engines.fleet import EngineFleet

            self.fleet = EngineFleet(c.engine, self.model_path, self.out / "engines", seed=c.seed)
            await asyncio.to_thread(self.fleet.start)
            urls, api_key = list(self.fleet.urls), self.fleet.api_key
            self._record_engine_pids()
        self.api_key = api_key
        self.router = await EngineRouter(urls, api_key=api_key, request_timeout_s=c.rollout.request_timeout_s).start()
        self.publisher = WeightPublisher.from_config(c.engine, self.backend, self.router, api_key=api_key,
                                                     staging_dir=self.out / "weights", keep_snapshot=True)
        self.teacher = None
        if c.algorithm.distill_coef > 0 and c.teacher.url:
            from relax_gym.protocol import EngineClient

            self.teacher = EngineClient(c.teacher.url, api_key=c.teacher.api_key, timeout_s=c.teacher.timeout_s)

    def _record_engine_pids(self) -> None:
        """Write the engine processes' ids, so a resume after a crash can stop orphans."""
        path = self.out / "engines" / "pids.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.fleet.pids), encoding="utf-8")

    def _assign_version(self) -> None:
        """New weights get the next version number, once."""
        if self.backend.version != self._versioned:
            self.state.weight_version += 1
            self._versioned = self.backend.version

    @property
    def publish_lock(self) -> asyncio.Lock:
        if self._publish_lock is None:
            self._publish_lock = asyncio.Lock()
        return self._publish_lock

    async def ensure_synced(self) -> dict[str, float]:
        """Publish the backend's weights (numbered once) if the engines do not serve them yet;
        waits for a publish already in flight."""
        async with self.publish_lock:
            return await self._sync_current()

    async def _sync_current(self) -> dict[str, float]:
        self._assign_version()
        if self.backend.version == self._synced_version:
            return {}
        metrics = await self.publisher.publish(self.state.weight_version)
        self._synced_version = self.backend.version
        return metrics

    @property
    def overlaps_sync(self) -> bool:
        return self.config.async_rl.overlap_sync and self.publisher.path != "disk"

    async def push_weights_to(self, url: str) -> str | None:
        """Bring one engine (a joiner or a revived one) to the published weights."""
        return await self.publisher.bring_up_to_date(url)

    async def track_engine(self, event: str, url: str) -> None:
        """Keep this router's membership in step with the rollout side's (Ray runtime): an engine
        added there is published to from now on; a removed one no longer is."""
        url = url.rstrip("/")
        known = next((h for h in self.router.engines if h.url == url), None)
        if event == "added" and known is None:
            await self.router.add_engine(url)
        elif event == "removed" and known is not None:
            await self.router.remove_engine(known.id, drain=False)

    def engine_info(self) -> dict[str, Any]:
        return {"urls": [h.url for h in self.router.engines], "api_key": self.api_key,
                "version": self.state.weight_version}

    def prepare_model_folder(self) -> str:
        """Build (or find) the starting model folder, before engines that serve it start."""
        self.out.mkdir(parents=True, exist_ok=True)
        return str(prepare_model(self.config, self.out))

    def set_engines(self, urls: list[str], api_key: str | None) -> None:
        """Use engines someone else started (the Ray runtime's engine actors)."""
        self.engine_urls = list(urls)
        self.given_api_key = api_key

    # ============================================================================================
    # opening: set-up, warm-up, RL start
    # ============================================================================================
    async def open(self) -> dict[str, Any]:
        """Set up, run the warm-up phase, start RL; returns where training stands and what a
        restored checkpoint held (queue contents, producer state)."""
        if self.resume:
            kill_orphan_engines(self.out)
        self._setup()
        c = self.config
        self._open_logger()
        await self._start_engines()
        self._opened = True
        if self.resume:
            # the restored weights go out under their own version number: queued samples keep
            # exactly the staleness they had before the crash
            self._versioned = self.backend.version  # the restored weights keep their number
            await self.publisher.publish(self.state.weight_version)
            self._synced_version = self.backend.version
            self._truncate_ledger(self.state.step)
            self.restored_from = str(self._resume_from)
        else:
            self._synced_version = -1  # engines may serve anything (shared or external): push ours
        if not self._finished():
            await self._run_warmup()
        await self._start_rl()
        if c.algorithm.needs_reference:
            await asyncio.to_thread(self._reference)  # the policy at RL start, for workers and inline use
        extra = self.state.extra.get("async", {}) if self.resume else {}
        try:
            queue_groups = groups_from_trajectories(self.buffer) if self.buffer else []
            queue_state = check_queue_state(extra.get("queue", {}))
        except QueueError as exc:
            raise CheckpointError(f"{self._resume_from}: {exc}") from None
        self.buffer = []
        return {"version": self.state.weight_version, "step": self.state.step, "resumed": bool(self.resume),
                "done": self.state.step >= c.train.steps, "queue_groups": queue_groups,
                "queue_state": queue_state, "producer_state": extra.get("producer", {}),
                "reference_model": str(self.out / "reference_model") if c.algorithm.needs_reference else None,
                "model_path": str(self.model_path), "engines": self.engine_info(), "pid": os.getpid()}

    # ============================================================================================
    # one training step on a queued batch
    # ============================================================================================
    async def train(self, batch: Batch) -> dict[str, float]:
        c = self.config
        start = time.time()
        timer = PhaseTimer()
        version = self.state.weight_version
        samples = [s for g in batch.groups for s in g.samples]
        admitted = [ok for marks in batch.admitted for ok in marks]
        staleness = [m for marks in batch.staleness for m in marks]
        metrics = self._batch_metrics(batch, version)
        rows = [i for i, ok in enumerate(admitted) if ok]
        if not rows:
            metrics["train/skipped_step"] = 1.0
            self._write_ledger(batch, version)
            return {**metrics, **timer.metrics(), "version": float(version)}
        update = await update_policy(
            self.backend, c.algorithm, [ScoredSample(s.traj, s.reward) for s in samples],
            mini_batches=c.train.mini_batches, epochs=c.train.epochs, temperature=c.rollout.temperature,
            image_processor=self.processor, trained_rows=rows, reference=partial(self._reference_logprobs, samples),
            proximal=partial(self._proximal_logprobs, samples, version), teacher=self.teacher, timer=timer)
        metrics.update(update.metrics)
        self.train_intervals.append((*update.train_span, version))
        self._assign_version()
        if self.overlaps_sync and self.backend.version != self._synced_version:
            # what the next publish sends, while the next step already trains
            from relax_gym.trainer.modes.logprob_workers import current_weights

            self._pending = (self.state.weight_version, self.backend.version, current_weights(self.backend))
        self._write_ledger(batch, version)
        metrics["staleness/max"] = float(max(staleness[i] for i in rows))
        metrics["time/batch_wait"] = batch.waited_s
        metrics.update(timer.metrics())
        metrics["time/train_role"] = time.time() - start
        metrics["version"] = float(self.state.weight_version)
        return metrics

    def _batch_metrics(self, batch: Batch, version: int) -> dict[str, float]:
        trained = batch.admitted_samples()
        marks = [m for g, a in zip(batch.staleness, batch.admitted, strict=True) for m, ok in zip(g, a, strict=True)
                 if ok]
        m: dict[str, float] = {
            "rollout/trained_samples": float(len(trained)),
            "rollout/batch_samples": float(batch.num_samples),
            "rollout/refused_stale_samples": float(batch.num_samples - batch.num_admitted),
            "staleness/mean": float(np.mean(marks)) if marks else 0.0,
        }
        if trained:
            m["rollout/success"] = float(np.mean([s.traj.success for s in trained]))
            m["rollout/env_reward_mean"] = float(np.mean([s.traj.reward for s in trained]))
            m["rollout/reward_mean"] = float(np.mean([s.reward for s in trained]))
            m["rollout/reward_std"] = float(np.std([s.reward for s in trained]))
            m["rollout/response_tokens_mean"] = float(np.mean([s.traj.num_sampled_tokens for s in trained]))
            tokens = old = 0
            mixed = 0
            for s in trained:
                versions = [v for v, k in zip(s.traj.weight_versions, s.traj.loss_mask, strict=True) if k]
                tokens += len(versions)
                old += sum(v != version for v in versions)
                mixed += len(set(versions)) > 1
            m["staleness/off_policy_token_frac"] = old / max(1, tokens)
            m["rollout/partial_samples"] = float(mixed)  # sampled by more than one weight version
        trajs = [s.traj for s in trained]
        m.update(media_metrics(trajs))  # as colocate logs them, from this step's trajectories
        m.update(tool_metrics(trajs))
        return m

    async def _reference_logprobs(self, samples: list[QueuedSample], batch: SequenceBatch,
                                  rows: list[int]) -> tuple[list[torch.Tensor], dict[str, float]]:
        """The reference worker's annotations; computed here for the samples it did not reach
        (or all of them with inline logprobs: hybrid mode)."""
        missing = [i for i in rows if self.inline_logprobs or samples[i].ref_logprobs is None]
        out: dict[int, torch.Tensor] = {}
        if missing:
            res = await asyncio.to_thread(self._reference().compute_logprobs, batch.select(missing))
            out = dict(zip(missing, res.logprobs, strict=True))
        logprobs = [out[i] if i in out else torch.tensor(samples[i].ref_logprobs, dtype=torch.float32)
                    for i in rows]
        return logprobs, {"logprob/ref_from_worker_frac": 1.0 - len(missing) / max(1, len(rows))}

    async def _proximal_logprobs(self, samples: list[QueuedSample], version: int, batch: SequenceBatch,
                                 rows: list[int]) -> tuple[list[torch.Tensor], dict[str, float]]:
        """The proximal worker's annotations when every trained sample has them from a version at
        most ``async_rl.prox_max_lag`` behind; else computed here on the whole batch."""
        trained = [samples[i] for i in rows]
        lag = self.config.async_rl.prox_max_lag
        usable = not self.inline_logprobs and all(
            s.prox_logprobs is not None and s.prox_version is not None and version - s.prox_version <= lag
            for s in trained)
        metrics = {"logprob/prox_from_worker": float(usable)}
        if usable:
            metrics["logprob/prox_lag_max"] = float(max(version - s.prox_version for s in trained))
            return [torch.tensor(s.prox_logprobs, dtype=torch.float32) for s in trained], metrics
        return (await asyncio.to_thread(self.backend.compute_logprobs, batch)).logprobs, metrics

    # -- the ledger --------------------------------------------------------------------------------------
    def _write_ledger(self, batch: Batch, version: int) -> None:
        trained: list[str] = []
        refused: list[str] = []
        stale: list[int] = []
        oldest: list[int] = []
        for group, marks, ok in zip(batch.groups, batch.staleness, batch.admitted, strict=True):
            for s, m, yes in zip(group.samples, marks, ok, strict=True):
                (trained if yes else refused).append(s.sample_id)
                if yes:
                    stale.append(m)
                    oldest.append(s.min_version)
        record = {"step": self.state.step + 1, "version": version, "groups": [g.group_id for g in batch.groups],
                  "trained": trained, "refused": refused, "staleness": stale, "min_versions": oldest}
        with (self.out / LEDGER).open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")

    def _truncate_ledger(self, step: int) -> None:
        """After a resume from step ``step``: later lines belong to work the crash rolled back."""
        path = self.out / LEDGER
        if not path.is_file():
            return
        keep = [r for r in read_ledger(self.out) if int(r["step"]) <= step]
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in keep), encoding="utf-8")
        tmp.replace(path)

    # ============================================================================================
    # after the step: publish, log, evaluate, checkpoint
    # ============================================================================================
    async def publish(self) -> dict[str, float]:
        """Make the engines serve the weights of the last step (its snapshot when the next step
        may already be training); returns sync metrics and the published ``version``."""
        start = time.perf_counter()
        async with self.publish_lock:
            pending, self._pending = self._pending, None
            if pending is not None and pending[1] != self._synced_version:
                version, backend_version, named = pending
                metrics = await self.publisher.publish(version, named=named)
                self._synced_version = backend_version
            else:
                metrics = await self._sync_current()
                version = self.state.weight_version
        metrics["time/sync"] = time.perf_counter() - start
        metrics["version"] = float(version)
        return metrics

    def published_weights(self) -> list[tuple[str, torch.Tensor]]:
        """The weights the engines serve, as CPU tensors (for the proximal worker)."""
        snapshot = self.publisher.snapshot
        return snapshot if snapshot is not None else self.current_weights()

    async def end_step(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """Record step ``step``: metrics, progress, evaluation when due. Returns the eval metrics."""
        return await self._end_step(step, metrics, step_s=metrics.get("time/step_wall", float("nan")),
                                    stale=metrics.get("staleness/mean", float("nan")))

    async def save(self, name: str, producer_state: dict[str, Any], queue_snapshot: tuple[list[QueuedGroup],
                   dict[str, Any]]) -> str:
        """An atomic checkpoint holding the model, the queue's contents and the producer's state."""
        groups, queue_state = queue_snapshot
        self._record_run_state(producer_state.get("sampler", {}))
        queued = {g.group_id for g in groups}
        producer_state = dict(producer_state)
        # a group can be queued between the two snapshots: the queue's copy wins
        producer_state["pending"] = [p for p in producer_state.get("pending", []) if p.get("group_id") not in queued]
        self.state.extra["async"] = {"producer": producer_state, "queue": queue_state}
        c = self.config.checkpoint
        folder = await asyncio.to_thread(
            save_checkpoint, self.out, name, self.backend, self.state, buffer=groups_to_trajectories(groups),
            keep_last=c.keep_last, save_optimizer=c.save_optimizer)
        return str(folder)

    async def finish(self, producer_state: dict[str, Any], queue_snapshot: tuple[list[QueuedGroup],
                     dict[str, Any]]) -> dict[str, Any]:
        """Final evaluation, the final checkpoint (with what is still queued or pending), export."""
        c = self.config
        if c.train.steps > 0 and self.state.step > 0:
            await self._final_eval()
        self.state.phase = "done"
        await self.save(f"step_{self.state.step:06d}", producer_state, queue_snapshot)
        await self._export_final_model()
        return {"steps": self.state.step, "first_eval": self.first_eval, "final_eval": self.last_eval,
                "elapsed_s": self.logger.elapsed_s}

    async def close(self, *, plot: bool = True) -> str | None:
        try:
            await self._stop_engines()
        finally:
            logger = getattr(self, "logger", None)
            if logger is not None:
                logger.close()
        curves = None
        if plot and self.config.logging.plot and self._opened:
            curves = plot_curves(self.out / "metrics.jsonl", self.out / "curves.png", title=self.config.run_name)
        return str(curves) if curves else None

    def current_weights(self) -> list[tuple[str, torch.Tensor]]:
        """A CPU copy of the weights (for the proximal worker)."""
        from relax_gym.trainer.modes.logprob_workers import current_weights

        return current_weights(self.backend)

    def take_train_intervals(self) -> list[tuple[float, float, int]]:
        out, self.train_intervals = self.train_intervals, []
        return out


def _engine_port(pid: int) -> str | None:
    """The port an ``engine serve`` process listens on (from its --port-file), or None."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    if "engine" not in args or "serve" not in args or "--port-file" not in args:
        return None
    try:
        return Path(args[args.index("--port-file") + 1]).read_text().strip()
    except (IndexError, OSError):
        return None


PID_FILES = ("pids.json", "pids-scaleout.json")


def kill_orphan_engines(out_dir: Path) -> int:
    """Stop engine processes a crashed run left behind (recorded in ``engines/pids.json``, and
    ``engines/pids-scaleout.json`` for engines launched through the control API); a pid is
    signalled only if it still runs ``engine serve`` at the recorded URL's port."""
    killed = 0
    for path in (Path(out_dir) / "engines" / name for name in PID_FILES):
        if path.is_file():
            killed += _kill_recorded(path)
    return killed


def _kill_recorded(path: Path) -> int:
    import signal

    killed = 0
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0
    for entry in entries:
        pid, url = int(entry.get("pid", 0)), str(entry.get("url", ""))
        if pid <= 0 or _engine_port(pid) != url.rsplit(":", 1)[-1]:
            continue  # gone, or the pid now belongs to something else
        try:
            os.killpg(pid, signal.SIGKILL)  # the engine leads its own session (started that way)
            killed += 1
        except (ProcessLookupError, PermissionError):
            pass
    path.unlink(missing_ok=True)
    return killed


__all__ = ["LEDGER", "Learner", "PID_FILES", "kill_orphan_engines", "read_ledger"]
