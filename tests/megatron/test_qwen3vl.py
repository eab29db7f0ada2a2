"""Conversion check for Qwen3-VL: Megatron language model + HF vision tower on an image sample."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.megatron import dist_workers, tiny_models, video_workers

TOL = 1e-5


def _run(tmp_path: Path, tp: int) -> list[dict]:
    model_dir = tiny_models.save_model(tiny_models.qwen3vl_config(), tmp_path / "hf")
    image = tiny_models.save_image(tmp_path / "image.png")
    return dist_workers.spawn(
        dist_workers.qwen3vl_check,
        tp,
        parallel={"tensor_parallel_size": tp},
        model_dir=str(model_dir),
        image_path=str(image),
        export_dir=str(tmp_path / "out"),
        bucket_bytes=200_000,
    )


def _check(results: list[dict]) -> None:
    for rank, r in enumerate(results):
        print(
            f"rank {rank}: {r['n_image_tokens']} image tokens, logprob max diff "
            f"{r['logprob_max_diff']:.3g}, entropy {r['entropy_max_diff']:.3g}"
        )
        assert r["n_image_tokens"] >= 4
        assert r["positions_match_hf"]
        assert r["logprob_max_diff"] < TOL
        assert r["entropy_max_diff"] < TOL
        # Negative control: 1-D positions on the same sample do not match, so mRoPE matters.
        assert r["flat_positions_diff"] > 100 * TOL
        assert r["roundtrip_identical"] and r["exported_names_match"]
    assert results[0]["export_reload_logprobs_equal"]


def test_qwen3vl_tp1_image_sample(tmp_path: Path) -> None:
    _check(_run(tmp_path, tp=1))


@pytest.mark.slow
def test_qwen3vl_tp2_image_sample(tmp_path: Path) -> None:
    _check(_run(tmp_path, tp=2))


@pytest.mark.slow  # ~15 s: a fresh process importing megatron-core and transformers, two backends
def test_qwen3vl_video_sample_matches_torch_backend(tmp_path: Path) -> None:
    """Video on megatron: mRoPE positions == transformers', logprobs == the torch backend's
    within 1e-5 relative (packed and padded), and one training step agrees."""
    model_dir = tiny_models.save_model(tiny_models.qwen3vl_config(), tmp_path / "hf")
    r = dist_workers.run_isolated(
        video_workers.video_backend_check,
        env={"RELAX_MEGATRON_CPU_SHIM": "1"},
        model_dir=str(model_dir),
    )
    print(r)
    assert r["video_tokens"] == [8, 4, 3] and r["image_tokens"] == [0, 4, 0]
    assert r["positions_match_hf"] and r["positions_control_differs"]
    for key in ("packed_logprob_rel_diff", "padded_logprob_rel_diff", "packed_entropy_rel_diff",
                "padded_entropy_rel_diff", "after_step_logprob_rel_diff"):
        assert r[key] < TOL, key
    assert r["loss"] == pytest.approx(r["torch_loss"], rel=TOL)
    assert r["grad_norm"] == pytest.approx(r["torch_grad_norm"], rel=1e-4)
    assert r["vision_params_moved"] > 0.5
    assert r["second_loss"] < r["loss"]
