"""`relax-gym train` takes dataset envs like any other: the shipped example config validates
and its envs build before any model loads; a bad column fails as a ConfigError naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("datasets", reason="dataset envs need the `datasets` package (relax-gym[data], in dev)")

from relax_gym.trainer.config import ConfigError, check_envs, load_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_dataset_math_example_validates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the example's paths are relative to the repository root, like the quickstart's
    config = load_config(ROOT / "examples/dataset_math.yaml")
    assert config.data.envs[0].id == "relax/Dataset-v0"
    check_envs(config)


def test_a_bad_dataset_column_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    bad = "data.envs=[{id: relax/Dataset-v0, kwargs: {config: examples/data/math.yaml, prompt: questoin}}]"
    config = load_config(ROOT / "examples/dataset_math.yaml", [bad])
    with pytest.raises(ConfigError, match=r"data\.envs\.0.*no column 'questoin' \(mapped as prompt\)"):
        check_envs(config)
