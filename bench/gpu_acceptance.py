"""GPU acceptance of the megatron trainer path, one stage at a time (see gpu_acceptance.sh).

For a random Qwen3-0.6B-shaped model and a Qwen3-VL-2B-shaped model (built from config, nothing
downloaded) it:

1. **build** -- writes the HF folder;
2. **engine** -- starts an SGLang server with our launcher (``relax-gym engine sglang``); with
   ``--dry-run-cpu`` the run starts the embedded engine itself;
3. **train** -- runs ``--steps`` GRPO steps through ``relax-gym train`` with ``backend: megatron``
   under torchrun and ``engine.sync: distributed`` (NCCL on GPUs, gloo on CPU): weights go from
   the Megatron shards to the engine after every step;
4. **check** -- the engine's logprobs of the sampled tokens against the trainer's after a sync
   (``train/rollout_gap_max`` of the steps after the first, fp32), within ``--tol``;

then prints one table: step time, train tokens/s, sync time, logprob mismatch and peak memory.
A failing stage exits 1 with ``FAILED at stage <name> (<model>): <why>``.

    python bench/gpu_acceptance.py                 # GPUs (bash bench/gpu_acceptance.sh)
    python bench/gpu_acceptance.py --dry-run-cpu   # tiny models, CPU shim, embedded engine
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]

#: (name, kind, env, text-config overrides at full shape); the VL language model is shortened
#: to 8 layers as in gpu_megatron.py, so both fit one GPU beside SGLang
MODELS: list[tuple[str, str, str, dict[str, Any]]] = [
    ("qwen3-0.6b-shaped", "qwen3", "relax/ArithmeticWord-v0",
     {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
      "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": True}),
    ("qwen3-vl-2b-shaped", "qwen3_vl", "relax/ClockReading-v0",
     {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 8, "num_attention_heads": 16,
      "num_key_value_heads": 8, "head_dim": 128}),
]


class StageError(RuntimeError):
    def __init__(self, stage: str, model: str, why: str) -> None:
        super().__init__(f"FAILED at stage {stage} ({model}): {why}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the engine exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2.0)
    raise RuntimeError(f"no /health from {url} within {timeout_s:.0f} s")


def _config(model_dir: Path, out: Path, env_id: str, *, dry: bool, tp: int, steps: int,
            engine_url: str | None) -> dict[str, Any]:
    engine: dict[str, Any] = {"sync": "distributed",
                              "distributed": {"backend": "gloo" if dry else "nccl", "ranks_per_engine": 1}}
    if engine_url:
        engine.update(kind="external", urls=[engine_url])
    else:
        engine.update(threads=1)
    return {
        "run_name": "gpu-acceptance", "output_dir": str(out), "seed": 0, "device": "cpu" if dry else "cuda",
        "threads": 1 if dry else None, "backend": "megatron",
        "megatron": {"tensor_parallel_size": tp, "params_dtype": "float32"},
        "model": {"path": str(model_dir)},
        "engine": engine,
        "data": {"envs": [{"id": env_id}]},
        "rollout": {"group_size": 4, "prompts_per_step": 2 if dry else 8, "max_new_tokens": 8 if dry else 128,
                    "concurrency": 16},
        "algorithm": {"policy_loss": "gspo", "loss_agg_mode": "seq-mean-token-mean"},
        "train": {"steps": steps, "lr": 1e-5, "micro_batch_size": 4},
        "eval": {"every": 0, "episodes": 1, "at_start": False},
        "checkpoint": {"every": 0, "export_hf": False},
        "logging": {"progress": "none", "tensorboard": False, "plot": False, "dump_samples": 0},
    }


def run_model(name: str, kind: str, env_id: str, shape: dict[str, Any], work: Path, *, dry: bool, tp: int,
              steps: int, tol: float, timeout_s: float) -> dict[str, Any]:
    from relax_gym.trainer.models import build_tiny_model

    stage = "build"
    engine: subprocess.Popen[bytes] | None = None
    try:
        model_dir = build_tiny_model(kind, work / name / "model", seed=0,
                                     tokenizer="tiny-bpe" if dry else "qwen3", **({} if dry else shape))
        stage = "engine"
        url = None
        if not dry:
            port = _free_port()
            url = f"http://127.0.0.1:{port}"
            engine = subprocess.Popen([sys.executable, "-m", "relax_gym.cli.main", "engine", "sglang", "--model",
                                       str(model_dir), "--port", str(port), "--mem-fraction-static", "0.3",
                                       "--log-file", str(work / name / "sglang.log")])
            _wait_healthy(url, engine, 300)
        stage = "train"
        cfg = _config(model_dir, work / name / "run", env_id, dry=dry, tp=tp, steps=steps, engine_url=url)
        cfg_path = work / name / "train.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if dry:
            env["RELAX_MEGATRON_CPU_SHIM"] = "1"
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={tp}", "--master-addr=127.0.0.1",
               f"--master-port={_free_port()}", "-m", "relax_gym.cli.main", "train", str(cfg_path)]
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            tail = [line for line in proc.stderr.strip().splitlines() if line.strip()][-3:]
            raise RuntimeError(f"relax-gym train exited {proc.returncode}: {' | '.join(tail)}")
        stage = "check"
        records = [json.loads(line) for line in (work / name / "run" / "metrics.jsonl").read_text().splitlines()]
        train = [r for r in records if r["phase"] == "train"]
        if len(train) != steps:
            raise RuntimeError(f"{len(train)} train records for {steps} steps")
        after_sync = [r["train/rollout_gap_max"] for r in train[1:] if "train/rollout_gap_max" in r]
        mismatch = max(after_sync) if after_sync else float("nan")
        if not after_sync or mismatch > tol:
            raise RuntimeError(f"engine vs trainer logprob mismatch after a sync {mismatch:.2e} > {tol:.0e}")
        step_s = sorted(r["time/step"] for r in train)[len(train) // 2]
        tokens_s = sum(r["train/num_tokens"] for r in train) / max(1e-9, sum(r["time/train"] for r in train))
        sync_s = sorted(r.get("sync/seconds", 0.0) for r in train)[len(train) // 2]
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        return {"model": name, "tp": tp, "step_s": step_s, "train_tokens_s": tokens_s, "sync_s": sync_s,
                "logprob_mismatch": mismatch, "peak_host_rss_mb": peak_mb, "wall_s": wall}
    except subprocess.TimeoutExpired:
        raise StageError(stage, name, f"timed out after {timeout_s:.0f} s") from None
    except StageError:
        raise
    except Exception as exc:  # noqa: BLE001 - every failure is reported with its stage
        raise StageError(stage, name, str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    finally:
        if engine is not None:
            engine.terminate()
            engine.wait(timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run-cpu", action="store_true", help="tiny models on CPU (CI): checks the script")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--tp", type=int, default=None, help="tensor parallel size (default: 2 on CPU, GPUs on GPU)")
    parser.add_argument("--tol", type=float, default=1e-4, help="max engine vs trainer logprob mismatch (fp32)")
    parser.add_argument("--work", default=None, help="working folder (default: a temporary one)")
    parser.add_argument("--timeout", type=float, default=420.0, help="seconds per model's training run")
    args = parser.parse_args()
    import torch

    dry = args.dry_run_cpu
    if not dry and not torch.cuda.is_available():
        print("gpu_acceptance: no CUDA device visible (try --dry-run-cpu)", file=sys.stderr)
        return 2
    tp = args.tp or (2 if dry else max(1, min(2, torch.cuda.device_count())))
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="gpu-acceptance-"))
    rows = []
    try:
        for name, kind, env_id, shape in MODELS:
            rows.append(run_model(name, kind, env_id, shape, work, dry=dry, tp=tp, steps=args.steps,
                                  tol=args.tol, timeout_s=args.timeout))
    except StageError as exc:
        print(f"gpu_acceptance: {exc}", file=sys.stderr)
        return 1
    print("| model | TP | step s | train tokens/s | sync s | logprob mismatch | peak host RSS MB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['model']} | {r['tp']} | {r['step_s']:.2f} | {r['train_tokens_s']:.0f} | {r['sync_s']:.2f} | "
              f"{r['logprob_mismatch']:.1e} | {r['peak_host_rss_mb']:.0f} |")
    print(json.dumps({"dry_run_cpu": dry, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
