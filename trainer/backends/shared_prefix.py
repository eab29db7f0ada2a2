"""Forward a micro-batch whose rows share prompts once per distinct prompt.

A GRPO group is G samples of one prompt, so a padded forward over the batch computes every
prompt G times (for a vision model, its image through the vision tower G times too). Here each
distinct prompt -- the tokens before a row's first loss token, and the content of its media --
runs once with a KV cache; the cache is indexed out to the rows that share it, and the rows'
remaining tokens run on top of it at their true positions (M-RoPE positions from the model's
own ``get_rope_index`` for Qwen-VL). Autograd flows through the index into the shared prompt,
so the loss and its gradient are those of the plain forward up to float rounding; only the
repeated prompt compute is gone. Media must sit inside the prompt (a multi-turn row with an
image after its first reply keeps the plain forward), and the omni thinker and activation
checkpointing (which turns the cache off) keep it always.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from relax_gym.content_cache import tensor_digest


@dataclass(frozen=True)
class PrefixPlan:
    """Which rows share which prompt: ``prefixes[row_prefix[i]]`` is row ``i``'s first
    ``prefix_len[i]`` tokens; ``representatives[j]`` is the first row of prompt ``j`` (its media
    are the prompt's media)."""

    prefixes: list[list[int]]
    row_prefix: list[int]
    prefix_len: list[int]
    representatives: list[int]
    saved_tokens: int
    total_tokens: int


def prompt_cut(ids: Sequence[int], mask: Sequence[int]) -> int:
    """Where row's prompt ends: its first loss token, keeping at least one token each side."""
    first = next((t for t, m in enumerate(mask) if m), len(ids))
    return max(1, min(first, len(ids) - 1))


def media_key(multimodal: Mapping[str, Tensor]) -> tuple[tuple[str, str], ...]:
    """A content key of one row's media inputs (empty for a text row)."""
    return tuple((name, tensor_digest(t)) for name, t in sorted(multimodal.items()))


def plan_shared_prefixes(input_ids: Sequence[Sequence[int]], loss_mask: Sequence[Sequence[int]],
                         media: Sequence[Any] | None = None, *, min_saving: float = 0.1) -> PrefixPlan | None:
    """The plan for a micro-batch (``media[i]``: a hashable key of row ``i``'s media, see
    :func:`media_key`), or None when sharing would save under ``min_saving`` of its tokens
    (then the plain forward is as cheap and simpler)."""
    keys: dict[tuple[Any, ...], int] = {}
    prefixes: list[list[int]] = []
    representatives: list[int] = []
    row_prefix: list[int] = []
    prefix_len: list[int] = []
    for i, (ids, mask) in enumerate(zip(input_ids, loss_mask, strict=True)):
        cut = prompt_cut(ids, mask)
        key = (tuple(ids[:cut]), media[i] if media is not None else None)
        if key not in keys:
            keys[key] = len(prefixes)
            prefixes.append(list(ids[:cut]))
            representatives.append(i)
        row_prefix.append(keys[key])
        prefix_len.append(cut)
    total = sum(len(ids) for ids in input_ids)
    saved = sum(prefix_len) - sum(len(p) for p in prefixes)
    if len(input_ids) < 2 or min(map(len, input_ids)) < 2 or saved < min_saving * total:
        return None
    return PrefixPlan(prefixes, row_prefix, prefix_len, representatives, saved, total)


def group_order(input_ids: Sequence[Sequence[int]], loss_mask: Sequence[Sequence[int]]) -> list[int]:
    """Row order that keeps rows of one prompt next to each other (so one micro-batch holds the
    whole group) and otherwise follows length, like the plain sort."""
    def key(i: int) -> tuple[int, tuple[int, ...], int]:
        prompt = tuple(input_ids[i][: prompt_cut(input_ids[i], loss_mask[i])])
        return len(prompt), prompt, len(input_ids[i])

    return sorted(range(len(input_ids)), key=key)


def shared_prefix_hidden(base: Any, rows: Sequence[Sequence[int]], plan: PrefixPlan, width: int,
                         pad_token_id: int, device: torch.device, *,
                         prefix_inputs: Mapping[str, Tensor] | None = None,
                         positions: Tensor | None = None) -> Tensor:
    """``[rows, width, hidden]`` last hidden states of the right-padded rows, equal to the plain
    ``base(input_ids, attention_mask, ...)`` on the real tokens (pads are zero).

    ``prefix_inputs``: extra inputs of the prompts' forward (the representatives' media, in
    prompt order, with ``mm_token_type_ids`` over ``[prompts, longest prompt]``).
    ``positions``: ``[3, rows, width]`` M-RoPE positions of the padded batch (Qwen-VL), else
    None for plain ``0..n-1``.
    """
    u, p_max = len(plan.prefixes), max(len(p) for p in plan.prefixes)
    pre_ids = torch.full((u, p_max), pad_token_id, dtype=torch.long)
    pre_attn = torch.zeros((u, p_max), dtype=torch.long)
    for j, prefix in enumerate(plan.prefixes):
        pre_ids[j, : len(prefix)] = torch.tensor(prefix, dtype=torch.long)
        pre_attn[j, : len(prefix)] = 1
    pre_kwargs: dict[str, Any] = dict(prefix_inputs or {})
    if positions is not None:
        pre_kwargs["position_ids"] = positions[:, plan.representatives, :p_max]
    pre = base(input_ids=pre_ids.to(device), attention_mask=pre_attn.to(device), use_cache=True, **pre_kwargs)
    index = torch.tensor(plan.row_prefix, dtype=torch.long, device=device)
    cache = getattr(pre, "cache", None) or pre.past_key_values  # transformers 5.2x renamed it
    cache.reorder_cache(index)  # index_select per layer: differentiable, gradients sum into the prompt

    b = len(rows)
    s_max = max(len(r) - f for r, f in zip(rows, plan.prefix_len, strict=True))
    suf_ids = torch.full((b, s_max), pad_token_id, dtype=torch.long)
    suf_attn = torch.zeros((b, s_max), dtype=torch.long)
    at = torch.tensor(plan.prefix_len, dtype=torch.long)[:, None] + torch.arange(s_max)[None, :]  # text index
    for i, (row, f) in enumerate(zip(rows, plan.prefix_len, strict=True)):
        suf_ids[i, : len(row) - f] = torch.tensor(row[f:], dtype=torch.long)
        suf_attn[i, : len(row) - f] = 1
    if positions is None:
        suf_pos = at.to(device)
    else:  # each row's own M-RoPE positions from its cut on (padding columns: any valid index)
        cols = at.clamp(max=width - 1).to(positions.device)
        suf_pos = positions.gather(2, cols[None].expand(positions.shape[0], -1, -1))
    attn = torch.cat([pre_attn.to(device)[index], suf_attn.to(device)], dim=1)
    suf = base(input_ids=suf_ids.to(device), attention_mask=attn, position_ids=suf_pos,
               use_cache=True, **{_cache_argument(base): cache}).last_hidden_state

    pre_h = pre.last_hidden_state
    hidden = pre_h.new_zeros((b, width, pre_h.shape[-1]))
    for i, (row, f) in enumerate(zip(rows, plan.prefix_len, strict=True)):
        hidden[i, :f] = pre_h[plan.row_prefix[i], :f]
        hidden[i, f: len(row)] = suf[i, : len(row) - f]
    return hidden


def _cache_argument(base: Any) -> str:
    """``cache`` (transformers >= 5.2x) or ``past_key_values`` (earlier), whichever forward takes."""
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


__all__ = ["PrefixPlan", "group_order", "media_key", "plan_shared_prefixes", "prompt_cut", "shared_prefix_hidden"]
