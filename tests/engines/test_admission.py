"""How the engine admits requests (in process, no HTTP): a burst that reaches an idle engine one
request at a time is prefilled as one batch and decoded in lockstep, and a short cached prefix
does not split a waiting batch into one prefill per row, while a long one is still reused."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from relax_gym.trainer.engines.engine import PREFIX_BATCH_MIN, EngineCore
from relax_gym.trainer.engines.model_runner import ModelRunner

from .in_process_helpers import Results, fresh_max_diff
from .in_process_helpers import submit as submit_new

NEW = 6


def submit(engine: EngineCore, results: Results, rid: str, prompt: list[int], seed: int) -> None:
    submit_new(engine, results, rid, prompt, seed, NEW)


@pytest.fixture(scope="module")
def runner(bpe_qwen3: Path) -> ModelRunner:
    return ModelRunner(bpe_qwen3)


def test_a_burst_reaching_an_idle_engine_one_by_one_is_prefilled_once(runner: ModelRunner) -> None:
    # a generous quiet gap: the submitting thread may be descheduled on a busy machine
    engine = EngineCore(runner, max_batch_size=16, admit_quiet_s=2.0, admit_window_s=20.0)
    results = Results()
    prompts = [[30 + i, 40, 41, 42 + i, 43, 44] + [50 + j for j in range(i)] for i in range(6)]
    steps_before = runner.stats.decode_steps
    engine.start()
    try:
        for i, p in enumerate(prompts):
            submit(engine, results, f"r{i}", p, seed=i)
            time.sleep(0.02)  # arrivals spaced out, as HTTP requests reach the engine thread
        results.wait(len(prompts))
    finally:
        engine.stop()
    assert engine.stats.prefill_batches == 1
    assert runner.stats.decode_steps - steps_before == NEW - 1  # the first token comes from the prefill
    for i, p in enumerate(prompts):
        assert len(results.items[f"r{i}"]["output_ids"]) == NEW
        assert fresh_max_diff(runner, p, results.items[f"r{i}"]) < 1e-4


def test_a_short_cached_prefix_does_not_split_a_waiting_batch(runner: ModelRunner) -> None:
    engine = EngineCore(runner, max_batch_size=16, prefix_cache_tokens=4096, admit_quiet_s=0.0)
    results = Results()
    head = list(range(60, 80))  # a shared chat-template head, well under PREFIX_BATCH_MIN
    long_prompt = list(range(100, 100 + PREFIX_BATCH_MIN + 20))
    engine.start()
    try:
        submit(engine, results, "prime-short", head + [5], seed=0)
        submit(engine, results, "prime-long", long_prompt, seed=1)
        results.wait(2)
        batches = engine.stats.prefill_batches
        # queued before the engine thread looks: all four wait together
        engine.run_job(lambda: engine.pause("in_place")).result(timeout=60)
        followers = [head + [6 + i, 7] for i in range(3)]
        for i, p in enumerate(followers):
            submit(engine, results, f"f{i}", p, seed=10 + i)
        turn2 = long_prompt + results.items["prime-long"]["output_ids"] + [9]
        submit(engine, results, "turn2", turn2, seed=20)
        deadline = time.monotonic() + 60
        while engine.snapshot()["num_waiting_reqs"] < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        engine.run_job(engine.resume).result(timeout=60)
        results.wait(6)
    finally:
        engine.stop()
    for i, p in enumerate(followers):
        item = results.items[f"f{i}"]
        assert item["meta_info"]["cached_tokens"] == 0  # prefilled in one batch instead
        assert fresh_max_diff(runner, p, item) < 1e-4
    # the three followers share one prefill; the long hit is still reused, on its own
    assert engine.stats.prefill_batches - batches == 2
    assert results.items["turn2"]["meta_info"]["cached_tokens"] >= PREFIX_BATCH_MIN
    assert fresh_max_diff(runner, turn2, results.items["turn2"]) < 1e-4
