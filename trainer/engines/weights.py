"""Weight transport between a trainer and engines: in-memory tensors and a gloo broadcast group.

Two paths besides ``/update_weights_from_disk``:

* **In memory** (``POST /update_weights_from_tensor``, for a trainer on the same host): SGLang's
  request shape (``serialized_named_tensors``, ``load_format``, ``flush_cache``,
  ``abort_all_requests``, ``weight_version``), but each item is the base64 text of a
  *safetensors* blob holding some named tensors, and ``load_format`` must be ``"safetensors"``.
  SGLang's own items are pickles carrying CUDA IPC handles; unpickling request bodies would let a
  caller run code, so the embedded engine refuses them.
* **Distributed** (``/init_weights_update_group`` + ``/update_weights_from_distributed``): the
  trainer is rank 0 of a dedicated process group and broadcasts each tensor, in the order the
  request lists them, to every engine rank. The group is built directly on a ``TCPStore`` (no
  default process group is touched on either side), so a trainer that already runs its own
  ``torch.distributed`` world can still open it. The embedded engine joins over gloo;
  :class:`WeightBroadcaster` is the sender side.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import datetime as _dt
import json
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import torch
import torch.distributed as dist

from relax_gym.errors import RelaxGymError
from relax_gym.protocol import (
    EngineClient,
    EngineError,
    InitWeightsUpdateGroupRequest,
    UpdateWeightsFromDistributedRequest,
    UpdateWeightsFromTensorRequest,
    UpdateWeightsResponse,
)

NamedTensors = list[tuple[str, torch.Tensor]]

DEFAULT_GROUP_TIMEOUT_S = 60.0  # rendezvous and each broadcast; a present trainer takes < 1 s
MAX_PENDING_JOINS = 4  # join threads alive at once (a join that timed out may linger a little)


class WeightTransportError(RelaxGymError, ValueError):
    """A weight payload or group request is malformed or cannot be served."""


# ------------------------------------------------------------------------------------------------
# safetensors items
# ------------------------------------------------------------------------------------------------
_ALIASES_KEY = "relax_gym.aliases"  # safetensors metadata: {"alias name": "stored name"}


def encode_named_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """Base64 text of one safetensors blob holding ``named`` (moved to CPU, made contiguous).

    A tensor that is an exact alias of one already in the blob (tied weights such as
    ``lm_head.weight`` and the embeddings) is stored once and listed in the blob's metadata, so
    the payload does not carry the same bytes twice; :func:`decode_named_tensors` restores both
    names. Tensors that merely overlap in memory are copied.
    """
    from safetensors.torch import save

    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    by_view: dict[tuple[int, int, tuple[int, ...], tuple[int, ...], torch.dtype], str] = {}
    storages: set[int] = set()
    for name, t in named:
        t = t.detach()
        view = (t.untyped_storage().data_ptr(), int(t.storage_offset()), tuple(t.shape), tuple(t.stride()), t.dtype)
        if view in by_view:
            aliases[name] = by_view[view]
            continue
        by_view[view] = name
        cpu = t.to("cpu").contiguous()
        ptr = cpu.untyped_storage().data_ptr()
        tensors[name] = cpu.clone() if ptr in storages else cpu
        storages.add(ptr)
    metadata = {_ALIASES_KEY: json.dumps(aliases)} if aliases else None
    return base64.b64encode(save(tensors, metadata=metadata)).decode("ascii")


def _blob_metadata(blob: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors blob (an 8-byte header length, then JSON)."""
    if len(blob) < 8:
        return {}
    size = int.from_bytes(blob[:8], "little")
    try:
        header = json.loads(blob[8 : 8 + size])
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return meta if isinstance(meta, dict) else {}


