"""Pack variable-length sequences into one row, and map per-token values back.

A micro-batch's sequences are concatenated into a single ``[1, S]`` row (no padding). Each
sequence keeps its own positions (restarting at 0; Qwen3-VL: its own 3-D mRoPE positions), and
a block-diagonal causal mask stops attention across sequence boundaries, so every token sees
exactly the context it would see alone. megatron-core's THD packing needs Transformer Engine
attention; this block mask works with the local ``DotProductAttention`` on any device.

Alignment follows ``relax_gym.trainer.backends.base``: the value at position ``t`` of a sequence is
about token ``t`` (its logprob is ``log p(ids[t] | ids[:t])``), and position 0 gets 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from relax_gym.trainer.backends.megatron.logprobs import vocab_parallel_logprobs
from relax_gym.trainer.backends.megatron.vl import mrope_position_ids
from torch import Tensor


@dataclass
class PackedRow:
    """One micro-batch packed into a single row."""

    rows: list[int]  # indices into the full batch, in packing order
    lengths: list[int]
    input_ids: Tensor  # [1, S]
    position_ids: Tensor  # [1, S] (text) or [3, 1, S] (Qwen3-VL)
    attention_mask: Tensor  # bool [1, 1, S, S], True = blocked
    multimodal: dict[str, Tensor] = field(default_factory=dict)
    weight: float = 1.0  # 0 for a placeholder micro-batch that must not move the weights

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)


def block_causal_mask(lengths: list[int], device: torch.device | str = "cpu") -> Tensor:
    """Bool ``[1, 1, S, S]``: True where query ``i`` may not attend key ``j``."""
    seq_id = torch.repeat_interleave(
        torch.arange(len(lengths), device=device), torch.tensor(lengths, device=device)
    )
    n = seq_id.numel()
    future = torch.ones(n, n, dtype=torch.bool, device=device).triu(1)
    other = seq_id[:, None] != seq_id[None, :]
    return (future | other)[None, None]


def pack_rows(
    input_ids: list[list[int]],
    rows: list[int],
    multimodal: list[dict[str, Tensor]],
    *,
    vision: dict[str, int] | None = None,
    device: torch.device | str = "cpu",
) -> PackedRow:
    """Pack ``input_ids[r]`` for ``r`` in ``rows``; ``vision`` = Qwen3-VL's token facts.

    ``vision`` holds ``image_token_id`` and ``spatial_merge_size``; with it, positions are
    3-D and each sequence's ``pixel_values`` / ``image_grid_thw`` are concatenated in order.
    """
    lengths = [len(input_ids[r]) for r in rows]
    ids = torch.tensor([t for r in rows for t in input_ids[r]], dtype=torch.long)[None]
    mm: dict[str, Tensor] = {}
    if vision is None:
        positions = torch.cat([torch.arange(n) for n in lengths])[None]
    else:
        parts = []
        for r in rows:
            seq = torch.tensor(input_ids[r], dtype=torch.long)[None]
            grid = multimodal[r].get("image_grid_thw")
            parts.append(
                mrope_position_ids(
                    seq, vision["image_token_id"], grid, vision["spatial_merge_size"]
                )
            )
        positions = torch.cat(parts, dim=-1)
        for key in ("pixel_values", "image_grid_thw"):
            values = [multimodal[r][key] for r in rows if key in multimodal[r]]
            if values:
                mm[key] = torch.cat(values, dim=0).to(device)
        unknown = {k for r in rows for k in multimodal[r]} - {"pixel_values", "image_grid_thw"}
        if unknown:
            raise ValueError(
                f"unsupported multimodal inputs for Megatron Qwen3-VL: {sorted(unknown)}"
            )
    return PackedRow(
        rows=list(rows),
        lengths=lengths,
        input_ids=ids.to(device),
        position_ids=positions.to(device),
        attention_mask=block_causal_mask(lengths, device),
        multimodal=mm,
    )


def token_logprobs(
    packed: PackedRow, logits: Tensor, *, entropy: bool, temperature: float = 1.0
) -> tuple[list[Tensor], list[Tensor] | None]:
    """Per-sequence token-aligned logprobs (and entropies) from vocab-parallel ``logits``.

    ``logits``: ``[1, S, vocab/tp]`` of the packed row. Sequence starts (whose "prediction"
    would come from the previous sequence) get 0.
    """
    ids = packed.input_ids[0]
    labels = torch.roll(ids, shifts=-1)  # position p predicts token p + 1
    lp, ent = vocab_parallel_logprobs(
        logits[0], labels, with_entropy=entropy, temperature=temperature
    )
    zero = lp.new_zeros(1)
    lp_tok = torch.cat([zero, lp[:-1]])  # value of token t comes from position t - 1
    ent_tok = torch.cat([zero, ent[:-1]]) if ent is not None else None
    out_lp, out_ent = [], []
    start = 0
    for n in packed.lengths:
        keep = torch.ones(n, dtype=lp.dtype, device=lp.device)
        keep[0] = 0.0
        out_lp.append(lp_tok[start : start + n] * keep)
        if ent_tok is not None:
            out_ent.append(ent_tok[start : start + n] * keep)
        start += n
    return out_lp, (out_ent if ent_tok is not None else None)


def pad_rows(values: list[Tensor], width: int) -> Tensor:
    """Right-pad per-sequence 1-D tensors into ``[b, width]`` (keeps the autograd graph)."""
    rows = [torch.nn.functional.pad(v, (0, width - v.numel())) for v in values]
    return torch.stack(rows)
