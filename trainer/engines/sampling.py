"""Next-token sampling for a batch of requests that each bring their own parameters and RNG.

Every request owns a ``torch.Generator`` (seeded from ``sampling_seed``, or from the engine's
seed sequence when none is given) and draws exactly one uniform number per generated token,
then inverts the CDF of its own truncated distribution. What a request samples therefore does
not depend on which other requests share its batch.

Reported logprobs (``meta_info.output_token_logprobs``) are ``log_softmax(logits / T)`` of the
sampled token: temperature-scaled, *before* top-k / top-p / min-p truncation. With the usual RL
settings (``top_p=1, top_k=-1, min_p=0``) this is exactly SGLang's default, and it is what a
trainer recomputes as ``log_softmax(logits / T)``. Greedy requests (``temperature == 0``) report
the unscaled ``log_softmax(logits)``. An engine started with ``logprob_mode="raw"`` always
reports ``log_softmax(logits)`` (SGLang's ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

LogprobMode = Literal["scaled", "raw"]


@dataclass(frozen=True, slots=True)
class SamplingSpec:
    """Resolved, validated sampling parameters of one request."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    max_new_tokens: int = 128
    stop_strings: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def truncates(self) -> bool:
        return (self.top_k > 1) or self.top_p < 1.0 or self.min_p > 0.0


@dataclass(slots=True)
class SampleOutput:
    tokens: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[float, int]] | None]


def make_generator(seed: int) -> torch.Generator:
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)
    return gen


_CANDIDATES = 1024  # top-k / top-p / min-p look at this many best tokens first


def _sample_truncated(probs: torch.Tensor, spec: SamplingSpec, gen: torch.Generator) -> int:
    """Sample one row under top-k, then top-p (on the top-k-renormalised mass), then min-p.

    ``probs`` is the row's full (temperature-scaled) distribution. Only the best
    ``_CANDIDATES`` tokens are sorted when they provably hold every token the filters can keep;
    otherwise the whole row is sorted.
    """
    vocab = probs.numel()
    k = spec.top_k if 1 < spec.top_k < vocab else vocab
    c = min(k, _CANDIDATES)
    top, ids = torch.topk(probs, c)
    exact = (
        c == k
        or (spec.top_p < 1.0 and float(top.sum()) >= spec.top_p)
        or (spec.min_p > 0.0 and float(top[-1]) < spec.min_p * float(top[0]))
    )
    if exact:
        mass = top.sum() if c == k else torch.tensor(1.0)
    else:
        top, ids = torch.sort(probs, descending=True)
        top, ids = top[:k], ids[:k]
        mass = top.sum()
    p = top / mass
    keep = torch.ones_like(p, dtype=torch.bool)
    if spec.top_p < 1.0:
        keep &= (torch.cumsum(p, dim=0) - p) < spec.top_p
    if spec.min_p > 0.0:
        keep &= p >= spec.min_p * p[0]
    cdf = torch.cumsum(p * keep, dim=0)
    u = torch.rand(1, generator=gen) * cdf[-1]
    j = int(torch.searchsorted(cdf, u, right=True).clamp_(max=len(cdf) - 1))
    return int(ids[j])


def _block_size(vocab: int) -> int | None:
    """A divisor of ``vocab`` near its square root for two-level sampling (None: small vocab)."""
    if vocab < 16384:
        return None
    root = vocab**0.5
    divisors = [d for d in range(64, 8193) if vocab % d == 0]
    return min(divisors, key=lambda d: abs(d - root)) if divisors else None


