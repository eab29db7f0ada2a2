"""Load a megatron-core distributed checkpoint without running code from it.

What megatron-core 0.16.1's ``dist_checkpointing.load`` reads (format ``torch_dist``):

* ``metadata.json`` -- ``json.load`` (which strategies wrote the checkpoint);
* ``common.pt`` -- ``torch.load(path, map_location="cpu")``, which on torch >= 2.6 defaults to
  ``weights_only=True`` (torch's restricted unpickler; megatron adds a few classes to its
  allow-list on import) unless ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` is set;
* ``.metadata`` -- torch DCP's ``FileSystemReader.read_metadata``: a plain ``pickle.load``, which
  runs any code the file names;
* ``__<rank>_<n>.distcp`` -- tensors through ``torch.load(weights_only=True)``, but every
  non-tensor item (a ``ShardedObject``, e.g. each layer's ``_extra_state``) through DCP's
  ``DefaultLoadPlanner.load_bytes``: ``torch.load(weights_only=False)``, a plain unpickle again.

:func:`safe_load` closes the two plain unpickles and pins the third: ``.metadata`` is read by a
restricted unpickler that builds only DCP's own metadata classes (anything else is refused, never
imported), and its file references are checked to stay inside the folder; byte items and
``common.pt`` go through ``torch.load(weights_only=True)`` explicitly; the strategies are fixed
(``torch_dist`` / ``torch``), so ``metadata.json`` cannot pick another loader. Megatron's loader
builds its DCP reader and planner internally, so they are swapped for the safe ones for the
duration of the call (the names are checked first: a megatron-core that moved them fails closed).
"""

from __future__ import annotations

import io
import pickle
import pickletools
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from relax_gym.errors import RelaxGymError
from relax_gym.trainer.safe_state import one_line

_METADATA = ".metadata"
_DATA_FILE = re.compile(r"^[A-Za-z0-9_.-]+$")
_DCP = "torch.distributed.checkpoint"
#: the classes a DCP ``.metadata`` pickle may build (torch 2.x); nothing else is ever imported
_ALLOWED = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    (f"{_DCP}.filesystem", "_StorageInfo"),
    *((f"{_DCP}.metadata", n) for n in ("Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
                                        "TensorStorageMetadata", "BytesStorageMetadata",
                                        "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")),
    *((f"{_DCP}.planner", n) for n in ("SavePlan", "WriteItem", "WriteItemType", "TensorWriteData")),
}
_LOCK = threading.Lock()


class UnsafeCheckpointError(RelaxGymError, ValueError):
    """A distributed checkpoint file is malformed or holds something other than data."""



#: opcodes that fetch objects from copyreg's extension cache, bypassing ``find_class``
_REFUSED_OPCODES = {"EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID"}


def _check_opcodes(data: bytes) -> None:
    for op, _, _ in pickletools.genops(data):  # a parser only: nothing is built or imported
        if op.name in _REFUSED_OPCODES:
            raise pickle.UnpicklingError(f"refused opcode {op.name}")


def _refusal(exc: BaseException) -> str:
    """The gist of a ``weights_only`` refusal (torch's own message runs to many lines)."""
    text = one_line(exc)
    found = re.search(r"GLOBAL ([\w.]+)", text)
    return f"refused {found.group(1)}" if found else text[:200]


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP metadata objects and torch dtypes only; refuses every other global."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused a persistent id")


