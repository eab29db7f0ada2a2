"""The contract every training backend implements, and the batch types that cross it.

A backend owns a model and its optimizer. The loop hands it :class:`SequenceBatch` objects --
ragged token sequences with their loss masks, multimodal inputs and per-token training fields --
and asks for four things (:class:`TrainerBackend`):

* ``compute_logprobs(batch)`` -- the log-probability (and optionally the entropy) of every
  loss-mask token, for the proximal / reference policy or for checks against the engine;
* ``train_step(batch, objective)`` -- one optimizer update over the whole batch, cut into
  micro-batches with gradient accumulation. The objective's normaliser is computed once from the
  *whole* batch before any micro-batch runs, so the update does not depend on the cut;
* ``named_weights()`` / ``export_weights(bucket_bytes)`` -- the weights in Hugging Face naming
  (the HF model class's ``state_dict`` names, what an engine's ``load_weights`` takes), streamed
  in buckets for weight sync;
* ``save_pretrained(dir)`` / ``save_state(dir)`` / ``load_state(dir)`` -- an HF folder the engines
  load, and the full training state (weights, optimizer, scheduler) for an exact resume.

Objectives (:class:`PolicyObjective` for RL, :class:`NLLObjective` for SFT) are pure functions of
tensors built on :mod:`relax_gym.trainer.algorithms`, so the torch and megatron-core backends run
the very same loss code.

Token alignment: every per-token list runs parallel to ``input_ids``; the value at position ``t``
belongs to token ``t`` (its logprob is ``log p(input_ids[t] | input_ids[:t])``). Position 0 has no
prediction and is never in the loss mask.
"""

from __future__ import annotations

import math
import shutil
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from relax_gym.errors import RelaxGymError
from relax_gym.trainer.algorithms import (
    AlgorithmConfig,
    LossNormalizer,
    LossOutput,
    compute_policy_loss,
)

NamedTensors = list[tuple[str, Tensor]]
_TOKEN_FIELDS = ("advantages", "old_logprobs", "rollout_logprobs", "ref_logprobs")


class BatchError(RelaxGymError, ValueError):
    """A batch is inconsistent (ragged lists of different lengths, a mask on position 0...)."""


