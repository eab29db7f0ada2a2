"""Embedded-engine benchmark: continuous batching vs one request at a time, logprob fidelity,
weight-update latency.

    python bench/engine.py                      # tiny Qwen3 (real 151k tokenizer), about 2-4 min
    python bench/engine.py --requests 16 --tokens 64 --repeats 3 --threads 2 --json out.json

What it measures, against a real ``relax-gym engine serve`` process on 127.0.0.1:

* **batching**: ``R`` requests of ``--tokens`` new tokens (``ignore_eos``) sent one after the
  other vs all at once; wall time, tokens/s and the speed-up (median over ``--repeats``);
* **fidelity**: the largest |engine logprob - fresh forward-pass logprob| over every token of the
  concurrent run (fp32; the train/rollout mismatch figure);
* **weight updates**: median latency of ``/update_weights_from_disk``, ``/update_weights_from_tensor``
  (base64 safetensors) and the gloo broadcast path, for the whole model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def run_batching(url: str, prompts: list[list[int]], tokens: int, repeats: int) -> dict[str, Any]:
    from relax_gym.protocol import EngineClient, GenerateRequest, SamplingParams

    def request(ids: list[int], seed: int) -> GenerateRequest:
        return GenerateRequest(
            input_ids=ids,
            return_logprob=True,
            sampling_params=SamplingParams(max_new_tokens=tokens, ignore_eos=True, sampling_seed=seed),
        )

    seq_times, conc_times, outs = [], [], []
    async with EngineClient(url, timeout_s=3600) as client:
        await client.generate(request(prompts[0], 0))  # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            for i, p in enumerate(prompts):
                await client.generate(request(p, i))
            seq_times.append(time.perf_counter() - start)
            start = time.perf_counter()
            outs = await asyncio.gather(*(client.generate(request(p, i)) for i, p in enumerate(prompts)))
            conc_times.append(time.perf_counter() - start)
    total = len(prompts) * tokens
    seq, conc = statistics.median(seq_times), statistics.median(conc_times)
    return {
        "requests": len(prompts),
        "new_tokens_each": tokens,
        "sequential_s": round(seq, 3),
        "concurrent_s": round(conc, 3),
        "sequential_tok_s": round(total / seq, 1),
        "concurrent_tok_s": round(total / conc, 1),
        "speedup": round(seq / conc, 2),
        "outputs": outs,
    }


def fidelity(model_dir: Path, prompts: list[list[int]], outs: list[Any]) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    worst = 0.0
    for p, out in zip(prompts, outs, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([p + out.output_ids])).logits[0, len(p) - 1 : -1]
        ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(out.output_ids)[:, None]).squeeze(1)
        worst = max(worst, float((ref - torch.tensor(out.token_logprobs())).abs().max()))
    return worst


async def run_weight_updates(url: str, api_key: str, model_dir: Path, other_dir: Path, repeats: int) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    from relax_gym.protocol import EngineClient, UpdateWeightsFromDiskRequest
    from relax_gym.trainer.config import DistributedSyncConfig
    from relax_gym.trainer.weights.broadcast import BroadcastTransport
    from relax_gym.trainer.weights.tensor import TensorTransport
    from relax_gym.trainer.weights.transport import Snapshot

    state = dict(AutoModelForCausalLM.from_pretrained(str(other_dir), dtype=torch.float32).state_dict())
    unique = {t.untyped_storage().data_ptr(): t for t in state.values()}  # tied weights count once
    size_mb = sum(t.numel() * t.element_size() for t in unique.values()) / 1e6
    disk, tensor, dist = [], [], []
    async with EngineClient(url, api_key=api_key, timeout_s=600) as client:
        for i in range(repeats):
            start = time.perf_counter()
            await client.update_weights_from_disk(
                UpdateWeightsFromDiskRequest(
                    model_path=str(other_dir if i % 2 == 0 else model_dir), weight_version=f"disk-{i}"
                )
            )
            disk.append(time.perf_counter() - start)
        for i in range(repeats):
            start = time.perf_counter()
            await TensorTransport(api_key=api_key).send(Snapshot(list(state.items())), f"mem-{i}", [url])
            tensor.append(time.perf_counter() - start)
        sender = BroadcastTransport(DistributedSyncConfig(master_port=free_port(), timeout_s=60), api_key=api_key)
        await sender.ensure_group([url])
        try:
            for i in range(repeats):
                start = time.perf_counter()
                await sender.send(Snapshot(list(state.items())), f"dist-{i}", [url])
                dist.append(time.perf_counter() - start)
        finally:
            await sender.close()
    return {
        "model_mb": round(size_mb, 1),
        "from_disk_s": round(statistics.median(disk), 3),
        "from_tensor_s": round(statistics.median(tensor), 3),
        "distributed_gloo_s": round(statistics.median(dist), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per request")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads of the engine process (1: no spin contention on a busy box)",
    )
    parser.add_argument("--tokenizer", default="qwen3", choices=["qwen3", "tiny-bpe"])
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()

    from relax_gym.trainer.engines.launch import EmbeddedEngineProcess
    from relax_gym.trainer.models import build_tiny_model

    tmp = tempfile.TemporaryDirectory(prefix="bench-engine-")
    root = Path(tmp.name)
    model_dir = build_tiny_model("qwen3", root / "m0", seed=0, tokenizer=args.tokenizer)
    other_dir = build_tiny_model("qwen3", root / "m1", seed=1, tokenizer=args.tokenizer)
    gen = torch.Generator().manual_seed(0)
    vocab = 500 if args.tokenizer == "tiny-bpe" else 150_000
    prompts = [torch.randint(0, vocab, (args.prompt_tokens + i,), generator=gen).tolist() for i in range(args.requests)]
    api_key = "bench-key"
    with EmbeddedEngineProcess(
        model_dir, threads=args.threads, api_key=api_key, extra_args=["--max-batch-size", str(max(args.requests, 1))]
    ) as engine:
        batching = asyncio.run(run_batching(engine.url, prompts, args.tokens, args.repeats))
        outs = batching.pop("outputs")
        worst = fidelity(model_dir, prompts, outs)
        updates = asyncio.run(run_weight_updates(engine.url, api_key, model_dir, other_dir, args.repeats))
    tmp.cleanup()
    with open("/proc/loadavg", encoding="ascii") as f:
        load = f.read().split()[0]
    result = {
        "batching": batching,
        "max_logprob_diff": worst,
        "weight_updates": updates,
        "engine_threads": args.threads,
        "tokenizer": args.tokenizer,
        "load_average_1m": float(load),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
