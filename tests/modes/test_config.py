"""The mode selection in the config: validation, readable errors, the CLI entry point."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from relax_gym.trainer.config import ConfigError
from relax_gym.trainer.modes import ModesTrainConfig, modes_config_from_dict
from relax_gym.trainer.modes.runner import needs_workers

BASE = {"model": {"build": {"kind": "qwen3", "tokenizer": "tiny-bpe"}},
        "data": {"envs": [{"id": "relax/ArithmeticWord-v0"}]}}


def test_defaults_and_overrides() -> None:
    c = modes_config_from_dict(BASE)
    assert c.mode == "colocate" and not c.is_async
    c = modes_config_from_dict(BASE, ["mode=fully_async", "async_rl.max_staleness=3", "rollout.prompts_per_step=4",
                                      "async_rl.runtime=ray", "async_rl.ray.num_cpus=2"])
    assert c.is_async and c.async_rl.max_staleness == 3 and c.async_rl.capacity(4) == 20
    assert c.async_rl.ray.num_cpus == 2
    again = ModesTrainConfig.model_validate(yaml.safe_load(c.to_yaml()))  # the saved config.yaml reloads
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
        modes_config_from_dict(BASE, overrides)
    assert message in str(err.value)


def test_which_logprob_workers_each_mode_runs() -> None:
    kl = ["algorithm.kl_loss_coef=0.1", "train.mini_batches=2"]
    assert needs_workers(modes_config_from_dict(BASE, ["mode=fully_async", *kl])) == (True, True)
    assert needs_workers(modes_config_from_dict(BASE, ["mode=hybrid", *kl])) == (False, False)
    assert needs_workers(modes_config_from_dict(BASE, ["mode=fully_async"])) == (False, False)


def test_cli_prints_the_config_and_rejects_bad_ones(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(BASE))
    ok = subprocess.run([sys.executable, "-m", "relax_gym.trainer.modes", str(path), "mode=hybrid", "--print-config"],
                        capture_output=True, text=True, timeout=120, check=False)
    assert ok.returncode == 0, ok.stderr
    assert yaml.safe_load(ok.stdout)["mode"] == "hybrid"
    bad = subprocess.run([sys.executable, "-m", "relax_gym.trainer.modes", str(path), "async_rl.runtime=rya"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode == 2 and "async_rl.runtime: must be one of" in bad.stderr
