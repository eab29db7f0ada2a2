"""Execution modes beyond colocate: fully asynchronous and hybrid RL, on one machine or on Ray.

* :class:`~.config.ModesTrainConfig` -- the training config with ``mode: colocate | fully_async |
  hybrid`` and the ``async_rl:`` section (:class:`~.config.AsyncConfig`);
* :class:`~.queue.TrajectoryQueue` -- bounded, group-preserving, per-sample staleness admission,
  exactly-once consumption, checkpointable;
* :class:`~.producer.RolloutProducer` -- continuous, throttled generation into the queue;
* :class:`~.learner.Learner` -- trains on queued batches and publishes weights while rollouts run;
* :class:`~.logprobs.LogprobWorker` -- reference / proximal logprobs off the trainer's path;
* :mod:`.weight_sync` -- the distributed broadcast path, publishing with failover, elastic joins;
* :mod:`.runner` -- the loop and the embedded runtime; :mod:`.ray_runtime` -- the Ray runtime.

``python -m relax_gym.trainer.modes CONFIG [key=value ...] [--resume]`` runs any mode.
See ``docs/async.md``.
"""

from .config import ASYNC_MODES, AsyncConfig, ModesTrainConfig, RayConfig, load_modes_config, modes_config_from_dict
from .queue import Batch, QueuedGroup, QueuedSample, QueueError, TrajectoryQueue

__all__ = [
    "ASYNC_MODES",
    "AsyncConfig",
    "Batch",
    "ModesTrainConfig",
    "QueueError",
    "QueuedGroup",
    "QueuedSample",
    "RayConfig",
    "TrajectoryQueue",
    "load_modes_config",
    "modes_config_from_dict",
    "run_async",
    "train",
]


def __getattr__(name: str) -> object:
    # the runners pull in torch and the rollout stack; load them when asked for
    if name in ("run_async", "train"):
        from . import runner

        return getattr(runner, name)
    raise AttributeError(name)
