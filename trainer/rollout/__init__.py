"""The asynchronous multi-turn rollout manager: exact token-level trajectories from environments.

* :class:`RolloutManager` -- runs episodes concurrently (per-episode asyncio tasks) and returns
  :class:`Trajectory` samples;
* :class:`EngineRouter` -- least-loaded routing with session affinity over several SGLang-protocol
  engines, health checks, failover, pause/continue/abort, weight sync, elastic add/drain;
* :class:`ControlServer` -- the token-protected REST API that adds and removes engines at run time.

Episodes are encoded by the core's chat encoder (:mod:`relax_gym.chat`: ``ChatCodec`` and
``ChatContext``), the one ``relax-gym eval`` uses too. See ``docs/rollout.md``.
"""

from typing import TYPE_CHECKING

from relax_gym.lazy_exports import lazy_exports

# Names load on first use: validating a training config imports ``.config`` (the ``rollout:``
# section) without the router's HTTP client, and the control server pulls in FastAPI/uvicorn
# only when asked for.
__getattr__, __all__ = lazy_exports(__name__, {
    "config": ["RolloutConfig"],
    "control": ["ControlServer"],
    "episode": ["EpisodeRunner", "EpisodeSpec"],
    "manager": ["RolloutManager"],
    "metrics": ["RolloutMetrics"],
    "router": ["EngineHandle", "EngineRouter", "NoEngineAvailable", "WeightSyncError", "parse_weight_version"],
    "trajectory": ["FAILED_STOP_REASONS", "STOP_REASONS", "StopReason", "Trajectory", "TrajectoryError",
                   "TurnRecord", "iter_jsonl", "load_jsonl", "save_jsonl"],
})

if TYPE_CHECKING:
    from relax_gym.trainer.rollout.config import RolloutConfig
    from relax_gym.trainer.rollout.control import ControlServer
    from relax_gym.trainer.rollout.episode import EpisodeRunner, EpisodeSpec
    from relax_gym.trainer.rollout.manager import RolloutManager
    from relax_gym.trainer.rollout.metrics import RolloutMetrics
    from relax_gym.trainer.rollout.router import (
        EngineHandle,
        EngineRouter,
        NoEngineAvailable,
        WeightSyncError,
        parse_weight_version,
    )
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
