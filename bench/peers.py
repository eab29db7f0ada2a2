"""relax-gym against TRL's GRPOTrainer on the same CPU workload, interleaved in one run.

    python bench/peers.py [--workload vowels|vl] [--trl-python /work/trl-venv/bin/python] [--steps 20]
                          [--rounds 2] [--samples N] [--group N] [--max-new-tokens N] [--threads 1]
                          [--eval-every 5] [--runs relax,trl] [--out /tmp/bench-peers] [--json FILE]

TRL lives in a virtual environment of its own, never in relax-gym's dependencies (Pillow is for
``--workload vl``: without it transformers' image utilities do not import)::

    python3.11 -m venv /work/trl-venv && /work/trl-venv/bin/pip install torch==2.13.0 trl==1.16.0 pillow

**vowels** (the default): bench/modes.py's workload, a tiny random Qwen3 (hidden 256, 4 layers,
tiny BPE) built once, learning "reply with vowels" (reward: the fraction of vowels among the
reply's letters; success: at least three quarters) with GRPO, colocate; ``--samples 32 --group 8
--max-new-tokens 24`` unless given. Both sides get the same model folder, the same prompts (the
env's own, rendered by the model's chat template with relax-gym's ``enable_thinking: false``,
given to TRL as ``chat_template_kwargs`` and to the common evaluator; the run checks that TRL
tokenizes its first training prompt to relax-gym's ids: ``prompt_ids_match``), the same reward, the same hyperparameters
(AdamW lr 1e-3 constant, grad clip 1, groups of ``--group``, ``--samples`` per step in one
optimizer step, clip 0.2/0.28, token-mean loss, no KL, temperature 1) and the same torch threads
per compute process. relax-gym runs with its defaults otherwise (embedded engine, ``engine.sync:
auto``).

**vl**: the quickstart's image task (examples/quickstart.yaml): its tiny Qwen3-VL built from
config once, relax/SceneQuery-v0 ``single`` (name the colour of the one shape, answer in
``\\boxed{}``, 6 colours); ``--samples 64 --group 4 --max-new-tokens 8`` (16 prompts x 4) unless
given. The quickstart's supervised warm-up (oracle SFT until held-out success >= 0.25 at
temperature 1, checked every 2 steps; ``warmup.save_to``) runs once, untimed, and its HF folder
is the start of both sides, so learning outcomes compare from one model. Then GRPO with the
hyperparameters above (lr 1e-3 constant, grad clip 1, clip 0.2/0.28, no KL, temperature 1, one
optimizer step per 64 samples, micro-batch 64), the same reward (relax-gym: the env; TRL:
bench/peers_vl.py's rewrite of the env's grading, checked against the env on random strings
before each run), the same prompts (each seed's question and image as the env renders them, as
PNGs; chat template with relax-gym's ``enable_thinking: false``, given to TRL as
``chat_template_kwargs``; the run checks that TRL tokenizes its first training prompt to relax-
gym's ids: ``prompt_ids_match``) and the same threads. TRL cannot load the model's processor
itself (transformers' Qwen-VL processors import torchvision, which does not install beside the
CPU torch), so bench/peers_trl.py passes ``processing_class`` = transformers' own
``Qwen3VLProcessor`` built from the PIL image processor (``Qwen2VLImageProcessorPil``, the one
relax-gym's codec uses), no video processor, and the processor's type check skipped while it
is built (bench/peers_vl.py). The processor returns ``mm_token_type_ids`` and GRPOTrainer
forwards them to ``generate`` and to the training forward (M-RoPE needs them): no other patch.
TRL's ``save_model`` fails on the absent video processor, so its final model is written with
``model.save_pretrained`` plus the starting folder's tokenizer and processor files. The common
evaluator (``common_eval_vl``) runs transformers' model and processor on both final models,
greedy and also sampled at temperature 1 (fixed seed), graded by the env itself; the warmed-up
start is scored the same way (``common_eval_start``).

Reported per side (medians over the steps after the first, then over rounds; A,B,A,B order):
step time, generation time and completion tokens/s, the rest of the step ("train": logprobs,
loss, backward, optimizer, and weight sync for relax-gym), held-out success (greedy, 64
episodes with seeds never trained on, every ``--eval-every`` steps, evaluation time excluded)
and the training time until it first reached ``--target``, and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EVAL_SEED_START = 1_000_000_000
VL_ENV = {"id": "relax/SceneQuery-v0", "kwargs": {"difficulty": "single"}}  # examples/quickstart.yaml
TEMPLATE_KWARGS = {"enable_thinking": False}  # relax-gym's model.template_kwargs default, given to TRL too
# per workload: --samples, --group, --max-new-tokens
DEFAULTS = {"vowels": (32, 8, 24), "vl": (64, 4, 8)}


def _import_modes() -> Any:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import bench.modes as modes

    return modes


def prompts(seeds: range) -> list[dict[str, Any]]:
    """The env's first observation for each seed, as chat messages (what TRL trains on)."""
    modes = _import_modes()
    env = modes.VowelsEnv()
    rows = []
    for s in seeds:
        obs, _ = env.reset(seed=s)
        rows.append({"prompt": [{"role": m.role, "content": m.text} for m in obs.messages]})
    return rows