def read_dcp_metadata(folder: str | Path) -> Any:
    """``folder/.metadata`` read without running code, its file references checked.

    Raises :class:`UnsafeCheckpointError` naming the file."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        Metadata,
        MetadataIndex,
        StorageMeta,
        TensorStorageMetadata,
    )

    folder = Path(folder)
    path = folder / _METADATA
    try:
        data = path.read_bytes()
        _check_opcodes(data)
        meta = _MetadataUnpickler(io.BytesIO(data)).load()
    except FileNotFoundError:
        raise UnsafeCheckpointError(f"{path}: missing") from None
    except Exception as exc:  # noqa: BLE001 - a crafted pickle can raise nearly anything
        raise UnsafeCheckpointError(f"{path}: not a checkpoint metadata file ({one_line(exc)})") from None
    if not isinstance(meta, Metadata) or not isinstance(meta.state_dict_metadata, dict):
        raise UnsafeCheckpointError(f"{path}: not a checkpoint metadata file")
    for key, item in meta.state_dict_metadata.items():
        if not isinstance(key, str) or not isinstance(item, (TensorStorageMetadata, BytesStorageMetadata)):
            raise UnsafeCheckpointError(f"{path}: unexpected entry {str(key)[:80]!r}")
    if not isinstance(meta.storage_data, dict):
        raise UnsafeCheckpointError(f"{path}: no storage table")
    for index, info in meta.storage_data.items():
        if not isinstance(index, MetadataIndex) or not isinstance(info, _StorageInfo):
            raise UnsafeCheckpointError(f"{path}: malformed storage table")
        name = info.relative_path
        if not isinstance(name, str) or not _DATA_FILE.match(name) or name in (".", "..") \
                or not (folder / name).is_file():
            raise UnsafeCheckpointError(f"{path}: refers to {str(name)[:80]!r}, not a data file in {folder}")
        if not (isinstance(info.offset, int) and isinstance(info.length, int) and info.offset >= 0
                and info.length >= 0):
            raise UnsafeCheckpointError(f"{path}: malformed storage entry for {index.fqn!r}")
        size = (folder / name).stat().st_size
        if info.offset + info.length > size:
            raise UnsafeCheckpointError(f"{folder / name}: {size} bytes, but {index.fqn!r} ends at byte "
                                        f"{info.offset + info.length} (truncated)")
    if meta.storage_meta is None:
        meta.storage_meta = StorageMeta()
    return meta


def _safe_classes(folder: Path) -> tuple[type, type, Any]:
    """The safe DCP reader and load planner for ``folder``, built on megatron's and torch's own classes."""
    from megatron.core.dist_checkpointing.strategies import torch as mtorch
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint._traverse import set_element

    class SafeReader(FileSystemReader):
        """A DCP reader whose metadata comes from :func:`read_dcp_metadata` (read once)."""

        def __init__(self, path: str | Path) -> None:
            super().__init__(path)
            self._safe_metadata: Any = None

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("rank") is not None:
                raise UnsafeCheckpointError(f"{self.path}: per-rank metadata is not supported")
            if self._safe_metadata is None:
                self._safe_metadata = read_dcp_metadata(Path(str(self.path)))
                self._safe_metadata.storage_meta.load_id = self.load_id
            return self._safe_metadata

    class SafePlanner(mtorch.MCoreLoadPlanner):  # type: ignore[misc,name-defined]
        """Megatron's planner with byte items read by ``torch.load(weights_only=True)``."""

        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            try:
                obj = torch.load(value, map_location="cpu", weights_only=True)
            except Exception as exc:  # noqa: BLE001 - the restricted unpickler raises several types
                info = (self.metadata.storage_data or {}).get(read_item.storage_index)
                where = folder / str(getattr(info, "relative_path", "?"))
                raise UnsafeCheckpointError(
                    f"{where}: object {read_item.dest_index.fqn!r} is not plain data ({_refusal(exc)})") from None
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    def reader(checkpoint_dir: str | Path, cache_metadata: bool = False) -> SafeReader:
        return SafeReader(checkpoint_dir)

    return SafeReader, SafePlanner, reader


@contextmanager
def _safe_megatron_reading(folder: Path) -> Iterator[None]:
    """Swap megatron's internal DCP reader factory and load planner for the safe ones."""
    from megatron.core.dist_checkpointing.strategies import torch as mtorch

    missing = [n for n in ("_get_filesystem_reader", "MCoreLoadPlanner") if not hasattr(mtorch, n)]
    if missing:
        raise UnsafeCheckpointError(
            f"this megatron-core has no {', '.join(missing)}: cannot load a checkpoint without unpickling it")
    _, planner, reader = _safe_classes(folder)
    with _LOCK:
        saved = mtorch._get_filesystem_reader, mtorch.MCoreLoadPlanner
        mtorch._get_filesystem_reader, mtorch.MCoreLoadPlanner = reader, planner
        try:
            yield
        finally:
            mtorch._get_filesystem_reader, mtorch.MCoreLoadPlanner = saved


def _common_strategy() -> Any:
    from megatron.core.dist_checkpointing.strategies.common import TorchCommonLoadStrategy

    class SafeCommon(TorchCommonLoadStrategy):
        """``common.pt`` (and any object shards) through ``torch.load(weights_only=True)``."""

        def load_common(self, checkpoint_dir: str | Path) -> Any:
            path = Path(checkpoint_dir) / "common.pt"
            try:
                return torch.load(path, map_location="cpu", weights_only=True)
            except Exception as exc:  # noqa: BLE001
                raise UnsafeCheckpointError(f"{path}: not plain data ({_refusal(exc)})") from None

        def load_sharded_objects(self, sharded_objects_state_dict: Any, checkpoint_dir: str | Path) -> Any:
            raise UnsafeCheckpointError(f"{checkpoint_dir}: separate object shards are not supported")

    return SafeCommon()


def safe_load(sharded_state_dict: dict[str, Any], checkpoint_dir: str | Path) -> dict[str, Any]:
    """``dist_checkpointing.load`` with every file read as data (see the module docstring)."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistLoadShardedStrategy

    from torch.distributed.checkpoint.api import CheckpointException

    read_dcp_metadata(checkpoint_dir)  # fail early, naming the file, before megatron starts
    try:
        with _safe_megatron_reading(Path(checkpoint_dir)):
            return dist_checkpointing.load(sharded_state_dict, str(checkpoint_dir),
                                           sharded_strategy=TorchDistLoadShardedStrategy(),
                                           common_strategy=_common_strategy())
    except CheckpointException as exc:  # a BaseException: DCP gathers each rank's failure into it
        causes = [failure for failure, _ in exc.failures.values()]
        cause = next((c for c in causes if isinstance(c, UnsafeCheckpointError)), causes[0] if causes else exc)
        if isinstance(cause, UnsafeCheckpointError):
            raise UnsafeCheckpointError(str(cause)) from None
        raise UnsafeCheckpointError(f"{checkpoint_dir}: cannot read ({one_line(cause)[:300]})") from None


__all__ = ["UnsafeCheckpointError", "read_dcp_metadata", "safe_load"]
