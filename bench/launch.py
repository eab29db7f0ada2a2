"""Engine start-up and SGLang validation timings (issue 19's figures).

    python bench/launch.py --repeats 3
    RELAX_GYM_SGLANG_PATH=/path/to/sglang-target python bench/launch.py --repeats 3 --validation

* **time to healthy**: ``EngineFleet.launch_one`` (the code path ``relax-gym train`` and the
  control API's scale-out use) for a tiny Qwen3 with the real 151k-token tokenizer and a tiny
  Qwen3-VL with the offline BPE, from the call to a passing ``/health``; median over
  ``--repeats``, each start followed by a stop;
* **validation module** (``--validation``): the wall time of ``pytest -m "slow or not slow"
  tests/engines/test_sglang_compat.py`` against the sglang found by ``RELAX_GYM_SGLANG_PATH``.

The load average is printed beside the figures: the box is often shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def time_to_healthy(kind: str, repeats: int, threads: int) -> list[float]:
    from relax_gym.trainer.config import EngineConfig
    from relax_gym.trainer.engines.fleet import EngineFleet
    from relax_gym.trainer.models import build_tiny_model

    times = []
    with tempfile.TemporaryDirectory(prefix="bench-launch-") as tmp:
        tokenizer = "qwen3" if kind == "qwen3" else "tiny-bpe"
        model = build_tiny_model(kind, Path(tmp) / "model", seed=0, tokenizer=tokenizer)
        for i in range(repeats):
            fleet = EngineFleet(EngineConfig(kind="embedded", num_engines=1, threads=threads), model,
                                Path(tmp) / f"logs{i}")
            start = time.perf_counter()
            try:
                fleet.launch_one()
                times.append(time.perf_counter() - start)
            finally:
                fleet.stop()
    return times


def validation_module() -> float | None:
    if not os.environ.get("RELAX_GYM_SGLANG_PATH"):
        print("--validation needs RELAX_GYM_SGLANG_PATH (see .ci/run for the install)", file=sys.stderr)
        return None
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "slow or not slow",
                           "tests/engines/test_sglang_compat.py"], cwd=ROOT, capture_output=True, text=True,
                          timeout=1800)
    took = time.perf_counter() - start
    print(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:])
    return took if done.returncode == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--validation", action="store_true", help="also time the SGLang compatibility module")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args()
    out: dict[str, object] = {"load_before": os.getloadavg()[0]}
    for kind in ("qwen3", "qwen3_vl"):
        times = time_to_healthy(kind, args.repeats, args.threads)
        out[f"healthy_s/{kind}"] = {"median": round(statistics.median(times), 2), "all": [round(t, 2) for t in times]}
        print(f"embedded {kind}: time to healthy median {statistics.median(times):.2f} s over {len(times)}")
    if args.validation:
        took = validation_module()
        out["validation_module_s"] = None if took is None else round(took, 1)
        print(f"SGLang validation module: {took if took is None else round(took, 1)} s")
    out["load_after"] = os.getloadavg()[0]
    print(json.dumps(out))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
