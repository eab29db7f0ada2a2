"""Colocate against fully_async (embedded and Ray runtimes) on the same workload, in one run.

    python bench/modes.py [--steps 16] [--rounds 2] [--runs colocate,async,async-proc,ray] [--out /tmp/bench-modes]
                          [--plot docs/modes_timeline.png] [--json results.json]

The workload: a tiny random Qwen3 (tiny BPE vocabulary) learning a one-turn text task with GRPO
("reply with vowels": the reward is the fraction of vowels among the reply's letters, success is
at least three quarters), one embedded engine with 1 torch thread, a trainer with 1 torch thread. Every run
uses the same model, seed, data order and hyperparameters; only ``mode`` / ``async_rl.runtime``
differ (``async`` is the default embedded runtime, every role in one process; ``async-proc``
sets ``async_rl.learner_process=true``: the learner in a child process of its own).

Reported, from each run's metrics:

* colocate's rollout time R (rollout + reward) and train time T (logprob + train + weight sync)
  per step (medians), its step time, and the ideal overlap bound (R+T)/max(R,T);
* fully_async's step time (wall time between two trained batches, steady state: the first step
  is left out of every mean), the speed-up over colocate and its fraction of the bound;
* held-out success (greedy, 64 episodes) at the start and the end of each run, with a 95% Wilson
  interval, so "the same final success rate within noise" can be read off;
* every figure is the median over ``--rounds`` repetitions run in alternating order (the machine
  is shared: its load drifts), with the load average before and after each run;
* the Ray runtime's step time against the embedded runtime's (its overhead), and its start-up.

``--plot`` draws the step timeline (engine and trainer lanes) of the colocate and fully_async
runs. The figures in docs/benchmarks.md come from this script.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import relax_gym
from relax_gym import Action, Message, Observation

ENV_ID = "bench/Vowels-v0"


class VowelsEnv(relax_gym.Env):
    """Bench-only one-turn task; the reward is the fraction of vowels among the reply's letters."""

    max_turns = 1

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):  # type: ignore[override]
        super().reset(seed=seed)
        n = int(self.np_random.integers(0, 1000))
        return Observation([Message.user(f"Task {n}: reply with vowels only.")]), {}

    def step(self, action: Action | str):  # type: ignore[override]
        letters = [ch for ch in Action.coerce(action).text.lower() if ch.isalpha()]
        score = sum(ch in "aeiou" for ch in letters) / max(1, len(letters))
        return Observation([]), float(score), True, False, {"success": score >= 0.75}


if ENV_ID not in relax_gym.registration.registry:
    relax_gym.register(ENV_ID, VowelsEnv, max_turns=1, modalities=["text"], description="bench/modes.py task")

# widened so that one training step costs about as much as one rollout step on 1 thread each
MODEL = {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 64}


def base_config(model: Path, out: Path, steps: int) -> dict[str, Any]:
    return {
        "run_name": out.name, "output_dir": str(out), "seed": 11, "threads": 1,
        "model": {"path": str(model)},
        "engine": {"kind": "embedded", "num_engines": 1, "threads": 1, "sync": "tensor"},
        "data": {"envs": [{"id": ENV_ID}]},
        "rollout": {"group_size": 8, "prompts_per_step": 4, "concurrency": 64, "max_new_tokens": 24,
                    "max_total_tokens": 128},
        "algorithm": {"advantage_estimator": "grpo", "rollout_correction": "tis"},
        "train": {"steps": steps, "lr": 1e-3, "micro_batch_size": 32},
        "eval": {"every": 0, "episodes": 64, "at_start": True},
        "checkpoint": {"every": 0, "export_hf": False},
        "logging": {"progress": "none", "tensorboard": False, "dump_samples": 0, "plot": False},
        "async_rl": {"max_staleness": 1, "imports": ["bench.modes"]},
    }


