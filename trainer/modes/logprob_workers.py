"""Reference and proximal logprob workers: forward passes off the trainer's critical path.

In ``fully_async`` mode these run beside the trainer (threads of the embedded runtime, actors
of the Ray runtime), take queued groups that still need logprobs (:meth:`TrajectoryQueue.claim`),
compute them and write them back into the samples (:meth:`TrajectoryQueue.annotate`), so that by
the time the trainer takes a batch, most of the forward passes are done:

* **reference** -- the frozen policy at RL start (``<out>/reference_model``), for the KL term.
  Every sample needs it exactly once, whenever it is computed.
* **proximal** -- the policy the decoupled objective clips against. The worker holds a copy of
  the policy and receives every published version (:meth:`LogprobWorker.update`); each sample is
  annotated with the newest version the worker has. The trainer uses the annotation when it is
  at most ``async_rl.prox_max_lag`` versions old, and recomputes it otherwise (counted).

``hybrid`` mode runs neither: the trainer computes both itself.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Literal

import torch

from relax_gym.trainer.modes.trajectory_queue import QueuedGroup
from relax_gym.trainer.modes.roles import Role

log = logging.getLogger("relax_gym.trainer.modes")
Kind = Literal["ref", "prox"]


class LogprobWorker:
    """Annotates queued samples with ``kind`` logprobs; see the module docstring."""

    def __init__(self, kind: Kind, model_path: str | Path, queue: Role, *, temperature: float = 1.0,
                 micro_batch_size: int = 16, claim_groups: int = 4, poll_s: float = 0.1, device: str = "cpu",
                 threads: int | None = None) -> None:
        from relax_gym.chat import ChatCodec
        from relax_gym.trainer.backends.pytorch import TorchBackend

        if threads:
            torch.set_num_threads(threads)
        self.kind = kind
        self.queue = queue
        self.temperature = temperature
        self.claim_groups = claim_groups
        self.poll_s = poll_s
        self.backend = TorchBackend(model_path, device=device, micro_batch_size=micro_batch_size)
        codec = ChatCodec.from_pretrained(model_path)
        self.processor = codec.vision.image_processor if codec.vision is not None else None
        self.version = 0
        self.annotated = 0
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self.errors = 0

    def update(self, version: int, named: list[tuple[str, torch.Tensor]]) -> None:
        """Load a published version (proximal worker)."""
        state = {n: t for n, t in named}
        with torch.no_grad():
            _missing, unexpected = self.backend.model.load_state_dict(state, strict=False)
        if unexpected:
            raise ValueError(f"unknown weights for the proximal worker: {unexpected[:5]}")
        self.version = version

    async def start(self) -> None:
        self._stop.clear()
        self._task = asyncio.create_task(self._loop(), name=f"{self.kind}-logprob-worker")

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def stats(self) -> dict[str, float]:
        return {f"logprob/{self.kind}_worker_annotated": float(self.annotated),
                f"logprob/{self.kind}_worker_errors": float(self.errors),
                f"logprob/{self.kind}_worker_version": float(self.version)}

    async def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                groups: list[QueuedGroup] = await self.queue.claim(self.kind, self.claim_groups, version=self.version)
            except Exception:
                log.debug("logprob worker: claim failed", exc_info=True)
                groups = []
            if not groups:
                try:
                    await asyncio.wait_for(self._stop.wait(), self.poll_s)
                except TimeoutError:
                    pass
                continue
            try:
                version = self.version
                values = await asyncio.to_thread(self._compute, groups)
                for group in groups:
                    await self.queue.annotate(self.kind, group.group_id, values[group.group_id], version=version)
                self.annotated += sum(len(v) for v in values.values())
            except Exception:
                self.errors += 1
                log.exception("%s logprob worker failed on %d groups", self.kind, len(groups))

    def _compute(self, groups: list[QueuedGroup]) -> dict[str, dict[str, list[float]]]:
        from relax_gym.trainer.algorithms.batching import ScoredSample, to_sequence_batch

        samples = [s for g in groups for s in g.samples]
        batch = to_sequence_batch([ScoredSample(s.traj, s.reward) for s in samples], self.processor,
                                  temperature=self.temperature)
        result = self.backend.compute_logprobs(batch)
        out: dict[str, dict[str, list[float]]] = {g.group_id: {} for g in groups}
        i = 0
        for g in groups:
            for s in g.samples:
                out[g.group_id][s.sample_id] = result.logprobs[i].tolist()
                i += 1
        return out


def current_weights(backend: Any) -> list[tuple[str, torch.Tensor]]:
    """A CPU copy of a backend's weights (what the proximal worker loads)."""
    return [(n, t.detach().to("cpu", copy=True)) for n, t in backend.named_weights()]


__all__ = ["LogprobWorker", "current_weights"]
