"""The ``async_rl:`` section of the training config: every knob of the fully_async and hybrid
modes, with its meaning beside it.

The training config (:class:`~relax_gym.trainer.config.TrainConfig`) embeds :class:`AsyncConfig`
as ``async_rl``, and checks it against the other sections there. This module therefore imports
nothing from the training config, nor torch or ray: importing the config stays light.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: weight-sync keys that moved to the ``engine:`` section
_MOVED = {"weight_sync": "engine.sync (distributed)", "broadcast_backend": "engine.distributed.backend",
          "master_address": "engine.distributed.master_address", "master_port": "engine.distributed.master_port"}


class _Section(BaseModel):
    # allow_inf_nan=False: `step_timeout_s: .inf` or `num_cpus: nan` would pass `gt=0` / `ge=0`
    model_config = ConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False)


class RoleResources(_Section):
    """Ray resources of one actor (its placement-group bundle)."""

    num_cpus: float = Field(1.0, ge=0, description="CPUs reserved for the actor")
    num_gpus: float = Field(0.0, ge=0, description="GPUs reserved for the actor")
    resources: dict[str, float] = Field(default_factory=dict, description="custom Ray resources, e.g. {node_a: 1}")


class RayConfig(_Section):
    """Where the Ray runtime runs and what each actor reserves."""

    address: str | None = Field(
        None, description="an existing cluster ('ray://host:10001' or 'host:6379' or 'auto'); "
        "None starts a local single-node cluster bound to 127.0.0.1")
    num_cpus: int | None = Field(None, ge=1, description="CPUs of the local cluster (None: Ray's count)")
    num_gpus: int | None = Field(None, ge=0, description="GPUs of the local cluster (None: Ray's count)")
    namespace: str = Field("relax-gym", description="Ray namespace of the run's actors")
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="how the placement group spreads the bundles over nodes")
    placement_timeout_s: float = Field(120.0, gt=0, description="wait this long for the bundles to be placed")
    trainer: RoleResources = Field(default_factory=lambda: RoleResources(num_cpus=1))
    rollout: RoleResources = Field(default_factory=lambda: RoleResources(num_cpus=0))
    engine: RoleResources = Field(default_factory=lambda: RoleResources(num_cpus=1),
                                  description="one engine actor (embedded engines run as its child process)")
    reward: RoleResources = Field(default_factory=lambda: RoleResources(num_cpus=0))
    queue: RoleResources = Field(default_factory=lambda: RoleResources(num_cpus=0))
    logprob: RoleResources = Field(default_factory=lambda: RoleResources(num_cpus=0))
    reward_workers: int = Field(1, ge=1, description="reward actors (GenRM clients / rule rewards), round-robin")
    actor_max_restarts: int = Field(2, ge=0, description="restarts of a crashed reward or engine actor")
    runtime_env: dict[str, Any] = Field(default_factory=dict, description="Ray runtime_env for the actors")


class AsyncConfig(_Section):
    """The ``async_rl:`` section: queue, staleness, overlapped weight updates, workers, runtime."""

    max_staleness: int = Field(
        1, ge=0, description="a sample is trained only if current_version - min(its token versions) <= this; "
        "0 reproduces colocate's on-policy batches")
    stale_policy: Literal["drop", "correct"] = Field(
        "drop", description="too-stale samples: drop them (counted), or train them with the configured "
        "rollout correction (algorithm.rollout_correction must be tis, mis or decoupled)")
    queue_capacity: int | None = Field(
        None, ge=1, description="groups the queue holds at most (None: (max_staleness + 2) * prompts_per_step)")
    prox_max_lag: int = Field(
        1, ge=0, description="fully_async: a proximal logprob computed by the worker is used when its "
        "version is at most this far behind the trainer; otherwise the trainer recomputes it")
    overlap_sync: bool = Field(
        True, description="push a step's weights while the next step trains (tensor and distributed paths; the "
        "disk path always publishes before training on): the sync leaves the trainer's critical path")
    reward_retries: int = Field(
        2, ge=0, description="a crashed reward worker is retried this many times, then its samples are "
        "marked reward-failed (rewards.failed decides drop or zero)")
    runtime: Literal["embedded", "ray"] = Field(
        "embedded", description="embedded: this machine, no cluster (asyncio + engine subprocesses); ray: every "
        "role an actor")
    learner_process: bool = Field(
        False, description="embedded runtime: run the trainer role in a child process of its own, so its steps do "
        "not share the interpreter lock with rollout generation. Off by default: on a 2-core machine the extra "
        "runnable process costs more than the lock (docs/benchmarks.md, 'Async modes'); try it with cores to spare "
        "and many engines feeding one driver")
    ray: RayConfig = Field(default_factory=RayConfig)
    imports: list[str] = Field(
        default_factory=list, description="modules imported in every process before envs/rewards are made "
        "(registers custom envs and rewards in Ray workers too)")
    control_port: int | None = Field(
        None, ge=0, le=65535, description="serve the elastic control API (add/remove engines) on 127.0.0.1 at "
        "this port (0: a free port); None: off")
    control_token: str | None = Field(None, description="bearer token of the control API (None: random, written "
                                      "to <out>/control.json)")
    step_timeout_s: float = Field(
        1800.0, gt=0, description="the trainer gives up when no batch is ready for this long (all engines dead)")

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        """The weight-sync transport is chosen in one place for every mode: say where it went."""
        if isinstance(data, dict):
            moved = [f"async_rl.{key} is now {where}" for key, where in _MOVED.items() if key in data]
            if moved:
                raise ValueError("; ".join(moved))
        return data

    def capacity(self, prompts_per_step: int) -> int:
        return self.queue_capacity or (self.max_staleness + 2) * prompts_per_step


__all__ = ["AsyncConfig", "RayConfig", "RoleResources"]