# ------------------------------------------------------------------------------------------------
# batches
# ------------------------------------------------------------------------------------------------
@dataclass
class SequenceBatch:
    """Ragged token sequences plus what training needs per sequence and per token.

    ``multimodal[i]`` holds the model's extra inputs for sequence ``i`` in HF names (Qwen-VL:
    ``pixel_values`` ``[patches, dim]`` and ``image_grid_thw`` ``[images, 3]``), or is empty. The
    backend pads each micro-batch, concatenates the multimodal tensors in row order and derives
    ``mm_token_type_ids`` itself.

    ``temperature`` divides the logits before the softmax: RL batches use the rollout's sampling
    temperature so trainer and engine logprobs describe the same distribution; SFT uses 1.
    """

    input_ids: list[list[int]]
    loss_mask: list[list[int]]
    multimodal: list[dict[str, Tensor]] = field(default_factory=list)
    advantages: list[Tensor] | None = None
    old_logprobs: list[Tensor] | None = None
    rollout_logprobs: list[Tensor] | None = None
    ref_logprobs: list[Tensor] | None = None
    group_ids: list[str] = field(default_factory=list)
    temperature: float = 1.0

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        if not self.multimodal:
            self.multimodal = [{} for _ in range(n)]
        if not self.group_ids:
            self.group_ids = [str(i) for i in range(n)]
        self.validate()

    def __len__(self) -> int:
        return len(self.input_ids)

    def validate(self) -> None:
        n = len(self.input_ids)
        for name in ("loss_mask", "multimodal", "group_ids"):
            if len(getattr(self, name)) != n:
                raise BatchError(f"{name} has {len(getattr(self, name))} rows for {n} sequences")
        for i, (ids, mask) in enumerate(zip(self.input_ids, self.loss_mask, strict=True)):
            if len(ids) != len(mask):
                raise BatchError(f"sequence {i}: {len(ids)} tokens but {len(mask)} loss-mask entries")
            if mask and mask[0]:
                raise BatchError(f"sequence {i}: position 0 has no prediction and cannot be in the loss mask")
        if self.temperature <= 0:
            raise BatchError(f"temperature must be positive, got {self.temperature}")
        for name in _TOKEN_FIELDS:
            values = getattr(self, name)
            if values is None:
                continue
            if len(values) != n:
                raise BatchError(f"{name} has {len(values)} rows for {n} sequences")
            for i, (row, ids) in enumerate(zip(values, self.input_ids, strict=True)):
                if row.dim() != 1 or row.numel() != len(ids):
                    raise BatchError(f"{name}[{i}] has shape {tuple(row.shape)} for {len(ids)} tokens")

    # -- views -----------------------------------------------------------------------------------
    @property
    def num_loss_tokens(self) -> int:
        return sum(sum(m) for m in self.loss_mask)

    @property
    def max_loss_tokens(self) -> int:
        """Loss tokens of the longest response: the padded response length of the batch."""
        return max((sum(m) for m in self.loss_mask), default=0)

    def select(self, rows: Sequence[int]) -> SequenceBatch:
        """The sub-batch of ``rows`` (in that order)."""
        rows = list(rows)

        def pick(values: list[Any] | None) -> list[Any] | None:
            return None if values is None else [values[i] for i in rows]

        return SequenceBatch(
            input_ids=[self.input_ids[i] for i in rows],
            loss_mask=[self.loss_mask[i] for i in rows],
            multimodal=[self.multimodal[i] for i in rows],
            advantages=pick(self.advantages),
            old_logprobs=pick(self.old_logprobs),
            rollout_logprobs=pick(self.rollout_logprobs),
            ref_logprobs=pick(self.ref_logprobs),
            group_ids=[self.group_ids[i] for i in rows],
            temperature=self.temperature,
        )

    def padded_mask(self, width: int | None = None) -> Tensor:
        """The loss mask as a bool ``[B, T]`` tensor (right-padded with False)."""
        width = width or max((len(m) for m in self.loss_mask), default=0)
        out = torch.zeros(len(self), width, dtype=torch.bool)
        for i, m in enumerate(self.loss_mask):
            out[i, : len(m)] = torch.tensor(m, dtype=torch.bool)
        return out

    def padded(self, name: str, width: int | None = None) -> Tensor | None:
        """A per-token field as a float ``[B, T]`` tensor (right-padded with 0), or None."""
        values = getattr(self, name)
        if values is None:
            return None
        width = width or max((len(m) for m in self.loss_mask), default=0)
        dtype = torch.float64 if any(v.dtype == torch.float64 for v in values) else torch.float32
        out = torch.zeros(len(self), width, dtype=dtype)
        for i, v in enumerate(values):
            out[i, : v.numel()] = v.to(dtype)
        return out


@dataclass
class MicroBatch:
    """One micro-batch, padded to its own longest sequence; what an objective sees.

    ``logprobs`` from the model are aligned with these tensors: ``[b, T]``, zero off the mask.
    """

    rows: list[int]  # indices into the full batch
    loss_mask: Tensor  # bool [b, T]
    advantages: Tensor | None = None
    old_logprobs: Tensor | None = None
    rollout_logprobs: Tensor | None = None
    ref_logprobs: Tensor | None = None

    def to(self, device: torch.device) -> MicroBatch:
        """The same micro-batch with its tensors on ``device``."""

        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device)

        return MicroBatch(
            rows=self.rows,
            loss_mask=self.loss_mask.to(device),
            advantages=move(self.advantages),
            old_logprobs=move(self.old_logprobs),
            rollout_logprobs=move(self.rollout_logprobs),
            ref_logprobs=move(self.ref_logprobs),
        )

    @classmethod
    def from_batch(cls, batch: SequenceBatch, rows: Sequence[int]) -> MicroBatch:
        sub = batch.select(rows)
        width = max((len(m) for m in sub.loss_mask), default=0)
        return cls(
            rows=list(rows),
            loss_mask=sub.padded_mask(width),
            advantages=sub.padded("advantages", width),
            old_logprobs=sub.padded("old_logprobs", width),
            rollout_logprobs=sub.padded("rollout_logprobs", width),
            ref_logprobs=sub.padded("ref_logprobs", width),
        )


