"""Checkpoints: everything an exact resume needs, written atomically.

A checkpoint is a folder ``<out>/checkpoints/step_<N>/`` holding

* ``backend/`` -- the backend's own state (weights, optimizer, scheduler; :meth:`save_state`);
* ``trainer_state.json`` -- step counters, the phase (warm-up or RL), the data sampler's position
  (its RNG state), the weight version, elapsed time and anything else the loop keeps;
* ``rng.pt`` -- Python's, NumPy's and torch's global RNG states (CPU and CUDA);
* ``buffer.jsonl`` (+ ``buffer.jsonl.media/``) -- trajectories collected but not trained on yet
  (e.g. extra groups from dynamic sampling), in the rollout manager's replayable format.

The folder is first written as ``step_<N>.tmp`` and renamed when complete, and ``latest`` (a
small text file) is updated last, so a crash mid-save never leaves a half checkpoint that
``--resume`` would pick up. Old checkpoints beyond ``keep_last`` are removed.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from relax_gym.errors import RelaxGymError
from relax_gym.trainer.backend import TrainerBackend

FORMAT_VERSION = 1


class CheckpointError(RelaxGymError, RuntimeError):
    """A checkpoint is missing, incomplete or from an incompatible run."""


@dataclass
class TrainerState:
    """The loop's own counters and positions (JSON-serialisable)."""

    step: int = 0  # RL steps completed
    phase: str = "warmup"  # warmup | rl | done
    warmup_step: int = 0  # SFT steps completed
    warmup_done: bool = False
    weight_version: int = 0
    elapsed_s: float = 0.0
    sampler: dict[str, Any] = field(default_factory=dict)
    warmup_sampler: dict[str, Any] = field(default_factory=dict)
    config_hash: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def capture_rng() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_root(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def save_checkpoint(out_dir: str | Path, name: str, backend: TrainerBackend, state: TrainerState, *,
                    buffer: list[Any] | None = None, keep_last: int = 2, save_optimizer: bool = True) -> Path:
    """Write checkpoint ``name`` (e.g. ``step_000010``) atomically; returns its folder."""
    root = checkpoint_root(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / name
    tmp = root / f"{name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    backend.save_state(tmp / "backend")
    if not save_optimizer:
        (tmp / "backend" / "optimizer.pt").unlink(missing_ok=True)
    torch.save(capture_rng(), tmp / "rng.pt")
    if buffer:
        from relax_gym.trainer.rollout import save_jsonl

        save_jsonl(buffer, tmp / "buffer.jsonl")
    record = {"format": FORMAT_VERSION, **asdict(state), "buffer_size": len(buffer or [])}
    (tmp / "trainer_state.json").write_text(json.dumps(record, indent=2, default=str), encoding="utf-8")
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    (root / "latest.tmp").write_text(name, encoding="utf-8")
    (root / "latest.tmp").replace(root / "latest")
    _prune(root, keep_last, protect=name)
    return final


def _prune(root: Path, keep_last: int, protect: str) -> None:
    done = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.endswith(".tmp") and
                  (p / "trainer_state.json").is_file())
    done.sort(key=lambda p: p.stat().st_mtime)
    for old in done[: max(0, len(done) - keep_last)]:
        if old.name != protect:
            shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The folder ``latest`` points at, if it is complete; else None."""
    root = checkpoint_root(out_dir)
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    folder = root / pointer.read_text(encoding="utf-8").strip()
    return folder if (folder / "trainer_state.json").is_file() else None


def load_checkpoint(folder: str | Path, backend: TrainerBackend, *, restore_global_rng: bool = True
                    ) -> tuple[TrainerState, list[Any]]:
    """Restore the backend from ``folder`` and return the loop state and buffered trajectories."""
    folder = Path(folder)
    state_file = folder / "trainer_state.json"
    if not state_file.is_file():
        raise CheckpointError(f"{folder}: not a complete checkpoint (no trainer_state.json)")
    record = json.loads(state_file.read_text(encoding="utf-8"))
    if record.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"{folder}: checkpoint format {record.get('format')!r}, expected {FORMAT_VERSION}")
    backend.load_state(folder / "backend")
    fields = {k: record[k] for k in TrainerState.__dataclass_fields__ if k in record}
    state = TrainerState(**fields)
    buffer: list[Any] = []
    if (folder / "buffer.jsonl").is_file():
        from relax_gym.trainer.rollout import load_jsonl

        buffer = load_jsonl(folder / "buffer.jsonl")
    if restore_global_rng and (folder / "rng.pt").is_file():
        restore_rng(torch.load(folder / "rng.pt", weights_only=False))
    return state, buffer


__all__ = [
    "CheckpointError",
    "TrainerState",
    "capture_rng",
    "checkpoint_root",
    "latest_checkpoint",
    "load_checkpoint",
    "restore_rng",
    "save_checkpoint",
]
