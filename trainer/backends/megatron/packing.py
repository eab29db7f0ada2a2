"""Lay a micro-batch out for the model (packed or padded), and map per-token values back.

Two layouts, both exact (every token sees exactly the context it would see alone):

* **packed** -- the sequences are concatenated into a single ``[1, S]`` row (no padding). Each
  sequence keeps its own positions (restarting at 0; Qwen3-VL: its own 3-D mRoPE positions), and
  a block-diagonal causal mask stops attention across sequence boundaries. megatron-core's THD
  packing needs Transformer Engine attention; this block mask works with the local
  ``DotProductAttention`` on any device, but its attention cost is ``(sum of lengths)^2``.
* **padded** -- ``[b, S_max]`` rows, right-padded, with a causal mask that also blocks the pad
  keys: no token is wasted on the block mask's cross-sequence scores, but pads go through the
  linear layers.

:func:`layout_micro_batch` picks the cheaper one from the lengths and the hidden size.

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
    padded: bool = False  # [b, S_max] rows (one sequence each) instead of one packed row

    @property
    def num_tokens(self) -> int:
        """The sequence dimension the model sees."""
        return max(self.lengths) if self.padded else sum(self.lengths)

    @property
    def batch_rows(self) -> int:
        return len(self.lengths) if self.padded else 1


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

    ``vision`` holds ``image_token_id``, ``spatial_merge_size`` and (optional)
    ``video_token_id``; with it, positions are 3-D and each sequence's ``pixel_values`` /
    ``image_grid_thw`` (and ``pixel_values_videos`` / ``video_grid_thw``) are concatenated in order.
    """
    lengths = [len(input_ids[r]) for r in rows]
    ids = torch.tensor([t for r in rows for t in input_ids[r]], dtype=torch.long)[None]
    positions = torch.cat(_positions(input_ids, rows, multimodal, vision), dim=-1)
    mm = _images(rows, multimodal, device) if vision is not None else {}
    return PackedRow(
        rows=list(rows),
        lengths=lengths,
        input_ids=ids.to(device),
        position_ids=positions.to(device),
        attention_mask=block_causal_mask(lengths, device),
        multimodal=mm,
    )


MEDIA_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")


def _positions(
    input_ids: list[list[int]], rows: list[int], multimodal: list[dict[str, Tensor]],
    vision: dict[str, int] | None,
) -> list[Tensor]:
    """Each sequence's own position ids: ``[1, n]`` (text) or ``[3, 1, n]`` (Qwen3-VL)."""
    if vision is None:
        return [torch.arange(len(input_ids[r]))[None] for r in rows]
    return [
        mrope_position_ids(
            torch.tensor(input_ids[r], dtype=torch.long)[None],
            vision["image_token_id"],
            multimodal[r].get("image_grid_thw"),
            vision["spatial_merge_size"],
            video_token_id=vision.get("video_token_id"),
            video_grid_thw=multimodal[r].get("video_grid_thw"),
        )
        for r in rows
    ]


def _images(
    rows: list[int], multimodal: list[dict[str, Tensor]], device: torch.device | str
) -> dict[str, Tensor]:
    unknown = {k for r in rows for k in multimodal[r]} - set(MEDIA_KEYS)
    if unknown:
        raise ValueError(f"unsupported multimodal inputs for Megatron Qwen3-VL: {sorted(unknown)} (the bridge takes "
                         f"{', '.join(MEDIA_KEYS)}; see docs/megatron.md)")
    mm: dict[str, Tensor] = {}
    for key in MEDIA_KEYS:
        values = [multimodal[r][key] for r in rows if key in multimodal[r]]
        if values:
            mm[key] = torch.cat(values, dim=0).to(device)
    return mm


