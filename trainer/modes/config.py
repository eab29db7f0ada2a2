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
from pydantic import Field, ValidationError, model_validator
from relax_gym.trainer.config import ConfigError, TrainConfig, apply_overrides, format_validation_error

from .settings import AsyncConfig, RayConfig, RoleResources

Mode = Literal["colocate", "fully_async", "hybrid"]
ASYNC_MODES: tuple[str, ...] = ("fully_async", "hybrid")


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
