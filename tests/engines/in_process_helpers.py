"""Helpers for the tests that drive an ``EngineCore`` in process (no HTTP): collect delivered
results with a bounded wait, submit one seeded request, and compare its logprobs with a fresh
forward pass of the model."""

from __future__ import annotations

import threading
from typing import Any

import torch
from relax_gym.trainer.engines.engine import EngineCore, make_sequence
from relax_gym.trainer.engines.model_runner import ModelRunner
from relax_gym.trainer.engines.sampling import SamplingSpec


class Results:
    """Collects delivered results; ``wait`` is bounded."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self.cond = threading.Condition()

    def deliver_for(self, rid: str) -> Any:
        def deliver(result: dict[str, Any] | BaseException) -> None:
            assert not isinstance(result, BaseException), result
            with self.cond:
                self.items[rid] = result
                self.cond.notify_all()
        return deliver

    def wait(self, n: int, timeout_s: float = 120.0) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.items) >= n, timeout_s), f"{len(self.items)}/{n} results"


def submit(engine: EngineCore, results: Results, rid: str, prompt: list[int], seed: int, new: int,
           logprob_start_len: int = -1) -> None:
    """One request of ``new`` tokens at temperature 1 (no early stop), with its logprobs."""
    spec = SamplingSpec(temperature=1.0, max_new_tokens=new, ignore_eos=True)
    engine.submit(make_sequence(engine, rid=rid, prompt_ids=prompt, spec=spec, deliver=results.deliver_for(rid),
                                seed=seed, return_logprob=True, logprob_start_len=logprob_start_len))


def fresh_logprobs(runner: ModelRunner, ids: list[int]) -> torch.Tensor:
    """log p(ids[i] | ids[:i]) for i >= 1, from one plain forward pass."""
    with torch.no_grad():
        logits = runner.model(torch.tensor([ids])).logits[0, :-1]
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)


def fresh_max_diff(runner: ModelRunner, prompt: list[int], result: dict[str, Any]) -> float:
    """Largest gap between a result's output logprobs and a fresh forward over prompt + output."""
    ref = fresh_logprobs(runner, prompt + result["output_ids"])[len(prompt) - 1:]
    got = torch.tensor([lp for lp, _, _ in result["meta_info"]["output_token_logprobs"]])
    return float((ref - got).abs().max())
