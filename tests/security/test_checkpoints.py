"""Attacks on the checkpoint boundary (``--resume``, :func:`load_checkpoint`, backend states).

A checkpoint folder may come from anyone (a shared drive, a download, a teammate's run), so
resuming from it must never run code and must fail with one line naming the file:

* a pickle whose ``__reduce__`` runs a command, planted as ``rng.pt`` / ``backend/optimizer.pt``
  (what format 1 unpickled), or in place of ``rng.safetensors`` / ``optimizer.safetensors``,
  with the manifest rewritten to match (an attacker controls the whole folder);
* the same payload in a megatron distributed checkpoint: ``.metadata`` (DCP unpickles it),
  a byte item in a ``.distcp`` file, ``common.pt``;
* a truncated file, a flipped byte, a missing manifest, an added or symlinked file, a half-written
  ``.tmp`` folder, an optimizer state that does not fit the model, a malformed state tree;
* ``--resume`` without a step skips a corrupt newest checkpoint and says which one it took;
  ``relax-gym train ... --resume`` exits 2 with one line and no traceback.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("transformers")

from relax_gym.trainer.checkpoint import (  # noqa: E402
    CheckpointError,
    TrainerState,
    load_checkpoint,
    save_checkpoint,
)

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------
class _Payload:
    """Unpickling this creates ``marker`` (what an attacker's command would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def evil_pickle(marker: Path) -> bytes:
    return pickle.dumps({"state": _Payload(marker)})


def evil_torch_file(marker: Path) -> bytes:
    buf = io.BytesIO()
    torch.save({"optimizer": _Payload(marker), "updates": 0}, buf)
    return buf.getvalue()


def reseal(folder: Path) -> None:
    """Rewrite ``manifest.json`` to match the folder, as an attacker who edited it would."""
    files = {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*"))
             if p.is_file() and p.relative_to(folder).as_posix() != "manifest.json"}
    entries = {rel: {"size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
               for rel, p in files.items()}
    (folder / "manifest.json").write_text(json.dumps({"format": 2, "files": entries}), encoding="utf-8")


def one_line_naming(exc: BaseException, name: str) -> None:
    text = str(exc)
    assert "\n" not in text, text
    assert name in text, text


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from relax_gym.trainer.models import build_tiny_model

    return build_tiny_model("qwen3", tmp_path_factory.mktemp("ckpt-qwen3"), seed=0, tokenizer="tiny-bpe")


@pytest.fixture(scope="module")
def backend(tiny_model: Path) -> Any:
    from relax_gym.trainer.backends.base import OptimizerSettings
    from relax_gym.trainer.backends.pytorch import TorchBackend

    return TorchBackend(tiny_model, optimizer=OptimizerSettings(lr=1e-2))


@pytest.fixture
def saved(backend: Any, tmp_path: Path) -> Path:
    """A run folder holding checkpoints step_000001 and step_000002 (the newest)."""
    from relax_gym.trainer.backends.base import NLLObjective, SequenceBatch

    backend.train_step(SequenceBatch([[5, 6, 7, 8]], [[0, 1, 1, 1]]), NLLObjective())  # a real AdamW state
    save_checkpoint(tmp_path, "step_000001", backend, TrainerState(step=1), keep_last=5)
    save_checkpoint(tmp_path, "step_000002", backend, TrainerState(step=2), keep_last=5)
    return tmp_path


@pytest.fixture
def marker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("marker") / "PWNED"
    yield path
    assert not path.exists(), "a pickle from the checkpoint was executed"


# ------------------------------------------------------------------------------------------------
# code execution through pickles
# ------------------------------------------------------------------------------------------------
def test_planted_rng_and_optimizer_pickles_never_run(saved: Path, backend: Any, marker: Path) -> None:
    """format 1 unpickled rng.pt and optimizer.pt with weights_only=False: plant both, reseal."""
    folder = saved / "checkpoints" / "step_000002"
    (folder / "rng.pt").write_bytes(evil_torch_file(marker))
    (folder / "backend" / "optimizer.pt").write_bytes(evil_torch_file(marker))
    reseal(folder)
    try:
        load_checkpoint(folder, backend)
    except CheckpointError:
        pass  # refusing is fine; running the payload is not (the marker fixture checks)
    assert not marker.exists()


def test_format_1_checkpoint_with_pickles_is_refused(saved: Path, backend: Any, marker: Path) -> None:
    folder = saved / "checkpoints" / "step_000002"
    (folder / "rng.pt").write_bytes(evil_torch_file(marker))
    state = json.loads((folder / "trainer_state.json").read_text())
    (folder / "trainer_state.json").write_text(json.dumps({**state, "format": 1}))
    (folder / "manifest.json").unlink()  # format 1 had none
    with pytest.raises(CheckpointError, match="format 1") as err:
        load_checkpoint(folder, backend)
    one_line_naming(err.value, str(folder))


@pytest.mark.parametrize("target", ["rng.safetensors", "backend/optimizer.safetensors", "backend/model.safetensors"])
@pytest.mark.parametrize("payload", ["pickle", "torch"])
def test_pickle_in_place_of_a_state_file_is_refused(saved: Path, backend: Any, marker: Path, target: str,
                                                    payload: str) -> None:
    folder = saved / "checkpoints" / "step_000002"
    (folder / target).write_bytes(evil_pickle(marker) if payload == "pickle" else evil_torch_file(marker))
    reseal(folder)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(folder, backend)
    one_line_naming(err.value, str(folder / target))


def test_no_unpickling_call_is_left_in_the_checkpoint_code() -> None:
    """The files that read checkpoints call neither pickle.load(s) nor torch.load(weights_only=False)."""
    for rel in ("trainer/checkpoint.py", "trainer/backends/pytorch.py", "trainer/safe_state.py",
                "trainer/backends/megatron/backend.py", "trainer/modes/trajectory_queue.py", "trainer/modes/learner.py"):
        text = (ROOT / rel).read_text(encoding="utf-8")
        assert "weights_only=False" not in text, rel
        assert "pickle.load" not in text, rel


def test_megatron_dcp_metadata_pickle_never_runs(tmp_path: Path, marker: Path) -> None:
    """DCP reads ``.metadata`` with a plain pickle.load; ours refuses every foreign global."""
    from relax_gym.trainer.backends.megatron.safe_checkpoint import UnsafeCheckpointError, read_dcp_metadata

    (tmp_path / ".metadata").write_bytes(evil_pickle(marker))
    with pytest.raises(UnsafeCheckpointError, match="refused") as err:
        read_dcp_metadata(tmp_path)
    one_line_naming(err.value, str(tmp_path / ".metadata"))


def test_megatron_dcp_metadata_cannot_point_outside_the_folder(tmp_path: Path) -> None:
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, MetadataIndex

    from relax_gym.trainer.backends.megatron.safe_checkpoint import UnsafeCheckpointError, read_dcp_metadata

    (tmp_path / "data.distcp").write_bytes(b"x" * 8)
    for name, (offset, length), why in [("../../etc/passwd", (0, 4), "not a data file"),
                                        ("data.distcp", (4, 100), "truncated")]:
        meta = Metadata(state_dict_metadata={"obj": BytesStorageMetadata()},
                        storage_data={MetadataIndex("obj"): _StorageInfo(name, offset, length)})
        (tmp_path / ".metadata").write_bytes(pickle.dumps(meta))
        with pytest.raises(UnsafeCheckpointError, match=why):
            read_dcp_metadata(tmp_path)


# ------------------------------------------------------------------------------------------------
# corruption: one line naming the file
# ------------------------------------------------------------------------------------------------
def test_truncated_file_names_the_file(saved: Path, backend: Any) -> None:
    target = saved / "checkpoints" / "step_000002" / "backend" / "model.safetensors"
    target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated") as err:
        load_checkpoint(target.parents[1], backend)
    one_line_naming(err.value, str(target))


@pytest.mark.parametrize("target", ["backend/model.safetensors", "backend/optimizer.safetensors",
                                    "rng.safetensors", "trainer_state.json", "backend/backend.json"])
def test_flipped_byte_is_a_sha256_mismatch(saved: Path, backend: Any, target: str) -> None:
    folder = saved / "checkpoints" / "step_000002"
    data = bytearray((folder / target).read_bytes())
    data[len(data) // 2] ^= 0x01
    (folder / target).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256") as err:
        load_checkpoint(folder, backend)
    one_line_naming(err.value, str(folder / target))


def test_missing_manifest_names_the_file(saved: Path, backend: Any) -> None:
    folder = saved / "checkpoints" / "step_000002"
    (folder / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="missing") as err:
        load_checkpoint(folder, backend)
    one_line_naming(err.value, str(folder / "manifest.json"))


@pytest.mark.parametrize("how", ["added", "symlink", "removed", "bad-manifest"])
def test_folder_must_match_its_manifest(saved: Path, backend: Any, how: str) -> None:
    folder = saved / "checkpoints" / "step_000002"
    if how == "added":
        culprit = folder / "backend" / "extra.pt"
        culprit.write_bytes(b"\x80\x04N.")
    elif how == "symlink":
        culprit = folder / "backend" / "model.safetensors"
        culprit.unlink()
        culprit.symlink_to(saved / "checkpoints" / "step_000001" / "backend" / "model.safetensors")
    elif how == "removed":
        culprit = folder / "rng.safetensors"
        culprit.unlink()
    else:
        culprit = folder / "manifest.json"
        culprit.write_text('{"format": 2, "files": {"x": {"size": -1, "sha256": "zz"}}}')
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(folder, backend)
    one_line_naming(err.value, str(culprit))


def test_optimizer_state_that_does_not_fit_is_refused(saved: Path, backend: Any) -> None:
    from relax_gym.trainer.safe_state import load_tree, save_tree

    folder = saved / "checkpoints" / "step_000002"
    target = folder / "backend" / "optimizer.safetensors"
    tree = load_tree(target, kind="torch_optimizer")
    first = next(iter(tree["optimizer"]["state"].values()))
    first["exp_avg"] = torch.zeros(3, 3)  # the wrong shape for its parameter
    save_tree(tree, target, kind="torch_optimizer")
    reseal(folder)
    with pytest.raises(CheckpointError, match="shape") as err:
        load_checkpoint(folder, backend)
    one_line_naming(err.value, str(target))


@pytest.mark.parametrize("tree", ['{"dict": [[1, {"dict": [["x", {"tensor": "t99"}]]}]]}',
                                  "[" * 5000 + "]" * 5000, '{"eval": "__import__(\'os\')"}', "not json"])
def test_malformed_state_tree_is_refused(tmp_path: Path, tree: str) -> None:
    from safetensors.torch import save_file

    from relax_gym.trainer.safe_state import StateFileError, load_tree

    target = tmp_path / "rng.safetensors"
    save_file({}, str(target), metadata={"relax_gym.kind": "rng", "relax_gym.tree": tree})
    with pytest.raises(StateFileError) as err:
        load_tree(target, kind="rng")
    one_line_naming(err.value, str(target))


@pytest.mark.parametrize("state", [{"step": "many"}, {"extra": [1, 2]}, {"warmup_done": {"x": 1}}])
def test_bad_trainer_state_field_names_the_field(saved: Path, backend: Any, state: dict[str, Any]) -> None:
    folder = saved / "checkpoints" / "step_000002"
    record = json.loads((folder / "trainer_state.json").read_text())
    (folder / "trainer_state.json").write_text(json.dumps({**record, **state}))
    reseal(folder)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(folder, backend)
    one_line_naming(err.value, str(folder / "trainer_state.json"))
    assert next(iter(state)) in str(err.value)


# ------------------------------------------------------------------------------------------------
# atomic writes and choosing the checkpoint to resume from
# ------------------------------------------------------------------------------------------------
class _CrashingBackend:
    """Writes part of its state, then dies: what a crash mid-save leaves behind."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def save_state(self, path: str | Path) -> None:
        out = Path(path)
        out.mkdir(parents=True)
        (out / "model.safetensors").write_bytes(b"partial")
        raise KeyboardInterrupt


def test_crash_mid_save_leaves_a_tmp_folder_resume_never_takes(saved: Path, backend: Any,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    from relax_gym.trainer.checkpoint import NoCheckpointError, latest_checkpoint, resolve_checkpoint

    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(saved, "step_000003", _CrashingBackend(backend), TrainerState(step=3))  # type: ignore[arg-type]
    root = saved / "checkpoints"
    assert (root / "step_000003.tmp").is_dir() and not (root / "step_000003").exists()
    assert latest_checkpoint(saved) == root / "step_000002"
    with caplog.at_level(logging.WARNING):
        assert resolve_checkpoint(saved) == root / "step_000002"
    with pytest.raises(CheckpointError, match="half-written") as err:
        resolve_checkpoint(saved, "step_000003.tmp")
    one_line_naming(err.value, "step_000003.tmp")
    # the tmp folder renamed into place by hand: no manifest, so still not a checkpoint
    (root / "step_000003.tmp").rename(root / "step_000003")
    with pytest.raises(CheckpointError, match="manifest.json: missing") as err:
        resolve_checkpoint(saved, "3")
    one_line_naming(err.value, str(root / "step_000003" / "manifest.json"))
    # only half-written folders left: the error names them
    for name in ("step_000001", "step_000002", "step_000003"):
        os.rename(root / name, root / f"{name}.tmp")
    with pytest.raises(NoCheckpointError, match="no complete checkpoint") as err:
        resolve_checkpoint(saved)
    one_line_naming(err.value, "step_000002.tmp: a half-written temp folder")


def test_resume_skips_a_corrupt_newest_checkpoint_and_says_which_it_took(
        saved: Path, caplog: pytest.LogCaptureFixture) -> None:
    from relax_gym.trainer.checkpoint import latest_checkpoint, resolve_checkpoint

    root = saved / "checkpoints"
    assert latest_checkpoint(saved) == root / "step_000002"
    target = root / "step_000002" / "backend" / "model.safetensors"
    target.write_bytes(target.read_bytes()[:100])
    with caplog.at_level(logging.WARNING, logger="relax_gym.trainer.checkpoint"):
        chosen = resolve_checkpoint(saved)
    assert chosen == root / "step_000001"
    text = caplog.text
    assert str(target) in text and "truncated" in text  # why the newest was skipped
    assert f"resuming from {root / 'step_000001'}" in text  # which one it took


def test_resume_with_a_step_takes_exactly_that_one(saved: Path) -> None:
    from relax_gym.trainer.checkpoint import NoCheckpointError, resolve_checkpoint

    root = saved / "checkpoints"
    assert resolve_checkpoint(saved, "1") == root / "step_000001"
    assert resolve_checkpoint(saved, "step_000002") == root / "step_000002"
    assert resolve_checkpoint(saved, str(root / "step_000001")) == root / "step_000001"
    with pytest.raises(NoCheckpointError, match="step_000007") as err:
        resolve_checkpoint(saved, "7")
    assert "step_000001" in str(err.value)  # lists what there is
    (root / "step_000001" / "rng.safetensors").write_bytes(b"junk")
    with pytest.raises(CheckpointError, match="rng.safetensors"):  # a named one never falls back
        resolve_checkpoint(saved, "1")


def test_latest_pointer_cannot_escape_the_checkpoint_folder(saved: Path) -> None:
    from relax_gym.trainer.checkpoint import latest_checkpoint, resolve_checkpoint

    (saved / "checkpoints" / "latest").write_text("../../../etc")
    assert latest_checkpoint(saved) is None
    assert resolve_checkpoint(saved).parent == saved / "checkpoints"


def test_trainer_resume_falls_back_past_a_corrupt_checkpoint(tiny_model: Path, tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """The loop's own resume path (before any engine starts) takes the older valid checkpoint."""
    from relax_gym.trainer.config import config_from_dict
    from relax_gym.trainer.modes.colocate import Trainer
    from relax_gym.trainer.modes.colocate import config_hash, make_backend

    config = _config(tiny_model, tmp_path / "run")
    be = make_backend(config, tiny_model)
    for step in (1, 2):
        save_checkpoint(config.out_dir, f"step_{step:06d}", be,
                        TrainerState(step=step, weight_version=step, config_hash=config_hash(config)))
    newest = config.out_dir / "checkpoints" / "step_000002" / "trainer_state.json"
    newest.write_text(newest.read_text().replace('"step": 2', '"step": 3'))
    trainer = Trainer(config_from_dict(config.model_dump(mode="json")), resume=True)
    with caplog.at_level(logging.WARNING):
        trainer._setup()
    assert trainer.state.step == 1
    assert "resuming from" in caplog.text and "step_000001" in caplog.text and str(newest) in caplog.text


# ------------------------------------------------------------------------------------------------
# the CLI: exit 2, one line naming the file, no traceback
# ------------------------------------------------------------------------------------------------
def _config(model: Path, out: Path) -> Any:
    from relax_gym.trainer.config import config_from_dict

    return config_from_dict({
        "run_name": "t", "output_dir": str(out), "seed": 3, "threads": 1,
        "model": {"path": str(model)},
        "data": {"envs": [{"id": "test/Letters-v0", "entry_point": "tests.trainer.envs:LetterEnv"}]},
        "rollout": {"group_size": 2, "prompts_per_step": 1, "max_new_tokens": 4},
        "train": {"steps": 2},
        "eval": {"every": 0, "episodes": 1, "at_start": False},
        "logging": {"progress": "none", "tensorboard": False, "plot": False},
    })


def _write_config(model: Path, out: Path, path: Path) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(_config(model, out).model_dump(mode="json")), encoding="utf-8")
    return path


def test_cli_resume_from_a_corrupt_checkpoint_is_one_line(tiny_model: Path, backend: Any, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from relax_gym.cli.main import main

    out = tmp_path / "run"
    save_checkpoint(out, "step_000001", backend, TrainerState(step=1))
    target = out / "checkpoints" / "step_000001" / "rng.safetensors"
    data = bytearray(target.read_bytes())
    data[-1] ^= 0xFF
    target.write_bytes(bytes(data))
    cfg = _write_config(tiny_model, out, tmp_path / "c.yaml")
    for argv in (["--resume"], ["--resume", "1"], ["--resume", "step_000001"]):
        assert main(["train", str(cfg), *argv]) == 2
        err = capsys.readouterr().err
        line = [ln for ln in err.splitlines() if ln.startswith("relax-gym train:")]
        assert len(line) == 1 and str(target) in line[0] and "sha256" in line[0], err
        assert "Traceback" not in err


def test_cli_resume_followed_by_an_override_keeps_the_override(tiny_model: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from relax_gym.cli.main import main

    cfg = _write_config(tiny_model, tmp_path / "run", tmp_path / "c.yaml")
    assert main(["train", str(cfg), "--print-config", "--resume", "train.steps=7"]) == 0
    assert "steps: 7" in capsys.readouterr().out


def test_checkpoint_error_raised_in_a_ray_actor_is_unwrapped() -> None:
    from relax_gym.trainer.checkpoint import find_checkpoint_error

    inner = CheckpointError("/x/step_000001/rng.safetensors: sha256 does not match manifest.json")

    class RayTaskError(CheckpointError):  # ray's wrapper subclasses the cause's type; its text is a traceback
        def __init__(self) -> None:
            super().__init__("Traceback (most recent call last):\n ... remote frames ...")
            self.cause = inner

    assert find_checkpoint_error(RayTaskError()) is inner
    try:
        try:
            raise inner
        except CheckpointError as exc:
            raise RuntimeError("learner failed") from exc
    except RuntimeError as outer:
        assert find_checkpoint_error(outer) is inner
    assert find_checkpoint_error(ValueError("x")) is None


@pytest.mark.slow
def test_cli_subprocess_resume_exits_2_with_one_line(tiny_model: Path, backend: Any, tmp_path: Path) -> None:
    out = tmp_path / "run"
    save_checkpoint(out, "step_000001", backend, TrainerState(step=1))
    target = out / "checkpoints" / "step_000001" / "backend" / "optimizer.safetensors"
    target.write_bytes(target.read_bytes()[:-10])
    cfg = _write_config(tiny_model, out, tmp_path / "c.yaml")
    proc = subprocess.run([sys.executable, "-m", "relax_gym.cli.main", "train", str(cfg), "--resume"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("relax-gym train:")]
    assert len(line) == 1 and str(target) in line[0] and "truncated" in line[0], proc.stderr


# ------------------------------------------------------------------------------------------------
# megatron end to end (a real distributed checkpoint; ~30 s, so slow)
# ------------------------------------------------------------------------------------------------
def _megatron_attacks(model_dir: str, work_dir: str, marker: str) -> dict[str, Any]:
    """Runs in a fresh process with the CPU shim: save a real state, then load crafted copies."""
    import shutil

    from relax_gym.trainer.backends.base import NLLObjective, OptimizerSettings
    from relax_gym.trainer.backends.megatron.backend import MegatronBackend, MegatronBackendError
    from tests.megatron import dist_workers

    work = Path(work_dir)
    be = MegatronBackend(model_dir, micro_batch_size=2, optimizer=OptimizerSettings(lr=1e-3))
    be.train_step(dist_workers.grpo_batch(be.dims.vocab_size), NLLObjective())
    be.save_state(work / "good")
    be.load_state(work / "good")
    payload = _Payload(Path(marker))
    out: dict[str, Any] = {"clean_version": be.version}

    def attempt(name: str, tamper: Any) -> None:
        bad = work / name
        shutil.copytree(work / "good", bad)
        tamper(bad / "megatron")
        try:
            be.load_state(bad)
            out[name] = "loaded"
        except MegatronBackendError as exc:
            out[name] = str(exc)

    def metadata(d: Path) -> None:
        (d / ".metadata").write_bytes(pickle.dumps(payload))

    def common(d: Path) -> None:
        torch.save({"x": payload}, d / "common.pt")

    def byte_item(d: Path) -> None:  # a consistent .metadata pointing a byte item at the payload
        md = pickle.loads((d / ".metadata").read_bytes())
        buf = io.BytesIO()
        torch.save([payload], buf)
        for idx, info in md.storage_data.items():
            if "_extra_state" in idx.fqn:
                f = d / info.relative_path
                info.offset, info.length = f.stat().st_size, len(buf.getvalue())
                with f.open("ab") as fh:
                    fh.write(buf.getvalue())
        (d / ".metadata").write_bytes(pickle.dumps(md))

    def truncated(d: Path) -> None:
        f = sorted(d.glob("*.distcp"))[-1]
        f.write_bytes(f.read_bytes()[:1000])

    for name, fn in [("metadata", metadata), ("common", common), ("byte_item", byte_item),
                     ("truncated", truncated)]:
        attempt(name, fn)
    out["marker"] = Path(marker).exists()
    return out


@pytest.mark.slow
def test_megatron_state_never_unpickles(tmp_path: Path, marker: Path) -> None:
    pytest.importorskip("megatron.core")
    from tests.megatron import dist_workers, tiny_models

    model_dir = tiny_models.save_model(tiny_models.qwen3_config(layers=1), tmp_path / "hf")
    r = dist_workers.run_isolated(_megatron_attacks, env={"RELAX_MEGATRON_CPU_SHIM": "1"}, timeout=240,
                                  model_dir=str(model_dir), work_dir=str(tmp_path), marker=str(marker))
    assert r["marker"] is False and r["clean_version"] == 1
    assert ".metadata" in r["metadata"] and "refused" in r["metadata"]
    assert "common.pt" in r["common"] and "refused" in r["common"]
    assert ".distcp" in r["byte_item"] and "refused" in r["byte_item"]
    assert ".distcp" in r["truncated"] and "truncated" in r["truncated"]
    for name in ("metadata", "common", "byte_item", "truncated"):
        assert "\n" not in r[name]


# --- trajectory/transcript records name media by plain file name only -------------------------


@pytest.mark.parametrize("name", ["../secret.png", "/etc/passwd", "sub/../../x.png", "..", "", 42, "a\\..\\b.png"])
def test_a_record_cannot_read_media_outside_its_folder(name: object, tmp_path) -> None:
    from relax_gym.errors import MediaError
    from relax_gym.transcript import message_from_record

    media = tmp_path / "media"
    media.mkdir()
    (tmp_path / "secret.png").write_bytes(b"not for you")
    rec = {"role": "user", "content": [{"type": "image", "path": name}]}
    with pytest.raises(MediaError, match="plain file name"):
        message_from_record(rec, media)


def test_a_record_cannot_follow_a_symlink_out_of_its_folder(tmp_path) -> None:
    from relax_gym.errors import MediaError
    from relax_gym.transcript import message_from_record

    media = tmp_path / "media"
    media.mkdir()
    (media / "image-0.png").symlink_to("/etc/hostname")
    with pytest.raises(MediaError, match="symlink"):
        message_from_record({"role": "user", "content": [{"type": "image", "path": "image-0.png"}]}, media)


# --- the async producer's state in a checkpoint is checked, not trusted -----------------------


def _bare_producer():
    from relax_gym.trainer.config import EnvEntry
    from relax_gym.trainer.rollout.sampler import EpisodeSampler
    from relax_gym.trainer.modes.producer import RolloutProducer

    producer = RolloutProducer.__new__(RolloutProducer)  # only the state fields matter here
    producer.sampler = EpisodeSampler([EnvEntry(id="relax/SenseCount-v0")], seed=1)
    return producer


@pytest.mark.parametrize(
    "state",
    [
        {"pending": [{"seed": 3}]},  # no env_id
        {"pending": "not a list"},
        {"counts": {"x": "many"}},
        {"sampler": {"drawn": 1}},  # no bit_generator
        {"sampler": {"drawn": 1, "bit_generator": {"bit_generator": "Evil"}}},
        {"unknown": 1},
    ],
)
def test_a_malformed_producer_state_is_one_checkpoint_error(state) -> None:
    from relax_gym.trainer.checkpoint import CheckpointError

    producer = _bare_producer()
    with pytest.raises(CheckpointError, match="rollout producer state"):
        producer.load_state_dict(state)


def test_a_valid_producer_state_round_trips() -> None:
    producer = _bare_producer()
    producer.sampler.next(3)
    state = {"sampler": producer.sampler.state_dict(), "counts": {"groups": 2}, "dropped_ids": ["g1"],
             "pending": [{"env_id": "relax/SenseCount-v0", "seed": 5, "group_id": "g7"},
                         {"env_id": "relax/SenseCount-v0", "seed": 6, "group_id": "skip"}]}
    fresh = _bare_producer()
    fresh.load_state_dict(state, skip_groups={"skip"})
    assert [s.group for s in fresh._regen] == ["g7"] and fresh.sampler.drawn == 3
    assert fresh.counts["groups"] == 2 and fresh.counts["regenerated_groups"] == 1
