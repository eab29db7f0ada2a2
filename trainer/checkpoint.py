"""Checkpoints: everything an exact resume needs, written atomically, read without unpickling.

A checkpoint is a folder ``<out>/checkpoints/<name>/`` (``step_<N>`` or ``warmup_<N>``) holding

* ``backend/`` -- the backend's own state (weights, optimizer, scheduler; :meth:`save_state`);
* ``trainer_state.json`` -- step counters, the phase (warm-up or RL), the data sampler's position
  (its RNG state), the weight version, elapsed time and anything else the loop keeps;
* ``rng.safetensors`` -- Python's, NumPy's and torch's global RNG states (CPU and CUDA), as a
  safetensors state tree (:mod:`.safe_state`);
* ``buffer.jsonl`` (+ ``buffer.jsonl.media/``) -- trajectories collected but not trained on yet
  (e.g. extra groups from dynamic sampling), in the rollout manager's replayable format;
* ``manifest.json`` -- the size and sha256 of every other file in the folder.

Nothing in a checkpoint is a pickle: a checkpoint handed to ``--resume`` may come from anyone,
and unpickling runs code. Files are JSON, JSONL, safetensors or media, and the megatron
backend's distributed checkpoint is read through :mod:`.megatron.safe_checkpoint`.

Writing: the folder is built as ``<name>.tmp``, every file and folder is fsynced, the manifest is
written (and fsynced) last, the folder is renamed into place and ``latest`` (a small text file) is
replaced after it, so a crash mid-save leaves a ``.tmp`` folder that ``--resume`` never takes.
Reading: :func:`verify_checkpoint` checks the manifest against the folder (no file missing,
added, truncated or changed) before anything is loaded; ``--resume`` without a name takes the
newest checkpoint that passes (:func:`resolve_checkpoint`). Every problem is a one-line
:class:`CheckpointError` naming the file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from relax_gym.errors import RelaxGymError, find_cause
from relax_gym.trainer.backends.base import TrainerBackend
from relax_gym.trainer.safe_state import StateFileError, load_tree, one_line, save_tree

FORMAT_VERSION = 2  # 1 stored pickles (rng.pt, optimizer.pt); 2 stores none
MANIFEST = "manifest.json"
STATE_FILE = "trainer_state.json"
RNG_FILE = "rng.safetensors"
#: the torch backend's optimizer file, dropped when ``save_optimizer`` is off
OPTIMIZER_FILE = "backend/optimizer.safetensors"
#: what ``--resume STEP`` may name, besides a path: a checkpoint folder's name or an RL step number
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_HASH_CHUNK = 1 << 20

log = logging.getLogger("relax_gym.trainer.checkpoint")

#: what to resume from: ``True`` = the newest valid checkpoint, a string = a name, step or path
Resume = bool | str


class CheckpointError(RelaxGymError, RuntimeError):
    """A checkpoint is missing, incomplete, corrupted or from an incompatible run."""


class NoCheckpointError(CheckpointError, FileNotFoundError):
    """``--resume`` found no checkpoint it can use."""


class CheckpointMismatchError(CheckpointError, ValueError):
    """A checkpoint was written by a run with a different model/data/rollout/algorithm config."""


def find_checkpoint_error(exc: BaseException) -> CheckpointError | None:
    """The :class:`CheckpointError` behind ``exc`` (itself, a cause, or what a Ray actor raised)."""
    return find_cause(exc, CheckpointError)


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


_STATE_ADAPTER = TypeAdapter(TrainerState)


class _FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class Manifest(BaseModel):
    """``manifest.json``: every file of the checkpoint (relative POSIX path) with its size and hash."""

    model_config = ConfigDict(extra="forbid")
    format: Literal[2]
    files: dict[str, _FileEntry]



# ------------------------------------------------------------------------------------------------
# global RNG states (no pickle: JSON numbers and uint8 / int64 tensors)
# ------------------------------------------------------------------------------------------------
def capture_rng() -> dict[str, Any]:
    """Python's, NumPy's and torch's global RNG states, as a :mod:`.safe_state` tree."""
    version, internal, gauss_next = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng`; raises ``ValueError`` on a state that does not fit."""
    try:
        py, npy = state["python"], state["numpy"]
        random.setstate((int(py["version"]), tuple(int(x) for x in py["internal"]),
                         None if py["gauss_next"] is None else float(py["gauss_next"])))
        keys = npy["keys"]
        if not isinstance(keys, torch.Tensor) or keys.dtype != torch.int64 or keys.dim() != 1:
            raise ValueError("numpy keys are not a 1-D int64 tensor")
        if bool(((keys < 0) | (keys >= 2**32)).any()):
            raise ValueError("numpy keys out of the uint32 range")
        np.random.set_state((str(npy["kind"]), keys.numpy().astype(np.uint32), int(npy["pos"]),
                             int(npy["has_gauss"]), float(npy["cached_gaussian"])))
        cpu = state["torch"]
        if not isinstance(cpu, torch.Tensor) or cpu.dtype != torch.uint8:
            raise ValueError("torch state is not a uint8 tensor")
        torch.set_rng_state(cpu)
        cuda = state.get("cuda") or []
        if cuda and torch.cuda.is_available():
            for device, dev_state in enumerate(cuda[: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(dev_state, device)
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"not an RNG state ({one_line(exc)})") from None


# ------------------------------------------------------------------------------------------------
# writing
# ------------------------------------------------------------------------------------------------
def checkpoint_root(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _walk(folder: Path) -> tuple[list[Path], list[Path]]:
    """Every entry below ``folder`` that is not a folder, and every folder (deepest first)."""
    files: list[Path] = []
    dirs: list[Path] = []
    for here, subdirs, names in os.walk(folder, followlinks=False):
        base = Path(here)
        dirs.append(base)
        files += [base / n for n in names]
        files += [base / d for d in subdirs if (base / d).is_symlink()]  # os.walk lists them as dirs
    return sorted(files), sorted(dirs, key=lambda p: len(p.parts), reverse=True)


def _seal(folder: Path) -> None:
    """fsync every file, write the manifest (fsynced), fsync every folder."""
    files, dirs = _walk(folder)
    entries: dict[str, dict[str, Any]] = {}
    for path in files:
        if path.is_symlink() or not path.is_file():
            raise CheckpointError(f"{path}: not a plain file; a checkpoint holds plain files only")
        _fsync(path)
        entries[path.relative_to(folder).as_posix()] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    manifest = folder / MANIFEST
    manifest.write_text(json.dumps({"format": FORMAT_VERSION, "files": entries}, indent=1), encoding="utf-8")
    _fsync(manifest)
    for d in dirs:
        _fsync(d)


def save_checkpoint(out_dir: str | Path, name: str, backend: TrainerBackend, state: TrainerState, *,
                    buffer: list[Any] | None = None, keep_last: int = 2, save_optimizer: bool = True) -> Path:
    """Write checkpoint ``name`` (e.g. ``step_000010``) atomically; returns its folder."""
    if not _NAME.match(name) or name.endswith(".tmp"):
        raise CheckpointError(f"{name!r} is not a checkpoint name (letters, digits, '_', '-', '.')")
    root = checkpoint_root(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    final, tmp, stale = root / name, root / f"{name}.tmp", root / f"{name}.stale.tmp"
    for leftover in (tmp, stale):
        if leftover.exists():
            shutil.rmtree(leftover)
    tmp.mkdir()
    backend.save_state(tmp / "backend")
    if not save_optimizer:
        (tmp / OPTIMIZER_FILE).unlink(missing_ok=True)
    save_tree(capture_rng(), tmp / RNG_FILE, kind="rng")
    if buffer:
        from relax_gym.trainer.rollout import save_jsonl

        save_jsonl(buffer, tmp / "buffer.jsonl")
    record = {"format": FORMAT_VERSION, **asdict(state), "buffer_size": len(buffer or [])}
    (tmp / STATE_FILE).write_text(json.dumps(record, indent=2, default=str), encoding="utf-8")
    _seal(tmp)
    if final.exists():
        final.rename(stale)  # the old copy leaves in one rename; the new one arrives in the next
    tmp.rename(final)
    _fsync(root)
    shutil.rmtree(stale, ignore_errors=True)
    pointer = root / "latest.tmp"
    pointer.write_text(name, encoding="utf-8")
    _fsync(pointer)
    pointer.replace(root / "latest")
    _fsync(root)
    _prune(root, keep_last, protect=name)
    return final


def _prune(root: Path, keep_last: int, protect: str) -> None:
    done = [p for p in root.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.endswith(".tmp")
            and (p / MANIFEST).is_file()]
    done.sort(key=lambda p: (p / MANIFEST).stat().st_mtime)
    for old in done[: max(0, len(done) - keep_last)]:
        if old.name != protect:
            shutil.rmtree(old, ignore_errors=True)


# ------------------------------------------------------------------------------------------------
# checking
# ------------------------------------------------------------------------------------------------
def _check_format(folder: Path) -> None:
    """A checkpoint of another format says so (before the manifest: format 1 had none)."""
    try:
        record = json.loads((folder / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # missing or unreadable: the manifest check names the problem
    fmt = record.get("format") if isinstance(record, dict) else None
    if fmt != FORMAT_VERSION:
        why = " (format 1 stored pickles, which are never loaded: start a new output_dir)" if fmt == 1 else ""
        raise CheckpointError(f"{folder}: checkpoint format {fmt!r}, expected {FORMAT_VERSION}{why}")


def _read_manifest(folder: Path) -> Manifest:
    path = folder / MANIFEST
    if path.is_symlink() or not path.is_file():
        raise CheckpointError(f"{path}: missing; not a complete checkpoint (its save did not finish)")
    try:
        return Manifest.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "(top)"
        raise CheckpointError(f"{path}: not a valid manifest ({where}: {err['msg']})") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: unreadable ({one_line(exc)})") from None


def _check_files(folder: Path, manifest: Manifest) -> None:
    files, _ = _walk(folder)
    present = {p.relative_to(folder).as_posix(): p for p in files if p.name != MANIFEST or p.parent != folder}
    for rel, path in present.items():
        if path.is_symlink() or not path.is_file():
            raise CheckpointError(f"{path}: not a plain file; a checkpoint holds plain files only")
        if rel not in manifest.files:
            raise CheckpointError(f"{path}: not listed in {MANIFEST} (added after the save)")
    for rel, entry in manifest.files.items():
        path = present.get(rel)
        if path is None:
            raise CheckpointError(f"{folder / rel}: missing (listed in {MANIFEST})")
        size = path.stat().st_size
        if size != entry.size:
            raise CheckpointError(f"{path}: {size} bytes, {MANIFEST} says {entry.size} (truncated or changed)")
        if _sha256(path) != entry.sha256:
            raise CheckpointError(f"{path}: sha256 does not match {MANIFEST} (corrupted or changed after saving)")


def verify_checkpoint(folder: str | Path) -> Path:
    """Check ``folder`` is a complete checkpoint whose files match its manifest; returns it."""
    folder = Path(folder)
    if folder.name.endswith(".tmp"):
        raise CheckpointError(f"{folder}: a half-written temp folder (its save did not finish)")
    if folder.is_symlink() or not folder.is_dir():
        raise CheckpointError(f"{folder}: not a checkpoint folder")
    _check_format(folder)
    _check_files(folder, _read_manifest(folder))
    return folder


# ------------------------------------------------------------------------------------------------
# choosing what to resume from
# ------------------------------------------------------------------------------------------------
def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The folder ``latest`` points at, if it was completely written (has a manifest); else None.

    Cheap (no hashing): for reports and tests. ``--resume`` uses :func:`resolve_checkpoint`."""
    root = checkpoint_root(out_dir)
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    name = pointer.read_text(encoding="utf-8").strip()
    if not _NAME.match(name) or name.endswith(".tmp"):
        return None
    folder = root / name
    return folder if (folder / MANIFEST).is_file() and not folder.is_symlink() else None


def _candidates(root: Path) -> list[Path]:
    """Checkpoint folders under ``root``, newest first: ``latest``'s target, then by save time."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir()
             if p.is_dir() and not p.is_symlink() and _NAME.match(p.name) and not p.name.endswith(".tmp")]

    def saved_at(p: Path) -> float:
        return ((p / MANIFEST) if (p / MANIFEST).is_file() else p).stat().st_mtime

    found.sort(key=saved_at, reverse=True)
    pointed = latest_checkpoint(root.parent)
    if pointed is not None and pointed in found:
        found.remove(pointed)
        found.insert(0, pointed)
    return found


def _named(root: Path, which: str) -> Path:
    """The folder ``--resume WHICH`` means: an RL step number, a folder name or a path."""
    if which.isdigit():
        return root / f"step_{int(which):06d}"
    if _NAME.match(which) and os.sep not in which:
        return root / which
    return Path(which)


def resolve_checkpoint(out_dir: str | Path, which: Resume = True) -> Path:
    """The checkpoint ``--resume`` continues from, verified; says which it took.

    ``which=True``: the newest checkpoint that passes :func:`verify_checkpoint`, skipping (and
    naming) any that do not. A string: exactly that checkpoint (see :func:`_named`), or an error."""
    root = checkpoint_root(out_dir)
    if isinstance(which, str):
        folder = _named(root, which)
        if not folder.exists() and not folder.is_symlink():
            have = ", ".join(p.name for p in _candidates(root)) or "none"
            raise NoCheckpointError(f"--resume {which}: no checkpoint {folder} (checkpoints: {have})")
        verify_checkpoint(folder)
        log.warning("--resume: resuming from %s", folder)
        return folder
    skipped: list[str] = []
    for folder in _candidates(root):
        try:
            verify_checkpoint(folder)
        except CheckpointError as exc:
            skipped.append(str(exc))
            log.warning("--resume: skipping %s", exc)
            continue
        note = f" (skipped {len(skipped)} newer that failed the checks)" if skipped else ""
        log.warning("--resume: resuming from %s%s", folder, note)
        return folder
    half = sorted(p.name for p in root.glob("*.tmp") if p.is_dir()) if root.is_dir() else []
    if half:
        skipped += [f"{root / n}: a half-written temp folder (its save did not finish)" for n in half]
    detail = f": {'; '.join(skipped)}" if skipped else ""
    raise NoCheckpointError(f"--resume: no complete checkpoint under {root}{detail}")


# ------------------------------------------------------------------------------------------------
# loading
# ------------------------------------------------------------------------------------------------
def _read_state(folder: Path) -> TrainerState:
    path = folder / STATE_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable ({one_line(exc)})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT_VERSION:
        fmt = record.get("format") if isinstance(record, dict) else None
        raise CheckpointError(f"{folder}: checkpoint format {fmt!r}, expected {FORMAT_VERSION}")
    fields = {k: record[k] for k in TrainerState.__dataclass_fields__ if k in record}
    try:
        return _STATE_ADAPTER.validate_python(fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise CheckpointError(f"{path}: field {where}: {err['msg']}") from None


def load_checkpoint(folder: str | Path, backend: TrainerBackend, *, restore_global_rng: bool = True,
                    verify: bool = True) -> tuple[TrainerState, list[Any]]:
    """Restore the backend from ``folder`` and return the loop state and buffered trajectories.

    ``verify=False`` skips the manifest check, for a folder :func:`resolve_checkpoint` just checked."""
    folder = Path(folder)
    if verify:
        verify_checkpoint(folder)
    state = _read_state(folder)
    try:
        backend.load_state(folder / "backend")
    except RelaxGymError as exc:  # the backends' errors name the file
        raise CheckpointError(one_line(exc)) from None
    buffer: list[Any] = []
    if (folder / "buffer.jsonl").is_file():
        from relax_gym.trainer.rollout import load_jsonl

        try:
            buffer = load_jsonl(folder / "buffer.jsonl")
        except RelaxGymError as exc:
            raise CheckpointError(f"{folder / 'buffer.jsonl'}: {one_line(exc)}") from None
    if restore_global_rng:
        try:
            restore_rng(load_tree(folder / RNG_FILE, kind="rng"))
        except StateFileError as exc:
            raise CheckpointError(one_line(exc)) from None
        except ValueError as exc:
            raise CheckpointError(f"{folder / RNG_FILE}: {one_line(exc)}") from None
    return state, buffer


__all__ = [
    "FORMAT_VERSION",
    "CheckpointError",
    "CheckpointMismatchError",
    "Manifest",
    "NoCheckpointError",
    "Resume",
    "TrainerState",
    "capture_rng",
    "checkpoint_root",
    "find_checkpoint_error",
    "latest_checkpoint",
    "load_checkpoint",
    "resolve_checkpoint",
    "restore_rng",
    "save_checkpoint",
    "verify_checkpoint",
]
