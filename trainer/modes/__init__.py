"""Execution modes beyond colocate: fully asynchronous and hybrid RL, on one machine or on Ray.

* :class:`~.settings.AsyncConfig` -- the ``async_rl:`` section of the one training config
  (:class:`~relax_gym.trainer.config.TrainConfig`, whose ``mode`` selects colocate, fully_async
  or hybrid);
* :class:`~.queue.TrajectoryQueue` -- bounded, group-preserving, per-sample staleness admission,
  exactly-once consumption, checkpointable;
* :class:`~.producer.RolloutProducer` -- continuous, throttled generation into the queue;
* :class:`~.learner.Learner` -- trains on queued batches and publishes weights while rollouts run;
* :class:`~.logprobs.LogprobWorker` -- reference / proximal logprobs off the trainer's path;
* :mod:`.weight_sync` -- the distributed broadcast path, publishing with failover, elastic joins;
* :mod:`.runner` -- the loop and the embedded runtime; :mod:`.ray_runtime` -- the Ray runtime.

``relax-gym train CONFIG [key=value ...] [--resume]`` runs any mode (``python -m
relax_gym.trainer.modes`` is the same command). See ``docs/async.md``.
"""

from importlib import import_module
from typing import Any

# Names are loaded on first use: a Ray reward worker imports this package without paying for
# torch, and the training config imports .settings without a cycle.
_EXPORTS = {
    "AsyncConfig": ".settings", "RayConfig": ".settings", "RoleResources": ".settings",
    "Batch": ".queue", "QueueError": ".queue", "QueuedGroup": ".queue", "QueuedSample": ".queue",
    "TrajectoryQueue": ".queue", "run_async": ".runner", "train": ".runner",
}

__all__ = [
    "AsyncConfig", "Batch", "QueueError", "QueuedGroup", "QueuedSample", "RayConfig", "RoleResources",
    "TrajectoryQueue", "run_async", "train",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(name)
    return getattr(import_module(module, __name__), name)
