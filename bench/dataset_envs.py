"""Dataset envs and MCP tools, measured in one run (docs/benchmarks.md, "Datasets and MCP").

    python bench/dataset_envs.py                   # 1M rows, 2000 resets, 300 tool calls
    python bench/dataset_envs.py --rows 100000 --resets 500 --calls 100 --json

1. Writes a Parquet file of ``--rows`` rows (a question, an answer and an image *path*; the
   paths cycle over 256 small PNG files next to it) into a temp folder.
2. Opens it as ``relax/Dataset-v0`` in a fresh cache folder: the time to open (Arrow
   conversion, the missing-media check over every row, the first rows built) and again from
   the cache.
3. Resets/s on seeds spread over the whole file (each reset reads its row and decodes its PNG),
   against ``relax/SceneQuery-v0`` (which renders its image) on the same seeds.
4. Peak RSS of the process (``ru_maxrss``).
5. Tool-call latency, p50/p99, interleaved: ``add`` on a stdio MCP server written with the SDK
   (``tests/tools/mcp_server.py``) against our built-in ``calculator`` (both through
   ``Tool.ainvoke``, as ``ToolEnv`` calls them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def write_parquet(folder: Path, rows: int) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    (folder / "img").mkdir()
    for i in range(256):
        Image.new("RGB", (64, 64), (i, 255 - i, (7 * i) % 256)).save(folder / "img" / f"{i}.png")
    path = folder / "rows.parquet"
    writer = None
    chunk = 100_000
    for lo in range(0, rows, chunk):
        n = min(chunk, rows - lo)
        idx = range(lo, lo + n)
        table = pa.table({
            "question": [f"What colour is picture {i}?" for i in idx],
            "answer": [str(i % 256) for i in idx],
            "image": [f"img/{i % 256}.png" for i in idx],
        })
        writer = writer or pq.ParquetWriter(str(path), table.schema)
        writer.write_table(table)
    assert writer is not None
    writer.close()
    return path


def resets_per_s(env: Any, seeds: list[int]) -> float:
    start = time.perf_counter()
    for s in seeds:
        env.reset(seed=s)
    return len(seeds) / (time.perf_counter() - start)


async def tool_latency(calls: int) -> dict[str, dict[str, float]]:
    from relax_gym.tools import calculator
    from relax_gym.tools.mcp import mcp_tools

    server = [{"name": "bench", "command": [sys.executable, str(ROOT / "tests/tools/mcp_server.py")], "timeout_s": 30}]
    add = next(t for t in mcp_tools(server) if t.name == "add")
    times: dict[str, list[float]] = {"mcp_stdio_add": [], "builtin_calculator": []}
    for _ in range(10):  # warm both
        await add.ainvoke({"a": 1, "b": 2})
        await calculator.ainvoke({"expression": "1+2"})
    for i in range(calls):
        pair = [("mcp_stdio_add", add, {"a": i, "b": 2}), ("builtin_calculator", calculator, {"expression": f"{i}+2"})]
        for name, tool, args in (pair if i % 2 == 0 else pair[::-1]):
            t0 = time.perf_counter()
            result = await tool.ainvoke(args)
            times[name].append(time.perf_counter() - t0)
            assert not result.is_error, result.text
    return {k: {"p50_ms": 1000 * pct(v, 0.5), "p99_ms": 1000 * pct(v, 0.99), "mean_ms": 1000 * statistics.mean(v)}
            for k, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--resets", type=int, default=2000)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import relax_gym

    out: dict[str, Any] = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
                           "load_avg_start": os.getloadavg()[0], "rows": args.rows}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        path = write_parquet(folder, args.rows)
        out["write_s"] = time.perf_counter() - t0
        out["file_mb"] = path.stat().st_size / 2**20
        kwargs = {"path": str(path), "prompt": "question", "image": "image", "cache_dir": str(folder / "cache")}
        t0 = time.perf_counter()
        env = relax_gym.make("relax/Dataset-v0", **kwargs)
        out["open_s"] = time.perf_counter() - t0
        from relax_gym.envs.dataset_source import _SOURCES

        _SOURCES.clear()  # open again: the Arrow cache is there now
        t0 = time.perf_counter()
        env = relax_gym.make("relax/Dataset-v0", **kwargs)
        out["open_cached_s"] = time.perf_counter() - t0
        stride = max(1, args.rows // args.resets)
        seeds = [i * stride + 7 for i in range(args.resets)]
        out["dataset_resets_per_s"] = resets_per_s(env, seeds)
        shipped = relax_gym.make("relax/SceneQuery-v0", difficulty="single")
        out["scenequery_resets_per_s"] = resets_per_s(shipped, seeds)
        out["dataset_resets_per_s_again"] = resets_per_s(env, seeds)
        out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["tools"] = asyncio.run(tool_latency(args.calls))
    out["load_avg_end"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(out, indent=2))
    print(f"| measure | value |\n| --- | ---: |")
    print(f"| rows / file size | {out['rows']:,} / {out['file_mb']:.1f} MB |")
    print(f"| open (first: Arrow conversion + media check) | {out['open_s']:.1f} s |")
    print(f"| open (from the Arrow cache) | {out['open_cached_s']:.1f} s |")
    print(f"| dataset env resets/s (row + PNG decode) | {out['dataset_resets_per_s']:.0f} (again: {out['dataset_resets_per_s_again']:.0f}) |")
    print(f"| relax/SceneQuery-v0 resets/s (renders its image) | {out['scenequery_resets_per_s']:.0f} |")
    print(f"| peak RSS | {out['peak_rss_mb']:.0f} MB |")
    for name, t in out["tools"].items():
        print(f"| {name} latency p50 / p99 | {t['p50_ms']:.2f} / {t['p99_ms']:.2f} ms |")
    print(f"\nload average {out['load_avg_start']:.1f} at the start, {out['load_avg_end']:.1f} at the end; {out['machine']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
