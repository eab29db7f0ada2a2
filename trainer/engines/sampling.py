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


def _sample_truncated(row: torch.Tensor, lse: torch.Tensor, spec: SamplingSpec, gen: torch.Generator) -> int:
    """Sample one row under top-k, then top-p (on the top-k-renormalised mass), then min-p.

    Only the best ``_CANDIDATES`` tokens are sorted when they provably hold every token the
    filters can keep; otherwise the whole row is sorted.
    """
    vocab = row.numel()
    k = spec.top_k if 1 < spec.top_k < vocab else vocab
    c = min(k, _CANDIDATES)
    vals, ids = torch.topk(row, c)
    probs = (vals - lse).exp()  # probabilities under the full (scaled) distribution
    exact = (
        c == k
        or (spec.top_p < 1.0 and float(probs.sum()) >= spec.top_p)
        or (spec.min_p > 0.0 and float(probs[-1]) < spec.min_p * float(probs[0]))
    )
    if exact:
        mass = probs.sum() if c == k else torch.tensor(1.0)
    else:
        vals, ids = torch.sort(row, descending=True)
        vals, ids = vals[:k], ids[:k]
        probs = (vals - lse).exp()
        mass = probs.sum()
    p = probs / mass
    keep = torch.ones_like(p, dtype=torch.bool)
    if spec.top_p < 1.0:
        keep &= (torch.cumsum(p, dim=0) - p) < spec.top_p
    if spec.min_p > 0.0:
        keep &= p >= spec.min_p * p[0]
    cdf = torch.cumsum(p * keep, dim=0)
    u = torch.rand(1, generator=gen) * cdf[-1]
    j = int(torch.searchsorted(cdf, u, right=True).clamp_(max=len(cdf) - 1))
    return int(ids[j])


def sample_next(
    logits: torch.Tensor,
    specs: list[SamplingSpec],
    generators: list[torch.Generator],
    top_logprobs_num: list[int] | None = None,
    mode: LogprobMode = "scaled",
) -> SampleOutput:
    """Pick one token per row of ``logits`` ([B, V], float32) and its reported logprob.

    Works on unnormalised ``exp(scaled - max)`` and a cumulative sum per row, so a step costs a
    few passes over ``[B, V]`` and no full log-softmax is materialised.
    """
    logits = logits.float()
    batch, vocab = logits.shape
    temps = [s.temperature if s.temperature > 0 else 1.0 for s in specs]
    scaled = logits if all(t == 1.0 for t in temps) else logits / torch.tensor(temps)[:, None]
    peak = scaled.amax(dim=-1, keepdim=True)
    weights = (scaled - peak).exp_()  # unnormalised probabilities of the scaled distribution
    lse = peak.squeeze(-1) + weights.sum(dim=-1).log()
    if mode == "raw" and scaled is not logits:
        report_from, report_lse = logits, torch.logsumexp(logits, dim=-1)
    else:
        report_from, report_lse = scaled, lse

    tokens = torch.empty(batch, dtype=torch.long)
    greedy_rows = [i for i, s in enumerate(specs) if s.greedy]
    plain_rows = [i for i, s in enumerate(specs) if not s.greedy and not s.truncates]
    truncated_rows = [i for i, s in enumerate(specs) if not s.greedy and s.truncates]
    if greedy_rows:
        idx = torch.tensor(greedy_rows)
        tokens[idx] = torch.max(logits.index_select(0, idx), dim=-1).indices
    rows_weights: list[tuple[list[int], torch.Tensor]] = []
    if plain_rows:
        rows_weights.append((plain_rows, weights if len(plain_rows) == batch else weights[torch.tensor(plain_rows)]))
    for i in truncated_rows:
        tokens[i] = _sample_truncated(scaled[i], lse[i], specs[i], generators[i])
    for rows, w in rows_weights:
        cdf = torch.cumsum(w, dim=-1)
        uniforms = torch.cat([torch.rand(1, generator=generators[i]) for i in rows])
        picks = torch.searchsorted(cdf, (uniforms * cdf[:, -1])[:, None], right=True).squeeze(-1)
        tokens[torch.tensor(rows)] = picks.clamp_(max=vocab - 1)
    chosen = report_from.gather(1, tokens[:, None]).squeeze(-1) - report_lse

    tops: list[list[tuple[float, int]] | None] = [None] * batch
    if top_logprobs_num:
        for i, n in enumerate(top_logprobs_num):
            if n > 0:
                vals, ids = torch.topk(report_from[i], min(n, vocab))
                tops[i] = list(zip((vals - report_lse[i]).tolist(), ids.tolist(), strict=True))
    return SampleOutput(tokens=tokens.tolist(), logprobs=chosen.tolist(), top_logprobs=tops)


def prompt_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, mode: LogprobMode = "scaled"
) -> list[float]:
    """Logprob of ``targets[j]`` under ``logits[j]`` (the position before it), same convention."""
    t = temperature if (temperature > 0 and mode == "scaled") else 1.0
    lp = torch.log_softmax(logits.float() / t, dim=-1)
    return lp.gather(1, targets[:, None]).squeeze(-1).tolist()


__all__ = ["LogprobMode", "SampleOutput", "SamplingSpec", "make_generator", "prompt_logprobs", "sample_next"]
