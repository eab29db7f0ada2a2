"""Decode throughput of an imported real model: the embedded engine vs transformers ``generate()``.

    python bench/real_models.py --model runs/models/smollm2-135m-instruct --rounds 2

Both decode the same chat prompt for ``--new-tokens`` tokens (EOS ignored, greedy) at batch 1
and batch 32, in alternating rounds (engine, generate, engine, generate...) so load on a shared
box hits both alike. The engine is measured end to end over HTTP on 127.0.0.1 (a request's
tokens over its wall time); ``generate()`` in this process with the same thread count. Prints
one JSON line per measurement and a summary with medians and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from typing import Any

PROMPT = [{"role": "user", "content": "Tom has 12 apples and buys 7 more. How many apples does he have now?"}]


async def _engine_round(url: str, ids: list[int], batch: int, new_tokens: int) -> float:
    from relax_gym.protocol import EngineClient, GenerateRequest, SamplingParams

    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    async with EngineClient(url, timeout_s=1800) as client:
        start = time.perf_counter()
        outs = await asyncio.gather(*(client.generate(GenerateRequest(input_ids=ids, sampling_params=params))
                                      for _ in range(batch)))
        wall = time.perf_counter() - start
    return sum(len(o.output_ids) for o in outs) / wall


def _generate_round(model: Any, ids: list[int], batch: int, new_tokens: int, pad: int) -> float:
    import torch

    x = torch.tensor([ids] * batch)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad)
    wall = time.perf_counter() - start
    return (out.shape[1] - len(ids)) * batch / wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from relax_gym.trainer.engines.launch import EmbeddedEngineProcess

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.model)
    text = tok.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True)
    ids = list(tok(text, add_special_tokens=False)["input_ids"])
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    engine = EmbeddedEngineProcess(args.model, threads=args.threads, startup_timeout_s=900)
    engine.start()
    results: dict[str, list[float]] = {}
    try:
        for r in range(args.rounds):
            for batch in (int(b) for b in args.batches.split(",")):
                for name in ("engine", "generate"):
                    if name == "engine":
                        tps = asyncio.run(_engine_round(engine.url, ids, batch, args.new_tokens))
                    else:
                        tps = _generate_round(model, ids, batch, args.new_tokens, tok.pad_token_id or 0)
                    results.setdefault(f"{name}@{batch}", []).append(tps)
                    print(json.dumps({"round": r, "runner": name, "batch": batch, "tokens_per_s": round(tps, 2),
                                      "load": round(os.getloadavg()[0], 2)}), flush=True)
    finally:
        engine.stop()
    summary = {k: round(statistics.median(v), 2) for k, v in results.items()}
    ratios = {f"engine/generate@{b}": round(summary[f"engine@{b}"] / summary[f"generate@{b}"], 2)
              for b in args.batches.split(",")}
    print(json.dumps({"median_tokens_per_s": summary, "ratios": ratios, "prompt_tokens": len(ids),
                      "new_tokens": args.new_tokens, "threads": args.threads, "load_avg": os.getloadavg()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
