"""The one weight publisher: what every mode and backend calls after a training step.

:meth:`WeightPublisher.publish` makes every live engine behind a router serve the trainer's
weights as a numbered version:

1. **targets** -- the router's live engines (waiting, bounded, for the health loop to revive one
   when none is live);
2. **pause** -- generation stops; in-flight segments come back partial and resume afterwards;
3. **push** -- the transport (:mod:`~.tensor`, :mod:`~.disk` or :mod:`~.broadcast`) streams the
   weights; only the last bucket carries the version, so no engine reports a half-loaded one;
4. **flush** -- ``/flush_cache`` drops prefix caches of the old weights (a refusal because a
   request slipped in before the pause is harmless: that request runs on the new weights);
5. **verify** -- every engine must report the version in ``/get_model_info``;
6. **record** -- the router learns the version (and the disk folder) for engines that join
   later; then **resume**.

**Failover.** Engines that fail the push (the transport names them, or it fails as a whole, as a
broken collective does), the flush or the check are probed once: the dead ones are marked
unhealthy at once, and the push is retried, still paused, on those that answer (``retries``
times; then they are marked unhealthy too, since they may hold half-loaded weights). The sync
succeeds when at least one engine serves the version; with none, :class:`WeightSyncFailed`.

**Catch-up.** The publisher is the router's ``weight_sync`` hook: an engine that is added or
revived gets the *published* weights before it takes traffic -- the disk transport's folder, the
kept CPU snapshot (``keep_snapshot``: the async modes, whose trainer trains on while engines
serve the last version), or the backend's live weights while they are still the published ones
(colocate, which keeps no second copy: an engine revived during a training step is caught up
after the next publish).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from relax_gym.protocol import EngineError
from relax_gym.trainer.backends.base import NamedTensors, TrainerBackend
from relax_gym.trainer.config import EngineConfig
from relax_gym.trainer.engines.weight_receiver import WeightGroupError
from relax_gym.trainer.rollout import EngineHandle, EngineRouter, WeightSyncError
from relax_gym.trainer.weights.transport import (
    Delivery,
    LiveWeights,
    Snapshot,
    SyncPath,
    WeightSource,
    WeightSyncFailed,
    WeightTransport,
)

log = logging.getLogger(__name__)

#: a transport that failed as a whole: probe the engines and retry on the survivors
_RETRYABLE = (EngineError, WeightGroupError, WeightSyncError, OSError, RuntimeError, TimeoutError)


class WeightPublisher:
    """Pushes a backend's weights to every live engine of a router; see the module docstring."""

    def __init__(self, backend: TrainerBackend, router: EngineRouter, transport: WeightTransport, *,
                 retries: int = 2, keep_snapshot: bool = False) -> None:
        self.backend = backend
        self.router = router
        self.transport = transport
        self.retries = retries
        self.keep_snapshot = keep_snapshot
        self.version: int | None = None  # the version engines serve
        self._published_at: int | None = None  # backend.version of the published weights
        self._snapshot: NamedTensors | None = None
        self.lock = asyncio.Lock()
        self.events: dict[str, int] = {"publishes": 0, "retries": 0, "joins": 0, "engines_failed": 0}
        router.set_weight_sync(self._catch_up)

    @classmethod
    def from_config(cls, engine: EngineConfig, backend: TrainerBackend, router: EngineRouter, *,
                    api_key: str | None, staging_dir: str | Path, keep_snapshot: bool = False) -> WeightPublisher:
        """The publisher over the transport ``engine.sync`` names (see :func:`make_transport`)."""
        return cls(backend, router, make_transport(engine, api_key=api_key, staging_dir=staging_dir),
                   keep_snapshot=keep_snapshot)

    @property
    def path(self) -> SyncPath:
        return self.transport.name

    @property
    def snapshot(self) -> NamedTensors | None:
        """The weights engines serve, as CPU tensors (``keep_snapshot``; tensor and distributed paths)."""
        return self._snapshot

    # -- publishing ---------------------------------------------------------------------------
    async def publish(self, version: int, named: NamedTensors | None = None) -> dict[str, float]:
        """Make every live engine serve ``named`` (default: the backend's current weights) as
        ``version``; returns the ``sync/*`` metrics."""
        start = time.perf_counter()
        # wait (bounded) for the health loop to revive an engine, outside the lock its catch-up takes
        await self.router.live_engines(wait_s=self.router.no_engine_timeout_s)
        async with self.lock:
            source: WeightSource = Snapshot(named) if named is not None else LiveWeights(self.backend)
            delivery, engines, attempts = await self._push(str(version), source)
            self._record(version, named)
            return {"sync/seconds": time.perf_counter() - start, "sync/megabytes": delivery.bytes / 2**20,
                    "sync/buckets": float(delivery.buckets), "sync/engines": float(engines),
                    "sync/version": float(version), "sync/retries": float(attempts - 1)}

    async def _push(self, version: str, source: WeightSource) -> tuple[Delivery, int, int]:
        """Push to every live engine inside one pause, retrying on the engines that failed but
        still answer; returns the fullest delivery, the engines serving ``version`` and the attempts."""
        router = self.router
        targets = router.live()
        if not targets:
            raise WeightSyncFailed(
                f"no live engine to sync weights to after waiting {router.no_engine_timeout_s:.0f} s; engines: "
                + (", ".join(f"{h.id} {h.state} ({h.last_error})" for h in router.engines) or "none"))
        serving: list[EngineHandle] = []
        sent = Delivery()
        attempts = 0
        async with router.paused_for_update():
            pending = targets
            while pending:
                attempts += 1
                delivery, failed = await self._attempt(source, version, pending)
                sent = max(sent, delivery, key=lambda d: d.bytes)
                serving += [h for h in pending if h not in failed]
                if not failed:
                    break
                self.events["engines_failed"] += len(failed)
                log.warning("weight push v%s failed on %d engine(s): %s", version, len(failed),
                            "; ".join(f"{h.id}: {why}" for h, why in failed.items()))
                pending = await router.probe_engines(list(failed), "unreachable after a failed weight push")
                if attempts > self.retries:
                    for h in pending:  # alive but failing: out of service until caught up
                        router.mark_unhealthy(h, failed[h])
                    break
                self.events["retries"] += bool(pending)
            if not serving:
                raise WeightSyncFailed(f"weight sync v{version} failed on every engine after {attempts} attempt(s): "
                                       + "; ".join(f"{h.id}: {h.last_error}" for h in targets))
            router.set_current_weights(version, sent.folder)
        return sent, len(serving), attempts

    async def _attempt(self, source: WeightSource, version: str,
                       handles: list[EngineHandle]) -> tuple[Delivery, dict[EngineHandle, str]]:
        """One push to ``handles``, then flush and verify; the engines that failed, with why."""
        try:
            delivery = await self.transport.send(source, version, [h.url for h in handles])
        except WeightSyncFailed:
            raise
        except _RETRYABLE as exc:  # the transport failed as a whole (a broken collective)
            return Delivery(), {h: f"weight push failed: {exc}" for h in handles}
        failed = {h: f"weight update failed: {delivery.failed[h.url]}" for h in handles if h.url in delivery.failed}
        loaded = [h for h in handles if h not in failed]
        flushed = await asyncio.gather(*(self._flush(h) for h in loaded))
        failed.update({h: why for h, why in zip(loaded, flushed, strict=True) if why})
        failed.update(await self.router.confirm_weights([h for h in loaded if h not in failed], version))
        return delivery, failed

    async def _flush(self, handle: EngineHandle) -> str | None:
        """``/flush_cache``; a 400 (a request that slipped in before the pause waits there) is fine."""
        try:
            await handle.client.flush_cache()
        except EngineError as exc:
            if exc.status != 400:
                return f"flush failed: {exc}"
        return None

    def _record(self, version: int, named: NamedTensors | None) -> None:
        self.version = version
        self._published_at = self.backend.version
        self.events["publishes"] += 1
        if self.keep_snapshot and self.transport.needs_source_for_catch_up:
            # the exact weights engines serve; a joiner gets these, not a half-trained later state
            self._snapshot = named if named is not None else [
                (n, t.detach().to("cpu", copy=True)) for n, t in self.backend.named_weights()]

    # -- catch-up ---------------------------------------------------------------------------------
    async def bring_up_to_date(self, url: str) -> str | None:
        """Push the published weights to one engine (a joiner or a revived one); returns the
        version it now serves (None before the first publish: it keeps its own weights)."""
        async with self.lock:
            if self.version is None:
                return None
            self.events["joins"] += 1
            await self.transport.send_one(self._published_source(), str(self.version), url)
            return str(self.version)

    async def _catch_up(self, handle: EngineHandle, version: str) -> None:
        await self.bring_up_to_date(handle.url)

    def _published_source(self) -> WeightSource | None:
        if not self.transport.needs_source_for_catch_up:
            return None
        if self._snapshot is not None:
            return Snapshot(self._snapshot)
        if self.backend.version == self._published_at:
            return LiveWeights(self.backend)
        raise WeightSyncError(f"the trainer has moved on from the published v{self.version}; the engine "
                              "gets the weights after the next publish")

    async def close(self) -> None:
        await self.transport.close()


def make_transport(engine: EngineConfig, *, api_key: str | None, staging_dir: str | Path) -> WeightTransport:
    """The transport ``engine.sync`` names (``auto``: tensor for embedded engines, else disk)."""
    path = engine.sync if engine.sync != "auto" else ("tensor" if engine.kind == "embedded" else "disk")
    bucket_bytes = engine.sync_bucket_mb << 20
    if path == "tensor":
        from relax_gym.trainer.weights.tensor import TensorTransport

        return TensorTransport(api_key=api_key, bucket_bytes=bucket_bytes, shared_memory=engine.sync_shared_memory)
    if path == "disk":
        from relax_gym.trainer.weights.disk import DiskTransport

        return DiskTransport(staging_dir, api_key=api_key)
    from relax_gym.trainer.weights.broadcast import BroadcastTransport

    return BroadcastTransport(engine.distributed, api_key=api_key, bucket_bytes=bucket_bytes)


__all__ = ["WeightPublisher", "make_transport"]
