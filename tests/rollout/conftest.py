"""Fixtures for the rollout tests: tiny models built from configs and real embedded engines on
127.0.0.1, shared across the session so the suite starts as few servers as possible."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def qwen3_tokenizer():  # type: ignore[no-untyped-def]
    from relax_gym.trainer.models import load_qwen3_tokenizer

    return load_qwen3_tokenizer()


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from relax_gym.trainer.models import build_tiny_model

    return build_tiny_model("qwen3", tmp_path_factory.mktemp("tiny-qwen3"), seed=0)


@pytest.fixture(scope="session")
def tiny_qwen3_vl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from relax_gym.trainer.models import build_tiny_model

    return build_tiny_model("qwen3_vl", tmp_path_factory.mktemp("tiny-qwen3-vl"), seed=0)


def start_engine(model: Path, tmp: Path, name: str, *extra: str):  # type: ignore[no-untyped-def]
    from relax_gym.trainer.engines.launch import EmbeddedEngineProcess

    engine = EmbeddedEngineProcess(model, threads=1, log_file=tmp / f"{name}.log", startup_timeout_s=180,
                                   extra_args=["--max-batch-size", "64", *extra])
    engine.start()
    return engine


@pytest.fixture(scope="session")
def qwen3_engine(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One embedded engine serving the tiny Qwen3 for the whole session."""
    engine = start_engine(tiny_qwen3, tmp_path_factory.mktemp("engine-logs"), "qwen3-main")
    try:
        yield engine
    finally:
        engine.stop()
