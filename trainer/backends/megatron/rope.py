"""Rotary embeddings driven by explicit position ids, on megatron-core's mRoPE hook.

megatron-core 0.16.1's ``GPTModel`` computes plain RoPE from ``arange(seq_len)`` and ignores
``position_ids``; only its ``mrope`` path (``MultimodalRotaryEmbedding``) reads them. Packed
sequences need per-sequence positions, and Qwen3-VL needs 3-D ones, so every model here is
built with ``position_embedding_type="mrope"`` and this module as its rotary embedding:

- text models (``mrope_section=None``): standard RoPE at the given ``[b, s]`` positions;
- Qwen3-VL: positions ``[3, b, s]`` (t, h, w) with Qwen3-VL's *interleaved* layout. megatron's
  own ``MultimodalRotaryEmbedding`` implements Qwen2-VL's *contiguous* sections (the first
  ``section[0]`` frequencies follow t, the next ``section[1]`` h, the rest w). Qwen3-VL
  instead takes frequency ``i`` from h when ``i % 3 == 1`` and ``i < 3 * section[1]``, from w
  when ``i % 3 == 2`` and ``i < 3 * section[2]``, and from t otherwise.

The output keeps Megatron's interface (``[s, b, 1, head_dim]`` frequencies in rotate-half
layout), so Megatron's own ``apply_rotary_pos_emb`` applies it, as HF does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from megatron.core.models.common.embeddings.rotary_pos_embedding import MultimodalRotaryEmbedding


def interleave_mrope_freqs(freqs: torch.Tensor, mrope_section: Sequence[int]) -> torch.Tensor:
    """Combine per-axis frequencies ``[3, ..., dim/2]`` into Qwen3-VL's interleaved layout."""
    out = freqs[0].clone()
    _, h, w = (int(x) for x in mrope_section)
    out[..., 1 : 3 * h : 3] = freqs[1, ..., 1 : 3 * h : 3]
    out[..., 2 : 3 * w : 3] = freqs[2, ..., 2 : 3 * w : 3]
    return out


class PositionRotaryEmbedding(MultimodalRotaryEmbedding):  # type: ignore[misc]
    """RoPE at explicit positions: ``[b, s]`` (text) or ``[3, b, s]`` (Qwen3-VL, interleaved)."""

    def __init__(
        self, kv_channels: int, rotary_base: float, mrope_section: Sequence[int] | None = None
    ) -> None:
        super().__init__(kv_channels=kv_channels, rotary_percent=1.0, rotary_base=rotary_base)
        self.interleaved_section = tuple(mrope_section) if mrope_section else None

    def forward(
        self,
        position_ids: torch.Tensor,
        mrope_section: list[int] | None = None,
        cp_group: torch.distributed.ProcessGroup | None = None,
    ) -> torch.Tensor:
        """Frequencies ``[s, b, 1, head_dim]``; ``mrope_section`` (Megatron's) is ignored."""
        if cp_group is not None and cp_group.size() > 1:
            raise NotImplementedError("context parallelism is not wired for explicit positions")
        seq = position_ids.to(device=self.inv_freq.device, dtype=torch.float32)
        if self.interleaved_section is None:
            if seq.dim() == 3:  # text positions given as [3, b, s]: all three are equal
                seq = seq[0]
            half = seq[..., None] * self.inv_freq  # [b, s, dim/2]
        else:
            if seq.dim() != 3 or seq.shape[0] != 3:
                raise ValueError("Qwen3-VL needs [3, batch, seq] (t, h, w) position ids")
            half = interleave_mrope_freqs(seq[..., None] * self.inv_freq, self.interleaved_section)
        emb = torch.cat((half, half), dim=-1)  # rotate-half layout, as in HF
        return emb[:, :, None, :].transpose(0, 1).contiguous()  # [s, b, 1, dim]
