"""What the host accepts from the sandbox's processes: one pydantic model per message.

Every channel the host reads -- the zygote's control socket, each supervisor's socket and each
executor's status pipe -- is decoded here with a size bound first and a strict schema second
(no extra keys, no type coercion, exit codes and wait statuses in range, reasons from a closed
set). Anything else is ``None`` for the caller, which turns it into that call's error: a
malformed message never raises in the host and never becomes part of a result.
"""

from __future__ import annotations

import struct
from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

_HEADER = struct.Struct("!I")
STATUS_MESSAGE_MAX = 4096  # the executor's messages are a few dozen bytes
SOCKET_MESSAGE_MAX = 64 * 1024  # one datagram from the zygote or a supervisor

Reason = Literal["memory_limit", "process_limit", "file_size_limit", "open_files_limit", "limits_failed"]


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# -- the executor's status pipe ------------------------------------------------------------------
class Done(_Message):
    """A session call finished (relayed by the executor after it checked the runner's record)."""

    type: Literal["done"]
    seq: int
    exit_code: Annotated[int, Field(ge=0, le=255)]
    reason: Reason | None


class Exit(_Message):
    """The runner ended: its wait status and CPU time, as the executor reaped them."""

    type: Literal["exit"]
    status: Annotated[int, Field(ge=0, le=0xFFFF)]
    cpu_s: Annotated[float, Field(ge=0, allow_inf_nan=False)]


class Fault(_Message):
    """The executor caught the runner breaking the protocol and killed the call."""

    type: Literal["fault"]
    error: Annotated[str, Field(max_length=500)]


StatusMessage = Annotated[Done | Exit | Fault, Field(discriminator="type")]


# -- a supervisor's socket -----------------------------------------------------------------------
class Ready(_Message):
    type: Literal["ready"]
    executor_pid: Annotated[int, Field(gt=0)]
    runner_pid: Annotated[int, Field(gt=0)]
    workdir: Annotated[str, Field(max_length=4096)]


class Failed(_Message):
    type: Literal["failed"]
    error: Annotated[str, Field(max_length=4096)]


class SupervisorExit(_Message):
    """The executor itself ended (its status, not the runner's)."""

    type: Literal["exit"]
    status: Annotated[int, Field(ge=0, le=0xFFFF)]
    cpu_s: Annotated[float, Field(ge=0, allow_inf_nan=False)]


SupervisorMessage = Annotated[Ready | Failed | SupervisorExit, Field(discriminator="type")]


# -- the zygote's control socket -----------------------------------------------------------------
class Hello(_Message):
    type: Literal["hello"]
    pid: Annotated[int, Field(gt=0)]
    caps: dict[str, bool]
    error: Annotated[str, Field(max_length=4096)] | None


class WorkerBorn(_Message):
    type: Literal["worker"]
    pid: Annotated[int, Field(gt=0)]
    uid: int | None


ZygoteMessage = Annotated[Hello | WorkerBorn, Field(discriminator="type")]

_status = TypeAdapter(StatusMessage)
_supervisor = TypeAdapter(SupervisorMessage)
_zygote = TypeAdapter(ZygoteMessage)
T = TypeVar("T")


def _validate(adapter: TypeAdapter[T], body: bytes) -> T | None:
    try:
        return adapter.validate_json(body)
    except (ValidationError, ValueError, RecursionError):
        return None


def parse_status(body: bytes) -> Done | Exit | Fault | None:
    """One status message body (without its length header), or None if malformed."""
    if len(body) > STATUS_MESSAGE_MAX:
        return None
    return _validate(_status, body)


def _datagram_body(data: bytes) -> bytes | None:
    """The body of one length-prefixed datagram, if the prefix matches its length."""
    if not _HEADER.size <= len(data) <= _HEADER.size + SOCKET_MESSAGE_MAX:
        return None
    (size,) = _HEADER.unpack(data[: _HEADER.size])
    return data[_HEADER.size :] if size == len(data) - _HEADER.size else None


def parse_supervisor(data: bytes) -> Ready | Failed | SupervisorExit | None:
    body = _datagram_body(data)
    return None if body is None else _validate(_supervisor, body)


def parse_zygote(data: bytes) -> Hello | WorkerBorn | None:
    body = _datagram_body(data)
    return None if body is None else _validate(_zygote, body)


def frame_size(buf: bytes | bytearray) -> int | None:
    """The body size a buffered status frame announces (None while the header is incomplete)."""
    if len(buf) < _HEADER.size:
        return None
    return int(_HEADER.unpack(bytes(buf[: _HEADER.size]))[0])
