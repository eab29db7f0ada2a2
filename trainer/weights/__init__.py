"""Weight sync: moving the trainer's weights into the engines, in every mode and from both backends.

* :mod:`~.transport` -- the :class:`~.transport.WeightTransport` interface and what it sends
  (:class:`~.transport.LiveWeights`: the backend's ``export_weights`` buckets, streamed;
  :class:`~.transport.Snapshot`: a CPU copy);
* :mod:`~.tensor`, :mod:`~.disk`, :mod:`~.broadcast` -- the three transports
  (``engine.sync: tensor | disk | distributed``);
* :mod:`~.publisher` -- :class:`~.publisher.WeightPublisher`: pause, push, flush, verify the
  version, record it, resume; failover when an engine dies mid-push; catch-up of engines that
  join or come back.

The engine's receiving side stays with the engine (:mod:`relax_gym.trainer.engines.weight_receiver`).
See ``docs/training.md`` (weight sync) and ``docs/async.md`` (publishing while rollouts run).
"""
