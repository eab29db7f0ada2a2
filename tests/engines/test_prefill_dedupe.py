"""A prefill batch computes each distinct prompt once (in process, no HTTP).

A GRPO rollout sends every prompt G times; the runner forwards one row per distinct prompt and
copies its KV and logits into the rows that share it. Every row still samples with its own
generator, and every returned logprob still matches a fresh forward pass of the model.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from relax_gym.trainer.engines.engine import PREFIX_BATCH_MIN, EngineCore
from relax_gym.trainer.engines.model_runner import ModelRunner, SeqInput, dedupe_key

from .in_process_helpers import Results, fresh_logprobs, fresh_max_diff
from .in_process_helpers import submit as submit_new

NEW = 6
A = [30, 40, 41, 42, 43, 44, 45, 46, 47]
B = [31, 50, 51, 52, 53, 54, 55]


@pytest.fixture(scope="module")
def runner(bpe_qwen3: Path) -> Iterator[ModelRunner]:
    runner = ModelRunner(bpe_qwen3)
    yield runner
    runner.dedupe_prefill = True


def submit(engine: EngineCore, results: Results, rid: str, prompt: list[int], seed: int, new: int = NEW,
           logprob_start_len: int = -1) -> None:
    submit_new(engine, results, rid, prompt, seed, new, logprob_start_len)


@contextmanager
def held(engine: EngineCore, waiting: int) -> Iterator[None]:
    """Pause the engine for the block's submissions; then resume once ``waiting`` requests
    wait (bounded), so they are admitted together."""
    engine.run_job(lambda: engine.pause("in_place")).result(timeout=30)
    yield
    deadline = time.monotonic() + 30
    while engine.snapshot()["num_waiting_reqs"] < waiting and time.monotonic() < deadline:
        time.sleep(0.005)
    engine.run_job(engine.resume).result(timeout=30)


def burst(engine: EngineCore, results: Results, requests: list[tuple[str, list[int], int]], **kw: Any) -> None:
    """Submit ``requests`` so they wait together, then resume."""
    with held(engine, len(requests)):
        for rid, prompt, seed in requests:
            submit(engine, results, rid, prompt, seed, **kw)


def run_groups(runner: ModelRunner, requests: list[tuple[str, list[int], int]], **engine_kw: Any) -> tuple[
        Results, EngineCore, dict[str, int]]:
    engine = EngineCore(runner, admit_quiet_s=0.0, **{"max_batch_size": 32, **engine_kw})
    results = Results()
    before = engine.snapshot()
    engine.start()
    try:
        burst(engine, results, requests)
        results.wait(len(requests))
    finally:
        engine.stop()
    after = engine.snapshot()
    delta = {k: after[k] - before[k] for k in ("prefill_rows", "prefill_tokens", "prefill_tokens_saved")}
    return results, engine, delta


def test_two_groups_of_eight_prefill_two_rows_and_stay_exact(runner: ModelRunner) -> None:
    requests = [(f"a{i}", A, i) for i in range(8)] + [(f"b{i}", B, 100 + i) for i in range(8)]
    results, engine, delta = run_groups(runner, requests)
    assert engine.stats.prefill_batches == 1
    assert delta["prefill_rows"] == 2
    assert delta["prefill_tokens"] == len(A) + len(B)
    assert delta["prefill_tokens_saved"] == 7 * (len(A) + len(B))
    for rid, prompt, _ in requests:
        assert len(results.items[rid]["output_ids"]) == NEW
        assert fresh_max_diff(runner, prompt, results.items[rid]) < 1e-4
    # one group's rows sample on their own generators: not eight copies of one completion
    assert len({tuple(results.items[f"a{i}"]["output_ids"]) for i in range(8)}) > 1


def test_seeded_samples_are_the_same_with_and_without_dedupe(runner: ModelRunner) -> None:
    requests = [(f"a{i}", A, i) for i in range(8)] + [(f"b{i}", B, 100 + i) for i in range(4)]
    shared, _, delta_on = run_groups(runner, requests)
    runner.dedupe_prefill = False
    try:
        alone, _, delta_off = run_groups(runner, requests)
    finally:
        runner.dedupe_prefill = True
    assert (delta_on["prefill_rows"], delta_off["prefill_rows"]) == (2, 12)
    assert delta_off["prefill_tokens_saved"] == 0
    for rid, _, _ in requests:
        assert shared.items[rid]["output_ids"] == alone.items[rid]["output_ids"]
        a = [lp for lp, _, _ in shared.items[rid]["meta_info"]["output_token_logprobs"]]
        b = [lp for lp, _, _ in alone.items[rid]["meta_info"]["output_token_logprobs"]]
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-4


def test_a_group_member_asking_for_prompt_logprobs_shares_the_row(runner: ModelRunner) -> None:
    engine = EngineCore(runner, max_batch_size=32, admit_quiet_s=0.0)
    results = Results()
    rows = runner.stats.prefill_rows
    engine.start()
    try:
        burst(engine, results, [(f"a{i}", A, i) for i in range(3)])  # plain requests first
        with held(engine, 4):
            submit(engine, results, "scored", A, 7, logprob_start_len=0)
            for i in range(3, 6):
                submit(engine, results, f"a{i}", A, i)
        results.wait(7)
    finally:
        engine.stop()
    assert runner.stats.prefill_rows - rows == 2  # one per burst
    scored = results.items["scored"]["meta_info"]["input_token_logprobs"]
    assert scored[0][0] is None and [t for _, t, _ in scored] == A
    ref = fresh_logprobs(runner, A)
    assert float((torch.tensor([lp for lp, _, _ in scored[1:]]) - ref).abs().max()) < 1e-4
    for i in range(6):
        assert results.items[f"a{i}"]["meta_info"]["input_token_logprobs"] == []
        assert fresh_max_diff(runner, A, results.items[f"a{i}"]) < 1e-4
    assert fresh_max_diff(runner, A, results.items["scored"]) < 1e-4


def test_twins_with_a_long_cached_prefix_share_one_prefill_on_top_of_it(runner: ModelRunner) -> None:
    engine = EngineCore(runner, max_batch_size=32, prefix_cache_tokens=4096, admit_quiet_s=0.0)
    results = Results()
    long_prompt = list(range(100, 100 + PREFIX_BATCH_MIN + 10))
    engine.start()
    try:
        submit(engine, results, "prime", long_prompt, 0)
        results.wait(1)
        turn2 = long_prompt + results.items["prime"]["output_ids"] + [9, 10]
        rows, batches = runner.stats.prefill_rows, engine.stats.prefill_batches
        # the first twin asks for prompt logprobs (no cached prefix for it): the others share its row
        burst(engine, results, [(f"t{i}", turn2, 10 + i) for i in range(4)])
        results.wait(5)
        mid_rows, mid_batches = runner.stats.prefill_rows, engine.stats.prefill_batches
        with held(engine, 4):
            submit(engine, results, "scored", turn2, 20, logprob_start_len=len(turn2) - 3)
            for i in range(3):
                submit(engine, results, f"u{i}", turn2, 30 + i)
        results.wait(9)
    finally:
        engine.stop()
    # four twins: one row prefilled on top of the cached prefix
    assert (mid_rows - rows, mid_batches - batches) == (1, 1)
    for i in range(4):
        item = results.items[f"t{i}"]
        assert item["meta_info"]["cached_tokens"] >= PREFIX_BATCH_MIN
        assert fresh_max_diff(runner, turn2, item) < 1e-4
    # a scored twin first: the others drop their cached prefix and share its full row
    assert (runner.stats.prefill_rows - mid_rows, engine.stats.prefill_batches - mid_batches) == (1, 1)
    scored = results.items["scored"]["meta_info"]["input_token_logprobs"]
    ref = fresh_logprobs(runner, turn2)[-2:]
    assert float((torch.tensor([lp for lp, _, _ in scored[1:]]) - ref).abs().max()) < 1e-4
    for rid in ["scored", "u0", "u1", "u2"]:
        assert fresh_max_diff(runner, turn2, results.items[rid]) < 1e-4


def test_aborting_one_row_of_a_group_leaves_the_others_exact(runner: ModelRunner) -> None:
    engine = EngineCore(runner, max_batch_size=32, admit_quiet_s=0.0)
    results = Results()
    engine.start()
    try:
        burst(engine, results, [(f"a{i}", A, i) for i in range(6)], new=24)
        engine.abort("a2")
        results.wait(6)
    finally:
        engine.stop()
    for i in range(6):
        item = results.items[f"a{i}"]
        if i != 2:
            assert len(item["output_ids"]) == 24
        if item["output_ids"]:
            assert fresh_max_diff(runner, A, item) < 1e-4


def test_max_batch_size_still_bounds_a_shared_prefill(runner: ModelRunner) -> None:
    requests = [(f"a{i}", A, i) for i in range(10)]
    results, engine, delta = run_groups(runner, requests, max_batch_size=4)
    assert engine.stats.max_running == 4
    assert delta["prefill_rows"] == engine.stats.prefill_batches == 3  # 4 + 4 + 2 rows, one computed each
    for rid, prompt, _ in requests:
        assert fresh_max_diff(runner, prompt, results.items[rid]) < 1e-4


def vl_seq(prepared: Any) -> SeqInput:
    """The engine's SeqInput of a prepared Qwen3-VL prompt (as Sequence.prefill_input builds it)."""
    v = prepared.vision
    return SeqInput(input_ids=prepared.input_ids, pixel_values=v.pixel_values, image_grid_thw=v.image_grid_thw,
                    mm_token_type_ids=v.mm_token_type_ids)


