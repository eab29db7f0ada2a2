"""Fixtures for the trainer tests: tiny models built from configs (tiny BPE tokenizer, so a
step takes milliseconds) and the test envs."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from .envs import register_test_envs  # noqa: E402

register_test_envs()


@pytest.fixture(scope="session")
def tiny_text_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from relax_gym.trainer.models import build_tiny_model

    return build_tiny_model("qwen3", tmp_path_factory.mktemp("trainer-qwen3"), seed=0, tokenizer="tiny-bpe")


@pytest.fixture(scope="session")
def tiny_vl_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from relax_gym.trainer.models import build_tiny_model

    return build_tiny_model("qwen3_vl", tmp_path_factory.mktemp("trainer-qwen3-vl"), seed=0, tokenizer="tiny-bpe",
                            image_max_pixels=64 * 64)
