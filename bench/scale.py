"""How the step time grows with samples per step and response length, relax-gym against TRL.

    python bench/scale.py [--grid 8x24,32x24,128x24,32x128,32x512] [--steps 4] [--rounds 1]
                          [--threads 1] [--trl-python /work/trl-venv/bin/python] [--json FILE]

Each grid point ``SxN`` is ``S`` samples per step (groups of 8) and ``N`` new tokens (the rows
of bench/peers.py's vowels workload, which this reuses: same model, prompts, reward and
hyperparameters; relax-gym on its defaults). Per point, the two sides run ``--steps`` steps
each, interleaved (A,B at even rounds, B,A at odd ones), with no held-out evaluation; the
figure is the median step time over steps 2.. (the first pays for warm-up), then over rounds,
with the generation part and the load average. The default grid holds the issue's corners:
8/32/128 samples at 24 tokens and 24/128/512 tokens at 32 samples.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def point(steps: list[dict[str, float]]) -> dict[str, float]:
    rest = steps[1:] or steps
    return {"step_s": statistics.median(s["step_s"] for s in rest), "gen_s": statistics.median(s["gen_s"] for s in rest),
            "gen_tok_s": sum(s["gen_tokens"] for s in rest) / max(1e-9, sum(s["gen_s"] for s in rest))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grid", default="8x24,32x24,128x24,32x128,32x512")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--placement", default="auto", choices=["auto", "process", "in_process"])
    p.add_argument("--runs", default="relax,trl")
    p.add_argument("--trl-python", default="/work/trl-venv/bin/python")
    p.add_argument("--timeout-s", type=float, default=3600.0)
    p.add_argument("--out", default="/tmp/bench-scale")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import bench.peers as peers
    from relax_gym.trainer.models import build_tiny_model

    root = Path(a.out)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    model = build_tiny_model("qwen3", root / "model", seed=0, tokenizer="tiny-bpe", **peers._import_modes().MODEL)
    heldout = peers.prompts(range(peers.EVAL_SEED_START, peers.EVAL_SEED_START + 1))
    kinds = a.runs.split(",")
    table: list[dict[str, Any]] = []
    for cell in a.grid.split(","):
        samples, tokens = (int(x) for x in cell.split("x"))
        if samples % a.group:
            p.error(f"{cell}: samples must be a multiple of --group")
        run_args = argparse.Namespace(steps=a.steps, samples=samples, group=a.group, max_new_tokens=tokens,
                                      threads=a.threads, eval_every=0, placement=a.placement,
                                      trl_python=a.trl_python, timeout_s=a.timeout_s)
        train_rows = peers.prompts(range(a.steps * samples // a.group * 2))
        got: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
        for r in range(a.rounds):
            for kind in kinds if r % 2 == 0 else list(reversed(kinds)):
                out = root / f"{cell}-{kind}-r{r}"
                res = (peers.run_relax(model, out, run_args) if kind == "relax"
                       else peers.run_trl(model, out, run_args, train_rows, heldout))
                got[kind].append({**point(res["steps"]), "load": res["load"]})
        row: dict[str, Any] = {"samples": samples, "tokens": tokens}
        for kind, rounds in got.items():
            row[kind] = {k: statistics.median(x[k] for x in rounds) for k in ("step_s", "gen_s", "gen_tok_s")}
            row[kind]["load"] = [x["load"] for x in rounds]
        if "relax" in row and "trl" in row:
            row["ratio_step"] = row["relax"]["step_s"] / row["trl"]["step_s"]
        table.append(row)
        print(json.dumps(row), flush=True)
    result = {"grid": table, "args": vars(a), "load_end": os.getloadavg()[0]}
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
