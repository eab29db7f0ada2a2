"""Read-only access to Hugging Face weights, one slice at a time.

The loader asks a source for exactly the rows or columns one tensor-parallel rank owns, so a
rank never reads (or holds) the full checkpoint. ``SafetensorsSource`` slices lazily from the
files on disk (``safe_open(...).get_slice``); ``StateDictSource`` serves an in-memory state
dict (a freshly built HF model, or tensors received over a weight-sync channel).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
from relax_gym.trainer.backends.megatron.config import MegatronBridgeError


class TensorSource(Protocol):
    """Named HF tensors that can be read whole or as a row/column slice."""

    def keys(self) -> Iterable[str]: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def read(self, name: str, rows: slice | None = None, cols: slice | None = None) -> torch.Tensor:
        """The tensor ``name`` (or ``name[rows, cols]``) as a new CPU tensor."""
        ...


def _missing(name: str, where: str) -> MegatronBridgeError:
    return MegatronBridgeError(f"checkpoint tensor {name!r} not found in {where}")


class StateDictSource:
    """A ``TensorSource`` over a mapping of name -> tensor (e.g. ``hf_model.state_dict()``)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self._tensors = tensors

    def keys(self) -> Iterable[str]:
        return self._tensors.keys()

    def shape(self, name: str) -> tuple[int, ...]:
        if name not in self._tensors:
            raise _missing(name, "the state dict")
        return tuple(self._tensors[name].shape)

    def read(self, name: str, rows: slice | None = None, cols: slice | None = None) -> torch.Tensor:
        if name not in self._tensors:
            raise _missing(name, "the state dict")
        t = self._tensors[name].detach()
        if rows is not None:
            t = t[rows]
        if cols is not None:
            t = t[:, cols]
        return t.to("cpu", copy=True).contiguous()


class SafetensorsSource:
    """A ``TensorSource`` over an HF model folder (``model.safetensors`` or a sharded index).

    Slices are read with ``get_slice`` so only the requested bytes leave the file.
    """

    def __init__(self, folder: str | Path) -> None:
        from safetensors import safe_open

        self.folder = Path(folder)
        index = self.folder / "model.safetensors.index.json"
        single = self.folder / "model.safetensors"
        if index.is_file():
            weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        elif single.is_file():
            weight_map = {}
            with safe_open(str(single), framework="pt") as f:
                weight_map = {k: single.name for k in f.keys()}  # noqa: SIM118 - safe_open is not iterable
        else:
            raise MegatronBridgeError(f"{self.folder} holds no model.safetensors(.index.json)")
        self._weight_map = weight_map
        self._handles: dict[str, Any] = {}

    def _file(self, name: str) -> Any:
        from safetensors import safe_open

        fname = self._weight_map.get(name)
        if fname is None:
            raise _missing(name, str(self.folder))
        if fname not in self._handles:
            path = self.folder / fname
            if not path.is_file():
                raise MegatronBridgeError(f"{path} is named in the index but missing")
            self._handles[fname] = safe_open(str(path), framework="pt")
        return self._handles[fname]

    def keys(self) -> Iterable[str]:
        return self._weight_map.keys()

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._file(name).get_slice(name).get_shape())

    def read(self, name: str, rows: slice | None = None, cols: slice | None = None) -> torch.Tensor:
        sl = self._file(name).get_slice(name)
        ndim = len(sl.get_shape())
        if rows is None and cols is None:
            whole: torch.Tensor = self._file(name).get_tensor(name)
            return whole.contiguous()
        index: tuple[slice, ...] = (rows or slice(None),)
        if cols is not None:
            if ndim < 2:
                raise MegatronBridgeError(f"{name!r} is 1-D; it has no columns to slice")
            index = index + (cols,)
        part: torch.Tensor = sl[index]
        return part.contiguous()