def run_one(model: Path, root: Path, kind: str, steps: int, round_: int = 0) -> dict[str, Any]:
    import os

    from relax_gym.trainer.config import config_from_dict
    from relax_gym.trainer.modes.async_runner import train

    out = root / f"{kind}-r{round_}"
    raw = base_config(model, out, steps)
    if kind == "colocate":
        raw["mode"] = "colocate"
    else:
        raw["mode"] = "fully_async"
        if kind == "async-proc":  # the embedded runtime with the learner in a child process of its own
            raw["async_rl"]["learner_process"] = True
        if kind == "ray":
            raw["async_rl"].update({"runtime": "ray", "ray": {"num_cpus": 2, "trainer": {"num_cpus": 1},
                                                              "engine": {"num_cpus": 1}}})
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    summary = train(config_from_dict(raw))
    total = time.perf_counter() - start
    load_after = os.getloadavg()[0]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train_rows = [r for r in rows if r["phase"] == "train"]
    return {"kind": kind, "out": str(out), "total_s": total, "rows": train_rows, "load": (load_before, load_after),
            "first_eval": summary.first_eval, "final_eval": summary.final_eval,
            "first_step_at_s": train_rows[0]["elapsed_s"] - train_rows[0].get("time/step_wall",
                                                                                train_rows[0].get("time/step", 0))}


