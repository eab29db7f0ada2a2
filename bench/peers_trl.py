"""TRL's GRPOTrainer on a task given as JSON: the peer side of bench/peers.py.

Runs in TRL's own virtual environment (it never imports relax_gym, whose venv does not hold
TRL), so bench/peers.py hands it everything as one JSON file::

    /work/trl-venv/bin/python bench/peers_trl.py spec.json result.json

The spec names the model folder, the training and held-out prompts (chat messages, the same
ones relax-gym's env produces), the reward ("vowels": the fraction of vowels among the reply's
letters, success at >= 0.75; "exact": the reply contains the answer; "scene": SceneQuery's
grading of the last ``\\boxed{}`` against the row's ``answer`` and ``options``, from
bench/peers_vl.py), the hyperparameters and the torch threads.

With ``"vision": true`` (bench/peers.py ``--workload vl``) each row also names a PNG
(``image``) that fills the prompt's ``{"type": "image"}`` placeholder, and the processor is
bench/peers_vl.py's ``Qwen3VLProcessor`` without torchvision (PIL image processor, no video
processor, the processor's class check skipped while it is built), passed to GRPOTrainer as
``processing_class``. Needs Pillow in TRL's venv (``pip install pillow``; without it
transformers' image utilities do not import). GRPOTrainer forwards the processor's
``mm_token_type_ids`` (Qwen3-VL's M-RoPE needs them) to ``generate`` and to the training
forward itself, so nothing is patched there. ``save_model`` would fail on the absent video
processor, so the final model is written with ``model.save_pretrained`` plus the starting
folder's tokenizer and processor files.

The result holds per-step wall times (step = generation + loss + backward + optimizer, as TRL's
loop runs them), the generation time and completion tokens of each step, and held-out success
(greedy) every ``eval_every`` steps with the training time spent so far (evaluation time
excluded).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


def vowels_score(text: str) -> float:
    letters = [ch for ch in text.lower() if ch.isalpha()]
    return sum(ch in "aeiou" for ch in letters) / max(1, len(letters))


def score(kind: str, text: str, answer: str | None, options: list[str] | None = None) -> float:
    if kind == "vowels":
        return vowels_score(text)
    if kind == "exact":
        return float(answer is not None and answer.lower() in text.lower())
    if kind == "scene":
        from peers_vl import scene_score

        return scene_score(text, answer or "", list(options or []))[0]
    raise ValueError(f"unknown reward {kind!r}")


def success(kind: str, value: float) -> bool:
    return value >= 0.75 if kind == "vowels" else value >= 1.0


def completion_text(completion: Any) -> str:
    if isinstance(completion, list):  # conversational: [{"role": "assistant", "content": ...}]
        parts = []
        for m in completion:
            c = m.get("content", "")
            parts.append(c if isinstance(c, str) else "".join(p.get("text", "") for p in c if isinstance(p, dict)))
        return "".join(parts)
    return str(completion)


def main(spec_path: str, result_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    import torch

    torch.set_num_threads(int(spec["threads"]))
    torch.manual_seed(int(spec["seed"]))
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    kind = spec["reward"]
    hp = spec["hp"]
    is_vision = bool(spec.get("vision"))

    def reward_fn(completions: list[Any], answer: list[str] | None = None, options: list[list[str]] | None = None,
                  **_: Any) -> list[float]:
        answers = answer if answer is not None else [None] * len(completions)
        opts = options if options is not None else [None] * len(completions)
        return [score(kind, completion_text(c), a, o) for c, a, o in zip(completions, answers, opts, strict=True)]

    rows = spec["train"]
    data: dict[str, list[Any]] = {"prompt": [r["prompt"] for r in rows], "answer": [r.get("answer", "") for r in rows]}
    if kind == "scene":
        data["options"] = [r["options"] for r in rows]
    if is_vision:
        from PIL import Image

        data["image"] = [Image.open(r["image"]).convert("RGB") for r in rows]
    dataset = Dataset.from_dict(data)
    if is_vision:  # transformers' own Qwen-VL processor, without torchvision (bench/peers_vl.py)
        from peers_vl import build_processor

        processing = build_processor(spec["model"])
    else:
        processing = AutoTokenizer.from_pretrained(spec["model"])
    tok = processing.tokenizer if is_vision else processing
    tok.padding_side = "left"
    config = GRPOConfig(
        output_dir=spec["out"], max_steps=int(hp["steps"]), learning_rate=float(hp["lr"]),
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, adam_epsilon=1e-8, max_grad_norm=1.0,
        per_device_train_batch_size=int(hp["samples_per_step"]), gradient_accumulation_steps=1,
        num_generations=int(hp["group_size"]), max_completion_length=int(hp["max_new_tokens"]),
        temperature=1.0, top_p=1.0, beta=0.0, epsilon=0.2, epsilon_high=0.28, loss_type="dapo",
        scale_rewards="group", num_iterations=1, seed=int(spec["seed"]), data_seed=int(spec["seed"]),
        use_cpu=True, bf16=False, fp16=False, logging_steps=1, save_strategy="no", report_to="none",
        disable_tqdm=True, dataloader_num_workers=0, shuffle_dataset=True, log_completions=False,
        chat_template_kwargs=spec.get("chat_template_kwargs"),
    )
    trainer = GRPOTrainer(model=spec["model"], reward_funcs=reward_fn, args=config, train_dataset=dataset,
                          processing_class=processing)
    model = trainer.model
    gen_log: list[tuple[float, int]] = []
    original_generate = model.generate

    def timed_generate(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = original_generate(*args, **kwargs)
        elapsed = time.perf_counter() - start
        ids = out.sequences if hasattr(out, "sequences") else out
        prompt_len = (kwargs.get("input_ids") if kwargs.get("input_ids") is not None else args[0]).shape[1]
        new = ids[:, prompt_len:]
        eos = set(tok.all_special_ids) if tok.eos_token_id is None else {tok.eos_token_id, tok.pad_token_id}
        tokens = 0
        for row in new.tolist():  # count up to and including the first end token
            n = 0
            for t in row:
                n += 1
                if t in eos:
                    break
            tokens += n
        gen_log.append((elapsed, tokens))
        return out

    model.generate = timed_generate  # type: ignore[method-assign]

    evals: list[dict[str, float]] = []
    steps: list[dict[str, float]] = []
    clock = {"train_s": 0.0, "begin": 0.0}

    def evaluate() -> dict[str, float]:
        heldout = spec["heldout"]
        wins, total = 0, 0.0
        if is_vision:
            from peers_vl import replies
            from PIL import Image

            images = [Image.open(r["image"]).convert("RGB") for r in heldout]
            texts = replies(model, processing, heldout, images, int(hp["max_new_tokens"]),
                            generate=original_generate, template_kwargs=spec.get("chat_template_kwargs"))
            for r, text in zip(heldout, texts, strict=True):
                value = score(kind, text, r.get("answer"), r.get("options"))
                total += value
                wins += success(kind, value)
            return {"success": wins / len(heldout), "reward": total / len(heldout)}
        model.eval()
        with torch.no_grad():
            for i in range(0, len(heldout), 32):
                chunk = heldout[i: i + 32]
                texts = [tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True,
                                                 **(spec.get("chat_template_kwargs") or {})) for r in chunk]
                enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
                out = original_generate(**enc, do_sample=False, max_new_tokens=int(hp["max_new_tokens"]),
                                        pad_token_id=tok.pad_token_id)
                for r, row in zip(chunk, out[:, enc["input_ids"].shape[1]:], strict=True):
                    value = score(kind, tok.decode(row, skip_special_tokens=True), r.get("answer"), r.get("options"))
                    total += value
                    wins += success(kind, value)
        model.train()
        return {"success": wins / len(heldout), "reward": total / len(heldout)}

    class Timing(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            clock["begin"] = time.perf_counter()
            clock["gen_mark"] = len(gen_log)

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            wall = time.perf_counter() - clock["begin"]
            clock["train_s"] += wall
            gens = gen_log[int(clock["gen_mark"]):]
            steps.append({"step_s": wall, "gen_s": sum(g for g, _ in gens), "gen_tokens": sum(n for _, n in gens)})
            every = int(spec.get("eval_every", 0))
            if every and state.global_step % every == 0:
                evals.append({"step": state.global_step, "train_s": clock["train_s"], **evaluate()})

    trainer.add_callback(Timing())
    # the first training row as GRPOTrainer tokenizes it (bench/peers.py compares it with ours)
    row = dataset[0]
    if is_vision:
        from trl.data_utils import prepare_multimodal_messages

        first_ids = processing.apply_chat_template(prepare_multimodal_messages(row["prompt"], images=[row["image"]]),
                                                   add_generation_prompt=True, tokenize=True, return_dict=True,
                                                   **(spec.get("chat_template_kwargs") or {}))["input_ids"][0]
    else:
        first_ids = tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True,
                                            return_dict=True, **(spec.get("chat_template_kwargs") or {}))["input_ids"]
    first_ids = [int(t) for t in first_ids]
    first = evaluate() if spec.get("eval_at_start", True) else None
    start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - start
    final = evals[-1] if evals and evals[-1]["step"] == int(hp["steps"]) else {
        "step": int(hp["steps"]), "train_s": clock["train_s"], **evaluate()}
    final_dir = Path(spec["out"]) / "final_model"  # for bench/peers.py's common evaluation
    if is_vision:  # save_model would save the processor too, which fails on its absent video processor
        import shutil

        trainer.model.save_pretrained(str(final_dir))
        for f in Path(spec["model"]).iterdir():  # tokenizer, chat template, image processor config
            if f.is_file() and not (final_dir / f.name).exists():
                shutil.copy2(f, final_dir / f.name)
    else:
        trainer.save_model(str(final_dir))
    logs = [h for h in trainer.state.log_history if "loss" in h]
    Path(result_path).write_text(json.dumps({
        "steps": steps, "evals": evals, "first_eval": first, "final_eval": final, "total_s": total,
        "logs": logs, "threads": torch.get_num_threads(), "first_prompt_ids": first_ids,
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
