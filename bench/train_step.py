"""The torch backend's training step against a plain torch loop over the same padded batch.

    python bench/train_step.py [--rows 32] [--prompt 20] [--response 24] [--group 1] [--repeats 5] [--threads 1]

Both sides: bench/modes.py's tiny Qwen3, ``--rows`` sequences of ``--prompt`` + ``--response``
tokens (random ids; response lengths vary by up to a quarter; with ``--group G`` each run of G
rows shares its prompt, as a GRPO group does), one forward with logprobs of the
response tokens, a policy-gradient loss (advantage x logprob, token mean), backward, gradient
clip and one AdamW step. The backend runs ``TorchBackend.train_step`` with relax-gym's PPO
objective (which forwards a shared prompt once: ``train.share_prompts``); the plain loop is the
textbook version (one padded forward, full-vocabulary log-softmax over every position, as most
trainers write it). Interleaved, medians reported with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--prompt", type=int, default=20)
    p.add_argument("--response", type=int, default=24)
    p.add_argument("--group", type=int, default=1, help="rows per shared prompt (1: every prompt distinct)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from bench.modes import MODEL
    from relax_gym.trainer.algorithms.config import AlgorithmConfig
    from relax_gym.trainer.backends.base import PolicyObjective
    from relax_gym.trainer.backends.base import SequenceBatch
    from relax_gym.trainer.backends.pytorch import TorchBackend
    from relax_gym.trainer.models import build_tiny_model

    torch.set_num_threads(a.threads)
    tmp = tempfile.TemporaryDirectory(prefix="bench-train-step-")
    model_dir = build_tiny_model("qwen3", Path(tmp.name) / "m", seed=0, tokenizer="tiny-bpe", **MODEL)
    gen = torch.Generator().manual_seed(0)
    lengths = [a.response - int(torch.randint(0, max(1, a.response // 4), (1,), generator=gen)) for _ in range(a.rows)]
    prompts = [torch.randint(3, 500, (a.prompt,), generator=gen).tolist() for _ in range(0, a.rows, a.group)]
    ids = [prompts[i // a.group] + torch.randint(3, 500, (n,), generator=gen).tolist() for i, n in enumerate(lengths)]
    mask = [[0] * a.prompt + [1] * n for n in lengths]
    adv = torch.randn(a.rows, generator=gen)

    backend = TorchBackend(model_dir, micro_batch_size=a.rows)
    objective = PolicyObjective(AlgorithmConfig(rollout_correction="tis"))  # bench/modes.py's

    def batch() -> SequenceBatch:
        b = SequenceBatch(input_ids=ids, loss_mask=mask)
        lp = backend.compute_logprobs(b).logprobs
        b.advantages = [torch.full((len(r),), float(adv[i])) for i, r in enumerate(ids)]
        b.rollout_logprobs = lp  # on-policy, one update: no old logprobs, as colocate trains
        return b

    plain = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    plain.train()
    opt = torch.optim.AdamW(plain.parameters(), lr=1e-6, weight_decay=0.0)
    width = max(len(r) for r in ids)
    x = torch.zeros((a.rows, width), dtype=torch.long)
    attn = torch.zeros((a.rows, width), dtype=torch.long)
    lm = torch.zeros((a.rows, width), dtype=torch.bool)
    for i, r in enumerate(ids):
        x[i, : len(r)] = torch.tensor(r)
        attn[i, : len(r)] = 1
        lm[i, : len(r)] = torch.tensor(mask[i], dtype=torch.bool)

    def plain_step() -> None:
        opt.zero_grad(set_to_none=True)
        logits = plain(input_ids=x, attention_mask=attn).logits[:, :-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, x[:, 1:, None]).squeeze(-1)
        m = lm[:, 1:].float()
        loss = -(adv[:, None] * logp * m).sum() / m.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(plain.parameters(), 1.0)
        opt.step()

    b = batch()
    backend.train_step(b, objective)  # warm-up
    plain_step()
    ours, theirs, loads = [], [], []
    for r in range(a.repeats):
        for kind in (("ours", "plain") if r % 2 == 0 else ("plain", "ours")):
            loads.append(os.getloadavg()[0])
            start = time.perf_counter()
            if kind == "ours":
                backend.train_step(b, objective)
                ours.append(time.perf_counter() - start)
            else:
                plain_step()
                theirs.append(time.perf_counter() - start)
    out = {"backend_train_step_s": statistics.median(ours), "plain_loop_s": statistics.median(theirs),
           "ratio": statistics.median(ours) / statistics.median(theirs), "load": [min(loads), max(loads)],
           "args": vars(a)}
    print(json.dumps(out, indent=1))
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