def _scene_env() -> Any:
    import relax_gym

    return relax_gym.make(VL_ENV["id"], **VL_ENV["kwargs"])


def vl_rows(seeds: range, img_dir: Path) -> list[dict[str, Any]]:
    """The env's first observation for each seed as chat messages with an image placeholder
    where the env put its image (after the question, as relax-gym renders it), the image as a
    PNG, the right word and the allowed words (what TRL trains on and both sides are graded by)."""
    env = _scene_env()
    img_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for s in seeds:
        obs, _ = env.reset(seed=s)
        msgs, images = [], []
        for m in env.format_observation(obs, "hf"):
            content = []
            for part in m["content"]:
                if part["type"] == "image":
                    images.append(part["image"])
                    content.append({"type": "image"})
                else:
                    content.append({"type": "text", "text": part["text"]})
            msgs.append({"role": m["role"], "content": content})
        assert len(images) == 1, f"seed {s}: {len(images)} images"
        path = img_dir / f"{s}.png"
        images[0].save(path)  # lossless: both sides read the same pixels
        task = env.unwrapped.task
        rows.append({"seed": s, "prompt": msgs, "image": str(path), "answer": task.answer,
                     "options": list(env.unwrapped._options)})
    return rows


def check_scene_grading(n: int = 20_000) -> None:
    """bench/peers_vl.py's rewrite of SceneQuery's grading (TRL's reward) against the env's own
    matcher and grading, on random strings of box commands, braces, escapes and colour words."""
    import random

    from bench import peers_vl
    from relax_gym.answers import last_boxed

    env = _scene_env()
    env.reset(seed=0)
    task, options = env.unwrapped.task, list(env.unwrapped._options)
    pieces = ["\\boxed", "\\fbox", "{", "}", "\\{", "\\}", "\\\\", " ", "\n", "x", "\\boxedx", "\\text{",
              ".", "$", "\\", task.answer, task.answer.upper(),
              options[(options.index(task.answer) + 1) % len(options)]]
    rng = random.Random(0)
    for _ in range(n):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        env.reset(seed=0)
        _, reward, _, _, info = env.step(text)
        if (peers_vl.last_boxed(text) != last_boxed(text)
                or peers_vl.scene_score(text, task.answer, options) != (reward, bool(info["success"]))):
            raise RuntimeError(f"bench/peers_vl.py grades {text!r} unlike the env")


def warm_up(base: Path, root: Path, a: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    """The quickstart's supervised warm-up (oracle SFT until held-out success >= 0.25, its own
    evaluation) on ``base``, exported as the HF folder both sides start from."""
    from relax_gym.trainer.config import config_from_dict, read_yaml_file
    from relax_gym.trainer.modes.colocate import train

    raw = read_yaml_file(ROOT / "examples" / "quickstart.yaml")
    out, model = root / "warmup", root / "model"
    raw.update({"run_name": "warmup", "output_dir": str(out), "threads": a.threads, "model": {"path": str(base)},
                "engine": {"threads": a.threads}})
    raw["warmup"]["save_to"] = str(model)
    raw["checkpoint"] = {"every": 0, "export_hf": False}
    raw["logging"] = {"progress": "none", "tensorboard": False, "dump_samples": 0, "plot": False}
    start = time.perf_counter()
    train(config_from_dict(raw), rl=False)
    took = time.perf_counter() - start
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r for r in rows if r["phase"] == "warmup_eval" and "success" in r]
    return model, {"s": took, "steps": evals[-1]["step"] if evals else None,
                   "success": evals[-1]["success"] if evals else None}


