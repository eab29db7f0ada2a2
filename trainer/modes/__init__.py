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

from importlib import import_module
from typing import Any

# Names are loaded on first use: a Ray reward worker imports this package without paying for
# torch (the config module pulls it in through the training config).
_EXPORTS = {
    "ASYNC_MODES": ".config", "AsyncConfig": ".config", "ModesTrainConfig": ".config", "RayConfig": ".config",
    "load_modes_config": ".config", "modes_config_from_dict": ".config",
    "Batch": ".queue", "QueueError": ".queue", "QueuedGroup": ".queue", "QueuedSample": ".queue",
    "TrajectoryQueue": ".queue", "run_async": ".runner", "train": ".runner",
}

__all__ = [
    "ASYNC_MODES", "AsyncConfig", "Batch", "ModesTrainConfig", "QueueError", "QueuedGroup", "QueuedSample",
    "RayConfig", "TrajectoryQueue", "load_modes_config", "modes_config_from_dict", "run_async", "train",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(name)
    return getattr(import_module(module, __name__), name)
