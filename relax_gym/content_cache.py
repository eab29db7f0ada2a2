"""A small bounded cache of encodings keyed by content, shared by the media encoders.

A GRPO group's samples and an episode's turns send the same clip again and again, so each clip's
encoding (mp4 bytes, a ``video_data`` or ``audio_data`` URL) is kept once, newest last, and the
oldest falls out past the bound. Rollout threads share it, hence the lock.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar

V = TypeVar("V")


class ContentCache(Generic[V]):
    """Least-recently-used ``key -> value`` with at most ``max_items`` entries (and, with
    ``size_of``, at most ``max_bytes`` of values), thread-safe."""

    def __init__(self, max_items: int, *, max_bytes: int | None = None,
                 size_of: Callable[[V], int] | None = None) -> None:
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._size_of = size_of
        self._items: OrderedDict[bytes, V] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get_or_make(self, key: bytes, make: Callable[[], V]) -> V:
        """The cached value for ``key``, or ``make()``'s, kept. ``make`` runs outside the lock
        (an encode may take a while); two threads may both make a missing value, the last kept."""
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit
        value = make()
        with self._lock:
            old = self._items.pop(key, None)
            self._bytes += self._size(value) - (self._size(old) if old is not None else 0)
            self._items[key] = value
            while len(self._items) > self.max_items or (
                    self.max_bytes is not None and self._bytes > self.max_bytes and len(self._items) > 1):
                _, dropped = self._items.popitem(last=False)
                self._bytes -= self._size(dropped)
        return value

    def _size(self, value: V) -> int:
        return self._size_of(value) if self._size_of is not None else 0

    def __len__(self) -> int:
        return len(self._items)


def tensor_digest(tensor: Any) -> str:
    """A content key of a torch tensor or numpy array: dtype, shape and bytes. Rows whose media
    digests match can share one forward (the engine's prefill, the trainer's prompts)."""
    import numpy as np

    if hasattr(tensor, "detach"):  # torch, any dtype (bf16 has no numpy twin): its raw bytes
        import torch

        flat = tensor.detach().cpu().contiguous().reshape(-1)
        head, data = f"{flat.dtype}{tuple(tensor.shape)}", flat.view(torch.uint8).numpy().tobytes()
    else:
        arr = np.ascontiguousarray(tensor)
        head, data = f"{arr.dtype}{arr.shape}", arr.tobytes()
    return hashlib.sha1(head.encode() + data).hexdigest()


def image_digest(image: Any) -> bytes:
    """A content key of a PIL image: its size, mode and pixels (the PNG and the processed-pixel
    caches of one image share it)."""
    return hashlib.sha1(f"{image.size}{image.mode}".encode() + image.tobytes()).digest()


__all__ = ["ContentCache", "image_digest", "tensor_digest"]