def micro_batches(batch: SequenceBatch, micro_batch_size: int, *, sort_by_length: bool = True) -> list[list[int]]:
    """Row indices of each micro-batch. Rows are grouped by length (less padding) when
    ``sort_by_length``; the loss does not depend on the cut (global normaliser)."""
    if micro_batch_size < 1:
        raise BatchError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    order = list(range(len(batch)))
    if sort_by_length:
        order.sort(key=lambda i: len(batch.input_ids[i]))
    return [order[i : i + micro_batch_size] for i in range(0, len(order), micro_batch_size)]


@dataclass
class LogprobResult:
    """Per-sequence tensors aligned with ``input_ids`` (0 off the loss mask)."""

    logprobs: list[Tensor]
    entropies: list[Tensor] | None = None


# ------------------------------------------------------------------------------------------------
# objectives: pure tensor code shared by every backend
# ------------------------------------------------------------------------------------------------
class Objective(ABC):
    """A loss over micro-batches whose normaliser comes from the whole batch."""

    needs_entropy: bool = False

    @abstractmethod
    def normalizer(self, batch: SequenceBatch) -> LossNormalizer:
        """Built once per optimizer update, from the full batch (all micro-batches)."""

    @abstractmethod
    def loss(self, mb: MicroBatch, logprobs: Tensor, entropies: Tensor | None, normalizer: LossNormalizer) -> LossOutput:
        """The micro-batch's share of the batch loss; summing the shares gives the batch loss."""


class PolicyObjective(Objective):
    """The configured RL surrogate (PPO-clip / GSPO / SAPO / CISPO + KL + entropy bonus).

    Without ``old_logprobs`` (no proximal recompute: strictly on-policy, one update per batch)
    the current logprobs, detached, are the old policy: the ratio is exactly 1 and its gradient
    is the policy gradient. ``rollout_logprobs`` are only used for the rollout-correction weights
    and the train/rollout gap metric.
    """

    def __init__(self, config: AlgorithmConfig) -> None:
        self.config = config
        self.needs_entropy = config.entropy_coef > 0

    def normalizer(self, batch: SequenceBatch) -> LossNormalizer:
        if batch.advantages is None:
            raise BatchError("a policy update needs advantages on the batch")
        length = self.config.loss_norm_length or max(batch.max_loss_tokens, 1)
        return LossNormalizer.from_mask(batch.padded_mask(), self.config, norm_length=length)

    def loss(self, mb: MicroBatch, logprobs: Tensor, entropies: Tensor | None, normalizer: LossNormalizer) -> LossOutput:
        if mb.advantages is None:
            raise BatchError("a policy update needs advantages on the batch")
        old = mb.old_logprobs if mb.old_logprobs is not None else logprobs.detach()
        return compute_policy_loss(
            self.config,
            logprobs=logprobs,
            old_logprobs=old,
            advantages=mb.advantages,
            mask=mb.loss_mask,
            normalizer=normalizer,
            rollout_logprobs=mb.rollout_logprobs,
            ref_logprobs=mb.ref_logprobs,
            entropies=entropies,
        )


class NLLObjective(Objective):
    """Supervised fine-tuning: negative log-likelihood of the loss-mask tokens.

    ``agg`` is any loss aggregation of :class:`~relax_gym.trainer.algorithms.LossNormalizer`;
    the default token mean is the usual SFT loss.
    """

    def __init__(self, agg: str = "token-mean") -> None:
        self.agg = agg

    def normalizer(self, batch: SequenceBatch) -> LossNormalizer:
        return LossNormalizer.from_mask(batch.padded_mask(), mode=self.agg,  # type: ignore[arg-type]
                                        norm_length=max(batch.max_loss_tokens, 1))

    def loss(self, mb: MicroBatch, logprobs: Tensor, entropies: Tensor | None, normalizer: LossNormalizer) -> LossOutput:
        nll = normalizer.aggregate(-logprobs, mb.loss_mask)
        # per-token share of the batch mean, so micro-batch metrics sum to the batch's
        metrics = {"loss": nll.detach(), "nll": nll.detach()}
        if entropies is not None:
            metrics["entropy"] = normalizer.token_mean(entropies.detach(), mb.loss_mask)
        return LossOutput(loss=nll, metrics=metrics)


