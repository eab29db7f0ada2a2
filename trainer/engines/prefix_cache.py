"""A small LRU cache of finished sequences' KV, reused when a new prompt extends one of them.

Multi-turn rollouts resend the whole conversation every turn: turn ``k+1``'s prompt starts with
turn ``k``'s prompt and answer. Keeping the KV of finished text-only sequences lets the engine
prefill only the new tokens (``meta_info.cached_tokens`` reports how many were reused). Lookup is
a linear scan for the longest common prefix -- the cache holds a bounded number of tokens, and
the scan costs far less than the prefill it saves. Weight updates clear it.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

Layers = list[tuple[torch.Tensor, torch.Tensor]]


def _common_prefix(a: tuple[int, ...], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixCache:
    """Token-budgeted LRU of ``ids -> per-layer KV [1, heads, len(ids), head_dim]``."""

    def __init__(self, max_tokens: int, *, min_match: int = 8) -> None:
        self.max_tokens = max_tokens
        self.min_match = min_match
        self._entries: OrderedDict[tuple[int, ...], Layers] = OrderedDict()
        self._tokens = 0
        self.hits = 0
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        return self._tokens

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0

    def insert(self, ids: list[int], layers: Layers) -> None:
        key = tuple(ids)
        if len(key) < self.min_match or len(key) > self.max_tokens:
            return
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        # An entry that is a prefix of the new one is now redundant.
        for old in [k for k in self._entries if len(k) <= len(key) and key[: len(k)] == k]:
            self._tokens -= len(old)
            del self._entries[old]
        self._entries[key] = layers
        self._tokens += len(key)
        while self._tokens > self.max_tokens and self._entries:
            old, _ = self._entries.popitem(last=False)
            self._tokens -= len(old)

    def lookup(self, ids: list[int]) -> tuple[Layers, int] | None:
        """The longest cached prefix of ``ids`` (leaving at least one token to run), or None."""
        best_key, best = None, 0
        for key in self._entries:
            m = _common_prefix(key, ids)
            if m > best:
                best_key, best = key, m
        best = min(best, len(ids) - 1)
        if best_key is None or best < self.min_match:
            return None
        self._entries.move_to_end(best_key)
        self.hits += 1
        self.hit_tokens += best
        layers = [(k[:, :, :best], v[:, :, :best]) for k, v in self._entries[best_key]]
        return layers, best


__all__ = ["PrefixCache"]
