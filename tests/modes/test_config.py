"""The mode selection in the one training config: validation, readable errors, and
``relax-gym train`` dispatching the asynchronous modes to their runner."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from relax_gym.cli.main import main
from relax_gym.trainer.config import ConfigError, TrainConfig, config_from_dict
from relax_gym.trainer.modes.learner import read_ledger
from relax_gym.trainer.modes.async_runner import needs_workers

from .conftest import config_dict

BASE = {"model": {"build": {"kind": "qwen3", "tokenizer": "tiny-bpe"}},
        "data": {"envs": [{"id": "relax/ArithmeticWord-v0"}]}}


def test_defaults_and_overrides() -> None:
    c = config_from_dict(BASE)
    assert c.mode == "colocate" and not c.is_async
    c = config_from_dict(BASE, ["mode=fully_async", "async_rl.max_staleness=3", "rollout.prompts_per_step=4",
                                "async_rl.runtime=ray", "async_rl.ray.num_cpus=2"])
    assert c.is_async and c.async_rl.max_staleness == 3 and c.async_rl.capacity(4) == 20
    assert c.async_rl.ray.num_cpus == 2
    again = TrainConfig.model_validate(yaml.safe_load(c.to_yaml()))  # the saved config.yaml reloads
    assert again == c


@pytest.mark.parametrize(("overrides", "message"), [
    (["mode=fully_asynch"], "mode: must be one of 'colocate', 'fully_async' or 'hybrid'"),
    (["mode=fully_async", "async_rl.max_stalenes=2"], "did you mean 'max_staleness'"),
    (["mode=fully_async", "async_rl.max_staleness=-1"], "async_rl.max_staleness"),
    (["mode=fully_async", "async_rl.stale_policy=correct"], "set algorithm.rollout_correction"),
    (["mode=fully_async", "async_rl.queue_capacity=2", "rollout.prompts_per_step=4"], "must hold one batch"),
    (["async_rl.runtime=ray"], "colocate runs embedded"),
    (["mode=hybrid", "async_rl.imports=['not a module']"], "is not a module name"),
])
def test_bad_async_settings_fail_fast_with_the_field(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match="invalid training config") as err:
        config_from_dict(BASE, overrides)
    assert message in str(err.value)


def test_which_logprob_workers_each_mode_runs() -> None:
    kl = ["algorithm.kl_loss_coef=0.1", "train.mini_batches=2"]
    assert needs_workers(config_from_dict(BASE, ["mode=fully_async", *kl])) == (True, True)
    assert needs_workers(config_from_dict(BASE, ["mode=hybrid", *kl])) == (False, False)
    assert needs_workers(config_from_dict(BASE, ["mode=fully_async"])) == (False, False)


def test_the_colocate_loop_refuses_an_async_config(tmp_path: Path) -> None:
    """Calling the colocate loop directly with an async mode fails before any work instead of
    silently training on-policy."""
    from relax_gym.trainer.modes.colocate import train

    cfg = config_from_dict(BASE, ["mode=hybrid", f"output_dir={tmp_path / 'run'}"])
    with pytest.raises(ValueError, match="does not run mode 'hybrid'"):
        train(cfg)
    assert not (tmp_path / "run").exists()


def test_module_entry_is_relax_gym_train(tmp_path: Path) -> None:
    """``python -m relax_gym.trainer.modes`` is an alias of ``relax-gym train``: same output, same exit codes."""
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(BASE))
    ok = subprocess.run([sys.executable, "-m", "relax_gym.trainer.modes", str(path), "mode=hybrid", "--print-config"],
                        capture_output=True, text=True, timeout=120, check=False)
    assert ok.returncode == 0, ok.stderr
    assert yaml.safe_load(ok.stdout)["mode"] == "hybrid"
    bad = subprocess.run([sys.executable, "-m", "relax_gym.trainer.modes", str(path), "async_rl.runtime=rya"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode == 2 and "async_rl.runtime: must be one of" in bad.stderr


def test_relax_gym_train_runs_fully_async_through_the_modes_runner(
        tiny_model: Path, engine: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A short real fully_async run started by ``relax-gym train``: the files only the
    asynchronous runner writes (ledger, timeline, the summary's mode and runtime) are there.
    With ``async_rl.learner_process`` the learner runs in a child process of its own, and finds
    the env although no ``async_rl.imports`` names its module (the module that registered it here
    is imported there)."""
    out = tmp_path / "run"
    path = tmp_path / "run.yaml"
    raw = config_dict(tiny_model, out, [engine.url], train={"steps": 2})
    raw["async_rl"].update({"imports": [], "learner_process": True})
    path.write_text(yaml.safe_dump(raw))
    assert main(["train", str(path)]) == 0
    assert "done (fully_async): 2 RL steps" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["mode"], summary["runtime"], summary["steps"]) == ("fully_async", "embedded", 2)
    assert summary["learner_pid"] not in (None, summary["driver_pid"])
    assert (out / "timeline.json").is_file()
    assert [r["step"] for r in read_ledger(out)] == [1, 2]
