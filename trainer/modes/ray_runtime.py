"""The Ray runtime: every role an actor, placed by a placement group built from the config.

Actors (one generic :class:`RoleActor` class, hosting the very objects the embedded runtime uses):

* ``learner`` -- :class:`~.learner.Learner` (backend, optimizer, evaluation, checkpoints, weight
  publishing); ``async_rl.ray.trainer`` resources (GPUs go here);
* ``engine-i`` -- one embedded engine each (a child process of the actor, so Ray schedules and
  accounts it); ``async_rl.ray.engine`` resources per engine;
* ``rollout`` -- :class:`~.producer.RolloutProducer` with its own router over the engines and
  the elastic control API;
* ``queue`` -- :class:`~.queue.TrajectoryQueue` (an async actor);
* ``reward-i`` -- :class:`~.rewards.RewardWorker` (rule rewards and GenRM clients), restarted by
  Ray when they crash; the producer retries on them and then marks samples failed;
* ``ref`` / ``prox`` -- :class:`~.logprobs.LogprobWorker` (fully_async mode, when needed).

Roles with resources get a bundle in one placement group (``async_rl.ray.placement_strategy``);
roles that reserve nothing are scheduled without one. ``async_rl.ray.address`` joins an existing
cluster (multi-node: engines then listen on their node's address, token-protected); without it a
local single-node cluster starts bound to 127.0.0.1. The runner drives the actors through
:class:`~.roles.RayRole`, so the loop is the same code as in the embedded runtime.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from relax_gym.trainer.config import TrainConfig

from relax_gym.trainer.modes.ray_actors import RoleActor
from relax_gym.trainer.modes.roles import RayRole, Role, Roles, needs_workers
from relax_gym.trainer.modes.async_config import RoleResources

log = logging.getLogger("relax_gym.trainer.modes")


# ------------------------------------------------------------------------------------------------
# the runtime
# ------------------------------------------------------------------------------------------------
def _bundle(r: RoleResources) -> dict[str, float]:
    out = {k: v for k, v in r.resources.items() if v > 0}
    if r.num_cpus > 0:
        out["CPU"] = r.num_cpus
    if r.num_gpus > 0:
        out["GPU"] = r.num_gpus
    return out


class RayRuntime:
    """Builds the roles as Ray actors; see the module docstring."""

    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        self._started_ray = False
        self._actors: list[Any] = []
        self._engines: list[Any] = []
        self._pg: Any = None
        self._slots: dict[str, int] = {}
        self._rollout: Any = None
        self._queue: Any = None
        self._rewards: list[Any] = []
        self._engine_key: str | None = None
        self.model_path = ""
        self.api_key = secrets.token_hex(16)

    # -- cluster and placement -------------------------------------------------------------------------
    def _init_ray(self) -> None:
        import ray

        r = self.config.async_rl.ray
        if ray.is_initialized():
            return
        # actors import the project and the config's modules (custom envs/rewards) from here too
        paths = [os.getcwd(), *[p for p in sys.path if p and Path(p).is_dir() and "site-packages" not in p]]
        env = dict(r.runtime_env)
        env_vars = dict(env.get("env_vars", {}))
        env_vars.setdefault("PYTHONPATH", os.pathsep.join(dict.fromkeys(paths)))
        env_vars.setdefault("TOKENIZERS_PARALLELISM", "false")
        env["env_vars"] = env_vars
        for attempt in range(3):
            try:
                if r.address is None:
                    ray.init(num_cpus=r.num_cpus, num_gpus=r.num_gpus, _node_ip_address="127.0.0.1", include_dashboard=False,
                             namespace=r.namespace, runtime_env=env, log_to_driver=False)
                else:
                    ray.init(address=r.address, namespace=r.namespace, runtime_env=env, log_to_driver=False)
                break
            except Exception as exc:
                if "timed out during startup" not in str(exc) or attempt == 2:
                    raise
                log.warning("Ray did not start (%s); retrying", exc)
                ray.shutdown()
        self._started_ray = True

    async def _place(self, roles: list[tuple[str, RoleResources]]) -> None:
        """One placement group holding a bundle per role that reserves something."""
        import ray
        from ray.util import placement_group

        bundles, names = [], []
        for name, res in roles:
            b = _bundle(res)
            if b:
                names.append(name)
                bundles.append(b)
        if not bundles:
            return
        r = self.config.async_rl.ray
        self._pg = placement_group(bundles, strategy=r.placement_strategy, name=f"{self.config.run_name}-modes")
        try:
            await asyncio.wait_for(self._pg.ready(), r.placement_timeout_s)
        except TimeoutError:
            available = ray.available_resources()
            raise RuntimeError(
                f"Ray could not place the run's bundles {dict(zip(names, bundles, strict=True))} within "
                f"{r.placement_timeout_s:.0f} s (strategy {r.placement_strategy}); cluster has {available}. "
                "Lower async_rl.ray.<role>.num_cpus/num_gpus or add nodes") from None
        self._slots = {name: i for i, name in enumerate(names)}

    def _spawn(self, slot: str, kind: str, res: RoleResources, kwargs: dict[str, Any], *,
               restarts: int = 0) -> Any:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        options: dict[str, Any] = {"num_cpus": res.num_cpus, "num_gpus": res.num_gpus, "max_restarts": restarts,
                                   "max_task_retries": 0, "max_concurrency": 1000}
        if res.resources:
            options["resources"] = dict(res.resources)
        if slot in self._slots:
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=self._pg, placement_group_bundle_index=self._slots[slot])
        actor = ray.remote(RoleActor).options(**options).remote(kind, self.config.model_dump(mode="json"), kwargs)
        self._actors.append(actor)
        return actor

    # -- the roles ---------------------------------------------------------------------------------------
    async def make_learner(self, config: TrainConfig, *, resume: bool | str) -> Role:
        self._init_ray()
        c, r = config, config.async_rl.ray
        want_ref, want_prox = needs_workers(c)
        slots: list[tuple[str, RoleResources]] = [("trainer", r.trainer), ("rollout", r.rollout), ("queue", r.queue)]
        slots += [(f"reward{i}", r.reward) for i in range(r.reward_workers)]
        engine_res = engine_resources(c)
        slots += [(f"engine{i}", engine_res) for i in range(c.engine.num_engines)]
        slots += [(name, r.logprob) for name, on in (("ref", want_ref), ("prox", want_prox)) if on]
        await self._place(slots)
        learner = self._spawn("trainer", "learner", r.trainer, {"resume": resume})
        if resume:
            from relax_gym.trainer.modes.learner import kill_orphan_engines

            kill_orphan_engines(c.out_dir)  # engines of a crashed driver (single node)
        self.model_path = await learner.call.remote("prepare_model_folder")
        if c.engine.kind == "external":
            urls, api_key = list(c.engine.urls), c.engine.api_key
        else:
            log_dir = c.out_dir / "engines"
            log_dir.mkdir(parents=True, exist_ok=True)
            sglang = c.engine.sglang.model_dump(mode="json") if c.engine.kind == "sglang" else None
            self._engines = [self._spawn(f"engine{i}", "engine", engine_res, {
                "model_path": self.model_path, "api_key": self.api_key, "seed": c.seed + i,
                "max_batch_size": c.engine.max_batch_size, "threads": c.engine.threads,
                "log_file": str(log_dir / f"engine{i}.log"), "startup_timeout_s": c.engine.startup_timeout_s,
                "local": r.address is None, "sglang": sglang})
                for i in range(c.engine.num_engines)]
            urls = list(await asyncio.gather(*(e.call.remote("url") for e in self._engines)))
            pids = await asyncio.gather(*(e.call.remote("pid") for e in self._engines))
            (log_dir / "pids.json").write_text(json.dumps([{"pid": p, "url": u} for p, u in zip(pids, urls,
                                                                                             strict=True)]))
            api_key = self.api_key
        await learner.call.remote("set_engines", urls, api_key)
        self._engine_key = api_key
        role = RayRole(learner, "learner")
        # the data plane starts now, so its imports overlap the learner's set-up and warm-up
        self._queue = RayRole(self._spawn("queue", "queue", r.queue, {"version": 0}), "queue")
        self._rewards = [RayRole(self._spawn(f"reward{i}", "reward", r.reward, {}, restarts=r.actor_max_restarts),
                                 f"reward{i}") for i in range(r.reward_workers)]
        rollout_actor = self._spawn("rollout", "rollout", r.rollout, {
            "learner": role, "urls": urls, "api_key": api_key, "model_path": self.model_path,
            "queue": self._queue, "rewards": self._rewards})
        self._rollout = RayRole(rollout_actor, "rollout")
        return role

    async def make_data_plane(self, config: TrainConfig, learner: Role, info: dict[str, Any]) -> Roles:
        c, a, r = config, config.async_rl, config.async_rl.ray
        queue, rollout = self._queue, self._rollout
        await rollout.open_router()
        if a.control_port is not None:
            await rollout.start_control(a.control_port, a.control_token, str(c.out_dir))
        roles = Roles(learner=learner, queue=queue, rollout=rollout, rewards=self._rewards,
                      extra={"engines": self.engines})
        want_ref, want_prox = needs_workers(c)
        if want_ref:
            roles.ref_worker = RayRole(self._spawn("ref", "logprob", r.logprob, {
                "which": "ref", "model_path": info["reference_model"], "queue": queue}), "ref")
        if want_prox:
            roles.prox_worker = RayRole(self._spawn("prox", "logprob", r.logprob, {
                "which": "prox", "model_path": self.model_path, "queue": queue}), "prox")
            await roles.prox_worker.update(int(info["version"]), await learner.current_weights())
        return roles

    @property
    def engines(self) -> list[Role]:
        return [RayRole(e, f"engine{i}") for i, e in enumerate(self._engines)]

    async def shutdown(self) -> None:
        import ray

        if self._rollout is not None:
            try:
                await asyncio.wait_for(self._rollout.close(), 60)
            except Exception:
                log.debug("closing the rollout actor failed", exc_info=True)
            self._rollout = None
        # engines are child processes of their actors: stop them before the actors go
        await asyncio.gather(*(asyncio.wait_for(_ray_call(e, "stop"), 60) for e in self._engines),
                             return_exceptions=True)
        self._engines = []
        for actor in self._actors:
            try:
                ray.kill(actor)
            except Exception:
                log.debug("killing an actor failed", exc_info=True)
        self._actors = []
        if self._pg is not None:
            from ray.util import remove_placement_group

            remove_placement_group(self._pg)
            self._pg = None
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False


async def _ray_call(actor: Any, name: str, *args: Any) -> Any:
    return await actor.call.remote(name, *args)



def engine_resources(config: TrainConfig) -> RoleResources:
    """What one engine actor reserves: ``async_rl.ray.engine``, and for ``engine.kind: sglang``
    at least ``engine.sglang.tp`` GPUs (Ray then sets the actor's ``CUDA_VISIBLE_DEVICES`` to
    them, which is where its SGLang server runs)."""
    res = config.async_rl.ray.engine
    if config.engine.kind == "sglang" and res.num_gpus < config.engine.sglang.tp:
        return res.model_copy(update={"num_gpus": float(config.engine.sglang.tp)})
    return res

__all__ = ["RayRuntime", "engine_resources"]