def wilson(p: float, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def summarize(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per kind: medians over rounds of the steady-state means (the first step of a run pays for
    warm-up and is left out)."""
    out: dict[str, Any] = {}
    for kind, runs in results.items():
        key = "time/step" if kind == "colocate" else "time/step_wall"
        steps = [statistics.mean(r[key] for r in res["rows"][1:]) for res in runs]
        entry: dict[str, Any] = {"step_s": statistics.median(steps), "step_s_rounds": steps,
                                 "total_s": [res["total_s"] for res in runs],
                                 "first_step_at_s": [res["first_step_at_s"] for res in runs],
                                 "load": [res["load"] for res in runs]}
        rows = [r for res in runs for r in res["rows"][1:]]
        if kind == "colocate":
            entry["R_s"] = statistics.median(r.get("time/rollout", 0) + r.get("time/reward", 0) for r in rows)
            entry["T_s"] = statistics.median(r.get("time/logprob", 0) + r.get("time/train", 0) + r.get("time/sync", 0)
                                             for r in rows)
        else:
            entry["staleness_mean"] = statistics.mean(r["staleness/mean"] for r in rows)
            entry["off_policy_token_frac"] = statistics.mean(r.get("staleness/off_policy_token_frac", 0) for r in rows)
            entry["train_s"] = statistics.median(r["time/train"] for r in rows)
            entry["sync_s"] = statistics.median(r["time/sync"] for r in rows if "time/sync" in r)
        for tag in ("first_eval", "final_eval"):
            evals = []
            for res in runs:
                ev = res[tag]
                n, p = int(ev.get("episodes", 0)), float(ev.get("success", 0.0))
                evals.append({"success": p, "ci95": wilson(p, n), "episodes": n, "reward": ev.get("reward_mean")})
            entry[tag] = evals
        out[kind] = entry
    if "colocate" in out:
        c = out["colocate"]
        c["bound"] = (c["R_s"] + c["T_s"]) / max(c["R_s"], c["T_s"])
        for kind in ("async", "async-proc", "ray"):
            if kind in out:
                out[kind]["speedup"] = c["step_s"] / out[kind]["step_s"]
                out[kind]["fraction_of_bound"] = out[kind]["speedup"] / c["bound"]
    if "async" in out and "ray" in out:
        out["ray"]["overhead_vs_embedded"] = out["ray"]["step_s"] / out["async"]["step_s"] - 1.0
    return out


def plot(results: dict[str, dict[str, Any]], path: Path, window_s: float = 30.0) -> None:
    """``results``: one run per kind (the last round's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lanes = [k for k in ("colocate", "async", "async-proc", "ray") if k in results]
    fig, axes = plt.subplots(len(lanes), 1, figsize=(11, 2.1 * len(lanes)), sharex=True, squeeze=False)
    colors = {"rollout": "#4C72B0", "train": "#DD8452"}
    titles = {"async": "fully_async, embedded runtime (max_staleness 1): rollout groups overlap training",
              "async-proc": "fully_async, embedded runtime, learner_process=true: the trainer in its own process",
              "ray": "fully_async, Ray runtime (max_staleness 1): the trainer in its own actor process"}
    for ax, kind in zip(axes[:, 0], lanes, strict=True):
        if kind == "colocate":
            rows = results["colocate"]["rows"]
            for r in rows[1:]:
                end = r["elapsed_s"] - rows[1]["elapsed_s"] + rows[1]["time/step"]
                start = end - r["time/step"]
                roll = r.get("time/rollout", 0) + r.get("time/reward", 0)
                ax.broken_barh([(start, roll)], (10, 8), color=colors["rollout"])
                ax.broken_barh([(start + roll, r["time/step"] - roll)], (0, 8), color=colors["train"])
            ax.set_title("colocate: generate, then train (engine idle while training)", fontsize=10)
            continue
        timeline = json.loads((Path(results[kind]["out"]) / "timeline.json").read_text())
        t0 = timeline["train"][1][0] if len(timeline["train"]) > 1 else 0.0
        for a, b, _v in timeline["rollout"]:
            ax.broken_barh([(a - t0, b - a)], (10, 8), color=colors["rollout"], alpha=0.35)
        for a, b, _v in timeline["train"]:
            ax.broken_barh([(a - t0, b - a)], (0, 8), color=colors["train"], edgecolor="white")
        ax.set_title(titles[kind], fontsize=10)
    axes = axes[:, 0]
    for ax in axes:
        ax.set_yticks([4, 14], ["trainer", "engine"])
        ax.set_xlim(0, window_s)
    axes[-1].set_xlabel("seconds (steady state, from step 2); engine lane: one bar per rollout group")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def markdown(summary: dict[str, Any]) -> str:
    lines = ["| run | step (s) | R (s) | T (s) | bound | speed-up | of bound | held-out success start -> end [95% CI] |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    c = summary.get("colocate", {})
    for kind in ("colocate", "async", "async-proc", "ray"):
        if kind not in summary:
            continue
        e = summary[kind]
        success = "; ".join(f"{a['success']:.2f} -> {b['success']:.2f} [{b['ci95'][0]:.2f}, {b['ci95'][1]:.2f}]"
                            for a, b in zip(e["first_eval"], e["final_eval"], strict=True))
        of_bound = format(e["fraction_of_bound"], ".0%") if "fraction_of_bound" in e else "-"
        lines.append(
            f"| {kind} | {e['step_s']:.2f} | {c.get('R_s', float('nan')):.2f} | {c.get('T_s', float('nan')):.2f} | "
            f"{c.get('bound', float('nan')):.2f} | {e.get('speedup', 1.0):.2f} | {of_bound} | {success} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--runs", default="colocate,async,ray")
    parser.add_argument("--rounds", type=int, default=2, help="repeat the runs, alternating their order")
    parser.add_argument("--out", default="/tmp/bench-modes")
    parser.add_argument("--plot", default=None, help="write the step-timeline PNG here")
    parser.add_argument("--json", default=None, help="write the summary JSON here")
    args = parser.parse_args(argv)
    import shutil

    # the runs (and Ray's actors) import this file as `bench.modes` to register the task
    repo = str(Path(__file__).resolve().parents[1])
    if repo not in sys.path:
        sys.path.insert(0, repo)

    from relax_gym.trainer.models import build_tiny_model

    root = Path(args.out)
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    model = build_tiny_model("qwen3", root / "model", seed=0, tokenizer="tiny-bpe", **MODEL)
    kinds = args.runs.split(",")
    results: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        # alternate the order, so a machine whose load drifts favours no run
        for kind in kinds if r % 2 == 0 else list(reversed(kinds)):
            res = run_one(model, root, kind, args.steps, r)
            results[kind].append(res)
            print(f"round {r} {kind}: {res['total_s']:.1f} s (load {res['load'][0]:.1f} -> {res['load'][1]:.1f})",
                  flush=True)
    summary = summarize(results)
    print(json.dumps(summary, indent=2))
    print(markdown(summary))
    if args.plot:
        plot({k: v[-1] for k, v in results.items()}, Path(args.plot))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