def relax_config(model: Path, out: Path, a: argparse.Namespace) -> dict[str, Any]:
    modes = _import_modes()
    raw = modes.base_config(model, out, a.steps)
    raw["mode"] = "colocate"
    raw["threads"] = a.threads
    raw["engine"] = {"kind": "embedded", "num_engines": 1, "threads": a.threads,  # sync: auto (the default)
                     "placement": a.placement}
    raw["rollout"].update({"group_size": a.group, "prompts_per_step": a.samples // a.group,
                           "max_new_tokens": a.max_new_tokens, "max_total_tokens": a.max_new_tokens + 104,
                           "concurrency": max(64, a.samples)})
    raw["train"].update({"micro_batch_size": a.samples})
    raw["eval"] = {"every": a.eval_every, "episodes": 64, "at_start": True}
    raw["checkpoint"]["export_hf"] = True  # out/final_model, for the common evaluation
    if getattr(a, "workload", "vowels") == "vl":  # the quickstart's env and RL section, from the warmed-up model
        raw["data"] = {"envs": [VL_ENV]}
        raw["rollout"].pop("max_total_tokens")  # the image prompt is longer; the default bounds it
        raw["train"]["micro_batch_size"] = a.samples  # quickstart: 64, one micro-batch per step
    if a.eval_every <= 0:  # timing only (bench/scale.py): one held-out episode at the end, no export
        raw["eval"] = {"every": 0, "episodes": 1, "at_start": False}
        raw["checkpoint"]["export_hf"] = False
    return raw


def run_relax(model: Path, out: Path, a: argparse.Namespace) -> dict[str, Any]:
    from relax_gym.trainer.config import config_from_dict
    from relax_gym.trainer.modes.async_runner import train

    load = os.getloadavg()[0]
    start = time.perf_counter()
    train(config_from_dict(relax_config(model, out, a)))
    total = time.perf_counter() - start
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train_rows = [r for r in rows if r["phase"] == "train"]
    steps = []
    for r in train_rows:
        gen = r.get("time/rollout", 0.0) + r.get("time/reward", 0.0)
        steps.append({"step_s": r["time/step"], "gen_s": gen, "gen_tokens": _tokens(r),
                      "sync_s": r.get("time/sync", 0.0), "logprob_s": r.get("time/logprob", 0.0),
                      "train_s": r.get("time/train", 0.0)})
    # training time so far at each evaluation: the steps' own times (evaluations excluded)
    elapsed = {r["step"]: sum(s["step_s"] for s in steps[: r["step"]]) for r in train_rows}
    evals = [{"step": r["step"], "train_s": elapsed.get(r["step"], 0.0), "success": r["success"]}
             for r in rows if r["phase"] == "eval" and "success" in r]
    rewards = [r["rollout/reward_mean"] for r in train_rows if "rollout/reward_mean" in r]
    return {"steps": steps, "evals": evals, "total_s": total, "load": (load, os.getloadavg()[0]),
            "reward_last5": statistics.mean(rewards[-5:]) if rewards else None}


def _tokens(row: dict[str, Any]) -> float:
    """Completion tokens sampled in the step (episodes x mean sampled tokens)."""
    return float(row.get("rollout/response_tokens_mean", float("nan"))) * float(row.get("rollout/episodes", 0))


