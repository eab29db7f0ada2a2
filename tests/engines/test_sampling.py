"""The sampler: distributions under temperature / top-k / top-p / min-p, seeds, logprob convention."""

from __future__ import annotations

import torch
from relax_gym.trainer.engines.sampling import (
    SamplingSpec,
    make_generator,
    prompt_logprobs,
    sample_next,
)

LOGITS = torch.tensor([[0.0, 1.0, 2.0, -1.0, 0.5]])


def frequencies(spec: SamplingSpec, n: int = 1500, seed: int = 0) -> torch.Tensor:
    gen = make_generator(seed)
    counts = torch.zeros(LOGITS.shape[1])
    for _ in range(n):
        counts[sample_next(LOGITS, [spec], [gen]).tokens[0]] += 1
    return counts / n


def test_plain_sampling_follows_softmax() -> None:
    for temp in (1.0, 0.5):
        freq = frequencies(SamplingSpec(temperature=temp))
        assert torch.allclose(freq, torch.softmax(LOGITS[0] / temp, -1), atol=0.04)


def test_truncation_filters() -> None:
    p = torch.softmax(LOGITS[0], -1)  # [0.076, 0.207, 0.563, 0.028, 0.126]
    top2 = frequencies(SamplingSpec(top_k=2))
    assert top2[[0, 3, 4]].sum() == 0 and abs(top2[2] - p[2] / (p[1] + p[2])) < 0.04
    top_p = frequencies(SamplingSpec(top_p=0.7))  # keeps 0.563 and 0.207
    assert top_p[[0, 3, 4]].sum() == 0
    min_p = frequencies(SamplingSpec(min_p=0.3))  # threshold 0.169 keeps tokens 2 and 1
    assert min_p[[0, 3, 4]].sum() == 0 and min_p[1] > 0.15
    both = frequencies(SamplingSpec(top_k=3, top_p=0.8))  # top-3 renormalised, then top-p
    assert both[[0, 3, 4]].sum() == 0


def test_top_p_on_a_large_flat_vocabulary_takes_the_exact_path() -> None:
    logits = torch.zeros(1, 5000)
    logits[0, :3] = 10.0  # each ~0.31 of the mass; the flat tail holds ~0.07
    gen = make_generator(1)
    # The best 1024 tokens hold < 0.99 of the mass, so this takes the full-sort path.
    picks = [sample_next(logits, [SamplingSpec(top_p=0.99)], [gen]).tokens[0] for _ in range(300)]
    assert any(t >= 3 for t in picks)
    picks = [sample_next(logits, [SamplingSpec(top_p=0.5)], [gen]).tokens[0] for _ in range(300)]
    assert len(set(picks)) == 2 and set(picks) <= {0, 1, 2}  # two of the three tied tokens


def test_greedy_and_reported_logprobs() -> None:
    out = sample_next(
        LOGITS.repeat(2, 1),
        [SamplingSpec(temperature=0.0), SamplingSpec(temperature=0.5)],
        [make_generator(0), make_generator(1)],
        top_logprobs_num=[2, 0],
    )
    assert out.tokens[0] == 2
    assert abs(out.logprobs[0] - float(torch.log_softmax(LOGITS[0], -1)[2])) < 1e-6
    assert abs(out.logprobs[1] - float(torch.log_softmax(LOGITS[0] / 0.5, -1)[out.tokens[1]])) < 1e-6
    assert [t for _, t in out.top_logprobs[0]] == [2, 1] and out.top_logprobs[1] is None
    raw = sample_next(LOGITS, [SamplingSpec(temperature=0.5)], [make_generator(1)], mode="raw")
    assert abs(raw.logprobs[0] - float(torch.log_softmax(LOGITS[0], -1)[raw.tokens[0]])) < 1e-6


def test_each_request_owns_its_random_stream() -> None:
    logits = torch.randn(4, 1000)
    specs = [SamplingSpec()] * 4
    alone = [sample_next(logits[2:3], specs[:1], [make_generator(7)]).tokens[0] for _ in range(1)]
    gens = [make_generator(s) for s in (1, 2, 7, 3)]
    batched = sample_next(logits, specs, gens).tokens
    assert batched[2] == alone[0]


def test_prompt_logprobs_convention() -> None:
    logits = torch.randn(3, 10)
    targets = torch.tensor([1, 2, 3])
    got = prompt_logprobs(logits, targets, 0.5)
    ref = torch.log_softmax(logits / 0.5, -1).gather(1, targets[:, None]).squeeze(1).tolist()
    assert max(abs(a - b) for a, b in zip(got, ref, strict=True)) < 1e-6
