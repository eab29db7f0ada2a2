"""Every shipped env passes relax_gym.check_env on 5 seeds at every difficulty (and, for the
grid games, with both renders): determinism down to media bytes, the oracle always winning,
junk actions handled, modalities as declared."""

from __future__ import annotations

import pytest

import relax_gym
from relax_gym.envs import SHIPPED
from relax_gym.envs._base import DIFFICULTIES

CASES = [(e.id, d, {}) for e in SHIPPED for d in DIFFICULTIES] + [
    (e.id, d, {"render": "image"}) for e in SHIPPED if e.vision_kwargs for d in DIFFICULTIES
]


def _case_id(value: object) -> str:
    if isinstance(value, dict):
        return "-".join(f"{k}={v}" for k, v in value.items()) or "default"
    return str(value)


@pytest.mark.parametrize(("env_id", "difficulty", "kwargs"), CASES, ids=_case_id)
def test_check_env_passes(env_id: str, difficulty: str, kwargs: dict[str, str]) -> None:
    env = relax_gym.make(env_id, difficulty=difficulty, **kwargs)
    report = relax_gym.check_env(env, seeds=[0, 1, 2, 3, 4], raise_on_failure=False)
    assert report.passed, str(report)
    assert all(not r.skipped for r in report.results), str(report)  # the oracle check really ran


def test_bad_options_are_clear_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for e in SHIPPED:
        with pytest.raises(relax_gym.RelaxGymError, match="difficulty must be one of"):
            relax_gym.make(e.id, difficulty="impossible")
    with pytest.raises(ValueError, match="render must be one of"):
        relax_gym.make("relax/Sokoban-v0", render="3d")
    from relax_gym.cli.main import main

    assert main(["play", "relax/GridMaze-v0", "-k", "difficulty=extreme", "--agent", "oracle"]) == 2
    assert "difficulty must be one of" in capsys.readouterr().err


def test_every_env_declares_its_contract() -> None:
    """Docstrings state task/observation/action/reward/difficulty; registry matches the class."""
    for e in SHIPPED:
        cls = relax_gym.spec(e.id).load()
        module_doc = __import__(cls.__module__, fromlist=["_"]).__doc__ or ""
        for word in ("Task", "Observation", "Action", "Reward", "Difficulty"):
            assert f"**{word}**" in module_doc, (e.id, word)
        assert set(e.modalities) >= set(cls.modalities), e.id
        assert cls.max_turns == e.max_turns, e.id
        assert cls.random_action is not relax_gym.Env.random_action, e.id  # a format-aware random agent

