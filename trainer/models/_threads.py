"""Run a block with a given number of torch CPU threads, then restore the previous setting.

Tiny models gain nothing from intra-op threads, and on a busy shared CPU extra threads spin
against each other: building or teaching a tiny model with one thread is both faster and kinder.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    import torch

    if not n:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