def run_trl(model: Path, out: Path, a: argparse.Namespace, train_rows: list[dict[str, Any]],
            heldout: list[dict[str, Any]]) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    vl = getattr(a, "workload", "vowels") == "vl"  # bench/scale.py passes no workload
    spec = {"model": str(model), "out": str(out), "seed": 11, "threads": a.threads,
            "reward": "scene" if vl else "vowels", "vision": vl,
            "chat_template_kwargs": TEMPLATE_KWARGS,
            "train": train_rows, "heldout": heldout, "eval_every": a.eval_every, "eval_at_start": a.eval_every > 0,
            "hp": {"steps": a.steps, "lr": 1e-3, "samples_per_step": a.samples, "group_size": a.group,
                   "max_new_tokens": a.max_new_tokens}}
    (out / "spec.json").write_text(json.dumps(spec))
    load = os.getloadavg()[0]
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([a.trl_python, str(ROOT / "bench" / "peers_trl.py"), str(out / "spec.json"),
                           str(out / "result.json")], env=env, capture_output=True, text=True, timeout=a.timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"TRL run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    res = json.loads((out / "result.json").read_text())
    evals = ([{"step": 0, "train_s": 0.0, "success": res["first_eval"]["success"]}] if res.get("first_eval") else [])
    evals += [{"step": e["step"], "train_s": e["train_s"], "success": e["success"]} for e in res["evals"]]
    rewards = [h["reward"] for h in res["logs"] if "reward" in h]
    return {"steps": res["steps"], "evals": evals, "total_s": res["total_s"], "load": (load, os.getloadavg()[0]),
            "reward_last5": statistics.mean(rewards[-5:]) if rewards else None,
            "first_prompt_ids": res.get("first_prompt_ids")}


def common_eval(model_dir: Path, heldout: list[dict[str, Any]], max_new_tokens: int) -> dict[str, float]:
    """Held-out success of a final model under one evaluator for both sides: the model's chat
    template, greedy ``generate`` (left-padded batches), the env's own reward and success."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    modes = _import_modes()
    env = modes.VowelsEnv()
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    wins, total = 0, 0.0
    for i in range(0, len(heldout), 32):
        chunk = heldout[i: i + 32]
        texts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False, **TEMPLATE_KWARGS)
                 for r in chunk]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id)
        for row in out[:, enc["input_ids"].shape[1]:]:
            env.reset(seed=0)
            _, reward, _, _, info = env.step(tok.decode(row, skip_special_tokens=True))
            total += reward
            wins += bool(info["success"])
    return {"success": wins / len(heldout), "reward": total / len(heldout)}


def common_eval_vl(model_dir: Path, heldout: list[dict[str, Any]], max_new_tokens: int) -> dict[str, float]:
    """common_eval's twin for the image task: transformers' Qwen3VLProcessor (without
    torchvision, bench/peers_vl.py) and model, ``generate`` on left-padded batches of 32, each
    reply graded by the env itself (reset to the row's seed, then ``step``). Greedy
    (``success``, ``reward``), and also sampled at temperature 1, four passes with fixed seeds
    averaged (``sampled_success``: the quickstart's own measure; one pass of 64 moves by
    +-0.1 between seeds)."""
    from PIL import Image

    from bench import peers_vl

    processor = peers_vl.build_processor(str(model_dir))
    model = peers_vl.load_model(str(model_dir)).eval()
    images = [Image.open(r["image"]).convert("RGB") for r in heldout]
    env = _scene_env()
    out: dict[str, float] = {}
    for prefix, seeds in (("", [None]), ("sampled_", [0, 1, 2, 3])):
        wins, total = 0, 0.0
        for seed in seeds:
            texts = peers_vl.replies(model, processor, heldout, images, max_new_tokens,
                                     template_kwargs=TEMPLATE_KWARGS, sample_seed=seed)
            for row, text in zip(heldout, texts, strict=True):
                env.reset(seed=row["seed"])
                _, reward, _, _, info = env.step(text)
                total += reward
                wins += bool(info["success"])
        n = len(heldout) * len(seeds)
        out[f"{prefix}success"], out[f"{prefix}reward"] = wins / n, total / n
    return out


def check_prompt_ids(model: Path, row: dict[str, Any], trl_ids: list[int] | None) -> bool | None:
    """Whether TRL tokenized the first training row as relax-gym's codec renders that seed."""
    if trl_ids is None:
        return None
    from relax_gym.chat import ChatCodec

    codec = ChatCodec.from_pretrained(str(model), template_kwargs=TEMPLATE_KWARGS)
    if "image" in row:
        env = _scene_env()
        obs, _ = env.reset(seed=row["seed"])
        ours = codec.prompt(env.format_observation(obs, "hf")).ids
    else:
        ours = codec.prompt(row["prompt"]).ids
    return list(ours) == list(trl_ids)


def summarize(runs: list[dict[str, Any]], target: float) -> dict[str, Any]:
    """Medians over rounds of each run's steady-state median (the first step pays for warm-up)."""

    def med(key: str) -> float:
        per_run = [statistics.median(s[key] for s in r["steps"][1:]) for r in runs]
        return statistics.median(per_run)

    tps = [sum(s["gen_tokens"] for s in r["steps"][1:]) / max(1e-9, sum(s["gen_s"] for s in r["steps"][1:]))
           for r in runs]
    reach = []
    for r in runs:
        hit = next((e for e in r["evals"] if e["success"] >= target), None)
        reach.append(hit["train_s"] if hit else None)
    out: dict[str, Any] = {"step_s": med("step_s"), "gen_s": med("gen_s"), "gen_tokens_per_s": statistics.median(tps),
                           "rest_s": statistics.median(statistics.median(s["step_s"] - s["gen_s"] for s in r["steps"][1:])
                                                       for r in runs),
                           "final_success": [r["evals"][-1]["success"] if r["evals"] else None for r in runs],
                           "common_eval": [r.get("common_eval") for r in runs],
                           "train_reward_last5": [r.get("reward_last5") for r in runs],
                           "time_to_target_s": reach, "total_s": [r["total_s"] for r in runs],
                           "load": [r["load"] for r in runs],
                           "step_s_rounds": [statistics.median(s["step_s"] for s in r["steps"][1:]) for r in runs]}
    if "sync_s" in runs[0]["steps"][0]:
        for key in ("sync_s", "logprob_s", "train_s"):
            out[key] = med(key)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="vowels", choices=["vowels", "vl"],
                   help="vowels: the tiny Qwen3 text task; vl: the quickstart's Qwen3-VL image task")
    p.add_argument("--trl-python", default="/work/trl-venv/bin/python")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--samples", type=int, default=None, help="samples per step (vowels 32, vl 64)")
    p.add_argument("--group", type=int, default=None, help="samples per prompt (vowels 8, vl 4)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="vowels 24, vl 8")
    p.add_argument("--threads", type=int, default=1, help="torch threads per compute process")
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--target", type=float, default=0.9, help="held-out success to time")
    p.add_argument("--runs", default="relax,trl")
    p.add_argument("--placement", default="auto", choices=["auto", "process", "in_process"],
                   help="relax-gym's engine.placement (auto: in the trainer's process for colocate)")
    p.add_argument("--timeout-s", type=float, default=3600.0)
    p.add_argument("--out", default="/tmp/bench-peers")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    for key, value in zip(("samples", "group", "max_new_tokens"), DEFAULTS[a.workload], strict=True):
        if getattr(a, key) is None:
            setattr(a, key, value)
    if a.samples % a.group:
        p.error("--samples must be a multiple of --group")
    import shutil

    modes = _import_modes()
    from relax_gym.trainer.models import build_tiny_model

    root = Path(a.out)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    warm: dict[str, Any] | None = None
    if a.workload == "vl":
        check_scene_grading()
        base = build_tiny_model("qwen3_vl", root / "model-base", seed=0, tokenizer="tiny-bpe",
                                image_min_pixels=4096, image_max_pixels=4096)  # examples/quickstart.yaml
        model, warm = warm_up(base, root, a)
        print(f"warm-up: {warm['steps']} SFT steps, held-out success {warm['success']} "
              f"(quickstart's evaluator), {warm['s']:.1f} s", flush=True)
        train_rows = vl_rows(range(a.steps * a.samples // a.group * 2), root / "images")
        heldout = vl_rows(range(EVAL_SEED_START, EVAL_SEED_START + 64), root / "images")
        evaluate = common_eval_vl
    else:
        model = build_tiny_model("qwen3", root / "model", seed=0, tokenizer="tiny-bpe", **modes.MODEL)
        train_rows = prompts(range(a.steps * a.samples // a.group * 2))
        heldout = prompts(range(EVAL_SEED_START, EVAL_SEED_START + 64))
        evaluate = common_eval
    start_eval = evaluate(model, heldout, a.max_new_tokens) if a.workload == "vl" else None
    kinds = a.runs.split(",")
    results: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    for r in range(a.rounds):
        for kind in kinds if r % 2 == 0 else list(reversed(kinds)):
            out = root / f"{kind}-r{r}"
            res = run_relax(model, out, a) if kind == "relax" else run_trl(model, out, a, train_rows, heldout)
            res["common_eval"] = evaluate(out / "final_model", heldout, a.max_new_tokens)
            if kind == "trl":
                res["prompt_ids_match"] = check_prompt_ids(model, train_rows[0], res.pop("first_prompt_ids"))
            results[kind].append(res)
            print(f"round {r} {kind}: step median {statistics.median(s['step_s'] for s in res['steps'][1:]):.2f} s, "
                  f"total {res['total_s']:.1f} s, final success {res['evals'][-1]['success'] if res['evals'] else '-'} "
                  f"(common evaluator {res['common_eval']['success']:.2f}, train reward last 5 {res['reward_last5']:.3f}) "
                  f"(load {res['load'][0]:.1f} -> {res['load'][1]:.1f})", flush=True)
    summary: dict[str, Any] = {k: summarize(v, a.target) for k, v in results.items()}
    if "trl" in results:
        summary["trl"]["prompt_ids_match"] = [r.get("prompt_ids_match") for r in results["trl"]]
    if a.workload == "vl":
        summary["warmup"] = warm
        summary["common_eval_start"] = start_eval
    if "relax" in summary and "trl" in summary:
        summary["ratio_step"] = summary["relax"]["step_s"] / summary["trl"]["step_s"]
        summary["ratio_step_rounds"] = [x / y for x, y in zip(summary["relax"]["step_s_rounds"],
                                                               summary["trl"]["step_s_rounds"], strict=True)]
    summary["args"] = vars(a)
    print(json.dumps(summary, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