def pad_batch(
    input_ids: list[list[int]],
    rows: list[int],
    multimodal: list[dict[str, Tensor]],
    *,
    vision: dict[str, int] | None = None,
    device: torch.device | str = "cpu",
) -> PackedRow:
    """``input_ids[r]`` for ``r`` in ``rows`` as right-padded ``[b, S_max]`` rows.

    The mask (bool ``[b, 1, S, S]``, True = blocked) is causal and blocks every pad key, so a
    real token attends exactly its own prefix; pad queries see their row's tokens (never a row
    of all-blocked scores). Images are concatenated in row order, which is the order of their
    ``<|image_pad|>`` runs in the flattened ``[b, S]`` batch.
    """
    lengths = [len(input_ids[r]) for r in rows]
    width = max(lengths)
    reserved = {v for k, v in (vision or {}).items() if k.endswith("token_id")}
    pad_id = min(set(range(len(reserved) + 1)) - reserved)  # never a pad the vision merge counts
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : lengths[i]] = torch.tensor(input_ids[r], dtype=torch.long)
    parts = _positions(input_ids, rows, multimodal, vision)
    positions = torch.cat(
        [torch.nn.functional.pad(p, (0, width - p.shape[-1])) for p in parts], dim=-2
    )
    key_pad = torch.arange(width)[None, :] >= torch.tensor(lengths)[:, None]  # [b, S]
    future = torch.ones(width, width, dtype=torch.bool).triu(1)
    mask = future[None, None] | key_pad[:, None, None, :]
    return PackedRow(
        rows=list(rows),
        lengths=lengths,
        input_ids=ids.to(device),
        position_ids=positions.to(device),
        attention_mask=mask.to(device),
        multimodal=_images(rows, multimodal, device) if vision is not None else {},
        padded=True,
    )


def layout_cost(lengths: list[int], hidden_size: int, *, padded: bool) -> int:
    """Relative compute of a micro-batch: ~6h per token through the linear layers (weights
    ~24h^2 flops, attention ~4h per score) plus the attention scores the mask computes."""
    if padded:
        tokens, scores = len(lengths) * max(lengths), len(lengths) * max(lengths) ** 2
    else:
        tokens, scores = sum(lengths), sum(lengths) ** 2
    return 6 * hidden_size * tokens + scores


def layout_micro_batch(
    input_ids: list[list[int]],
    rows: list[int],
    multimodal: list[dict[str, Tensor]],
    *,
    hidden_size: int,
    layout: str = "auto",
    vision: dict[str, int] | None = None,
    device: torch.device | str = "cpu",
) -> PackedRow:
    """``rows`` laid out as ``layout`` says (``packed``, ``padded``, or ``auto``: the cheaper
    one by :func:`layout_cost`); both are exact."""
    lengths = [len(input_ids[r]) for r in rows]
    padded = layout == "padded" or (
        layout == "auto"
        and len(rows) > 1
        and layout_cost(lengths, hidden_size, padded=True)
        < layout_cost(lengths, hidden_size, padded=False)
    )
    if padded:
        return pad_batch(input_ids, rows, multimodal, vision=vision, device=device)
    return pack_rows(input_ids, rows, multimodal, vision=vision, device=device)


def token_logprobs(
    packed: PackedRow, logits: Tensor, *, entropy: bool, temperature: float = 1.0
) -> tuple[list[Tensor], list[Tensor] | None]:
    """Per-sequence token-aligned logprobs (and entropies) from vocab-parallel ``logits``.

    ``logits``: ``[1, S, vocab/tp]`` of the packed row (``[b, S, vocab/tp]`` padded). Sequence
    starts (whose "prediction" would come from the previous sequence) get 0.
    """
    if packed.padded:
        return _padded_token_logprobs(packed, logits, entropy=entropy, temperature=temperature)
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


def _padded_token_logprobs(
    packed: PackedRow, logits: Tensor, *, entropy: bool, temperature: float
) -> tuple[list[Tensor], list[Tensor] | None]:
    b, width = packed.input_ids.shape
    labels = torch.roll(packed.input_ids, shifts=-1, dims=1)
    lp, ent = vocab_parallel_logprobs(
        logits.reshape(b * width, -1), labels.reshape(-1), with_entropy=entropy,
        temperature=temperature,
    )
    lp = lp.reshape(b, width)
    ent = ent.reshape(b, width) if ent is not None else None
    out_lp, out_ent = [], []
    for i, n in enumerate(packed.lengths):
        keep = torch.ones(n, dtype=lp.dtype, device=lp.device)
        keep[0] = 0.0
        out_lp.append(torch.cat([lp.new_zeros(1), lp[i, : n - 1]]) * keep)
        if ent is not None:
            out_ent.append(torch.cat([ent.new_zeros(1), ent[i, : n - 1]]) * keep)
    return out_lp, (out_ent if ent is not None else None)


def pad_rows(values: list[Tensor], width: int) -> Tensor:
    """Right-pad per-sequence 1-D tensors into ``[b, width]`` (keeps the autograd graph)."""
    rows = [torch.nn.functional.pad(v, (0, width - v.numel())) for v in values]
    return torch.stack(rows)
