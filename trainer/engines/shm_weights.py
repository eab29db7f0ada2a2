"""Weights through shared memory: a safetensors file in ``/dev/shm`` whose path is posted.

For an engine on the trainer's host, base64 text in a JSON body costs an encode, a body of 4/3
the size, a JSON parse and a decode on every sync (0.5 s per step at 15 MB on 2 busy cores).
Here the trainer writes each bucket once into a RAM-backed file, posts its *path* to
``/update_weights_from_tensor`` with ``load_format="relax_gym_shm"``, and removes the file when
every engine answered; the engine reads the file with one copy.

Both sides agree on the place (:func:`shm_dir`) and on being on one host (:func:`host_id`, the
kernel's boot id): the engine reports both in ``/server_info``, and the trainer uses this path
only when they match its own (else it falls back to base64 in the body). The engine opens only
regular files it owns, named like the trainer names them, directly inside its own shm folder,
without following links, and no larger than its weight-upload limit.
"""

from __future__ import annotations

import os
import re
import socket
import stat
import tempfile
from collections.abc import Iterable
from functools import cache
from pathlib import Path

import torch

from relax_gym.trainer.engines.weight_receiver import (
    ALIASES_KEY,
    NamedTensors,
    WeightTransportError,
    decode_blob,
    pack_named_tensors,
)

SHM_LOAD_FORMAT = "relax_gym_shm"
FILE_PREFIX = "relax-gym-weights-"
_NAME = re.compile(r"^relax-gym-weights-[A-Za-z0-9_]{1,64}\.safetensors$")


@cache
def shm_dir() -> Path:
    """``/dev/shm`` when it is a writable folder (RAM-backed on Linux), else the temp folder."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return Path(tempfile.gettempdir())


@cache
def host_id() -> str:
    """The boot id (one per running kernel: processes that share it share ``/dev/shm``) and host name."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def write_shm_blob(named: Iterable[tuple[str, torch.Tensor]], folder: Path | None = None) -> Path:
    """Write ``named`` as one safetensors file (mode 0600) in the shm folder; the caller removes it."""
    from safetensors.torch import save_file

    tensors, metadata = pack_named_tensors(named)
    fd, name = tempfile.mkstemp(prefix=FILE_PREFIX, suffix=".safetensors", dir=folder or shm_dir())
    os.close(fd)
    path = Path(name)
    try:
        save_file(tensors, str(path), metadata=metadata)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


def read_shm_blob(item: str, *, max_bytes: int, folder: Path | None = None) -> NamedTensors:
    """The named tensors in the shm file ``item`` names; WeightTransportError for anything but a
    regular file of ours, directly in the shm folder, within ``max_bytes``."""
    base = (folder or shm_dir()).resolve()
    path = Path(item)
    if not path.is_absolute() or path.parent != base or not _NAME.match(path.name):
        raise WeightTransportError(
            f"shared-memory weight item {item[:200]!r} is not a {FILE_PREFIX}*.safetensors file in {base}")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise WeightTransportError(f"cannot open shared-memory weights {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise WeightTransportError(f"shared-memory weights {path} are not a regular file of this user")
        if info.st_size > max_bytes:
            raise WeightTransportError(
                f"shared-memory weights {path} hold {info.st_size} bytes, more than the {max_bytes} allowed")
        proc_fd = Path(f"/proc/self/fd/{f.fileno()}")
        if not proc_fd.exists():  # no procfs: read the bytes (one more copy)
            return decode_blob(f.read(max_bytes + 1))
        return _map(proc_fd, path)


def _map(opened: Path, shown: Path) -> NamedTensors:
    """The tensors of an opened file, mapped rather than read (the copy into the model is the
    only one); ``opened`` is the ``/proc/self/fd`` link of the checked descriptor."""
    import json

    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(opened), framework="pt") as blob:
            named = {name: blob.get_tensor(name) for name in blob.keys()}  # noqa: SIM118 -- not a dict
            meta = blob.metadata() or {}
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise WeightTransportError(f"shared-memory weights {shown} are not a safetensors blob: {exc}") from None
    try:
        aliases = json.loads(meta.get(ALIASES_KEY, "{}"))
    except json.JSONDecodeError:
        aliases = None
    if not isinstance(aliases, dict):
        raise WeightTransportError(f"shared-memory weights {shown} have unreadable alias metadata")
    out = list(named.items())
    for alias, stored in aliases.items():
        if stored not in named:
            raise WeightTransportError(f"alias {alias!r} points to {stored!r}, which {shown} does not hold")
        out.append((str(alias), named[stored]))
    return out


__all__ = ["FILE_PREFIX", "SHM_LOAD_FORMAT", "host_id", "read_shm_blob", "shm_dir", "write_shm_blob"]
