"""Per-token log-probabilities and entropy from vocab-parallel logits, without gathering them.

With TP > 1 each rank holds logits for a contiguous ``1/tp`` slice of the vocabulary. The
log-softmax needs only three scalars per token from the other ranks -- the max, the sum of
exponentials and the chosen token's logit -- and the entropy one more (the sum of
``exp(z) * z``), so these are all-reduced instead of the ``[tokens, vocab]`` logits. The sums
go through Megatron's ``reduce_from_tensor_model_parallel_region`` (all-reduce forward,
identity backward), which makes the result differentiable: each rank gets the gradient for its
own vocabulary slice. Everything is computed in float32.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def _tp_context(tp_group: Any | None) -> tuple[int, int, Any | None]:
    from megatron.core import parallel_state

    if tp_group is None:
        if not parallel_state.model_parallel_is_initialized():
            return 0, 1, None
        tp_group = parallel_state.get_tensor_model_parallel_group()
    return dist.get_rank(tp_group), dist.get_world_size(tp_group), tp_group


def vocab_parallel_logprobs(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    with_entropy: bool = False,
    temperature: float = 1.0,
    tp_group: Any | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log p(label)`` and optionally the entropy, for logits split over the TP group.

    ``logits``: ``[..., vocab/tp]``, this rank's vocabulary slice. ``labels``: ``[...]``, global
    token ids. Returns float32 tensors shaped like ``labels``.
    """
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    rank, tp, group = _tp_context(tp_group)
    if labels.shape != logits.shape[:-1]:
        raise ValueError(f"labels {tuple(labels.shape)} do not match logits {tuple(logits.shape)}")

    def reduce(t: torch.Tensor) -> torch.Tensor:
        if tp == 1:
            return t
        summed: torch.Tensor = reduce_from_tensor_model_parallel_region(t.contiguous(), group=group)
        return summed

    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    z_max = z.detach().amax(dim=-1)
    if tp > 1:
        dist.all_reduce(z_max, op=dist.ReduceOp.MAX, group=group)
    z = z - z_max.unsqueeze(-1)
    exp_z = z.exp()
    sum_exp = reduce(exp_z.sum(dim=-1))
    log_z = sum_exp.log()

    local_vocab = z.shape[-1]
    local_label = labels.long() - rank * local_vocab
    in_slice = (local_label >= 0) & (local_label < local_vocab)
    picked = z.gather(-1, local_label.clamp(0, local_vocab - 1).unsqueeze(-1)).squeeze(-1)
    picked = reduce(torch.where(in_slice, picked, torch.zeros_like(picked)))
    logprobs = picked - log_z

    entropy = None
    if with_entropy:
        entropy = log_z - reduce((exp_z * z).sum(dim=-1)) / sum_exp
    return logprobs, entropy


def next_token_logprobs(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    *,
    with_entropy: bool = False,
    temperature: float = 1.0,
    tp_group: Any | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probability of each next token: ``[b, s, vocab/tp]`` logits -> ``[b, s-1]``.

    Position ``t`` of the result scores ``input_ids[:, t + 1]`` given the prefix up to ``t``.
    """
    return vocab_parallel_logprobs(
        logits[:, :-1],
        input_ids[:, 1:],
        with_entropy=with_entropy,
        temperature=temperature,
        tp_group=tp_group,
    )
