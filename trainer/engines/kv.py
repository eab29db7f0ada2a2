"""The running batch's KV cache: one HF ``DynamicCache`` with left padding and a 2-D mask.

Sequences of different lengths share one cache tensor per layer, ``[B, heads, T, head_dim]``,
right-aligned: row ``i`` holds its ``n_i`` cached tokens in the last ``n_i`` columns and zeros
before them, with ``mask[i]`` marking the real columns. Positions are always passed to the model
explicitly, so the left padding never shifts RoPE. Admitting sequences concatenates rows (padding
the shorter side on the left); retiring selects rows and trims columns no row uses any more.
Both are O(cache) copies done once per admission or retirement, not per decode step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache


def _pad_left(t: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    missing = length - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def _keys_values(layer: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A dynamic attention layer's cached keys and values (every layer of the models we serve)."""
    keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
    if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor):
        raise TypeError(f"unsupported cache layer {type(layer).__name__}: expected keys/values tensors")
    return keys, values


@dataclass
class BatchKV:
    """A batch of cached sequences (rows) and the mask of their real columns."""

    cache: DynamicCache
    mask: torch.Tensor  # [B, T] long, 1 on cached tokens

    @classmethod
    def from_layers(cls, layers: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor) -> BatchKV:
        return cls(DynamicCache(ddp_cache_data=layers), mask)

    @property
    def rows(self) -> int:
        return int(self.mask.shape[0])

    @property
    def length(self) -> int:
        return int(self.mask.shape[1])

    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [_keys_values(layer) for layer in self.cache.layers]

    def step_mask(self) -> torch.Tensor:
        """The attention mask for one more token per row (what a decode step attends to)."""
        return torch.cat([self.mask, self.mask.new_ones(self.rows, 1)], dim=1)

    def commit_step(self) -> None:
        """Record that the decode step appended one real token to every row."""
        self.mask = self.step_mask()

    def row_lengths(self) -> list[int]:
        return self.mask.sum(dim=1).tolist()

    def select(self, rows: list[int]) -> BatchKV | None:
        """Keep only ``rows`` (in that order); trim leading columns no kept row uses."""
        if not rows:
            return None
        idx = torch.tensor(rows, dtype=torch.long)
        mask = self.mask.index_select(0, idx)
        keep_from = int(self.length - mask.sum(dim=1).max().item())
        layers = [
            (k.index_select(0, idx)[:, :, keep_from:], v.index_select(0, idx)[:, :, keep_from:])
            for k, v in self.layers()
        ]
        return BatchKV.from_layers(layers, mask[:, keep_from:].contiguous())

    def extract_row(self, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The unpadded ``[1, heads, n, head_dim]`` tensors of one row (for prefix reuse)."""
        n = int(self.mask[row].sum().item())
        return [
            (k[row : row + 1, :, self.length - n :].clone(), v[row : row + 1, :, self.length - n :].clone())
            for k, v in self.layers()
        ]

    @staticmethod
    def concat(parts: list[BatchKV]) -> BatchKV:
        """Stack the rows of several batches, right-aligned to the longest."""
        if len(parts) == 1:
            return parts[0]
        length = max(p.length for p in parts)
        layer_count = len(parts[0].cache.layers)
        layers = []
        per_part = [p.layers() for p in parts]
        for li in range(layer_count):
            ks = [_pad_left(kv[li][0], length, 2) for kv in per_part]
            vs = [_pad_left(kv[li][1], length, 2) for kv in per_part]
            layers.append((torch.cat(ks, dim=0), torch.cat(vs, dim=0)))
        mask = torch.cat([_pad_left(p.mask, length, 1) for p in parts], dim=0)
        return BatchKV.from_layers(layers, mask)


__all__ = ["BatchKV"]
