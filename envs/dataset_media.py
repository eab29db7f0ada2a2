"""Media cells of a dataset row -> content parts.

A media column holds one item or a list of items per row. An item may be:

* a path (relative paths resolve against the folder of the data file the row came from);
* bytes, base64 text or a data URL;
* the storage of a Hugging Face ``Image`` / ``Audio`` / ``Video`` feature, ``{"bytes", "path"}``
  (the reader casts those features to ``decode=False``, so this is what it sees);
* an already decoded value: a PIL image, a ``{"array", "sampling_rate"}`` audio dict, a numpy
  image ``[H, W, 3]`` or video ``[T, H, W, 3]``.

Decoding goes through :mod:`relax_gym.media`, so the same size and format limits apply as for
every other input.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from relax_gym.media import load_audio, load_image, load_video
from relax_gym.types import AudioPart, ContentPart, ImagePart, VideoPart

MEDIA_KINDS = ("image", "audio", "video")


def items_of(cell: Any) -> list[Any]:
    """A cell as a list of media items (None and empty lists give no item)."""
    if cell is None:
        return []
    if isinstance(cell, (list, tuple)):
        return [x for x in cell if x is not None]
    if isinstance(cell, np.ndarray) and cell.dtype == object:
        return [x for x in cell.tolist() if x is not None]
    return [cell]


_B64 = re.compile(r"^[A-Za-z0-9+/\s]+={0,2}$")


def _is_inline(text: str) -> bool:
    """A data URL or base64 text rather than a path (a path may contain '/', as base64 does)."""
    if text.startswith("data:"):
        return True
    return len(text) >= 64 and _B64.fullmatch(text) is not None and "." not in text[-8:]


def _resolve_path(path: str, root: Path | None) -> str:
    if _is_inline(path) or os.path.isabs(path) or root is None:
        return path
    return str(root / path)


def item_path(item: Any, root: Path | None) -> str | None:
    """The file an item points at, when it is only a path (no bytes); else None."""
    if isinstance(item, str) and not _is_inline(item) and len(item) < 4096:
        return _resolve_path(item, root)
    if isinstance(item, Mapping) and not item.get("bytes") and isinstance(item.get("path"), str):
        return _resolve_path(item["path"], root)
    return None


def is_missing(item: Any, root: Path | None) -> bool:
    """True for an item that names a file which does not exist (a dropped row, not an error)."""
    path = item_path(item, root)
    if path is None:
        return isinstance(item, Mapping) and not item.get("bytes") and not item.get("path") and "array" not in item
    return not os.path.exists(path)


def _source(item: Any, root: Path | None) -> Any:
    if isinstance(item, Mapping):
        if item.get("bytes"):
            return bytes(item["bytes"])
        if isinstance(item.get("path"), str) and item["path"]:
            return _resolve_path(item["path"], root)
        raise ValueError(f"media dict has neither bytes nor a path (keys: {sorted(item)})")
    if isinstance(item, str):
        return _resolve_path(item, root)
    return item


def to_part(kind: str, item: Any, root: Path | None, *, video_fps: float, video_max_frames: int,
            audio_sample_rate: int | None) -> ContentPart:
    """Decode one item into a content part; raises MediaError / ValueError saying why not."""
    if kind == "image":
        if isinstance(item, np.ndarray):
            return ImagePart(Image.fromarray(np.asarray(item, dtype=np.uint8)).convert("RGB"))
        return ImagePart(load_image(_source(item, root)))
    if kind == "audio":
        if isinstance(item, Mapping) and "array" in item and "sampling_rate" in item:
            wave = np.asarray(item["array"], dtype=np.float32)
            if wave.ndim == 2:
                wave = wave.mean(axis=0 if wave.shape[0] < wave.shape[1] else 1)
            return AudioPart(wave, int(item["sampling_rate"]))
        wave, sr = load_audio(_source(item, root), sample_rate=audio_sample_rate)
        return AudioPart(wave, sr)
    if kind == "video":
        if isinstance(item, np.ndarray):
            return VideoPart(np.asarray(item, dtype=np.uint8), video_fps)
        frames, fps = load_video(_source(item, root), fps=video_fps, max_frames=video_max_frames)
        return VideoPart(frames, fps)
    raise ValueError(f"unknown media kind {kind!r}; expected one of {MEDIA_KINDS}")
