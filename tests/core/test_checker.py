from __future__ import annotations

import pytest

import relax_gym
from relax_gym import EnvCheckError
from tests.core.envs_for_tests import CrashOnJunkEnv, GlobalRandomEnv, GuessEnv, ImageEnv


def _results(report) -> dict[str, bool]:
    return {r.name: r.passed for r in report.results}


def test_multimodal_example_env_passes() -> None:
    report = relax_gym.check_env(relax_gym.make("relax/SenseCount-v0"), seeds=3)
    assert report.passed
    assert set(_results(report)) == {
        "gymnasium", "determinism", "formatting", "oracle", "invalid_action", "step_after_end", "declared_modalities",
    }


def test_nondeterministic_env_fails_with_clear_report() -> None:
    relax_gym.register("ck/GlobalRandom-v0", GlobalRandomEnv)
    try:
        env = relax_gym.make("ck/GlobalRandom-v0")
        with pytest.raises(EnvCheckError) as info:
            relax_gym.check_env(env, seeds=2)
        report = info.value.report
        assert _results(report)["determinism"] is False
        text = str(report)
        assert "FAILED" in text and "[FAIL] determinism: seed 0: two resets gave different observations" in text
        assert _results(report)["oracle"] is True  # the other checks still ran
    finally:
        relax_gym.deregister("ck/GlobalRandom-v0")


def test_env_that_raises_on_junk_fails_invalid_action() -> None:
    env = relax_gym.EpisodeGuard(CrashOnJunkEnv())
    report = relax_gym.check_env(env, seeds=2, raise_on_failure=False)
    assert not report.passed
    failure = {r.name: r.detail for r in report.failures}
    assert "invalid_action" in failure and "ValueError" in failure["invalid_action"]


def test_unguarded_env_fails_step_after_end_and_guarded_passes() -> None:
    from relax_gym.envs.sense_count import SenseCountEnv

    for raw, expected in ((GuessEnv(), "did not end within max_turns=3"), (SenseCountEnv(), "returned normally")):
        report = relax_gym.check_env(raw, seeds=2, raise_on_failure=False, skip_gymnasium=True)
        detail = {r.name: r.detail for r in report.failures}
        assert list(detail) == ["step_after_end"], str(report)
        assert expected in detail["step_after_end"] and "relax_gym.make()" in detail["step_after_end"]
    guarded = relax_gym.check_env(relax_gym.EpisodeGuard(GuessEnv()), seeds=2, raise_on_failure=False)
    assert guarded.passed, str(guarded)


def test_undeclared_modality_is_reported() -> None:
    report = relax_gym.check_env(relax_gym.EpisodeGuard(ImageEnv()), seeds=2, raise_on_failure=False)
    detail = {r.name: r.detail for r in report.failures}
    assert "declared_modalities" in detail and "['image']" in detail["declared_modalities"]


def test_report_serialises() -> None:
    report = relax_gym.check_env(relax_gym.make("relax/SenseCount-v0"), seeds=1, skip_gymnasium=True)
    d = report.to_dict()
    assert d["passed"] is True and d["env_id"] == "relax/SenseCount-v0"
    assert any(c["name"] == "oracle" for c in d["checks"])
    with pytest.raises(ValueError, match="at least one seed"):
        relax_gym.check_env(relax_gym.make("relax/SenseCount-v0"), seeds=[])
