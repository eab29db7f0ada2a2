"""The asynchronous multi-turn rollout manager: exact token-level trajectories from environments.

* :class:`RolloutManager` -- runs episodes concurrently (per-episode asyncio tasks) and returns
  :class:`Trajectory` samples;
* :class:`EngineRouter` -- least-loaded routing with session affinity over several SGLang-protocol
  engines, health checks, failover, pause/continue/abort, weight sync, elastic add/drain;
* :class:`ControlServer` -- the token-protected REST API that adds and removes engines at run time.

Episodes are encoded by the core's chat encoder (:mod:`relax_gym.chat`: ``ChatCodec`` and
``ChatContext``), the one ``relax-gym eval`` uses too. See ``docs/rollout.md``.
"""

from relax_gym.trainer.rollout.config import RolloutConfig
from relax_gym.trainer.rollout.episode import EpisodeRunner, EpisodeSpec
from relax_gym.trainer.rollout.manager import RolloutManager
from relax_gym.trainer.rollout.metrics import RolloutMetrics
from relax_gym.trainer.rollout.router import EngineHandle, EngineRouter, NoEngineAvailable, WeightSyncError, parse_weight_version
from relax_gym.trainer.rollout.trajectory import (
    FAILED_STOP_REASONS,
    STOP_REASONS,
    StopReason,
    Trajectory,
    TrajectoryError,
    TurnRecord,
    iter_jsonl,
    load_jsonl,
    save_jsonl,
)


def __getattr__(name: str) -> object:
    # The control server pulls in FastAPI/uvicorn; load it only when asked for.
    if name == "ControlServer":
        from relax_gym.trainer.rollout.control import ControlServer

        return ControlServer
    raise AttributeError(name)


__all__ = [
    "FAILED_STOP_REASONS",
    "STOP_REASONS",
    "ControlServer",
    "EngineHandle",
    "EngineRouter",
    "EpisodeRunner",
    "EpisodeSpec",
    "NoEngineAvailable",
    "RolloutConfig",
    "RolloutManager",
    "RolloutMetrics",
    "StopReason",
    "Trajectory",
    "TrajectoryError",
    "TurnRecord",
    "WeightSyncError",
    "iter_jsonl",
    "load_jsonl",
    "parse_weight_version",
    "save_jsonl",
]
