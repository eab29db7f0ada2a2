"""Qwen3-VL's interleaved multimodal RoPE on top of megatron-core's ``MultimodalRotaryEmbedding``.

megatron-core 0.16.1 ships ``MultimodalRotaryEmbedding`` (``position_embedding_type="mrope"``)
with Qwen2-VL's *contiguous* layout: the first ``mrope_section[0]`` frequencies follow the
temporal position, the next ``mrope_section[1]`` the height, the rest the width. Qwen3-VL
interleaves them instead: frequency ``i`` follows height when ``i % 3 == 1`` and
``i < 3 * section[1]``, width when ``i % 3 == 2`` and ``i < 3 * section[2]``, and the temporal
position otherwise. This subclass keeps Megatron's interface (position ids ``[3, b, s]`` in,
``[s, b, 1, head_dim]`` frequencies out, applied by Megatron's own rotate-half RoPE) and only
changes how the three frequency sets are combined.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from megatron.core.models.common.embeddings.rotary_pos_embedding import MultimodalRotaryEmbedding


def interleave_mrope_freqs(freqs: torch.Tensor, mrope_section: Sequence[int]) -> torch.Tensor:
    """Combine per-axis frequencies ``[3, ..., dim/2]`` into Qwen3-VL's interleaved ``[..., dim/2]``."""
    out = freqs[0].clone()
    _, h, w = (int(x) for x in mrope_section)
    out[..., 1 : 3 * h : 3] = freqs[1, ..., 1 : 3 * h : 3]
    out[..., 2 : 3 * w : 3] = freqs[2, ..., 2 : 3 * w : 3]
    return out


class InterleavedMRotaryEmbedding(MultimodalRotaryEmbedding):  # type: ignore[misc]
    """``MultimodalRotaryEmbedding`` with Qwen3-VL's interleaved t/h/w frequency layout."""

    def __init__(self, kv_channels: int, rotary_base: float) -> None:
        super().__init__(kv_channels=kv_channels, rotary_percent=1.0, rotary_base=rotary_base)

    def forward(
        self,
        position_ids: torch.Tensor,
        mrope_section: list[int],
        cp_group: torch.distributed.ProcessGroup | None = None,
    ) -> torch.Tensor:
        if cp_group is not None and cp_group.size() > 1:
            raise NotImplementedError("context parallelism is not wired for Qwen3-VL mRoPE")
        seq = position_ids.to(device=self.inv_freq.device, dtype=torch.float32)
        freqs = seq[..., None] * self.inv_freq  # [3, b, s, dim/2]
        combined = interleave_mrope_freqs(freqs, mrope_section)  # [b, s, dim/2]
        emb = torch.cat((combined, combined), dim=-1)  # rotate-half layout, as in HF
        return emb[:, :, None, :].transpose(0, 1).contiguous()  # [s, b, 1, dim]
