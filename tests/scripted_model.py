"""Teach a tiny model to answer given prompts with given completions (a "scripted" model).

A random tiny model emits noise, which cannot exercise the paths that depend on what the model
says: tool calls parsed out of its reply, stop strings, a multi-turn episode that ends. This
fine-tunes the model (full parameters, Adam) on ``(prompt_ids, completion_ids)`` pairs until the
greedy continuation of every prompt is exactly its completion, then saves it as a new HF folder.
With hidden size 64 a few dozen short completions memorise in seconds on a CPU. Loss and logits
are computed only at completion positions, so the 151k-row output layer stays cheap.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from relax_gym.errors import RelaxGymError

from relax_gym.trainer.models._threads import torch_threads

if TYPE_CHECKING:
    import torch


class ScriptingFailed(RelaxGymError, RuntimeError):
    """The model did not reproduce every completion within the step budget."""


def _min_margin(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """Smallest (target logit - best other logit) over all positions; > 0 means greedy is right."""
    import torch

    target = logits.gather(1, targets[:, None]).squeeze(1)
    others = logits.scatter(1, targets[:, None], float("-inf")).amax(dim=1)
    return float(torch.min(target - others))


def teach_completions(
    model_dir: str | Path,
    out_dir: str | Path,
    examples: list[tuple[list[int], list[int]]],
    *,
    max_steps: int = 1000,
    lr: float = 3e-2,
    margin: float = 2.0,
    check_every: int = 10,
    train_embeddings: bool = False,
    seed: int = 0,
    threads: int | None = 1,
) -> Path:
    """Fine-tune a text model so greedy decoding of each prompt yields its completion.

    Training stops once every completion token wins its position by at least ``margin`` logits,
    so small numeric differences (batching, another engine) cannot flip a greedy choice. The
    (tied) embeddings stay frozen unless ``train_embeddings``: their dense gradient would cost
    more than everything else with a 151k vocabulary, and the rest of the model suffices.
    Raises :class:`ScriptingFailed` when the budget runs out. Returns ``out_dir``.
    """
    with torch_threads(threads):
        return _teach(
            Path(model_dir),
            Path(out_dir),
            examples,
            max_steps=max_steps,
            lr=lr,
            margin=margin,
            check_every=check_every,
            train_embeddings=train_embeddings,
            seed=seed,
        )


def _teach(
    model_dir: Path,
    out_dir: Path,
    examples: list[tuple[list[int], list[int]]],
    *,
    max_steps: int,
    lr: float,
    margin: float,
    check_every: int,
    train_embeddings: bool,
    seed: int,
) -> Path:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if not examples or any(not c for _, c in examples):
        raise ValueError("give at least one (prompt_ids, completion_ids) pair with a non-empty completion")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.train()
    seqs = [p + c for p, c in examples]
    length = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), length), dtype=torch.long)
    mask = torch.zeros((len(seqs), length), dtype=torch.long)
    rows, cols, targets = [], [], []
    for i, ((prompt, completion), seq) in enumerate(zip(examples, seqs, strict=True)):
        ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, : len(seq)] = 1
        for j, tok in enumerate(completion):
            rows.append(i)
            cols.append(len(prompt) + j - 1)  # the position whose logits predict this token
            targets.append(tok)
    rows_t, cols_t, targets_t = torch.tensor(rows), torch.tensor(cols), torch.tensor(targets)
    if not train_embeddings:
        model.get_input_embeddings().weight.requires_grad_(False)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)

    def completion_logits() -> torch.Tensor:
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        return model.lm_head(hidden[rows_t, cols_t])

    ok, worst = False, float("-inf")
    for step in range(1, max_steps + 1):
        loss = torch.nn.functional.cross_entropy(completion_logits(), targets_t)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % check_every == 0 or step == max_steps:
            with torch.no_grad():
                model.eval()
                worst = _min_margin(completion_logits(), targets_t)
                model.train()
            if worst >= margin:
                ok = True
                break
    if not ok:
        raise ScriptingFailed(
            f"completions not memorised after {max_steps} steps (loss {float(loss):.4f}, worst margin {worst:.3f})"
        )
    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(model_dir, out)
    for f in out.glob("*.safetensors*"):
        f.unlink()
    model.eval()
    model.save_pretrained(str(out))
    return out


__all__ = ["ScriptingFailed", "teach_completions"]
