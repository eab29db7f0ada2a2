"""Torch backend vs megatron-core backend (TP=1): one identical step gives the same numbers.

Every policy loss of trainer/algorithms/losses.py (GRPO's PPO surrogate, GSPO, GSPO-token,
SAPO, CISPO, and Dr.GRPO's aggregation), each with a KL term, an entropy bonus and a TIS
rollout correction, on the same weights and batch; the two backends cut the batch into
different micro-batches (6 vs 2 sequences), which the global normaliser must make irrelevant.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.megatron import dist_workers, tiny_models

pytest.importorskip("megatron.core")

#: what a step reports that both backends compute from the same loss code
COMPARED = ("loss", "grad_norm", "pg_loss", "kl_ref", "entropy", "num_tokens")


@pytest.mark.slow  # ~15 s: a fresh process importing megatron-core and transformers
def test_one_step_matches_torch_for_every_loss(tmp_path: Path) -> None:
    model_dir = tiny_models.save_model(tiny_models.qwen3_config(layers=2), tmp_path / "hf")
    r = dist_workers.run_isolated(
        dist_workers.loss_parity_check,
        env={"RELAX_MEGATRON_CPU_SHIM": "1"},
        model_dir=str(model_dir),
    )
    assert set(r) == set(dist_workers.PARITY_CONFIGS)
    for name, pair in r.items():
        ref, meg = pair["torch"], pair["megatron"]
        print(name, {k: (ref.get(k), meg.get(k)) for k in COMPARED})
        assert ref["grad_norm"] > 0, name  # a real gradient, not a clipped-away one
        for key in COMPARED:
            if key in ref:
                assert meg[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-7), (name, key)
