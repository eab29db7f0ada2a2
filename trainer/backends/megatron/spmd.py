"""Many trainer processes under torchrun: rank 0 runs the product, the other ranks replay.

megatron-core is SPMD: every rank must make the same backend call, with the same batch, in the
same order. The training loop (rollout, rewards, evaluation, logging, checkpoint bookkeeping,
weight sync to the engines) runs on rank 0 only. Its backend is a :class:`SpmdBackend`: each
call is first broadcast to the other ranks over a dedicated gloo group (a :class:`Channel`),
then run locally, and every follower rank (:func:`follow`) runs the very same call on its own
:class:`~.backend.MegatronBackend`. So:

* every rank sees the same batches in the same order (rank 0's, as sent);
* exactly one rank logs, evaluates and writes the run's files (the followers write only their
  own shards of a distributed checkpoint, inside the call that rank 0 makes);
* weight sync gathers the TP/PP shards on the fly: rank 0's publisher walks
  ``export_weights`` and the followers walk the same generator to its end, bucket by bucket, so
  no rank holds a second full copy of the model.

Rank 0's calls are serialised by a lock (a generator holds it until it is exhausted, in
whichever thread resumes it), because the followers replay them one at a time. When rank 0 exits, normally or by an exception, it
sends ``stop`` (``atexit``); when it dies, torchrun ends the other ranks. A follower waits at
most ``megatron.follower_timeout_s`` for the next call (rollouts and evaluation run between
calls); every collective inside a call has ``megatron.collective_timeout_s``.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from relax_gym.trainer.backends.base import (
    LogprobResult,
    NamedTensors,
    Objective,
    OptimizerSettings,
    SequenceBatch,
    TrainerBackend,
)

log = logging.getLogger("relax_gym.trainer.megatron")

#: backend methods that run on every rank (collectives inside); anything else is rank 0's
FORWARDED = ("compute_logprobs", "train_step", "named_weights", "export_weights", "save_pretrained",
             "save_state", "load_state", "configure_optimizer")


def world_size() -> int:
    """Ranks of this launch (torchrun's ``WORLD_SIZE``; 1 without a launcher)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


class Channel:
    """Rank 0 -> every rank: one broadcast object per command, on its own gloo group."""

    def __init__(self, timeout_s: float) -> None:
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        self.is_source = dist.get_rank() == 0
        self._closed = False

    def send(self, command: tuple[Any, ...]) -> None:
        dist.broadcast_object_list([command], src=0, group=self.group)

    def receive(self) -> tuple[Any, ...]:
        holder: list[Any] = [None]
        dist.broadcast_object_list(holder, src=0, group=self.group)
        command: tuple[Any, ...] = holder[0]
        return command

    def stop(self) -> None:
        """Rank 0: release the followers (idempotent; registered with atexit)."""
        if self.is_source and not self._closed and dist.is_initialized():
            self._closed = True
            try:
                self.send(("stop",))
            except Exception:  # noqa: BLE001 - exiting anyway; torchrun ends the others
                log.warning("could not tell the follower ranks to stop", exc_info=True)


_channel: Channel | None = None
_next_id = 0


def channel(timeout_s: float, collective_timeout_s: float) -> Channel:
    """The one command channel of this process (made collectively on first use)."""
    global _channel
    if _channel is None:
        from relax_gym.trainer.backends.megatron.backend import ensure_distributed

        ensure_distributed(collective_timeout_s)
        _channel = Channel(timeout_s)
        if _channel.is_source:
            atexit.register(_channel.stop)
    return _channel


def make_megatron_backend(model_path: str | Path, **kwargs: Any) -> TrainerBackend:
    """A :class:`~.backend.MegatronBackend` in a world of one; on rank 0 of many, one that the
    follower ranks replay (:class:`SpmdBackend`)."""
    from relax_gym.trainer.backends.megatron.backend import MegatronBackend, MegatronBackendError

    if world_size() == 1:
        return MegatronBackend(model_path, **kwargs)
    if rank() != 0:
        raise MegatronBackendError("only rank 0 runs the training loop; the others run follow()")
    global _next_id
    cfg = _timeouts(kwargs.get("megatron"))
    chan = channel(*cfg)
    handle = _next_id
    _next_id += 1
    chan.send(("new", handle, str(model_path), kwargs))
    return SpmdBackend(MegatronBackend(model_path, **kwargs), chan, handle)


def _timeouts(megatron: Any) -> tuple[float, float]:
    from relax_gym.trainer.backends.megatron.config import MegatronConfig

    cfg = megatron if isinstance(megatron, MegatronConfig) else MegatronConfig(**(megatron or {}))
    return cfg.follower_timeout_s, cfg.collective_timeout_s


class SpmdBackend(TrainerBackend):
    """Rank 0's handle on a backend that every rank holds; see the module docstring."""

    def __init__(self, local: TrainerBackend, chan: Channel, handle: int) -> None:
        self.local = local
        self.chan = chan
        self.handle = handle
        # a plain Lock: a generator may be resumed (and so release it) in another thread
        self._lock = threading.Lock()
        self._lock_timeout_s = float(getattr(getattr(local, "cfg", None), "collective_timeout_s", 600.0))

    # what the loop reads
    @property  # type: ignore[override]
    def version(self) -> int:
        return self.local.version

    @property  # type: ignore[override]
    def updates(self) -> int:
        return self.local.updates

    def __getattr__(self, name: str) -> Any:  # micro_batch_size, optim_settings, model_path ...
        if name in ("local", "chan", "handle", "_lock", "_lock_timeout_s"):
            raise AttributeError(name)
        return getattr(self.local, name)

    @contextlib.contextmanager
    def _turn(self, name: str) -> Iterator[None]:
        """One call at a time, as the followers replay them; a call made while another is still
        open (e.g. from inside an export walk) fails after the timeout instead of hanging."""
        if not self._lock.acquire(timeout=self._lock_timeout_s):
            raise RuntimeError(f"backend call {name!r} waited {self._lock_timeout_s:.0f} s for the previous "
                               "call to finish (calls on a multi-process backend must not overlap)")
        try:
            yield
        finally:
            self._lock.release()

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        with self._turn(name):
            self.chan.send(("call", self.handle, name, args, kwargs))
            return getattr(self.local, name)(*args, **kwargs)

    def _stream(self, name: str, *args: Any, **kwargs: Any) -> Iterator[Any]:
        with self._turn(name):  # held until the generator ends: the followers walk it in lockstep
            self.chan.send(("call", self.handle, name, args, kwargs))
            gen = getattr(self.local, name)(*args, **kwargs)
            finished = False
            try:
                for item in gen:
                    yield item
                finished = True
            finally:
                if not finished:  # the caller stopped early: finish the collectives anyway
                    for _ in gen:
                        pass

    def compute_logprobs(self, batch: SequenceBatch, *, entropy: bool = False) -> LogprobResult:
        result: LogprobResult = self._call("compute_logprobs", batch, entropy=entropy)
        return result

    def train_step(self, batch: SequenceBatch, objective: Objective) -> dict[str, float]:
        metrics: dict[str, float] = self._call("train_step", batch, objective)
        return metrics

    def named_weights(self) -> Iterator[tuple[str, Any]]:
        return self._stream("named_weights")

    def export_weights(self, bucket_bytes: int = 256 << 20) -> Iterator[NamedTensors]:
        return self._stream("export_weights", bucket_bytes)

    def save_pretrained(self, path: str | Path) -> Path:
        out: Path = self._call("save_pretrained", path)
        return out

    def save_state(self, path: str | Path) -> None:
        self._call("save_state", path)

    def load_state(self, path: str | Path) -> None:
        self._call("load_state", path)

    def configure_optimizer(self, settings: OptimizerSettings) -> None:
        self._call("configure_optimizer", settings)

    def _make_optimizer(self, settings: OptimizerSettings) -> Any:
        raise NotImplementedError("the local backend makes its own optimizer")


def follow(megatron: Any = None) -> int:
    """A follower rank's whole life: build the backends rank 0 builds, replay its calls, return
    0 at ``stop``. Generators are walked to the end (they hold collectives per bucket)."""
    from relax_gym.trainer.backends.megatron.backend import MegatronBackend

    chan = channel(*_timeouts(megatron))
    backends: dict[int, TrainerBackend] = {}
    while True:
        command = chan.receive()
        kind = command[0]
        if kind == "stop":
            return 0
        if kind == "new":
            _, handle, model_path, kwargs = command
            backends[handle] = MegatronBackend(model_path, **kwargs)
            continue
        _, handle, name, args, kwargs = command
        if name not in FORWARDED:
            raise RuntimeError(f"rank 0 sent an unknown backend call {name!r}")
        method: Callable[..., Any] = getattr(backends[handle], name)
        result = method(*args, **kwargs)
        if name in ("named_weights", "export_weights"):
            for _ in result:
                pass


__all__ = ["Channel", "SpmdBackend", "follow", "make_megatron_backend", "rank", "world_size"]
