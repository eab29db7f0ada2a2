"""Latency of a trivial sandboxed ``run_python`` through the warm pool, against a fresh
``subprocess.run([python, "-c", ...])``, measured in the same run with the calls interleaved
(so machine load hits both alike).

    python bench/tools.py                      # 200 rounds, 20 ms between rounds
    python bench/tools.py --rounds 500 --gap-ms 0 --json

Each round times one pool call and the fresh-subprocess calls, in alternating order, with a
pause before each call that stands for the model turn separating two tool calls of an episode
(the pool refills meanwhile). A last series times pool calls in a tight loop, where refilling
competes with the calls for the CPU. Prints a Markdown table (``--json``: also raw figures).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

CODE = "print(1 + 1)"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarise(samples: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in samples]
    return {
        "p50_ms": percentile(ms, 0.50),
        "p90_ms": percentile(ms, 0.90),
        "p99_ms": percentile(ms, 0.99),
        "mean_ms": statistics.fmean(ms),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--gap-ms", type=float, default=20.0, help="pause between rounds (the model's turn)")
    ap.add_argument("--pool-size", type=int, default=2)
    ap.add_argument("--isolation", choices=["auto", "full", "rlimits"], default="auto")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from relax_gym.tools import SandboxPool

    pool = SandboxPool(size=args.pool_size, isolation=args.isolation).start()
    caps = pool.capabilities
    fresh_cmds = {
        "fresh subprocess": [sys.executable, "-c", CODE],
        "fresh subprocess, -I -S": [sys.executable, "-I", "-S", "-c", CODE],
    }

    def pool_call() -> float:
        t = time.perf_counter()
        r = pool.run(CODE, timeout_s=10)
        elapsed = time.perf_counter() - t
        if r.stdout != "2\n":
            raise SystemExit(f"pool call failed: {r}")
        return elapsed

    def fresh_call(cmd: list[str]) -> float:
        t = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
        elapsed = time.perf_counter() - t
        if out.stdout != "2\n":
            raise SystemExit(f"subprocess failed: {out}")
        return elapsed

    samples: dict[str, list[float]] = {"warm pool": [], **{k: [] for k in fresh_cmds}}
    tight = "warm pool, back-to-back (no pause: refills compete with calls)"
    try:
        for i in range(args.warmup + args.rounds):
            order = ["warm pool", *fresh_cmds] if i % 2 == 0 else [*fresh_cmds, "warm pool"]
            for name in order:
                if args.gap_ms:
                    time.sleep(args.gap_ms / 1000)
                elapsed = pool_call() if name == "warm pool" else fresh_call(fresh_cmds[name])
                if i >= args.warmup:
                    samples[name].append(elapsed)
        time.sleep(0.5)
        samples[tight] = [pool_call() for _ in range(args.rounds)]
    finally:
        pool.close()

    stats = {name: summarise(values) for name, values in samples.items()}
    base = stats["fresh subprocess"]["p50_ms"]
    load = os.getloadavg()
    meta: dict[str, Any] = {
        "rounds": args.rounds,
        "gap_ms": args.gap_ms,
        "pool_size": args.pool_size,
        "isolation": {k: v for k, v in caps.items() if k in ("network", "filesystem", "pid", "uid")},
        "cpus": os.cpu_count(),
        "loadavg_1m_at_end": round(load[0], 2),
        "python": platform.python_version(),
        "kernel": platform.release(),
    }
    print(f"{args.rounds} rounds, {args.gap_ms:g} ms gap, pool size {args.pool_size}, isolation {meta['isolation']}, "
          f"{meta['cpus']} CPUs, 1-min load average {meta['loadavg_1m_at_end']}")
    print()
    print("| variant | p50 (ms) | p90 (ms) | p99 (ms) | mean (ms) | p50 vs fresh subprocess |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, s in stats.items():
        ratio = base / s["p50_ms"] if s["p50_ms"] else float("nan")
        print(f"| {name} | {s['p50_ms']:.1f} | {s['p90_ms']:.1f} | {s['p99_ms']:.1f} | {s['mean_ms']:.1f} | {ratio:.2f}x |")
    if args.json:
        print(json.dumps({"meta": meta, "stats": stats}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
