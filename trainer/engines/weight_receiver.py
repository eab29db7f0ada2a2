"""The engine's side of weight transport, and the wire pieces both sides share.

The trainer's side -- the transports and the publisher -- is :mod:`relax_gym.trainer.weights`.
What lives here is what the engine needs to receive weights, plus what both ends must agree on:

* **In memory** (``POST /update_weights_from_tensor``, for a trainer on the same host): SGLang's
  request shape (``serialized_named_tensors``, ``load_format``, ``flush_cache``,
  ``abort_all_requests``, ``weight_version``), but each item is the base64 text of a
  *safetensors* blob holding some named tensors (:func:`encode_named_tensors` /
  :func:`decode_named_tensors`), and ``load_format`` must be ``"safetensors"``. SGLang's own
  items are pickles carrying CUDA IPC handles; unpickling request bodies would let a caller run
  code, so the embedded engine refuses them.
* **Distributed** (``/init_weights_update_group`` + ``/update_weights_from_distributed``): the
  trainer is rank 0 of a dedicated process group and broadcasts each tensor, in the order the
  request lists them, to every engine rank. The group is built directly on a ``TCPStore``
  (:func:`new_process_group`; no default process group is touched on either side), so a trainer
  that already runs its own ``torch.distributed`` world can still open it. The embedded engine
  joins over gloo (:class:`WeightReceiver`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import datetime as _dt
import json
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from relax_gym.errors import RelaxGymError
from relax_gym.protocol import (
    InitWeightsUpdateGroupRequest,
    UpdateWeightsFromDistributedRequest,
    UpdateWeightsFromTensorRequest,
)

NamedTensors = list[tuple[str, torch.Tensor]]

DEFAULT_GROUP_TIMEOUT_S = 60.0  # rendezvous and each broadcast; a present trainer takes < 1 s
MAX_PENDING_JOINS = 4  # join threads alive at once (a join that timed out may linger a little)


class WeightTransportError(RelaxGymError, ValueError):
    """A weight payload or group request is malformed or cannot be served."""


# ------------------------------------------------------------------------------------------------
# safetensors items
# ------------------------------------------------------------------------------------------------
ALIASES_KEY = "relax_gym.aliases"  # safetensors metadata: {"alias name": "stored name"}


def pack_named_tensors(
    named: Iterable[tuple[str, torch.Tensor]],
) -> tuple[dict[str, torch.Tensor], dict[str, str] | None]:
    """The tensors and metadata of one safetensors blob holding ``named`` (CPU, contiguous).

    A tensor that is an exact alias of one already packed (tied weights such as
    ``lm_head.weight`` and the embeddings) is stored once and listed in the metadata, so the
    blob does not carry the same bytes twice; :func:`decode_blob` restores both names. Tensors
    that merely overlap in memory are copied.
    """
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
    return tensors, ({ALIASES_KEY: json.dumps(aliases)} if aliases else None)


def encode_named_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """Base64 text of one safetensors blob holding ``named`` (see :func:`pack_named_tensors`)."""
    from safetensors.torch import save

    tensors, metadata = pack_named_tensors(named)
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
    try:
        blob = base64.b64decode(item, validate=True)
    except (binascii.Error, ValueError):
        raise WeightTransportError("serialized_named_tensors item is not valid base64") from None
    return decode_blob(blob)


def decode_blob(blob: bytes) -> NamedTensors:
    """The named tensors of one safetensors blob (aliases restored); WeightTransportError on bad input."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        named = load(blob)
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise WeightTransportError(f"serialized_named_tensors item is not a safetensors blob: {exc}") from None
    try:
        aliases = json.loads(_blob_metadata(blob).get(ALIASES_KEY, "{}"))
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
    """A process group of its own over a TCPStore hosted by rank 0 (the trainer).

    The store keys are laid out as SGLang's engine side lays them out, so the two sides meet:
    SGLang's ``init_custom_process_group`` rendezvouses on ``tcp://address:port``, wraps the
    store in ``PrefixStore(group_name)`` and hands it to torch's ``_new_process_group_helper``,
    which adds ``PrefixStore(f"{group_name}/")`` and then one per device (``"cpu/"`` for gloo,
    ``"cuda/"`` for nccl), and sets the group's sequence number through the store (rank 0
    writes it, the others wait for it). We build the same chain from public classes instead of
    calling torch's private helper, which would also register the group in torch's global
    table (one name per process: a trainer and an embedded engine in one process would clash).
    ``tests/engines/test_weight_group_layout.py`` checks the layout against torch's helper, and
    ``tests/sglang_compat`` against SGLang's own function when it is installed.
    """
    timeout = _dt.timedelta(seconds=timeout_s)
    store = dist.TCPStore(  # type: ignore[attr-defined]
        master_address, master_port, world_size, is_master=(rank == 0), timeout=timeout
    )
    device = {"gloo": "cpu", "nccl": "cuda"}.get(backend)
    if device is None:
        raise WeightTransportError(f"unsupported backend {backend!r}; expected 'gloo' or 'nccl'")
    prefixed = dist.PrefixStore(  # type: ignore[attr-defined]
        f"{device}/", dist.PrefixStore(f"{group_name}/", dist.PrefixStore(group_name, store))  # type: ignore[attr-defined]
    )
    group: Any
    if backend == "gloo":
        group = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
    else:  # nccl: trainer side against SGLang on GPUs
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        group = dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
    group._set_sequence_number_for_group()
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



def first_line(exc: BaseException) -> str:
    """torch's distributed errors carry a C++ stack trace after the first line; keep the cause."""
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def start_daemon(fn: Callable[[], None], name: str) -> concurrent.futures.Future[None]:
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
        fut = start_daemon(lambda: self._join_blocking(req, ticket), f"relax-gym-join-{req.group_name}")
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
                f"joining group {req.group_name!r} at {where} failed within {self.timeout_s:g} s: {first_line(exc)}"
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
                f"({first_line(exc)}); the group was destroyed, call /init_weights_update_group again"
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
        fut = start_daemon(lambda: self._receive_blocking(req.group_name, tensors), "relax-gym-receive")
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


__all__ = [
    "ALIASES_KEY",
    "DEFAULT_GROUP_TIMEOUT_S",
    "GroupHandle",
    "UpdateWeightsFromTensorRequest",
    "WeightGroupError",
    "WeightReceiver",
    "WeightTransportError",
    "decode_blob",
    "decode_named_tensors",
    "dtype_name",
    "encode_named_tensors",
    "first_line",
    "new_process_group",
    "pack_named_tensors",
    "parse_dtype",
    "start_daemon",
    "validate_distributed_request",
]
