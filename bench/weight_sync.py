"""Weight-sync time against model size: disk, in-memory tensors, and the distributed broadcast.

    python bench/weight_sync.py [--sizes xs,s,m,l] [--repeats 3] [--json out.json]

For each size, a tiny Qwen3 (tiny BPE vocabulary, so the layers dominate) is widened/deepened
(xs about 1.4 MB of float32 weights, s 16 MB, m 61 MB, l 204 MB, xl about 480 MB) and served by one embedded engine (1 torch thread) on
127.0.0.1. The trainer side (this process) then pushes the backend's weights with a new version
over each transport of ``relax_gym.trainer.weights`` (what the publisher calls):

* **disk** (``DiskTransport``) -- ``save_pretrained`` to a folder + ``/update_weights_from_disk`` (any engine);
* **shm** (``TensorTransport``, the default for an engine on this host) -- ``/update_weights_from_tensor``
  with the path of a ``/dev/shm`` safetensors file per bucket;
* **tensor** (``TensorTransport(shared_memory=False)``) -- ``/update_weights_from_tensor`` with base64
  safetensors buckets in the body (what an engine on another host gets);
* **broadcast** (``BroadcastTransport``) -- ``/init_weights_update_group`` once, then per push
  ``/update_weights_from_distributed`` and a bucketed broadcast over a gloo process group (the code path
  SGLang uses with NCCL).

Each push is timed end to end, until the engine reports the new version through
``/get_model_info``; the median of ``--repeats`` pushes is reported with MB/s. The group set-up
of the broadcast path is reported separately (paid once per run, and again when engines change).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# (hidden, intermediate, layers) of each size; the float32 MB are measured and reported
SHAPES = {"xs": (128, 256, 2), "s": (256, 1024, 4), "m": (512, 2048, 4), "l": (768, 3072, 6), "xl": (1024, 4096, 8)}


async def measure(size: str, repeats: int, work: Path) -> dict[str, Any]:
    from relax_gym.protocol import EngineClient
    from relax_gym.trainer.backends.pytorch import TorchBackend
    from relax_gym.trainer.config import DistributedSyncConfig
    from relax_gym.trainer.engines.launch import EmbeddedEngineProcess
    from relax_gym.trainer.models import build_tiny_model
    from relax_gym.trainer.weights.broadcast import BroadcastTransport
    from relax_gym.trainer.weights.disk import DiskTransport
    from relax_gym.trainer.weights.tensor import TensorTransport
    from relax_gym.trainer.weights.transport import LiveWeights

    hidden, inter, layers = SHAPES[size]
    model = build_tiny_model("qwen3", work / f"m-{size}", seed=0, tokenizer="tiny-bpe", hidden_size=hidden,
                             intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=hidden // 64,
                             num_key_value_heads=max(1, hidden // 128), head_dim=64)
    backend = TorchBackend(model)
    named = list(backend.named_weights())
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    key = "bench-key"
    engine = EmbeddedEngineProcess(model, threads=1, api_key=key, log_file=work / f"engine-{size}.log",
                                   startup_timeout_s=300)
    engine.start()
    version = 0
    out: dict[str, Any] = {"size": size, "megabytes": nbytes / 2**20, "tensors": len(named)}
    try:
        async with EngineClient(engine.url, api_key=key, timeout_s=600) as client:

            async def confirm(v: int) -> None:
                info = await client.model_info()
                if info.weight_version != str(v):
                    raise RuntimeError(f"engine reports {info.weight_version}, expected {v}")

            sync = BroadcastTransport(DistributedSyncConfig(timeout_s=600), api_key=key)
            start = time.perf_counter()
            await sync.ensure_group([engine.url])
            out["broadcast_group_setup_s"] = time.perf_counter() - start
            transports = (("disk", DiskTransport(work / f"push-{size}", api_key=key)),
                          ("shm", TensorTransport(api_key=key)),
                          ("tensor", TensorTransport(api_key=key, shared_memory=False)), ("broadcast", sync))
            for name, transport in transports:
                times = []
                for _ in range(repeats):
                    version += 1
                    start = time.perf_counter()
                    delivery = await transport.send(LiveWeights(backend), str(version), [engine.url])
                    await confirm(version)
                    times.append(time.perf_counter() - start)
                    assert not delivery.failed, delivery.failed
                median = statistics.median(times)
                out[f"{name}_s"] = median
                out[f"{name}_mb_per_s"] = out["megabytes"] / median
            await sync.close()
    finally:
        engine.stop()
    return out


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| model (MB fp32) | disk (s) | shm (s) | tensor, base64 body (s) | broadcast (s) | broadcast MB/s | "
             "group set-up (s) |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['megabytes']:.1f} | {r['disk_s']:.3f} | {r['shm_s']:.3f} | {r['tensor_s']:.3f} | "
                     f"{r['broadcast_s']:.3f} | "
                     f"{r['broadcast_mb_per_s']:.0f} | {r['broadcast_group_setup_s']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="xs,s,m,l", help=f"model sizes among {list(SHAPES)}")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    sizes = args.sizes.split(",")
    bad = [s for s in sizes if s not in SHAPES]
    if bad:
        parser.error(f"unknown sizes {bad}; choose from {list(SHAPES)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-weight-sync-") as tmp:
        for size in sizes:
            row = asyncio.run(measure(size, args.repeats, Path(tmp)))
            rows.append(row)
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