def _invert_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One draw per row by inverting its CDF at ``uniforms`` (each row handled on its own).

    For large vocabularies the CDF is walked in two levels (block sums, then one block), which
    costs one pass over ``probs`` instead of a full cumulative sum.
    """
    rows, vocab = probs.shape
    block = _block_size(vocab)
    if block is None:
        cdf = torch.cumsum(probs, dim=-1)
        picks = torch.searchsorted(cdf, (uniforms * cdf[:, -1])[:, None], right=True).squeeze(-1)
        return picks.clamp_(max=vocab - 1)
    blocks = probs.view(rows, vocab // block, block)
    cdf_blocks = torch.cumsum(blocks.sum(dim=-1), dim=-1)
    target = uniforms * cdf_blocks[:, -1]
    b = torch.searchsorted(cdf_blocks, target[:, None], right=True).clamp_(max=cdf_blocks.shape[1] - 1)
    before = torch.where(b > 0, cdf_blocks.gather(1, (b - 1).clamp(min=0)), torch.zeros_like(target[:, None]))
    inner = torch.cumsum(blocks.gather(1, b[:, :, None].expand(rows, 1, block)).squeeze(1), dim=-1)
    j = torch.searchsorted(inner, (target[:, None] - before), right=True).clamp_(max=block - 1)
    return (b * block + j).squeeze(-1)


def sample_next(
    logits: torch.Tensor,
    specs: list[SamplingSpec],
    generators: list[torch.Generator],
    top_logprobs_num: list[int] | None = None,
    mode: LogprobMode = "scaled",
) -> SampleOutput:
    """Pick one token per row of ``logits`` ([B, V], float32) and its reported logprob.

    One fused softmax of the scaled logits serves sampling and the reported logprobs; a step
    costs a few passes over ``[B, V]``.
    """
    logits = logits.float()
    batch, vocab = logits.shape
    temps = [s.temperature if s.temperature > 0 else 1.0 for s in specs]
    scaled = logits if all(t == 1.0 for t in temps) else logits / torch.tensor(temps)[:, None]
    probs = torch.softmax(scaled, dim=-1)

    tokens = torch.empty(batch, dtype=torch.long)
    greedy_rows = [i for i, s in enumerate(specs) if s.greedy]
    plain_rows = [i for i, s in enumerate(specs) if not s.greedy and not s.truncates]
    if greedy_rows:
        idx = torch.tensor(greedy_rows)
        tokens[idx] = torch.max(logits.index_select(0, idx), dim=-1).indices
    if plain_rows:
        rows = probs if len(plain_rows) == batch else probs[torch.tensor(plain_rows)]
        uniforms = torch.cat([torch.rand(1, generator=generators[i]) for i in plain_rows])
        tokens[torch.tensor(plain_rows)] = _invert_cdf(rows, uniforms)
    for i, spec in enumerate(specs):
        if not spec.greedy and spec.truncates:
            tokens[i] = _sample_truncated(probs[i], spec, generators[i])

    if mode == "raw" and scaled is not logits:
        lse = torch.logsumexp(logits, dim=-1)
        chosen = logits.gather(1, tokens[:, None]).squeeze(-1) - lse
    else:
        chosen = probs.gather(1, tokens[:, None]).squeeze(-1).log()

    tops: list[list[tuple[float, int]] | None] = [None] * batch
    if top_logprobs_num:
        for i, n in enumerate(top_logprobs_num):
            if n <= 0:
                continue
            if mode == "raw" and scaled is not logits:
                vals, ids = torch.topk(logits[i], min(n, vocab))
                vals = vals - torch.logsumexp(logits[i], dim=-1)
            else:
                vals, ids = torch.topk(probs[i], min(n, vocab))
                vals = vals.log()
            tops[i] = list(zip(vals.tolist(), ids.tolist(), strict=True))
    return SampleOutput(tokens=tokens.tolist(), logprobs=chosen.tolist(), top_logprobs=tops)


def prompt_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, mode: LogprobMode = "scaled"
) -> list[float]:
    """Logprob of ``targets[j]`` under ``logits[j]`` (the position before it), same convention."""
    t = temperature if (temperature > 0 and mode == "scaled") else 1.0
    lp = torch.log_softmax(logits.float() / t, dim=-1)
    return lp.gather(1, targets[:, None]).squeeze(-1).tolist()


def prompt_top_logprobs(
    logits: torch.Tensor, k: int, temperature: float, mode: LogprobMode = "scaled"
) -> list[list[tuple[float, int]]]:
    """The ``k`` best ``(logprob, token_id)`` at each row of ``logits``, same convention."""
    t = temperature if (temperature > 0 and mode == "scaled") else 1.0
    values, ids = torch.log_softmax(logits.float() / t, dim=-1).topk(k, dim=-1)
    return [list(zip(v, i, strict=True)) for v, i in zip(values.tolist(), ids.tolist(), strict=True)]


__all__ = [
    "LogprobMode",
    "SampleOutput",
    "SamplingSpec",
    "make_generator",
    "prompt_logprobs",
    "prompt_top_logprobs",
    "sample_next",
]
