"""Fixtures for the rollout tests: tiny models built from configs and real embedded engines on
127.0.0.1, shared across the session.

The first test that needs an engine boots all three at once (two tiny-Qwen3 engines and one
tiny-Qwen3-VL engine), overlapping their start-up, which dominates this suite's run time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def _needs_ml() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def qwen3_tokenizer():  # type: ignore[no-untyped-def]
    _needs_ml()
    from relax_gym.trainer.models import load_qwen3_tokenizer

    return load_qwen3_tokenizer()


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _needs_ml()
    from relax_gym.trainer.models import build_tiny_model

    return build_tiny_model("qwen3", tmp_path_factory.mktemp("tiny-qwen3"), seed=0)


@pytest.fixture(scope="session")
def tiny_qwen3_vl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _needs_ml()
    from relax_gym.trainer.models import build_tiny_model

    # the tiny offline BPE (512 tokens, Qwen's special tokens and the Qwen3-VL template): the text
    # side is covered with the real tokenizer elsewhere, and a small vocabulary boots faster
    return build_tiny_model("qwen3_vl", tmp_path_factory.mktemp("tiny-qwen3-vl"), seed=0, tokenizer="tiny-bpe")


@pytest.fixture(scope="session")
def codec(tiny_qwen3: Path) -> Any:
    """The tiny Qwen3's chat codec (the real Qwen3 tokenizer and template), loaded once."""
    from relax_gym.chat import ChatCodec

    return ChatCodec.from_pretrained(tiny_qwen3)


class EnginePool:
    """Engine processes started together; each is waited for when first used."""

    def __init__(self) -> None:
        self.engines: dict[str, Any] = {}
        self.ready: set[str] = set()

    def spawn(self, name: str, model: Path, logs: Path) -> None:
        from relax_gym.trainer.engines.launch import EmbeddedEngineProcess, ServerProcess

        engine = EmbeddedEngineProcess(model, threads=1, log_file=logs / f"{name}.log", startup_timeout_s=240,
                                       extra_args=["--max-batch-size", "64"])
        ServerProcess.start(engine)  # spawn now, wait for /health later
        self.engines[name] = engine

    def get(self, name: str) -> Any:
        engine = self.engines[name]
        if name not in self.ready:
            engine.wait_healthy(engine._read_port, timeout_s=engine.startup_timeout_s)
            self.ready.add(name)
        return engine

    def stop(self) -> None:
        for engine in self.engines.values():
            engine.stop()


@pytest.fixture(scope="session")
def engine_pool(tiny_qwen3: Path, tiny_qwen3_vl: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnginePool]:
    logs = tmp_path_factory.mktemp("engine-logs")
    pool = EnginePool()
    try:
        pool.spawn("qwen3", tiny_qwen3, logs)
        pool.spawn("qwen3-second", tiny_qwen3, logs)
        pool.spawn("qwen3-vl", tiny_qwen3_vl, logs)
        yield pool
    finally:
        pool.stop()


@pytest.fixture(scope="session")
def qwen3_engine(engine_pool: EnginePool) -> Any:
    """The main tiny-Qwen3 engine, shared by every test."""
    return engine_pool.get("qwen3")


@pytest.fixture(scope="session")
def second_engine(engine_pool: EnginePool) -> Any:
    """A second tiny-Qwen3 engine; the fault tests add, drain and finally kill it."""
    return engine_pool.get("qwen3-second")


@pytest.fixture(scope="session")
def vl_engine(engine_pool: EnginePool) -> Any:
    return engine_pool.get("qwen3-vl")