def decode_named_tensors(item: str) -> NamedTensors:
    """Inverse of :func:`encode_named_tensors`; raises WeightTransportError on bad input."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        blob = base64.b64decode(item, validate=True)
    except (binascii.Error, ValueError):
        raise WeightTransportError("serialized_named_tensors item is not valid base64") from None
    try:
        named = load(blob)
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise WeightTransportError(f"serialized_named_tensors item is not a safetensors blob: {exc}") from None
    try:
        aliases = json.loads(_blob_metadata(blob).get(_ALIASES_KEY, "{}"))
    except json.JSONDecodeError:
        raise WeightTransportError("serialized_named_tensors item has unreadable alias metadata") from None
    if not isinstance(aliases, dict):
        raise WeightTransportError("serialized_named_tensors item has unreadable alias metadata")
    out = list(named.items())
    for alias, stored in aliases.items():
        if stored not in named:
            raise WeightTransportError(f"alias {alias!r} points to {stored!r}, which the blob does not hold")
        out.append((str(alias), named[stored]))
    return out


def buckets(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[NamedTensors]:
    """Group tensors into lists of about ``bucket_bytes`` (a tensor larger than that goes alone)."""
    bucket: NamedTensors = []
    size = 0
    for name, t in named:
        nbytes = t.numel() * t.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += nbytes
    if bucket:
        yield bucket


async def push_weights_from_tensor(
    base_url: str,
    named: Iterable[tuple[str, torch.Tensor]],
    *,
    weight_version: str | None = None,
    api_key: str | None = None,
    bucket_bytes: int = 256 << 20,
    timeout_s: float = 600.0,
) -> int:
    """Send weights to one engine over ``/update_weights_from_tensor``, bucket by bucket.

    Only the last bucket carries ``weight_version``, so the version flips once every tensor is in.
    Returns the number of buckets sent.
    """
    groups = list(buckets(named, bucket_bytes))
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s) as http:
        for i, group in enumerate(groups):
            req = UpdateWeightsFromTensorRequest(
                serialized_named_tensors=[encode_named_tensors(group)],
                weight_version=weight_version if i == len(groups) - 1 else None,
            )
            resp = await http.post("/update_weights_from_tensor", json=req.model_dump(exclude_none=True))
            if resp.status_code >= 400:
                raise EngineError(base_url + "/update_weights_from_tensor", resp.text[:500], resp.status_code)
            body = UpdateWeightsResponse.model_validate(resp.json())
            if not body.success:
                raise EngineError(base_url + "/update_weights_from_tensor", body.message)
    return len(groups)


# ------------------------------------------------------------------------------------------------
# process groups without a default group
# ------------------------------------------------------------------------------------------------
def parse_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` or ``"torch.bfloat16"`` -> ``torch.bfloat16``."""
    value = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise WeightTransportError(f"unknown dtype {name!r}")
    return value


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass
class GroupHandle:
    """A process group and the TCPStore it rendezvoused on (rank 0 hosts the store's server,
    so the store must live as long as the group)."""

    group: Any
    store: Any
    rank: int
    world_size: int


def new_process_group(
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    *,
    group_name: str,
    backend: str = "gloo",
    timeout_s: float = DEFAULT_GROUP_TIMEOUT_S,
) -> GroupHandle:
    """A process group of its own over a TCPStore hosted by rank 0 (the trainer)."""
    timeout = _dt.timedelta(seconds=timeout_s)
    store = dist.TCPStore(  # type: ignore[attr-defined]
        master_address, master_port, world_size, is_master=(rank == 0), timeout=timeout
    )
    prefixed = dist.PrefixStore(group_name, store)  # type: ignore[attr-defined]
    group: Any
    if backend == "gloo":
        group = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
    elif backend == "nccl":  # trainer side against SGLang on GPUs
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        group = dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
    else:
        raise WeightTransportError(f"unsupported backend {backend!r}; expected 'gloo' or 'nccl'")
    return GroupHandle(group, store, rank, world_size)


def broadcast(handle: GroupHandle, tensors: list[torch.Tensor], root: int = 0) -> None:
    """Broadcast each tensor from ``root`` in order, then wait for all of them.

    Each wait is bounded by the group's timeout: gloo fails a collective whose peers do not show
    up within it, so a missing sender or receiver raises instead of blocking forever.
    """
    works = []
    for t in tensors:
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        works.append(handle.group.broadcast([t], opts))
    for w in works:
        w.wait()


