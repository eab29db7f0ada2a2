"""Execution modes: colocate, and fully asynchronous / hybrid RL on one machine or on Ray.

* :mod:`.colocate` -- generate, then train, then sync: strictly on-policy (``mode: colocate``);
* :class:`~.async_config.AsyncConfig` -- the ``async_rl:`` section of the one training config
  (:class:`~relax_gym.trainer.config.TrainConfig`, whose ``mode`` selects colocate, fully_async
  or hybrid);
* :class:`~.trajectory_queue.TrajectoryQueue` -- bounded, group-preserving, per-sample
  staleness admission, exactly-once consumption, checkpointable;
* :class:`~.producer.RolloutProducer` -- continuous, throttled generation into the queue;
* :class:`~.learner.Learner` -- trains on queued batches and publishes weights while rollouts run;
* :class:`~.logprob_workers.LogprobWorker` -- reference / proximal logprobs off the trainer's path;
* :mod:`.async_runner` -- the fully_async / hybrid loop and the embedded runtime;
  :mod:`.ray_runtime` and :mod:`.ray_actors` -- the Ray runtime; :mod:`.roles` -- role handles.

Weight publishing lives in :mod:`relax_gym.trainer.weights`. ``relax-gym train CONFIG
[key=value ...] [--resume]`` runs any mode (``python -m relax_gym.trainer.modes`` is the same
command). See ``docs/async.md``.
"""

from relax_gym.lazy_exports import lazy_exports

# Names are loaded on first use: a Ray reward worker imports this package without paying for
# torch, and the training config imports .async_config without a cycle.
__getattr__, __all__ = lazy_exports(__name__, {
    "async_config": ["AsyncConfig", "RayConfig", "RoleResources"],
    "trajectory_queue": ["Batch", "QueueError", "QueuedGroup", "QueuedSample", "TrajectoryQueue"],
    "async_runner": ["run_async", "train"],
})
