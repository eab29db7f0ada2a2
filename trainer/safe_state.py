"""Nested training state (optimizer, RNG) in one safetensors file, never a pickle.

``torch.save`` / ``torch.load`` pickle, and unpickling a file runs whatever code its author put
in it: a checkpoint handed to ``--resume`` must never be read that way. A *state tree* -- dicts,
lists and tuples of tensors, numbers, strings, booleans and ``None``, as in an optimizer's
``state_dict()`` -- is stored instead as

* the tensors, in the safetensors body (named ``t0``, ``t1``, ...), and
* the tree's shape, as JSON in the safetensors metadata (``relax_gym.tree``), with a tensor
  written as ``{"tensor": "t0"}``, a tuple as ``{"tuple": [...]}`` and a dict as
  ``{"dict": [[key, value], ...]}`` (keys may be ints: an optimizer's parameter ids).

Reading it parses JSON and safetensors only, so a crafted file can at worst fail to load; every
failure is a :class:`StateFileError` whose message names the file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, TypeVar

import torch
from pydantic import BaseModel, ValidationError

from relax_gym.errors import RelaxGymError

_TREE_KEY = "relax_gym.tree"
_KIND_KEY = "relax_gym.kind"
_MAX_DEPTH = 32  # optimizer and RNG trees are 4 deep; deeper means a crafted file


class StateFileError(RelaxGymError, ValueError):
    """A state file is missing, truncated, corrupted or not the kind of state expected."""


_Model = TypeVar("_Model", bound=BaseModel)


def one_line(exc: BaseException) -> str:
    """An exception's message folded onto one line, for the one-line errors users see."""
    return " ".join(str(exc).split()) or type(exc).__name__


def read_json_model(file: Path, model: type[_Model], error: type[Exception]) -> _Model:
    """``file`` parsed and checked as ``model`` (JSON only); any failure is ``error`` with one
    line naming the file and, for a bad value, the field."""
    try:
        return model.model_validate_json(file.read_bytes())
    except OSError as exc:
        raise error(f"{file}: unreadable ({one_line(exc)})") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "(top)"
        raise error(f"{file}: {where}: {err['msg']}") from None


def _encode(value: Any, tensors: dict[str, torch.Tensor], depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise TypeError("state tree nested too deeply")
    if isinstance(value, torch.Tensor):
        name = f"t{len(tensors)}"
        tensors[name] = value.detach().cpu().contiguous()
        return {"tensor": name}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, tuple):
        return {"tuple": [_encode(v, tensors, depth + 1) for v in value]}
    if isinstance(value, list):
        return [_encode(v, tensors, depth + 1) for v in value]
    if isinstance(value, dict):
        items = []
        for key, v in value.items():
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise TypeError(f"state tree key {key!r} is not a str or int")
            items.append([key, _encode(v, tensors, depth + 1)])
        return {"dict": items}
    raise TypeError(f"state tree holds a {type(value).__name__}, which has no safe encoding")


def _decode(node: Any, tensors: dict[str, torch.Tensor], depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise ValueError("state tree nested too deeply")
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, list):
        return [_decode(v, tensors, depth + 1) for v in node]
    if not isinstance(node, dict) or len(node) != 1:
        raise ValueError(f"unexpected node {str(node)[:60]!r}")
    (tag, body), = node.items()
    if tag == "tensor" and isinstance(body, str) and body in tensors:
        return tensors[body]
    if tag == "float" and body in ("nan", "inf", "-inf"):
        return float(body)
    if tag == "tuple" and isinstance(body, list):
        return tuple(_decode(v, tensors, depth + 1) for v in body)
    if tag == "dict" and isinstance(body, list):
        out: dict[Any, Any] = {}
        for pair in body:
            if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], (str, int))
                    and not isinstance(pair[0], bool)):
                raise ValueError(f"malformed dict entry {str(pair)[:60]!r}")
            out[pair[0]] = _decode(pair[1], tensors, depth + 1)
        return out
    raise ValueError(f"unexpected node {str(node)[:60]!r}")


def save_tree(tree: Any, path: str | Path, *, kind: str) -> Path:
    """Write ``tree`` to ``path`` (a ``.safetensors`` file); ``kind`` is checked on load."""
    from safetensors.torch import save_file

    path = Path(path)
    tensors: dict[str, torch.Tensor] = {}
    shape = _encode(tree, tensors, 0)
    save_file(tensors, str(path), metadata={_KIND_KEY: kind, _TREE_KEY: json.dumps(shape, allow_nan=False)})
    return path


def load_tree(path: str | Path, *, kind: str, device: str | torch.device = "cpu") -> Any:
    """Read a tree written by :func:`save_tree`; raises :class:`StateFileError` naming ``path``."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise StateFileError(f"{path}: missing")
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as fh:
            meta = fh.metadata() or {}
            tensors = {name: fh.get_tensor(name) for name in fh.keys()}  # noqa: SIM118 - not a dict
    except Exception as exc:  # noqa: BLE001 - safetensors raises several types on a bad header
        raise StateFileError(f"{path}: not a readable safetensors file ({one_line(exc)})") from None
    if meta.get(_KIND_KEY) != kind:
        raise StateFileError(f"{path}: holds {meta.get(_KIND_KEY)!r} state, expected {kind!r}")
    try:
        return _decode(json.loads(meta.get(_TREE_KEY, "")), tensors, 0)
    except (ValueError, RecursionError) as exc:
        raise StateFileError(f"{path}: malformed state tree ({one_line(exc)})") from None


__all__ = ["StateFileError", "load_tree", "save_tree"]
