"""Registration of the shipped envs and the suites built from their families."""

from __future__ import annotations

import relax_gym
from relax_gym.envs import FAMILIES, SHIPPED, register_envs, shipped
from relax_gym.types import MODALITIES


def test_every_shipped_env_is_registered_as_declared() -> None:
    ids = {s.id for s in relax_gym.list_envs(namespace="relax")}
    assert {e.id for e in SHIPPED} <= ids
    for e in SHIPPED:
        summary = relax_gym.spec(e.id).summary()
        assert summary["modalities"] == list(e.modalities)
        assert summary["tags"] == list(e.tags) and summary["max_turns"] == e.max_turns and summary["oracle"]
        assert e.family in FAMILIES and set(e.modalities) <= set(MODALITIES)
        if e.max_turns > 1:
            assert "multi-turn" in e.tags


def test_issue_counts_for_the_tool_free_envs() -> None:
    modal = lambda m: [e for e in SHIPPED if m in e.modalities]  # noqa: E731
    assert len(modal("image")) >= 4 + 1  # ShapeCount, Clock, GridRules, SceneQuery (+ games, SenseCount)
    assert len(shipped("audio")) >= 2 and len(shipped("video")) >= 2
    assert len([e for e in SHIPPED if "multi-turn" in e.tags]) >= 2


def test_register_envs_is_idempotent() -> None:
    before = (dict(relax_gym.registry), dict(relax_gym.registration.suites))
    register_envs()
    register_envs()
    assert (dict(relax_gym.registry), dict(relax_gym.registration.suites)) == before


def test_suites() -> None:
    suites = {s.name: s for s in relax_gym.list_suites()}
    core = relax_gym.make_suite("relax/core-v0")
    families = [next(e.family for e in SHIPPED if e.id == i) for i in core.env_ids]
    assert len(families) == len(set(families)) == len([f for f in FAMILIES if shipped(f)])
    text = suites["relax/text-v0"]
    assert all(set(relax_gym.spec(i).summary()["modalities"]) >= {"text"} for i in text.env_ids)
    assert text.env_kwargs["relax/Sokoban-v0"] == {"render": "text"}
    vision = suites["relax/vision-v0"]
    assert vision.env_kwargs["relax/GridMaze-v0"] == {"render": "image"}
    assert set(vision.env_ids) >= {e.id for e in shipped("image")}
    assert set(suites["relax/audio-v0"].env_ids) == {e.id for e in shipped("audio")}
    assert set(suites["relax/video-v0"].env_ids) == {e.id for e in shipped("video")}
    # no empty or placeholder suite: tools-v0 appears only with tool envs
    assert ("relax/tools-v0" in suites) == bool(shipped("tools"))


def test_every_suite_episode_makes_and_resets_with_its_kwargs() -> None:
    for suite in relax_gym.list_suites():
        if not suite.name.startswith("relax/"):
            continue
        for env_id in suite.env_ids:
            kwargs = suite.env_kwargs.get(env_id, {})
            env = relax_gym.make(env_id, **kwargs)
            obs, _ = env.reset(seed=suite.episodes()[0].seed)
            modalities = obs.modalities
            if kwargs.get("render") == "text" or suite.name == "relax/text-v0":
                assert modalities == {"text"}, (suite.name, env_id)
            if kwargs.get("render") == "image":
                assert "image" in modalities, (suite.name, env_id)