class WeightGroupError(RelaxGymError, RuntimeError):
    """Joining a weight-update group, or a collective on it, failed or ran out of time.

    ``status`` is the HTTP status the engine answers with (SGLang's ``{"success": false,
    "message": ...}`` body): 409 for a conflicting call, 503 when too many joins are pending,
    504 when the trainer did not rendezvous in time.
    """

    def __init__(self, message: str, status: int = 504) -> None:
        super().__init__(message)
        self.status = status



def _first_line(exc: BaseException) -> str:
    """torch's distributed errors carry a C++ stack trace after the first line; keep the cause."""
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def _start_daemon(fn: Callable[[], None], name: str) -> concurrent.futures.Future[None]:
    """Run ``fn`` in a daemon thread: a thread stuck in a rendezvous or collective can neither
    block the event loop nor keep the process alive at exit."""
    fut: concurrent.futures.Future[None] = concurrent.futures.Future()

    def target() -> None:
        if not fut.set_running_or_notify_cancel():
            return
        try:
            fn()
        except BaseException as exc:  # handed to the awaiting request
            fut.set_exception(exc)
        else:
            fut.set_result(None)

    threading.Thread(target=target, name=name, daemon=True).start()
    return fut


async def _await_bounded(fut: concurrent.futures.Future[None], timeout_s: float) -> bool:
    """Wait for ``fut`` up to ``timeout_s``; False when the deadline passed first."""
    try:
        await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(fut)), timeout_s)
    except TimeoutError:
        return False
    return True


@dataclass
class _Join:
    """One pending join; ``abandoned`` once its request gave up, so a late group is dropped."""

    name: str
    abandoned: bool = False