def test_rows_with_media_share_only_when_their_media_match() -> None:
    text = SeqInput(input_ids=[1, 2, 3])
    assert dedupe_key(text) == dedupe_key(SeqInput(input_ids=[1, 2, 3], mm_token_type_ids=[0, 0, 0]))
    assert dedupe_key(text) != dedupe_key(SeqInput(input_ids=[1, 2, 3], past_len=2))

    def image(fill: float) -> SeqInput:
        return SeqInput(input_ids=[1, 2, 3], pixel_values=torch.full((4, 8), fill),
                        image_grid_thw=torch.tensor([[1, 2, 2]]), mm_token_type_ids=[0, 1, 0])

    assert dedupe_key(image(0.0)) == dedupe_key(image(0.0)) != dedupe_key(image(1.0))
    assert dedupe_key(image(0.0)) != dedupe_key(text)
    audio = SeqInput(input_ids=[1, 2, 3], input_features=torch.zeros(1, 8, 4))
    assert dedupe_key(audio) == dedupe_key(SeqInput(input_ids=[1, 2, 3], input_features=torch.zeros(1, 8, 4)))
    assert dedupe_key(audio) != dedupe_key(SeqInput(input_ids=[1, 2, 3], input_features=torch.ones(1, 8, 4)))
    on_prefix = SeqInput(input_ids=[1, 2, 3], pixel_values=torch.zeros(4, 8), past=[], past_len=1)
    assert dedupe_key(on_prefix) is None  # media on top of a cached prefix: never shared