@dataclass(frozen=True)
class OptimizerSettings:
    """AdamW and its schedule; one set per training phase (warm-up SFT, RL)."""

    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_steps: int = 0
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    total_steps: int = 0  # optimizer updates of the phase; used by cosine/linear decay
    grad_clip: float | None = 1.0

    def factor(self, step: int) -> float:
        """Multiplier of ``lr`` at optimizer update ``step`` (0-based)."""
        if self.warmup_steps and step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.schedule == "constant" or self.total_steps <= self.warmup_steps:
            return 1.0
        progress = min(1.0, (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
        if self.schedule == "linear":
            return max(0.0, 1.0 - progress)
        return 0.5 * (1.0 + math.cos(math.pi * progress))


# ------------------------------------------------------------------------------------------------
# the backend interface
# ------------------------------------------------------------------------------------------------
def buckets(named: Iterable[tuple[str, Tensor]], bucket_bytes: int) -> Iterator[NamedTensors]:
    """Group named tensors, in order, into lists of about ``bucket_bytes`` (a larger tensor goes
    alone): the unit weight sync moves, so no transport needs the whole model at once."""
    bucket: NamedTensors = []
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


class TrainerBackend(ABC):
    """A model + optimizer that the training loop drives; see the module docstring.

    A backend builds its optimizer in :meth:`_make_optimizer`; :meth:`configure_optimizer` starts
    a phase with it and :meth:`_apply_lr` sets the scheduled learning rate before each update.
    """

    #: weight version of the current parameters (bumped by every ``train_step``)
    version: int = 0
    #: optimizer updates in the current phase (drives the learning-rate schedule)
    updates: int = 0
    optim_settings: OptimizerSettings
    optimizer: Any

    @abstractmethod
    def compute_logprobs(self, batch: SequenceBatch, *, entropy: bool = False) -> LogprobResult:
        """Logprobs (and entropies) of the loss-mask tokens, no gradient, in eval mode."""

    @abstractmethod
    def train_step(self, batch: SequenceBatch, objective: Objective) -> dict[str, float]:
        """One optimizer update over ``batch`` (micro-batched, gradients accumulated). Returns
        the merged loss metrics plus ``grad_norm``, ``lr``, ``num_tokens`` and ``num_seqs``."""

    @abstractmethod
    def named_weights(self) -> Iterator[tuple[str, Tensor]]:
        """The current weights in HF naming (detached; tied duplicates left out)."""

    def export_weights(self, bucket_bytes: int = 256 << 20) -> Iterator[NamedTensors]:
        """:meth:`named_weights` in buckets of about ``bucket_bytes`` (what weight sync streams)."""
        return buckets(self.named_weights(), bucket_bytes)

    @abstractmethod
    def save_pretrained(self, path: str | Path) -> Path:
        """Write an HF folder (config, safetensors, tokenizer, processor) the engines load."""

    @abstractmethod
    def save_state(self, path: str | Path) -> None:
        """Save weights, optimizer and scheduler state (everything an exact resume needs)."""

    @abstractmethod
    def load_state(self, path: str | Path) -> None:
        """Inverse of :meth:`save_state`."""

    @abstractmethod
    def _make_optimizer(self, settings: OptimizerSettings) -> Any:
        """A fresh optimizer over the model's parameters (param groups carrying ``lr``)."""

    def configure_optimizer(self, settings: OptimizerSettings) -> None:
        """Start a training phase: fresh optimizer state and learning-rate schedule (e.g. after
        the SFT warm-up)."""
        self.optim_settings = settings
        self.optimizer = self._make_optimizer(settings)
        self.updates = 0

    def _apply_lr(self) -> float:
        """Set the learning rate the schedule gives the next update; returns it."""
        lr = self.optim_settings.lr * self.optim_settings.factor(self.updates)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr


def copy_side_files(source: Path, out: Path, names: Sequence[str]) -> None:
    """Copy the files ``names`` that exist in the source model folder (tokenizer, processor,
    ...) next to exported weights in ``out``."""
    for name in names:
        src = source / name
        if src.is_file() and src.resolve() != (out / name).resolve():
            shutil.copyfile(src, out / name)


__all__ = [
    "BatchError",
    "LogprobResult",
    "MicroBatch",
    "NLLObjective",
    "NamedTensors",
    "Objective",
    "OptimizerSettings",
    "PolicyObjective",
    "SequenceBatch",
    "TrainerBackend",
    "buckets",
    "copy_side_files",
    "micro_batches",
]
