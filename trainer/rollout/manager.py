"""The rollout manager: many multi-turn episodes at once, each its own asyncio task.

``concurrency`` workers pull episodes from the (group-expanded) spec list; an episode that
finishes frees its worker for the next one at once, so long-tailed episodes never hold the
engines idle. Each episode is an :class:`EpisodeRunner` (token-in/token-out, see ``episode.py``)
talking to an :class:`EngineRouter` (routing, failover, pause, see ``router.py``)::

    router = await EngineRouter(["http://127.0.0.1:30000"]).start()
    codec = ChatCodec.from_pretrained(model_dir)
    manager = RolloutManager(router, codec, RolloutConfig(concurrency=32, group_size=4), run_id="step0")
    trajectories = await manager.generate([EpisodeSpec("relax/SenseCount-v0", seed=s) for s in range(8)])

``scheduling="turn_sync"`` runs cohorts of ``concurrency`` episodes one turn at a time (every
episode waits for the slowest generation of the turn); it exists only as the benchmark baseline.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

from relax_gym.chat import ChatCodec
from relax_gym.trainer.rollout.config import RolloutConfig
from relax_gym.trainer.rollout.episode import EpisodeRunner, EpisodeSpec
from relax_gym.trainer.rollout.metrics import RolloutMetrics
from relax_gym.trainer.rollout.router import EngineRouter
from relax_gym.trainer.rollout.trajectory import Trajectory

log = logging.getLogger(__name__)


class _TurnBarrier:
    """A barrier whose party count shrinks as episodes finish (for turn-synchronous batching)."""

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.waiting = 0
        self._event = asyncio.Event()

    async def wait(self) -> None:
        self.waiting += 1
        if self.waiting >= self.parties:
            self._release()
            return
        await self._event.wait()

    def leave(self) -> None:
        self.parties -= 1
        if self.parties > 0 and self.waiting >= self.parties:
            self._release()

    def _release(self) -> None:
        event, self._event, self.waiting = self._event, asyncio.Event(), 0
        event.set()


class RolloutManager:
    """Runs episodes concurrently against a router and returns their trajectories."""

    def __init__(self, router: EngineRouter, codec: ChatCodec, config: RolloutConfig | None = None, *,
                 run_id: str | None = None) -> None:
        """``run_id`` prefixes the episode ids (``<run_id>-<n>``, also the requests' ``rid``); give
        one derived from the run's seed and what is being generated (as the training modes do) so
        a resumed run names its episodes as the uninterrupted run would. Default: random."""
        self.router = router
        self.codec = codec
        self.config = config or RolloutConfig()
        self.run_id = run_id if run_id is not None else uuid.uuid4().hex[:8]
        self.metrics = RolloutMetrics()
        self._stopping = asyncio.Event()
        self._episode_counter = itertools.count()

    # -- public API -----------------------------------------------------------------------------------
    async def generate(self, specs: Iterable[EpisodeSpec]) -> list[Trajectory]:
        """Run every spec ``group_size`` times; trajectories come back in spec order, then sample
        index (then part)."""
        indexed: list[tuple[int, Trajectory]] = []
        async for order, trajectories in self._run(specs):
            indexed.extend((order, t) for t in trajectories)
        indexed.sort(key=lambda x: (x[0], x[1].part))
        return [t for _, t in indexed]

    async def stream(self, specs: Iterable[EpisodeSpec]) -> AsyncIterator[Trajectory]:
        """Yield trajectories as their episodes finish (for fully asynchronous training)."""
        async for _order, trajectories in self._run(specs):
            for traj in trajectories:
                yield traj

    async def stop(self) -> None:
        """Stop: running episodes end now with stop reason ``aborted`` (keeping their tokens),
        queued ones are not started."""
        self._stopping.set()
        await self.router.abort_all()

    async def update_weights(self, model_path: str, weight_version: str | int) -> None:
        """Pause every engine (in-flight segments come back partial and resume afterwards), load
        the checkpoint, verify the version, continue."""
        async with self.router.paused_for_update():
            await self.router.update_weights_from_disk(model_path, weight_version)

    # -- scheduling -----------------------------------------------------------------------------------
    def _expand(self, specs: Iterable[EpisodeSpec]) -> Iterator[tuple[int, EpisodeSpec, int]]:
        order = itertools.count()
        for spec in specs:
            for index in range(self.config.group_size):
                yield next(order), spec, index

    def _runner(self, spec: EpisodeSpec, index: int, gate: Any = None) -> EpisodeRunner:
        episode_id = f"{self.run_id}-{next(self._episode_counter)}"
        return EpisodeRunner(spec=spec, sample_index=index, episode_id=episode_id, router=self.router,
                             codec=self.codec, config=self.config, metrics=self.metrics, turn_gate=gate,
                             stopping=self._stopping)

    async def _safe_run(self, runner: EpisodeRunner) -> list[Trajectory]:
        try:
            return await runner.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("episode %s failed inside the manager", runner.episode_id)
            self.metrics.engine_errors["internal"] += 1
            self.metrics.stop_reasons["env_error"] += 1
            return [Trajectory(token_ids=[], loss_mask=[], rollout_logprobs=[], weight_versions=[], prompt_length=0,
                               episode_id=runner.episode_id, group_id=runner.spec.group,
                               sample_index=runner.sample_index, env_id=runner.spec.env_id, seed=runner.spec.seed,
                               stop_reason="env_error", error=f"internal error: {type(exc).__name__}: {exc}")]

    async def _run(self, specs: Iterable[EpisodeSpec]) -> AsyncIterator[tuple[int, list[Trajectory]]]:
        items = list(self._expand(specs))
        work = iter(items)
        if self.config.scheduling == "turn_sync":
            async for item in self._run_turn_sync(work):
                yield item
            return
        results: asyncio.Queue[tuple[int, list[Trajectory]] | None] = asyncio.Queue()

        async def worker() -> None:
            for order, spec, index in work:  # a shared iterator: each item goes to one worker
                if self._stopping.is_set():
                    break
                await results.put((order, await self._safe_run(self._runner(spec, index))))

        workers = [asyncio.create_task(worker(), name=f"rollout-worker-{i}")
                   for i in range(min(self.config.concurrency, len(items)))]
        done = asyncio.gather(*workers)
        done.add_done_callback(lambda _f: results.put_nowait(None))
        try:
            while True:
                got = await results.get()
                if got is None:
                    break
                yield got
            await done  # surfaces a worker's unexpected exception
        finally:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    async def _run_turn_sync(self, work: Iterator[tuple[int, EpisodeSpec, int]]
                             ) -> AsyncIterator[tuple[int, list[Trajectory]]]:
        while not self._stopping.is_set():
            cohort = list(itertools.islice(work, self.config.concurrency))
            if not cohort:
                return
            barrier = _TurnBarrier(len(cohort))
            for item in await asyncio.gather(*(self._gated(barrier, *c) for c in cohort)):
                yield item

    async def _gated(self, barrier: _TurnBarrier, order: int, spec: EpisodeSpec,
                     index: int) -> tuple[int, list[Trajectory]]:
        try:
            return order, await self._safe_run(self._runner(spec, index, gate=barrier.wait))
        finally:
            barrier.leave()


__all__ = ["RolloutManager"]
