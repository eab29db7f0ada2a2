"""Settings of the asynchronous execution modes, and a training config that selects the mode.

``mode`` picks how rollout and training share the machine:

* ``colocate`` -- generate, then train, then sync (the training core's loop, strictly on-policy);
* ``fully_async`` -- rollout never waits for training except where the staleness bound requires
  it; the trainer takes a batch as soon as one is ready; reference and proximal logprobs run as
  separate workers that annotate queued samples;
* ``hybrid`` -- the same separate rollout engines and queue, but the trainer computes reference
  and proximal logprobs itself (no extra workers: one process fewer on a small machine).

:class:`AsyncConfig` (the ``async_rl:`` section) holds every knob of the last two, each with its
meaning beside it. :class:`ModesTrainConfig` is the training core's
:class:`~relax_gym.trainer.config.TrainConfig` with ``mode`` widened to the three modes and this
section added; :func:`load_modes_config` reads it from YAML with the same dotted overrides and
the same readable errors.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from relax_gym.trainer.config import (
    ConfigError,
    TrainConfig,
    apply_overrides,
    format_validation_error,
)

Mode = Literal["colocate", "fully_async", "hybrid"]
ASYNC_MODES: tuple[str, ...] = ("fully_async", "hybrid")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


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
    """The ``async_rl:`` section: queue, staleness, weight updates, workers, runtime."""

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
    weight_sync: Literal["engine", "distributed"] = Field(
        "engine", description="engine: the path engine.sync selects (in-memory tensors or disk); distributed: "
        "/init_weights_update_group + /update_weights_from_distributed and a bucketed broadcast")
    broadcast_backend: Literal["gloo", "nccl"] = Field(
        "gloo", description="process-group backend of the distributed path (nccl for SGLang on GPUs)")
    master_address: str = Field("127.0.0.1", description="the trainer's address engines join the group at")
    master_port: int | None = Field(None, ge=1, le=65535, description="group port (None: a free port)")
    overlap_sync: bool = Field(
        True, description="push a step's weights while the next step trains (tensor and distributed paths; the "
        "disk path always publishes before training on): the sync leaves the trainer's critical path")
    reward_retries: int = Field(
        2, ge=0, description="a crashed reward worker is retried this many times, then its samples are "
        "marked reward-failed (rewards.failed decides drop or zero)")
    runtime: Literal["embedded", "ray"] = Field(
        "embedded", description="embedded: one process, asyncio + engine subprocesses; ray: every role an actor")
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

    def capacity(self, prompts_per_step: int) -> int:
        return self.queue_capacity or (self.max_staleness + 2) * prompts_per_step


class ModesTrainConfig(TrainConfig):
    """:class:`TrainConfig` with the three modes and the ``async_rl:`` section."""

    mode: Mode = Field(  # type: ignore[assignment]
        "colocate", description="colocate | fully_async | hybrid (see relax_gym.trainer.modes)")
    async_rl: AsyncConfig = Field(default_factory=AsyncConfig)

    @model_validator(mode="after")
    def _async_checks(self) -> ModesTrainConfig:
        a = self.async_rl
        if a.stale_policy == "correct" and self.algorithm.rollout_correction == "none":
            raise ValueError(
                "async_rl.stale_policy 'correct' trains too-stale samples with an importance correction: "
                "set algorithm.rollout_correction to tis, mis or decoupled (or use stale_policy: drop)")
        if a.queue_capacity is not None and a.queue_capacity < self.rollout.prompts_per_step:
            raise ValueError(
                f"async_rl.queue_capacity ({a.queue_capacity}) must hold one batch "
                f"(rollout.prompts_per_step = {self.rollout.prompts_per_step} groups)")
        if self.mode == "colocate" and a.runtime == "ray":
            raise ValueError("async_rl.runtime 'ray' runs the fully_async and hybrid modes; colocate runs embedded")
        for name in a.imports:
            if not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", name):
                raise ValueError(f"async_rl.imports entry {name!r} is not a module name")
        return self

    @property
    def is_async(self) -> bool:
        return self.mode in ASYNC_MODES


def _fix_floats(data: Any) -> Any:
    """YAML 1.1 reads ``1e-3`` as a string; turn such strings back into floats."""
    if isinstance(data, dict):
        return {k: _fix_floats(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_fix_floats(v) for v in data]
    if isinstance(data, str) and re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+", data):
        return float(data)
    return data


def modes_config_from_dict(data: Mapping[str, Any], overrides: Sequence[str] = ()) -> ModesTrainConfig:
    """Validate a config mapping plus ``key.sub=value`` overrides; :class:`ConfigError` names every bad field."""
    merged = _fix_floats(apply_overrides(dict(data), overrides))
    try:
        return ModesTrainConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, ModesTrainConfig)) from None


def load_modes_config(path: str | Path, overrides: Sequence[str] = ()) -> ModesTrainConfig:
    """Read a YAML training config (any mode), apply overrides and validate."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"config file {str(file)!r} not found")
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: the top level must be a mapping of sections, got {type(data).__name__}")
    return modes_config_from_dict(data, overrides)


__all__ = [
    "ASYNC_MODES",
    "AsyncConfig",
    "Mode",
    "ModesTrainConfig",
    "RayConfig",
    "RoleResources",
    "load_modes_config",
    "modes_config_from_dict",
]
