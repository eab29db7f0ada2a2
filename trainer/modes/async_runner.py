"""The fully_async and hybrid runners: rollout and training overlap, tied by the queue.

One loop, whatever the runtime (it only holds :mod:`roles <.roles>`)::

    learner.open()                         set-up, warm-up SFT, RL start, weights v published
    producer.start()                       generates groups continuously (throttled, see producer.py)
    repeat train.steps times:
        batch = queue.get_batch(B)         whole groups, each sample admitted by its staleness
        learner.train(batch)               advantages per group, updates on admitted samples
        producer.pause()                   in-flight segments come back partial ...
        learner.publish()                  ... weights v+1 reach every engine (verified) ...
        queue.advance(v+1)                 ... too-stale groups are evicted (counted) ...
        producer.resume(v+1)               ... partial segments continue on v+1; the gate opens
        learner.end_step()                 metrics, evaluation when due
        checkpoint when due                model + queue contents + producer state (+ pending)
    producer.stop(); learner.finish()      final eval and checkpoint (nothing queued is lost)

The embedded runtime (:class:`EmbeddedRuntime`, the default) needs no cluster: every role in this
process (one asyncio loop, worker threads; or, with ``async_rl.learner_process``, the learner in a
child process of its own, :mod:`.process_role`), engines as subprocesses. The Ray
runtime (:mod:`.ray_runtime`) builds them as actors. Neither the loop nor the algorithm code
knows which one it runs on.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from relax_gym.trainer.config import TrainConfig
from relax_gym.trainer.modes.training_run import RunSummary

from relax_gym.trainer.modes.roles import LocalRole, Role, Roles, Runtime, needs_workers

log = logging.getLogger("relax_gym.trainer.modes")


def import_modules(names: list[str]) -> None:
    for name in names:
        importlib.import_module(name)


# ------------------------------------------------------------------------------------------------
# the embedded runtime
# ------------------------------------------------------------------------------------------------
class EmbeddedRuntime:
    """Every role on this machine without a cluster: the learner in this process (the default)
    or in a child process of its own (``async_rl.learner_process``); the producer, queue, reward
    and logprob workers in this process (asyncio + worker threads); engines as subprocesses."""

    def __init__(self) -> None:
        self._learner: Any = None  # the Learner object, when it lives in this process
        self._learner_role: Any = None  # the ProcessRole, when it lives in a child
        self._producer: Any = None

    async def make_learner(self, config: TrainConfig, *, resume: bool | str) -> Role:
        import_modules(config.async_rl.imports)
        if config.async_rl.learner_process:
            from relax_gym.trainer.config import check_envs
            from relax_gym.trainer.modes.process_role import ProcessRole

            check_envs(config)  # here, where the error reads best; the child builds them again
            self._learner_role = ProcessRole(
                "relax_gym.trainer.modes.ray_actors:role_object",
                {"kind": "learner", "config_data": config.model_dump(mode="json"), "kwargs": {"resume": resume}},
                imports=env_modules(config), name="learner")
            return self._learner_role
        from relax_gym.trainer.modes.learner import Learner

        self._learner = Learner(config, resume=resume)
        return LocalRole(self._learner)

    async def make_data_plane(self, config: TrainConfig, learner: Role, info: dict[str, Any]) -> Roles:
        from relax_gym.trainer.modes.producer import RolloutProducer
        from relax_gym.trainer.modes.trajectory_queue import TrajectoryQueue
        from relax_gym.trainer.modes.reward_workers import RewardWorker

        c = config
        a = c.async_rl
        queue = TrajectoryQueue(capacity=a.capacity(c.rollout.prompts_per_step), max_staleness=a.max_staleness,
                                stale_policy=a.stale_policy, version=int(info["version"]))
        queue_role = LocalRole(queue)
        rewards: list[Role] = [LocalRole(RewardWorker(c.rewards.entries, c.rewards.per_env, c.rewards.timeout_s))]
        lrn = self._learner
        if lrn is not None:  # shares the learner's router: its weight sync pauses generation
            producer = RolloutProducer(c, lrn.codec, lrn.router, queue_role, rewards, owns_pause=False,
                                       model_path=lrn.model_path)
        else:  # its own router over the learner's engines, as the Ray rollout actor has
            from relax_gym.trainer.modes.ray_actors import build_role

            engines = info["engines"]
            producer = build_role("rollout", c, {
                "learner": learner, "urls": engines["urls"], "api_key": engines["api_key"],
                "model_path": info["model_path"], "queue": queue_role, "rewards": rewards})
            await producer.open_router()
        roles = Roles(learner=learner, queue=queue_role, rollout=LocalRole(producer), rewards=rewards)
        want_ref, want_prox = needs_workers(c)
        if want_ref or want_prox:
            from relax_gym.trainer.modes.logprob_workers import LogprobWorker

            mb = c.train.micro_batch_size
            if want_ref:
                roles.ref_worker = LocalRole(LogprobWorker("ref", info["reference_model"], queue_role,
                                                           temperature=c.rollout.temperature, micro_batch_size=mb))
            if want_prox:
                worker = LogprobWorker("prox", info["model_path"], queue_role, temperature=c.rollout.temperature,
                                       micro_batch_size=mb)
                worker.update(int(info["version"]), await learner.current_weights())
                roles.prox_worker = LocalRole(worker)
        if a.control_port is not None:
            await producer.start_control(a.control_port, a.control_token, str(c.out_dir))
        self._producer = producer
        return roles

    async def shutdown(self) -> None:
        if self._producer is not None:
            await self._producer.close()
            self._producer = None
        if self._learner_role is not None:
            await self._learner_role.stop_process()
            self._learner_role = None


def env_modules(config: TrainConfig) -> list[str]:
    """The modules that define the run's envs, for a child process to import before it builds
    them (an env registered in a module nobody lists in ``async_rl.imports`` still works)."""
    import relax_gym
    from relax_gym.trainer.config import env_ids

    out: list[str] = []
    for env_id in env_ids(config):
        spec = relax_gym.registration.registry.get(env_id)
        entry = getattr(spec, "entry_point", None)
        module = entry.split(":", 1)[0] if isinstance(entry, str) else getattr(entry, "__module__", None)
        if module and module not in out and _importable_by_name(module):
            out.append(module)
    return out


def _importable_by_name(module: str) -> bool:
    """A module another process can import by its name: not the script (``__main__``; spawn
    re-runs it there) and not one loaded from a file path under a made-up name (a config's
    ``entry_point: path/to/file.py:Env``, which the learner registers again from the config):
    its file must be where that name leads from ``sys.path``."""
    import sys

    if module in ("__main__", "__mp_main__"):
        return False
    spec = getattr(sys.modules.get(module), "__spec__", None)
    origin = getattr(spec, "origin", None)
    if spec is None or not origin or not Path(origin).is_file():
        return spec is not None  # built-in, frozen or namespace modules import by name
    rel = Path(*module.split("."))
    wanted = {rel.with_suffix(Path(origin).suffix), rel / Path(origin).name}
    for entry in sys.path:
        base = Path(entry or ".").resolve()
        if any((base / w).resolve() == Path(origin).resolve() for w in wanted):
            return True
    return False


# ------------------------------------------------------------------------------------------------
# the loop
# ------------------------------------------------------------------------------------------------
class AsyncRunner:
    """Runs a fully_async or hybrid training run on a runtime; see the module docstring."""

    def __init__(self, config: TrainConfig, runtime: Runtime, *, resume: bool | str = False) -> None:
        if not config.is_async:
            raise ValueError(f"AsyncRunner runs fully_async and hybrid; mode is {config.mode!r}")
        self.config = config
        self.runtime = runtime
        self.resume = resume
        self.roles: Roles | None = None
        self.timeline: dict[str, list[tuple[float, float, int]]] = {"rollout": [], "train": []}
        self._published: tuple[int, int] = (0, 0)  # (version, steps) the engines serve
        self.started_at = 0.0
        self.learner_pid: int | None = None  # the process the learner ran in (summary.json says)

    async def run(self) -> RunSummary:
        c = self.config
        self.started_at = time.time()
        curves: str | None = None
        summary: dict[str, Any] = {"steps": 0}
        learner: Role | None = None
        try:
            learner = await self.runtime.make_learner(c, resume=self.resume)
            info = await learner.open()
            summary = {"steps": info["step"]}
            self.learner_pid = info.get("pid")
            if not info["done"]:
                roles = self.roles = await self.runtime.make_data_plane(c, learner, info)
                try:
                    await self._prepare(roles, info)
                    await self._loop(roles, int(info["step"]))
                    summary = await self._finish(roles)
                finally:
                    await self._stop_workers(roles)
        finally:
            try:
                if learner is not None:
                    with contextlib.suppress(Exception):
                        curves = await learner.close()
            finally:
                await self.runtime.shutdown()
        return self._summary(summary, curves)

    def _summary(self, summary: dict[str, Any], curves: str | None) -> RunSummary:
        out = self.config.out_dir
        result = RunSummary(out, int(summary.get("steps", 0)), dict(summary.get("final_eval", {})),
                            dict(summary.get("first_eval", {})), float(summary.get("elapsed_s", 0.0)),
                            Path(curves) if curves else None)
        (out / "summary.json").write_text(json.dumps({
            "mode": self.config.mode, "runtime": self.config.async_rl.runtime, "steps": result.steps,
            "first_eval": result.first_eval, "final_eval": result.final_eval,
            "elapsed_s": round(result.elapsed_s, 2), "curves": curves, "learner_pid": self.learner_pid,
            "driver_pid": os.getpid()}, indent=2), encoding="utf-8")
        return result

    async def _prepare(self, roles: Roles, info: dict[str, Any]) -> None:
        groups = info["queue_groups"]
        if groups or info["queue_state"]:
            await roles.queue.restore(groups, info["queue_state"])
        await roles.queue.advance(int(info["version"]))
        queued = {g.group_id for g in groups}
        producer_state = info["producer_state"]
        await roles.rollout.load_state_dict(producer_state, skip_groups=queued)
        pending = [p for p in producer_state.get("pending", []) if p.get("group_id") not in queued]
        step = int(info["step"])
        effective = step * self.config.rollout.prompts_per_step + len(groups) + len(pending)
        for worker in (roles.ref_worker, roles.prox_worker):
            if worker is not None:
                await worker.start()
        self._published = (int(info["version"]), step)
        await roles.rollout.start(version=int(info["version"]), steps=step, effective=effective)

    async def _loop(self, roles: Roles, step: int) -> None:
        c = self.config
        B = c.rollout.prompts_per_step
        overlap = c.async_rl.overlap_sync
        pending: asyncio.Task[dict[str, float]] | None = None
        sync: dict[str, float] = {}
        try:
            while step < c.train.steps:
                start = time.time()
                batch = await self._next_batch(roles, B)
                metrics = await roles.learner.train(batch)
                version = int(metrics.pop("version"))
                # admission follows the trainer's weights at once; the engines follow when the push lands
                evicted = await roles.queue.advance(version)
                if pending is not None:
                    sync = await pending  # at most one push in flight
                pending = asyncio.create_task(self._publish(roles, version, step + 1, len(evicted)))
                if not overlap:
                    sync, pending = await pending, None
                step += 1
                metrics.update(sync)
                metrics.update(await roles.queue.stats())
                metrics.update(await roles.rollout.stats())
                for worker in (roles.ref_worker, roles.prox_worker):
                    if worker is not None:
                        metrics.update(await worker.stats())
                metrics["queue/evicted_now"] = float(len(evicted))
                metrics["time/step_wall"] = time.time() - start
                await self._collect_timeline(roles)
                await roles.learner.end_step(step, metrics)
                await roles.rollout.check()  # e.g. the env error rate stopped the producer
                if await roles.learner.checkpoint_due(step):
                    await self._checkpoint(roles, f"step_{step:06d}")
            if pending is not None:
                await pending
                pending = None
        finally:
            if pending is not None:
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)

    async def _publish(self, roles: Roles, version: int, steps: int, released: int) -> dict[str, float]:
        """Pause the engines, push ``version``, continue them; the producer's gate opens for
        ``steps`` once the push landed (on failure the previous version stays)."""
        await roles.rollout.pause()
        try:
            sync = await roles.learner.publish()
            self._published = (int(sync.pop("version")), steps)
        finally:
            await roles.rollout.resume(self._published[0], self._published[1], released)
        if roles.prox_worker is not None:
            await roles.prox_worker.update(self._published[0], await roles.learner.published_weights())
        # (a step whose update was skipped -- a non-finite gradient -- publishes nothing new: the
        # version stays, the gate still moves on by one step)
        return sync

    async def _next_batch(self, roles: Roles, groups: int) -> Any:
        """Wait for a batch, checking every few seconds that the producer still produces (a
        producer that failed for good raises here instead of leaving the trainer waiting)."""
        deadline = time.monotonic() + self.config.async_rl.step_timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                stats = await roles.queue.stats()
                raise TimeoutError(f"no batch of {groups} groups within {self.config.async_rl.step_timeout_s:.0f} s "
                                   f"(queue: {stats}); are the engines alive?")
            batch = await roles.queue.next_batch(groups, timeout_s=min(5.0, remaining))
            if batch is not None:
                return batch
            await roles.rollout.check()

    async def _checkpoint(self, roles: Roles, name: str) -> str:
        # taken together: no group moves between the producer's pending set and the queue meanwhile
        producer_state, snapshot = await roles.rollout.checkpoint_state()
        return str(await roles.learner.save(name, producer_state, snapshot))

    async def _collect_timeline(self, roles: Roles) -> None:
        self.timeline["rollout"].extend(await roles.rollout.take_timeline())
        self.timeline["train"].extend(await roles.learner.take_train_intervals())

    async def _finish(self, roles: Roles) -> dict[str, Any]:
        await roles.rollout.stop()
        await self._collect_timeline(roles)
        producer_state, snapshot = await roles.rollout.checkpoint_state()
        await roles.queue.check()
        self._write_timeline()
        return dict(await roles.learner.finish(producer_state, snapshot))

    async def _stop_workers(self, roles: Roles) -> None:
        with contextlib.suppress(Exception):
            await roles.rollout.stop()
        for worker in (roles.ref_worker, roles.prox_worker):
            if worker is not None:
                with contextlib.suppress(Exception):
                    await worker.stop()
        with contextlib.suppress(Exception):
            await roles.queue.close()

    def _write_timeline(self) -> None:
        path = self.config.out_dir / "timeline.json"
        data = {k: [[round(a - self.started_at, 4), round(b - self.started_at, 4), v] for a, b, v in items]
                for k, items in self.timeline.items()}
        path.write_text(json.dumps(data), encoding="utf-8")


async def run_async(config: TrainConfig, *, resume: bool | str = False, runtime: Runtime | None = None) -> RunSummary:
    """Run a fully_async / hybrid config on its configured runtime (or the one given)."""
    if runtime is None:
        if config.async_rl.runtime == "ray":
            from relax_gym.trainer.modes.ray_runtime import RayRuntime

            runtime = RayRuntime(config)
        else:
            runtime = EmbeddedRuntime()
    return await AsyncRunner(config, runtime, resume=resume).run()


def train(config: TrainConfig, *, resume: bool | str = False) -> RunSummary:
    """Run any mode to the end (blocking): the asynchronous modes through :class:`AsyncRunner`,
    colocate through the training core's loop (as ``relax-gym train`` does).

    As in colocate, SIGTERM (and Ctrl-C) cancel an asynchronous run cleanly: the workers stop,
    the engines the run started are stopped, then :class:`KeyboardInterrupt` is raised; resume
    from the last checkpoint.
    """
    if not config.is_async:
        from relax_gym.trainer.modes.colocate import train as colocate_train

        return colocate_train(config, resume=resume)
    from relax_gym.trainer.interrupts import run_stoppable

    return run_stoppable(lambda: run_async(config, resume=resume))


__all__ = ["AsyncRunner", "EmbeddedRuntime", "Roles", "Runtime", "import_modules", "needs_workers", "run_async",
           "train"]
