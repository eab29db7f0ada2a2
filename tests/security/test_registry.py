"""Attacks on the env registry boundary (``relax_gym.register`` / ``register_suite`` and the
``relax_gym.envs`` plugin entry points):

* a registration with a wrong type -- ``entry_point=42``, ``max_turns="3"``, ``tags="math"``
  (which would split into letters) -- is refused when registered, naming the id and the field,
  not when the env is first made, far from the mistake;
* a user env or a plugin that registers a shipped ``relax/...`` id (or any id that is already
  taken) is refused with an error naming the id, whether or not the shipped envs are loaded
  yet; a plugin that tries is reported as failed and the shipped env stays. ``override=True``
  replaces on purpose, with a warning.
"""

from __future__ import annotations

import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import relax_gym
from relax_gym import RegistrationError
from relax_gym import registration as reg
from tests.core.envs_for_tests import GuessEnv

SHIPPED_ID = "relax/ArithmeticWord-v0"
SHIPPED_ENTRY = "relax_gym.envs.arithmetic:ArithmeticWordEnv"


@pytest.fixture
def pristine_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A process where no plugin has run yet (the shipped envs are not registered); the real
    registry and suites come back afterwards."""
    saved_envs, saved_suites = dict(reg.registry), dict(reg.suites)
    reg.registry.clear()
    reg.suites.clear()
    monkeypatch.setattr(reg, "_plugins_loaded", False)
    try:
        yield
    finally:
        reg.registry.clear()
        reg.registry.update(saved_envs)
        reg.suites.clear()
        reg.suites.update(saved_suites)
        reg.plugin_errors.pop("shadow", None)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"entry_point": 42}, "entry_point must be a callable or a 'package.module:Name' string, got int"),
        ({"entry_point": None}, "entry_point must be a callable"),
        ({"entry_point": "no_colon_here"}, "must look like 'package.module:Name'"),
        ({"entry_point": "pkg.mod:Name.attr"}, "must look like 'package.module:Name'"),
        ({"entry_point": "1pkg:Env"}, "must look like 'package.module:Name'"),
        ({"entry_point": "pkg mod:Env"}, "must look like 'package.module:Name'"),
        ({"entry_point": GuessEnv, "max_turns": "3"}, "max_turns must be an int >= 1"),
        ({"entry_point": GuessEnv, "max_turns": 0}, "max_turns must be an int >= 1"),
        ({"entry_point": GuessEnv, "max_turns": True}, "max_turns must be an int >= 1"),
        ({"entry_point": GuessEnv, "max_turns": 2.5}, "max_turns must be an int >= 1"),
        ({"entry_point": GuessEnv, "tags": "math"}, "tags must be a list of str"),
        ({"entry_point": GuessEnv, "tags": ["ok", 3]}, "tags must be a list of str"),
        ({"entry_point": GuessEnv, "modalities": "text"}, "modalities must be a list of str"),
        ({"entry_point": GuessEnv, "kwargs": [("high", 3)]}, "kwargs must be a dict with str keys"),
        ({"entry_point": GuessEnv, "kwargs": {1: 2}}, "kwargs must be a dict with str keys"),
        ({"entry_point": GuessEnv, "nondeterministic": "yes"}, "nondeterministic must be True or False"),
        ({"entry_point": GuessEnv, "description": 5}, "description must be a str"),
        ({"entry_point": GuessEnv, "override": "yes"}, "override must be True or False"),
    ],
)
def test_bad_registrations_are_refused_when_registered(kwargs: dict, message: str) -> None:
    with pytest.raises(RegistrationError, match=r"^sec/Bad-v0: .*" + message.replace("(", r"\(").replace(")", r"\)")):
        relax_gym.register("sec/Bad-v0", **kwargs)
    assert "sec/Bad-v0" not in relax_gym.registry


def test_good_registrations_still_work() -> None:
    import numpy as np

    relax_gym.register("sec/Good-v0", "tests.core.envs_for_tests:GuessEnv", max_turns=np.int64(3), tags=("a",))
    relax_gym.register("sec/Good-v1", lambda **kw: GuessEnv(**kw), kwargs={"high": 4})
    try:
        assert relax_gym.spec("sec/Good-v0").max_turns == 3
        assert isinstance(relax_gym.make("sec/Good-v1").unwrapped, GuessEnv)
    finally:
        relax_gym.deregister("sec/Good-v0")
        relax_gym.deregister("sec/Good-v1")


def test_an_id_is_taken_until_overridden_on_purpose() -> None:
    relax_gym.register("sec/Taken-v0", GuessEnv)
    try:
        with pytest.raises(RegistrationError, match="'sec/Taken-v0' is already registered.*override=True"):
            relax_gym.register("sec/Taken-v0", dict)
        assert relax_gym.spec("sec/Taken-v0").entry_point is GuessEnv
        with pytest.warns(UserWarning, match="overriding environment 'sec/Taken-v0'"):
            relax_gym.register("sec/Taken-v0", GuessEnv, kwargs={"high": 2}, override=True)
        assert relax_gym.spec("sec/Taken-v0").kwargs == {"high": 2}
    finally:
        relax_gym.deregister("sec/Taken-v0")


def test_a_user_env_cannot_shadow_a_shipped_id() -> None:
    relax_gym.spec(SHIPPED_ID)  # the shipped envs are loaded
    with pytest.raises(RegistrationError, match=f"cannot register environment '{SHIPPED_ID}'"):
        relax_gym.register(SHIPPED_ID, GuessEnv)
    assert relax_gym.spec(SHIPPED_ID).entry_point == SHIPPED_ENTRY


def test_shadowing_is_refused_before_the_shipped_envs_are_loaded(pristine_registry: None) -> None:
    """The shipped envs register lazily; before that, the old registry let a user env take a
    shipped id, and the shipped registration then skipped it: a silent stand-in."""
    with pytest.raises(RegistrationError, match=f"'{SHIPPED_ID}'.*namespace is reserved"):
        relax_gym.register(SHIPPED_ID, GuessEnv)
    with pytest.raises(RegistrationError, match="'relax/Brand-New-v0'.*namespace is reserved"):
        relax_gym.register("relax/Brand-New-v0", GuessEnv)  # reserved even if not (yet) shipped
    with pytest.raises(RegistrationError, match="'relax/core-v0'.*reserved"):
        relax_gym.register_suite("relax/core-v0", ["sec/Other-v0"])
    assert relax_gym.spec(SHIPPED_ID).entry_point == SHIPPED_ENTRY
    assert relax_gym.make_suite("relax/core-v0").env_ids[0] == SHIPPED_ID


def test_override_replaces_a_shipped_env_loudly(pristine_registry: None) -> None:
    with pytest.warns(UserWarning, match=f"overriding environment '{SHIPPED_ID}'"):
        relax_gym.register(SHIPPED_ID, GuessEnv, override=True)
    assert relax_gym.spec(SHIPPED_ID).entry_point is GuessEnv  # the shipped registration keeps it


def _plugin(tmp_path: Path, body: str) -> None:
    pkg = tmp_path / "shadow_plugin"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent(body))
    dist = tmp_path / "shadow_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: shadow-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[relax_gym.envs]\nshadow = shadow_plugin:register_all\n")


def test_a_plugin_that_registers_a_shipped_id_fails_and_the_shipped_env_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pristine_registry: None
) -> None:
    """The plugin runs before the shipped entry point (it is first on sys.path): it still cannot
    take the id, its failure is reported with the id, and its other envs are not half-added."""
    _plugin(tmp_path, f"""
        import relax_gym
        def register_all():
            relax_gym.register("{SHIPPED_ID}", "tests.core.envs_for_tests:GuessEnv")
            relax_gym.register("shadow/Extra-v0", "tests.core.envs_for_tests:GuessEnv")
    """)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            found = relax_gym.spec(SHIPPED_ID)
        assert found.entry_point == SHIPPED_ENTRY
        assert "shadow" in reg.plugin_errors and SHIPPED_ID in reg.plugin_errors["shadow"]
        assert any("shadow" in str(w.message) and SHIPPED_ID in str(w.message) for w in caught)
        assert "shadow/Extra-v0" not in relax_gym.registry
    finally:
        sys.modules.pop("shadow_plugin", None)


def test_plugins_cannot_take_each_others_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pristine_registry: None
) -> None:
    relax_gym.register("acme/Guess-v0", GuessEnv)
    _plugin(tmp_path, """
        import relax_gym
        def register_all():
            relax_gym.register("acme/Guess-v0", "tests.core.envs_for_tests:GuessEnv")
    """)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            reg.load_plugins()
        assert relax_gym.spec("acme/Guess-v0").entry_point is GuessEnv
        assert "already registered" in reg.plugin_errors["shadow"]
    finally:
        sys.modules.pop("shadow_plugin", None)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"env_ids": "sec/A-v0"}, "env_ids must be a list of env ids"),
        ({"env_ids": ["sec/A-v0"], "episodes_per_env": "5"}, "episodes_per_env must be an int >= 1"),
        ({"env_ids": ["sec/A-v0"], "seed": 1.5}, "seed must be an int"),
    ],
)
def test_bad_suites_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(RegistrationError, match=message):
        relax_gym.register_suite("sec/suite-v0", **kwargs)
    assert "sec/suite-v0" not in reg.suites


def test_a_suite_name_is_taken_until_overridden() -> None:
    relax_gym.register_suite("sec/taken-v0", ["sec/A-v0"])
    try:
        with pytest.raises(RegistrationError, match="suite 'sec/taken-v0' is already registered"):
            relax_gym.register_suite("sec/taken-v0", ["sec/B-v0"])
        with pytest.warns(UserWarning, match="overriding suite"):
            relax_gym.register_suite("sec/taken-v0", ["sec/B-v0"], override=True)
        assert reg.suites["sec/taken-v0"].env_ids == ("sec/B-v0",)
    finally:
        reg.suites.pop("sec/taken-v0", None)