def test_image_prompts_of_a_group_prefill_once_and_equal_their_own_prefill(tmp_path: Path) -> None:
    import numpy as np
    from PIL import Image

    from relax_gym.chat import ChatCodec, ChatContext
    from relax_gym.protocol import GenerateRequest
    from relax_gym.trainer.engines.prepare import prepare_prompt
    from relax_gym.trainer.models import build_tiny_model

    model = build_tiny_model("qwen3_vl", tmp_path / "vl", seed=0, tokenizer="tiny-bpe")
    codec, vl = ChatCodec.from_pretrained(model), ModelRunner(model)
    seqs = []
    for k in (0, 0, 0, 1, 1):  # two images, the same question: a group of 3 and a group of 2
        img = Image.fromarray(np.random.default_rng(k).integers(0, 255, (64, 64, 3), dtype=np.uint8))
        chat = ChatContext(codec, [{"role": "user", "content": [{"type": "image", "image": img},
                                                                 {"type": "text", "text": "Colour?"}]}])
        req = GenerateRequest(input_ids=chat.ids, image_data=chat.payloads)
        seqs.append(vl_seq(prepare_prompt(req, vl)))
    assert len({dedupe_key(s) for s in seqs}) == 2
    before = vl.stats.prefill_tokens_saved
    shared = vl.prefill(seqs)
    assert vl.stats.prefill_tokens_saved - before == 3 * len(seqs[0].input_ids)
    vl.dedupe_prefill = False
    alone = vl.prefill(seqs)
    torch.testing.assert_close(shared.last_logits, alone.last_logits, atol=1e-4, rtol=0)
    assert shared.rope_deltas == alone.rope_deltas and shared.next_positions == alone.next_positions
