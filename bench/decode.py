"""Embedded-engine decode throughput against transformers ``generate()`` at the rollout's batch.

    python bench/decode.py [--batch 32] [--tokens 24,128] [--repeats 3] [--threads 1]
                           [--engines process,in_process] [--groups G] [--json FILE]

The model is bench/modes.py's tiny random Qwen3; the prompts are the vowels task's, rendered by
the model's chat template (what a rollout sends): ``--batch`` distinct prompts, or with ``--groups G``
a GRPO rollout's batch, ``G`` distinct prompts each sent ``--batch / G`` times (``--batch 32
--groups 4``: 4 prompts x 8 samples). The engine prefills each distinct prompt of a batch once
(``prefill_rows``, ``prefill_tokens_saved``); ``in_process_nodedupe`` (``--engines``) is the
in-process engine with that switched off. Each repeat, interleaved:

* **engine**: ``--batch`` concurrent ``/generate`` requests (temperature 1, ``ignore_eos``, so
  every row makes exactly ``N`` tokens) to one ``relax-gym engine serve`` process on 127.0.0.1
  (``process``, ``--threads`` torch threads) and/or to an engine in this process reached
  without a socket (``in_process``, what colocate runs use by default); wall time from the first
  send to the last reply, plus the engine's own counters: decode steps, prefill batches, prefill
  rows and tokens run and saved, time in forward passes, busy time;
* **generate**: the same prompts as one left-padded batch through ``model.generate`` in this
  process (``do_sample=True``, ``min_new_tokens=max_new_tokens=N``), same threads.

Reported: tokens/s of each (medians) and their ratio, and where the engine's wall time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
COUNTERS = ("decode_steps", "prefill_batches", "prefill_rows", "prefill_tokens", "prefill_tokens_saved",
            "forward_seconds", "busy_seconds")


def chat_prompts(model: Path, n: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from bench.modes import VowelsEnv

    tok = AutoTokenizer.from_pretrained(str(model))
    env = VowelsEnv()
    out = []
    for seed in range(n):
        obs, _ = env.reset(seed=seed)
        msgs = [{"role": m.role, "content": m.text} for m in obs.messages]
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        out.append(list(tok(text, add_special_tokens=False)["input_ids"]))
    return out


async def engine_round(url: str, prompts: list[list[int]], tokens: int, seed: int) -> dict[str, float]:
    from relax_gym.protocol import EngineClient, GenerateRequest, SamplingParams
    from relax_gym.trainer.engines.in_process import client_for, is_in_process_url

    client = client_for(url, timeout_s=600) if is_in_process_url(url) else EngineClient(url, timeout_s=600)
    async with client:
        before = await client.server_info()
        start = time.perf_counter()
        outs = await asyncio.gather(*(client.generate(GenerateRequest(
            input_ids=p, sampling_params=SamplingParams(max_new_tokens=tokens, temperature=1.0, ignore_eos=True,
                                                        sampling_seed=seed * 1000 + i)))
            for i, p in enumerate(prompts)))
        wall = time.perf_counter() - start
        after = await client.server_info()
    made = sum(len(o.output_ids) for o in outs)
    return {"wall_s": wall, "tokens": made, "tok_s": made / wall,
            **{k: after[k] - before[k] for k in COUNTERS}}


def generate_round(model: Any, tok: Any, prompts: list[list[int]], tokens: int, seed: int) -> dict[str, float]:
    import torch

    length = max(len(p) for p in prompts)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (length - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (length - len(p)) + [1] * len(p) for p in prompts])
    torch.manual_seed(seed)
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0,
                             top_k=0, max_new_tokens=tokens, min_new_tokens=tokens, pad_token_id=pad)
    wall = time.perf_counter() - start
    made = int((out.shape[1] - length) * out.shape[0])
    return {"wall_s": wall, "tokens": made, "tok_s": made / wall}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--tokens", default="24,128")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--engines", default="process,in_process",
                   help="engine placements to time: process (HTTP, child process), in_process, and "
                        "in_process_nodedupe (in process, every prefill row computed)")
    p.add_argument("--groups", type=int, default=0,
                   help="GRPO groups: G distinct prompts, each repeated batch/G times (0: every row distinct)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if a.groups and (a.groups < 0 or a.batch % a.groups):
        p.error(f"--groups {a.groups} must divide --batch {a.batch}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from relax_gym.trainer.engines.launch import EmbeddedEngineProcess
    from relax_gym.trainer.models import build_tiny_model

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from bench.modes import MODEL

    torch.set_num_threads(a.threads)
    tmp = tempfile.TemporaryDirectory(prefix="bench-decode-")
    model_dir = build_tiny_model("qwen3", Path(tmp.name) / "m", seed=0, tokenizer="tiny-bpe", **MODEL)
    distinct = chat_prompts(model_dir, a.groups or a.batch)
    prompts = [q for q in distinct for _ in range(a.batch // len(distinct))]  # a group's rows side by side
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    results: dict[str, Any] = {}
    from relax_gym.trainer.engines.in_process import InProcessEngine

    kinds = a.engines.split(",")
    engines: dict[str, Any] = {}
    if "process" in kinds:
        engines["process"] = EmbeddedEngineProcess(model_dir, threads=a.threads,
                                                   extra_args=["--max-batch-size", str(max(64, a.batch))])
    for kind in ("in_process", "in_process_nodedupe"):
        if kind in kinds:
            engines[kind] = InProcessEngine(model_dir, max_batch_size=max(64, a.batch))
    try:
        for kind, engine in engines.items():
            engine.start()
            if kind == "in_process_nodedupe":
                engine.engine.runner.dedupe_prefill = False
            asyncio.run(engine_round(engine.url, prompts[:2], 4, 0))  # warm-up
        generate_round(model, tok, prompts[:2], 4, 0)
        for n in (int(x) for x in a.tokens.split(",")):
            names = [*engines, "generate"]
            rows: dict[str, list[dict[str, float]]] = {k: [] for k in names}
            loads = []
            for r in range(a.repeats):
                for kind in names if r % 2 == 0 else list(reversed(names)):
                    loads.append(os.getloadavg()[0])
                    rows[kind].append(asyncio.run(engine_round(engines[kind].url, prompts, n, r + 1))
                                      if kind != "generate" else generate_round(model, tok, prompts, n, r + 1))
            gen = rows["generate"]
            res: dict[str, Any] = {"generate_tok_s": statistics.median(x["tok_s"] for x in gen),
                                   "generate_wall_s": statistics.median(x["wall_s"] for x in gen),
                                   "load": [min(loads), max(loads)]}
            for kind in engines:
                eng = rows[kind]
                med = {k: statistics.median(x[k] for x in eng) for k in eng[0]}
                res[kind] = {"tok_s": med["tok_s"], "wall_s": med["wall_s"], "decode_steps": med["decode_steps"],
                             "prefill_batches": med["prefill_batches"], "prefill_rows": med["prefill_rows"],
                             "prefill_tokens": med["prefill_tokens"],
                             "prefill_tokens_saved": med["prefill_tokens_saved"], "forward_s": med["forward_seconds"],
                             "busy_s": med["busy_seconds"], "ratio": med["tok_s"] / res["generate_tok_s"]}
            results[f"tokens_{n}"] = res
            print(json.dumps({f"tokens_{n}": res}), flush=True)
    finally:
        for engine in engines.values():
            engine.stop()
    tmp.cleanup()
    results["args"] = vars(a)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
