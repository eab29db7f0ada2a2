"""The transport interface: how one version of the weights reaches a set of engines.

A transport moves bytes and nothing else. Pausing generation, numbering versions, flushing
caches, checking what each engine serves, failover and catch-up belong to the one publisher
(:mod:`relax_gym.trainer.weights.publisher`), so every transport gets them the same way.

What is sent is a :class:`WeightSource`: the backend's weights (:class:`LiveWeights`, streamed
from ``backend.export_weights`` -- the torch backend's ``named_weights`` in buckets, the megatron
backend's ``iter_hf_buckets``) or a CPU copy taken earlier (:class:`Snapshot`). Transports pull
one bucket at a time and send it before asking for the next, so no transport holds a second copy
of the model; they always pull the source to its end, even when every engine has failed, because
a megatron export is a collective that every model-parallel rank must walk in step.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from relax_gym.errors import RelaxGymError
from relax_gym.protocol import EngineError
from relax_gym.trainer.backends.base import NamedTensors, TrainerBackend, buckets

SyncPath = Literal["tensor", "disk", "distributed"]


class WeightSyncFailed(RelaxGymError, RuntimeError):
    """No engine ended up serving the new weights (after failover and retries)."""


# ------------------------------------------------------------------------------------------------
# what is sent
# ------------------------------------------------------------------------------------------------
class WeightSource(ABC):
    """One version of the weights, in HF naming."""

    @abstractmethod
    def buckets(self, bucket_bytes: int) -> Iterator[NamedTensors]:
        """The tensors in buckets of about ``bucket_bytes``, produced lazily."""

    def save_pretrained(self, folder: Path) -> Path:
        """Write an HF folder an engine can load (the disk transport)."""
        raise WeightSyncFailed(f"{type(self).__name__} cannot write an HF folder; the disk transport "
                               "publishes the backend's own weights")


class LiveWeights(WeightSource):
    """The backend's current weights, streamed from :meth:`TrainerBackend.export_weights`."""

    def __init__(self, backend: TrainerBackend) -> None:
        self.backend = backend

    def buckets(self, bucket_bytes: int) -> Iterator[NamedTensors]:
        return iter(self.backend.export_weights(bucket_bytes))

    def save_pretrained(self, folder: Path) -> Path:
        return self.backend.save_pretrained(folder)


class Snapshot(WeightSource):
    """Named tensors copied earlier (CPU): the weights of a step while the next one trains."""

    def __init__(self, named: NamedTensors) -> None:
        self.named = named

    def buckets(self, bucket_bytes: int) -> Iterator[NamedTensors]:
        return buckets(self.named, bucket_bytes)


def with_last(items: Iterable[NamedTensors]) -> Iterator[tuple[NamedTensors, bool]]:
    """``(bucket, is_last)`` with one bucket of look-ahead: only the last bucket may carry the new
    weight version, so an engine never reports a version whose weights are half loaded."""
    it = iter(items)
    current = next(it, None)
    while current is not None:
        following = next(it, None)
        yield current, following is None
        current = following


def nbytes(bucket: NamedTensors) -> int:
    return sum(t.numel() * t.element_size() for _, t in bucket)


# ------------------------------------------------------------------------------------------------
# the interface
# ------------------------------------------------------------------------------------------------
@dataclass
class Delivery:
    """What one :meth:`WeightTransport.send` did."""

    bytes: int = 0
    buckets: int = 0
    failed: dict[str, str] = field(default_factory=dict)  # url -> why (engines told apart)
    folder: str | None = None  # an HF folder engines can load this version from (disk)


class WeightTransport(ABC):
    """Sends a :class:`WeightSource` to engines as one numbered version.

    ``send`` reports the engines that failed on their own in :attr:`Delivery.failed` (the
    publisher takes them out of service); it raises when the failure cannot be pinned to one
    engine (a broken collective), and the publisher then probes the engines and retries.
    """

    name: ClassVar[SyncPath]
    #: catch-up (``send_one``) needs the published tensors; False when the transport keeps its
    #: own copy (the disk path's folder)
    needs_source_for_catch_up: ClassVar[bool] = True

    @abstractmethod
    async def send(self, source: WeightSource, version: str, urls: Sequence[str]) -> Delivery:
        """Make the engines at ``urls`` load ``source`` as ``version``."""

    async def send_one(self, source: WeightSource | None, version: str, url: str) -> None:
        """Bring one engine (a joiner or a revived one) to the published ``version``."""
        if source is None:  # a real check: ``python -O`` drops asserts
            raise WeightSyncFailed(f"the {self.name} transport needs the published weights to catch an engine up")
        delivery = await self.send(source, version, [url])
        if delivery.failed:
            raise EngineError(url, delivery.failed[url])

    async def close(self) -> None:
        """Release what the transport holds (process groups, folders stay for inspection)."""


async def gather_failures(calls: dict[str, Awaitable[object]]) -> dict[str, str]:
    """Await one call per engine; the engines whose call raised an :class:`EngineError`, with why."""
    urls = list(calls)
    results = await asyncio.gather(*calls.values(), return_exceptions=True)
    failed: dict[str, str] = {}
    for url, result in zip(urls, results, strict=True):
        if isinstance(result, EngineError):
            failed[url] = str(result)
        elif isinstance(result, BaseException):
            raise result
    return failed


__all__ = [
    "Delivery",
    "LiveWeights",
    "Snapshot",
    "SyncPath",
    "WeightSource",
    "WeightSyncFailed",
    "WeightTransport",
    "gather_failures",
    "nbytes",
    "with_last",
]
