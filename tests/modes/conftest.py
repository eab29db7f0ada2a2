"""Fixtures for the modes tests: one tiny model and one embedded engine for the whole session.

Runs point their config at the shared engine (``engine.kind: external``) and push their own
weights first, so each test starts from the base model without paying for an engine start."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from . import workload

API_KEY = "modes-test-key"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from relax_gym.trainer.models import build_tiny_model

    return build_tiny_model("qwen3", tmp_path_factory.mktemp("modes-model"), seed=0, tokenizer="tiny-bpe")


def start_engine(model: Path, log_dir: Path, name: str) -> Any:
    from relax_gym.trainer.engines.launch import EmbeddedEngineProcess

    engine = EmbeddedEngineProcess(model, threads=1, api_key=API_KEY, log_file=log_dir / f"{name}.log",
                                   startup_timeout_s=180, extra_args=["--max-batch-size", "64"])
    engine.start()
    return engine


@pytest.fixture(scope="session")
def engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    proc = start_engine(tiny_model, tmp_path_factory.mktemp("modes-engines"), "shared")
    try:
        yield proc
    finally:
        proc.stop()


def config_dict(model: Path, out: Path, urls: list[str], **sections: Any) -> dict[str, Any]:
    """A small fully_async run on the shared engine(s); ``sections`` override top-level keys."""
    base: dict[str, Any] = {
        "run_name": "modes-test",
        "output_dir": str(out),
        "seed": 3,
        "mode": "fully_async",
        "model": {"path": str(model)},
        "engine": {"kind": "external", "urls": urls, "api_key": API_KEY, "sync": "tensor"},
        "data": {"envs": [{"id": workload.ENV_ID}]},
        "rollout": {"group_size": 4, "prompts_per_step": 2, "concurrency": 16, "max_new_tokens": 8,
                    "max_total_tokens": 128},
        "algorithm": {"advantage_estimator": "grpo"},
        "train": {"steps": 4, "lr": 1e-3, "micro_batch_size": 16},
        "eval": {"every": 0, "episodes": 4, "at_start": False},
        "checkpoint": {"every": 0, "keep_last": 3, "export_hf": False},
        "logging": {"progress": "none", "tensorboard": False, "dump_samples": 0, "plot": False},
        "async_rl": {"max_staleness": 1, "imports": ["tests.modes.workload"]},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return base