class WeightReceiver:
    """Engine side: joins named groups and receives broadcast tensors (one engine rank each).

    Every rendezvous and collective runs in a daemon thread under a deadline of ``timeout_s``
    (torch's own store and group timeouts are set to the same value), so a trainer that never
    shows up costs the caller one error reply after ``timeout_s`` -- never a stuck request, a
    stuck engine thread, or a process that cannot exit. Groups are dropped in daemon threads too,
    since releasing a gloo group waits for its unfinished collectives.
    """

    def __init__(
        self,
        timeout_s: float = DEFAULT_GROUP_TIMEOUT_S,
        *,
        max_pending_joins: int = MAX_PENDING_JOINS,
        max_receive_bytes: int | None = None,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        self.max_pending_joins = max(1, max_pending_joins)
        # one update's buffers are allocated before the broadcast fills them: no request may ask
        # for more than this (the engine sets it from its model's size)
        self.max_receive_bytes = max_receive_bytes
        self._lock = threading.Lock()
        self._groups: dict[str, GroupHandle] = {}
        self._joining: dict[str, _Join] = {}
        self._join_threads = 0
        self._busy: set[str] = set()  # groups with a collective in flight

    @property
    def group_names(self) -> list[str]:
        with self._lock:
            return sorted(self._groups)

    @property
    def pending_joins(self) -> int:
        """Join threads still alive (a timed-out rendezvous winds down in its own thread); at
        ``max_pending_joins`` new joins get a 503."""
        with self._lock:
            return self._join_threads

    # -- joining ------------------------------------------------------------------------------
    def _check_join(self, req: InitWeightsUpdateGroupRequest) -> None:
        if req.backend != "gloo":
            raise WeightTransportError(
                f"backend {req.backend!r} is not available on the CPU engine; send backend='gloo'"
            )
        if not 0 < req.rank_offset < req.world_size:
            raise WeightTransportError(f"rank_offset {req.rank_offset} is outside 1..{req.world_size - 1}")
        if not 0 < req.master_port < 65536:
            raise WeightTransportError(f"master_port {req.master_port} is not a TCP port")

    def _reserve_join(self, name: str) -> _Join:
        with self._lock:
            if name in self._groups:
                raise WeightGroupError(f"group {name!r} already exists; destroy it first", 409)
            if name in self._joining:
                raise WeightGroupError(f"group {name!r} is already being joined", 409)
            if self._join_threads >= self.max_pending_joins:
                raise WeightGroupError(
                    f"{self._join_threads} group joins are still pending; try again in up to {self.timeout_s:.0f} s",
                    503,
                )
            ticket = _Join(name)
            self._joining[name] = ticket
            self._join_threads += 1
            return ticket

    def _join_blocking(self, req: InitWeightsUpdateGroupRequest, ticket: _Join) -> None:
        """Thread body: rendezvous, then keep the group unless the request gave up meanwhile
        (the late group is released here, in this thread)."""
        try:
            handle = new_process_group(
                req.master_address,
                req.master_port,
                req.rank_offset,  # one engine rank (no tensor parallelism here)
                req.world_size,
                group_name=req.group_name,
                backend="gloo",
                timeout_s=self.timeout_s,
            )
            with self._lock:
                if not ticket.abandoned:
                    self._groups[ticket.name] = handle
            del handle
        finally:
            with self._lock:
                self._join_threads -= 1
                if self._joining.get(ticket.name) is ticket:
                    del self._joining[ticket.name]

    async def join(self, req: InitWeightsUpdateGroupRequest) -> None:
        """Join ``req``'s group within ``timeout_s``; raises WeightTransportError (bad request)
        or WeightGroupError (conflict, busy, or no rendezvous in time)."""
        self._check_join(req)
        ticket = self._reserve_join(req.group_name)
        where = f"{req.master_address}:{req.master_port}"
        fut = _start_daemon(lambda: self._join_blocking(req, ticket), f"relax-gym-join-{req.group_name}")
        if not await _await_bounded(fut, self.timeout_s):
            with self._lock:
                ticket.abandoned = True  # a late group is dropped by its thread; a retry may start now
                if self._joining.get(req.group_name) is ticket:
                    del self._joining[req.group_name]
                joined = req.group_name in self._groups
            if joined:  # finished at the deadline
                return
            raise WeightGroupError(
                f"no rendezvous for group {req.group_name!r} at {where} within {self.timeout_s:g} s "
                "(is the trainer listening there as rank 0?)"
            )
        exc = fut.exception()
        if exc is not None:
            raise WeightGroupError(
                f"joining group {req.group_name!r} at {where} failed within {self.timeout_s:g} s: {_first_line(exc)}"
            )

    def init_group(self, req: InitWeightsUpdateGroupRequest) -> None:
        """Blocking form of :meth:`join` (for callers outside an event loop)."""
        asyncio.run(self.join(req))

    # -- leaving ------------------------------------------------------------------------------
    def destroy_group(self, group_name: str) -> bool:
        """Forget a group (released in a daemon thread). Refused while a broadcast runs on it."""
        with self._lock:
            if group_name in self._busy:
                raise WeightGroupError(f"group {group_name!r} is receiving weights; destroy it afterwards", 409)
            if group_name not in self._groups:
                return False
            box = [self._groups.pop(group_name)]
        _release_in_background(box)
        return True

    def close(self) -> None:
        """Drop every group (at shutdown)."""
        with self._lock:
            box: list[Any] = list(self._groups.values())
            self._groups.clear()
        _release_in_background(box)

    # -- receiving ----------------------------------------------------------------------------
    def _claim(self, group_name: str) -> None:
        with self._lock:
            if group_name not in self._groups:
                raise WeightTransportError(f"no weight update group {group_name!r}; call /init_weights_update_group")
            if group_name in self._busy:
                raise WeightGroupError(f"group {group_name!r} is already receiving a broadcast", 409)
            self._busy.add(group_name)

    def _receive_blocking(self, group_name: str, tensors: list[torch.Tensor]) -> None:
        """Thread body: receive into ``tensors``; a failed or timed-out collective leaves the
        group out of step, so it is dropped (here, in this thread)."""
        with self._lock:
            entry = self._groups[group_name]
        try:
            broadcast(entry, tensors, root=0)
        except RuntimeError as exc:
            with self._lock:
                if self._groups.get(group_name) is entry:
                    del self._groups[group_name]
            del entry
            raise WeightGroupError(
                f"broadcast on group {group_name!r} did not complete within {self.timeout_s:g} s "
                f"({_first_line(exc)}); the group was destroyed, call /init_weights_update_group again"
            ) from None
        finally:
            with self._lock:
                self._busy.discard(group_name)

    def _check_size(self, req: UpdateWeightsFromDistributedRequest) -> None:
        if self.max_receive_bytes is None:
            return
        total = 0
        for dt, shape in zip(req.dtypes, req.shapes, strict=True):
            numel = 1
            for dim in shape:
                numel *= int(dim)
            total += numel * torch.empty((), dtype=parse_dtype(dt)).element_size()
        if total > self.max_receive_bytes:
            raise WeightTransportError(
                f"the request lists {total} bytes of tensors, more than the {self.max_receive_bytes} this engine "
                "accepts in one update (its model's size); send smaller buckets"
            )

    async def receive(self, req: UpdateWeightsFromDistributedRequest) -> NamedTensors:
        """Receive the tensors ``req`` lists (all of them, so the collective stays in step),
        off the engine thread and within the group's timeout."""
        validate_distributed_request(req)
        self._check_size(req)
        self._claim(req.group_name)
        try:
            tensors = [
                torch.empty(tuple(shape), dtype=parse_dtype(dt))
                for dt, shape in zip(req.dtypes, req.shapes, strict=True)
            ]
        except BaseException:
            with self._lock:
                self._busy.discard(req.group_name)
            raise
        fut = _start_daemon(lambda: self._receive_blocking(req.group_name, tensors), "relax-gym-receive")
        # gloo fails the collective at timeout_s; the extra seconds only cover a wedged thread
        if not await _await_bounded(fut, self.timeout_s + 5.0):
            raise WeightGroupError(
                f"broadcast on group {req.group_name!r} did not complete within {self.timeout_s:g} s; "
                "destroy the group and join again"
            )
        fut.result()
        return list(zip(req.names, tensors, strict=True))


def _release_in_background(box: list[Any]) -> None:
    """Drop the groups in ``box`` in a daemon thread (their destructors wait for pending work).
    ``box`` must hold the only references."""
    if box:
        threading.Thread(target=box.clear, name="relax-gym-group-release", daemon=True).start()


def validate_distributed_request(req: UpdateWeightsFromDistributedRequest) -> None:
    if not (len(req.names) == len(req.dtypes) == len(req.shapes)):
        raise WeightTransportError(
            f"names, dtypes and shapes differ in length ({len(req.names)}, {len(req.dtypes)}, {len(req.shapes)})"
        )
    for dt in req.dtypes:
        parse_dtype(dt)
    for shape in req.shapes:
        if any(int(s) < 0 for s in shape):
            raise WeightTransportError(f"negative dimension in shape {shape}")


# ------------------------------------------------------------------------------------------------
# sender side
# ------------------------------------------------------------------------------------------------
@dataclass
class EngineTarget:
    """One engine to broadcast to: its URL, auth, and how many ranks it joins with (SGLang: TP size)."""

    base_url: str
    api_key: str | None = None
    ranks: int = 1


class WeightBroadcaster:
    """Trainer side (rank 0) of the distributed path, for any number of engines.

    ``await init()`` opens the group (engines join through ``/init_weights_update_group``);
    ``await push(named, weight_version=...)`` sends buckets: for each bucket it posts
    ``/update_weights_from_distributed`` to every engine and broadcasts the tensors meanwhile.
    """

    def __init__(
        self,
        engines: list[EngineTarget],
        *,
        master_address: str = "127.0.0.1",
        master_port: int,
        group_name: str = "weight_update_group",
        backend: str = "gloo",
        timeout_s: float = DEFAULT_GROUP_TIMEOUT_S,
    ) -> None:
        self.engines = engines
        self.master_address = master_address
        self.master_port = master_port
        self.group_name = group_name
        self.backend = backend
        self.timeout_s = timeout_s
        self.world_size = 1 + sum(e.ranks for e in engines)
        self._group: GroupHandle | None = None
        # the engines answer within their own group timeout; wait a little longer than ours
        self._clients = [EngineClient(e.base_url, api_key=e.api_key, timeout_s=timeout_s + 30.0) for e in engines]

    async def init(self) -> None:
        offsets, offset = [], 1
        for e in self.engines:
            offsets.append(offset)
            offset += e.ranks
        calls = [
            asyncio.create_task(
                c.init_weights_update_group(
                    InitWeightsUpdateGroupRequest(
                        master_address=self.master_address,
                        master_port=self.master_port,
                        rank_offset=off,
                        world_size=self.world_size,
                        group_name=self.group_name,
                        backend=self.backend,
                    )
                )
            )
            for c, off in zip(self._clients, offsets, strict=True)
        ]
        box: list[GroupHandle] = []

        def rendezvous() -> None:
            box.append(
                new_process_group(
                    self.master_address,
                    self.master_port,
                    0,
                    self.world_size,
                    group_name=self.group_name,
                    backend=self.backend,
                    timeout_s=self.timeout_s,
                )
            )

        joined = asyncio.wrap_future(_start_daemon(rendezvous, "relax-gym-rendezvous"))
        try:
            await asyncio.wait_for(self._until_all_joined(joined, calls), self.timeout_s + 5.0)
        except TimeoutError:
            raise WeightGroupError(
                f"the engines did not join group {self.group_name!r} within {self.timeout_s:g} s"
            ) from None
        finally:
            for call in calls:
                call.cancel()
        self._group = box[0]

    async def _until_all_joined(
        self, joined: asyncio.Future[None], calls: list[asyncio.Task[UpdateWeightsResponse]]
    ) -> None:
        """Wait for our rendezvous and every engine's reply; the first failure raises at once
        (an engine that refused to join would otherwise leave rank 0 waiting out its timeout)."""
        pending: set[asyncio.Future[Any]] = {joined, *calls}
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                exc = fut.exception()
                if exc is not None and fut is joined:
                    raise WeightGroupError(f"opening group {self.group_name!r} failed: {_first_line(exc)}")
                if exc is not None:
                    raise exc
                if fut is not joined and not fut.result().success:
                    engine = self.engines[calls.index(fut)]  # type: ignore[arg-type]
                    raise EngineError(engine.base_url + "/init_weights_update_group", fut.result().message)

    async def push(
        self,
        named: Iterable[tuple[str, torch.Tensor]],
        *,
        weight_version: str | None = None,
        bucket_bytes: int = 256 << 20,
        abort_all_requests: bool = False,
    ) -> int:
        """Broadcast ``named`` to every engine; the last bucket sets ``weight_version``."""
        if self._group is None:
            raise WeightTransportError("call init() before push()")
        groups = list(buckets(((n, t.detach().cpu().contiguous()) for n, t in named), bucket_bytes))
        for i, group in enumerate(groups):
            req = UpdateWeightsFromDistributedRequest(
                names=[n for n, _ in group],
                dtypes=[dtype_name(t.dtype) for _, t in group],
                shapes=[list(t.shape) for _, t in group],
                group_name=self.group_name,
                weight_version=weight_version if i == len(groups) - 1 else None,
                abort_all_requests=abort_all_requests,
            )
            calls = [asyncio.create_task(c.update_weights_from_distributed(req)) for c in self._clients]
            handle, tensors = self._group, [t for _, t in group]
            try:
                await asyncio.wrap_future(_start_daemon(lambda: broadcast(handle, tensors, 0), "relax-gym-broadcast"))
            finally:
                replies = await asyncio.gather(*calls, return_exceptions=True)
            for r in replies:
                if isinstance(r, BaseException):
                    raise r
        return len(groups)

    async def close(self) -> None:
        for e, c in zip(self.engines, self._clients, strict=True):
            await c.aclose()
            headers = {"Authorization": f"Bearer {e.api_key}"} if e.api_key else {}
            try:
                async with httpx.AsyncClient(base_url=e.base_url.rstrip("/"), headers=headers, timeout=10.0) as http:
                    await http.post("/destroy_weights_update_group", json={"group_name": self.group_name})
            except httpx.HTTPError:
                pass  # the engine is gone; nothing to release there
        self._group = None


__all__ = [
    "DEFAULT_GROUP_TIMEOUT_S",
    "EngineTarget",
    "GroupHandle",
    "UpdateWeightsFromTensorRequest",
    "WeightBroadcaster",
    "WeightGroupError",
    "WeightReceiver",
    "WeightTransportError",
    "buckets",
    "decode_named_tensors",
    "dtype_name",
    "encode_named_tensors",
    "new_process_group",
    "parse_dtype",
    "push_weights_from_tensor",
    "validate_distributed_request",
]
