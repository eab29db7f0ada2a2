"""The distributed transport: the trainer is rank 0 of a process group the engines join, and each
bucket is broadcast over it.

SGLang's protocol: every engine joins through ``/init_weights_update_group`` (``rank_offset``,
``world_size``, ``backend``) while rank 0 opens the group; each bucket is announced with
``/update_weights_from_distributed`` (names, dtypes, shapes) and broadcast meanwhile, tensor by
tensor in the listed order. With ``backend="nccl"`` the tensors go from the trainer's CUDA device
to SGLang on GPUs; the embedded engine receives over gloo, so the same code runs (and is tested)
on CPU. The group is built on its own ``TCPStore`` (:func:`~relax_gym.trainer.engines.weight_receiver.new_process_group`),
so a trainer that runs its own ``torch.distributed`` world can still open it.

A process group has a fixed membership: it is rebuilt, on a fresh port, whenever the set of
engines changes (one died, joined or was removed), and a broken collective closes it. An engine
that catches up alone gets a one-off group, leaving the main one untouched. Every rendezvous and
broadcast runs in a daemon thread under the group timeout, so a missing engine costs an error,
never a hang.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
from collections.abc import Sequence
from typing import Any

import torch

from relax_gym.trainer.engines.in_process import engine_client
from relax_gym.protocol import (
    EngineClient,
    EngineError,
    InitWeightsUpdateGroupRequest,
    UpdateWeightsFromDistributedRequest,
    UpdateWeightsResponse,
)
from relax_gym.trainer.backends.base import NamedTensors
from relax_gym.trainer.config import DistributedSyncConfig
from relax_gym.trainer.engines.weight_receiver import (
    GroupHandle,
    WeightGroupError,
    broadcast,
    dtype_name,
    first_line,
    new_process_group,
    start_daemon,
)
from relax_gym.trainer.weights.transport import Delivery, WeightSource, WeightTransport, nbytes, with_last

log = logging.getLogger(__name__)
_group_ids = itertools.count()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


async def engine_ranks(client: EngineClient, configured: int | None) -> int:
    """The group ranks one engine joins with: SGLang's rank is ``rank_offset + tp_rank``, so an
    engine takes its TP size (``configured``, else its ``tp_size`` in ``/server_info``; 1 when it
    reports none, as the embedded engine's single rank)."""
    if configured is not None:
        return configured
    try:
        info = await client.server_info()
    except EngineError as exc:
        raise WeightGroupError(f"cannot read {client.base_url}/server_info for its tp_size: {exc}; "
                               "set engine.distributed.ranks_per_engine") from None
    tp = info.get("tp_size", 1)
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise WeightGroupError(f"{client.base_url}/server_info reports tp_size={tp!r}; "
                               "set engine.distributed.ranks_per_engine")
    return tp


class _Group:
    """Rank 0 of one weight-update group over fixed members; each engine joins with ``ranks[i]``
    ranks from ``rank_offset`` (an SGLang engine with TP > 1 takes TP ranks)."""

    def __init__(self, urls: Sequence[str], settings: DistributedSyncConfig, *, api_key: str | None, port: int,
                 group_name: str) -> None:
        self.urls = list(urls)
        self.settings = settings
        self.port = port
        self.group_name = group_name
        self.ranks: list[int] = []  # per engine, read in open()
        self.world_size = 0
        cuda = settings.backend == "nccl"
        self.device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        # the engines answer within their own group timeout; wait a little longer than ours
        self.clients = [engine_client(u, api_key=api_key, timeout_s=settings.timeout_s + 30.0) for u in self.urls]
        self.handle: GroupHandle | None = None

    async def open(self) -> None:
        """Every engine joins while rank 0 opens the group; the first refusal fails at once."""
        s = self.settings
        self.ranks = list(await asyncio.gather(*(engine_ranks(c, s.ranks_per_engine) for c in self.clients)))
        self.world_size = 1 + sum(self.ranks)
        offsets = [1 + sum(self.ranks[:i]) for i in range(len(self.ranks))]
        calls = [asyncio.create_task(c.init_weights_update_group(InitWeightsUpdateGroupRequest(
            master_address=s.master_address, master_port=self.port, rank_offset=offset,
            world_size=self.world_size, group_name=self.group_name, backend=s.backend)))
            for offset, c in zip(offsets, self.clients, strict=True)]
        box: list[GroupHandle] = []

        def rendezvous() -> None:
            box.append(new_process_group(s.master_address, self.port, 0, self.world_size,
                                         group_name=self.group_name, backend=s.backend, timeout_s=s.timeout_s))

        joined = asyncio.wrap_future(start_daemon(rendezvous, "relax-gym-rendezvous"))
        try:
            await asyncio.wait_for(self._until_all_joined(joined, calls), s.timeout_s + 5.0)
        except TimeoutError:
            raise WeightGroupError(f"the engines did not join group {self.group_name!r} within "
                                   f"{s.timeout_s:g} s") from None
        finally:
            for call in calls:
                call.cancel()
        self.handle = box[0]

    async def _until_all_joined(self, joined: asyncio.Future[None],
                                calls: list[asyncio.Task[UpdateWeightsResponse]]) -> None:
        pending: set[asyncio.Future[Any]] = {joined, *calls}
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                exc = fut.exception()
                if exc is not None and fut is joined:
                    raise WeightGroupError(f"opening group {self.group_name!r} failed: {first_line(exc)}")
                if exc is not None:
                    raise exc
                if fut is not joined and not fut.result().success:
                    url = self.urls[calls.index(fut)]  # type: ignore[arg-type]
                    raise EngineError(url + "/init_weights_update_group", fut.result().message)

    async def send_bucket(self, bucket: NamedTensors, version: str | None) -> None:
        """Announce the bucket to every engine and broadcast its tensors meanwhile."""
        assert self.handle is not None, "open() first"
        tensors = [t.detach().to(self.device).contiguous() for _, t in bucket]
        req = UpdateWeightsFromDistributedRequest(
            names=[n for n, _ in bucket], dtypes=[dtype_name(t.dtype) for t in tensors],
            shapes=[list(t.shape) for t in tensors], group_name=self.group_name, weight_version=version)
        calls = [asyncio.create_task(c.update_weights_from_distributed(req)) for c in self.clients]
        handle = self.handle
        try:
            await asyncio.wrap_future(start_daemon(lambda: broadcast(handle, tensors, 0), "relax-gym-broadcast"))
        finally:
            replies = await asyncio.gather(*calls, return_exceptions=True)
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply

    async def close(self) -> None:
        """Destroy the engines' side of the group (a gone engine has nothing to release)."""
        for client in self.clients:
            try:
                await asyncio.wait_for(client.destroy_weights_update_group(self.group_name), 10.0)
            except (EngineError, TimeoutError):
                pass
            await client.aclose()
        self.handle = None


class BroadcastTransport(WeightTransport):
    """Weights broadcast over a process group (see the module docstring); ``settings`` is the
    ``engine.distributed`` section (backend, address, port, ranks per engine, timeout)."""

    name = "distributed"

    def __init__(self, settings: DistributedSyncConfig | None = None, *, api_key: str | None = None,
                 bucket_bytes: int = 256 << 20) -> None:
        self.settings = settings or DistributedSyncConfig()
        self.api_key = api_key
        self.bucket_bytes = bucket_bytes
        self._group: _Group | None = None
        self._members: tuple[str, ...] = ()
        self.rebuilds = 0  # groups opened for the main membership

    @property
    def members(self) -> tuple[str, ...]:
        return self._members

    @property
    def group_name(self) -> str | None:
        """The open group's name (what the engines list in ``/get_server_info``)."""
        return self._group.group_name if self._group is not None else None

    async def _open(self, urls: Sequence[str]) -> _Group:
        # the configured port once; later groups take a fresh one (an old store may linger)
        configured = self.settings.master_port
        port = configured if configured and not self.rebuilds else free_port(self.settings.master_address)
        group = _Group(urls, self.settings, api_key=self.api_key, port=port,
                       group_name=f"relax_weights_{next(_group_ids)}_{port}")
        try:
            await group.open()
        except BaseException:
            await group.close()
            raise
        return group

    async def ensure_group(self, urls: Sequence[str]) -> None:
        """Open the group over ``urls`` unless it is open over exactly them."""
        members = tuple(sorted(u.rstrip("/") for u in urls))
        if self._group is not None and members == self._members:
            return
        await self.close()
        self._group = await self._open(members)
        self._members = members
        self.rebuilds += 1

    async def send(self, source: WeightSource, version: str, urls: Sequence[str]) -> Delivery:
        await self.ensure_group(urls)
        assert self._group is not None
        try:
            return await self._stream(self._group, source, version)
        except BaseException:
            await self.close()  # a broken collective cannot be reused
            raise

    async def send_one(self, source: WeightSource | None, version: str, url: str) -> None:
        assert source is not None, "the distributed transport needs the published weights"
        group = await self._open([url.rstrip("/")])
        try:
            await self._stream(group, source, version)
        finally:
            await group.close()

    async def _stream(self, group: _Group, source: WeightSource, version: str) -> Delivery:
        out = Delivery()
        items = with_last(source.buckets(self.bucket_bytes))
        try:
            for bucket, last in items:
                await group.send_bucket(bucket, version if last else None)
                out.buckets += 1
                out.bytes += nbytes(bucket)
        finally:
            for _ in items:  # walk the source to its end even after a failure (a collective export)
                pass
        return out

    async def close(self) -> None:
        if self._group is not None:
            group, self._group = self._group, None
            self._members = ()
            try:
                await group.close()
            except Exception:
                log.debug("closing the weight group failed", exc_info=True)


__all__ = ["BroadcastTransport", "engine_ranks", "free_port"]
