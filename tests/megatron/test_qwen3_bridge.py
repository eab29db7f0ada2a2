"""Conversion check: a tiny HF Qwen3 on Megatron GPTModel (real megatron-core, CPU shim).

Per-token logprobs and entropy must match Hugging Face within 1e-5 (fp32) for TP=1 and for
TP=2 over two gloo ranks; the Megatron -> HF export must be bit-identical and reload in
transformers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.megatron import dist_workers, tiny_models

TOL = 1e-5


def _check_common(results: list[dict], tp: int, vocab: int, bucket_bytes: int) -> None:
    for rank, r in enumerate(results):
        print(
            f"rank {rank}: logprob max diff {r['logprob_max_diff']:.3g}, entropy "
            f"{r['entropy_max_diff']:.3g}, grad {r['grad_max_diff']:.3g}"
        )
        assert r["local_vocab"] == vocab // tp
        assert r["logprob_max_diff"] < TOL
        assert r["entropy_max_diff"] < TOL
        assert r["grad_max_diff"] < TOL
        assert r["roundtrip_identical"]
        assert r["exported_names_match"]
        assert r["no_duplicates"]
        for count, size in r["bucket_sizes"]:
            assert size <= bucket_bytes or count == 1
    assert results[0]["export_reload_identical"]
    assert all("export_reload_identical" not in r for r in results[1:])  # one writer
    assert len(results[0]["bucket_sizes"]) > 3  # streamed, not one blob
    assert len(results[0]["export_files"]) == len(results[0]["bucket_sizes"])
    for r in results:  # bad checkpoints fail loudly and name the tensor
        assert "model.layers.0.mlp.up_proj.weight" in r["missing_error"]
        assert "input_layernorm" in r["shape_error"] and "(3,)" in r["shape_error"]


@pytest.mark.slow
def test_tp1_tied_from_state_dict(tmp_path: Path) -> None:
    model_dir = tiny_models.save_model(tiny_models.qwen3_config(tied=True), tmp_path / "hf")
    results = dist_workers.spawn(
        dist_workers.qwen3_check,
        1,
        model_dir=str(model_dir),
        export_dir=str(tmp_path / "out"),
        bucket_bytes=40_000,
        from_state_dict=True,
    )
    _check_common(results, tp=1, vocab=256, bucket_bytes=40_000)


def test_tp2_untied_gqa_from_safetensors(tmp_path: Path) -> None:
    model_dir = tiny_models.save_model(
        tiny_models.qwen3_config(tied=False, kv_heads=2), tmp_path / "hf"
    )
    results = dist_workers.spawn(
        dist_workers.qwen3_check,
        2,
        parallel={"tensor_parallel_size": 2},
        model_dir=str(model_dir),
        export_dir=str(tmp_path / "out"),
        bucket_bytes=40_000,
    )
    _check_common(results, tp=2, vocab=256, bucket_bytes=40_000)


@pytest.mark.slow
def test_tp2_more_ranks_than_kv_heads_tied(tmp_path: Path) -> None:
    """num_key_value_heads=1 < tp=2: both ranks hold halves of the single fused q/k/v group."""
    model_dir = tiny_models.save_model(
        tiny_models.qwen3_config(tied=True, kv_heads=1), tmp_path / "hf"
    )
    results = dist_workers.spawn(
        dist_workers.qwen3_check,
        2,
        parallel={"tensor_parallel_size": 2},
        model_dir=str(model_dir),
        export_dir=str(tmp_path / "out"),
        bucket_bytes=30_000,
    )
    _check_common(results, tp=2, vocab=256, bucket_bytes=30_000)


@pytest.mark.slow
def test_pp2_export_and_load_roundtrip(tmp_path: Path) -> None:
    """PP=2: each stage loads its layers; the export broadcasts stage-owned tensors."""
    model_dir = tiny_models.save_model(
        tiny_models.qwen3_config(tied=True, layers=4), tmp_path / "hf"
    )
    results = dist_workers.spawn(
        dist_workers.qwen3_check,
        2,
        parallel={"pipeline_parallel_size": 2},
        model_dir=str(model_dir),
        export_dir=str(tmp_path / "out"),
        bucket_bytes=50_000,
    )
    for r in results:
        assert r["roundtrip_identical"] and r["exported_names_match"] and r["no_duplicates"]
    assert results[0]["export_reload_identical"]
