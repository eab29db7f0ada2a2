from __future__ import annotations

import sys
import textwrap
import warnings

import pytest

import relax_gym
from relax_gym import RegistrationError
from relax_gym import registration as reg
from tests.core.envs_for_tests import GuessEnv


@pytest.mark.parametrize(
    "env_id, parts",
    [
        ("relax/Maze-v0", ("relax", "Maze", 0)),
        ("Maze-v12", (None, "Maze", 12)),
        ("acme:co/My.Env", ("acme:co", "My.Env", None)),
    ],
)
def test_parse_env_id(env_id, parts) -> None:
    assert reg.parse_env_id(env_id) == parts


@pytest.mark.parametrize("bad", ["", "a/b/c", "has space-v0", "ns/-v0/x"])
def test_malformed_ids_rejected(bad) -> None:
    with pytest.raises(RegistrationError):
        reg.parse_env_id(bad)


def test_versions_and_lookup_errors() -> None:
    relax_gym.register("vt/Guess-v0", GuessEnv)
    relax_gym.register("vt/Guess-v2", GuessEnv, kwargs={"high": 5})
    try:
        with pytest.warns(UserWarning, match="resolved to 'vt/Guess-v2'"):
            assert relax_gym.spec("vt/Guess").id == "vt/Guess-v2"
        with pytest.raises(RegistrationError, match="registered versions: vt/Guess-v0, vt/Guess-v2"):
            relax_gym.spec("vt/Guess-v1")
        with pytest.raises(RegistrationError, match="did you mean 'vt/Guess-v0'"):
            relax_gym.make("vt/Gues-v0")
        with pytest.raises(RegistrationError, match="both versioned and unversioned"):
            relax_gym.register("vt/Guess", GuessEnv)
        with pytest.raises(RegistrationError, match="'vt/Guess-v0' is already registered"):
            relax_gym.register("vt/Guess-v0", GuessEnv)
        with pytest.warns(UserWarning, match="overriding"):
            relax_gym.register("vt/Guess-v0", GuessEnv, override=True)
    finally:
        relax_gym.deregister("vt/Guess-v0")
        relax_gym.deregister("vt/Guess-v2")
    with pytest.raises(RegistrationError, match="no environment 'vt/Guess-v0' to deregister"):
        relax_gym.deregister("vt/Guess-v0")


def test_bad_entry_points_and_kwargs() -> None:
    relax_gym.register("bad/NoModule-v0", "no_such_module_xyz:Env")
    relax_gym.register("bad/NoAttr-v0", "relax_gym.core:Nope")
    relax_gym.register("bad/NotEnv-v0", dict)
    try:
        with pytest.raises(RegistrationError, match="cannot import 'no_such_module_xyz'"):
            relax_gym.make("bad/NoModule-v0")
        with pytest.raises(RegistrationError, match="has no attribute 'Nope'"):
            relax_gym.make("bad/NoAttr-v0")
        with pytest.raises(RegistrationError, match="must look like 'package.module:Name'"):
            relax_gym.register("bad/Malformed-v0", "relax_gym.core.Env")  # checked when registered
        with pytest.raises(RegistrationError, match="not a relax_gym.Env"):
            relax_gym.make("bad/NotEnv-v0")
        with pytest.raises(RegistrationError, match="cannot build with arguments"):
            relax_gym.make("relax/SenseCount-v0", colour="red")
        with pytest.raises(RegistrationError, match="unknown modalities"):
            relax_gym.register("bad/Mod-v0", GuessEnv, modalities=["smell"])
    finally:
        for env_id in ("bad/NoModule-v0", "bad/NoAttr-v0", "bad/NotEnv-v0"):
            relax_gym.deregister(env_id)


def test_listing_filters_and_declared_metadata() -> None:
    relax_gym.register("lt/Guess-v0", "tests.core.envs_for_tests:GuessEnv")
    try:
        spec = relax_gym.spec("lt/Guess-v0")
        assert spec.resolved_tags() == ("game", "multi-turn") and spec.resolved_max_turns() == 3
        assert spec.has_oracle()
        ids = [s.id for s in relax_gym.list_envs(tag="multi-turn")]
        assert "lt/Guess-v0" in ids
        assert "lt/Guess-v0" not in [s.id for s in relax_gym.list_envs(modality="image")]
        assert "relax/SenseCount-v0" in [s.id for s in relax_gym.list_envs(modality="video")]
        assert all(s.namespace == "lt" for s in relax_gym.list_envs(namespace="lt"))
    finally:
        relax_gym.deregister("lt/Guess-v0")


def test_plugin_discovery_through_entry_points(tmp_path, monkeypatch) -> None:
    """A real installed-distribution layout on sys.path: the registry finds it lazily."""
    pkg = tmp_path / "acme_plugin"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent("""
        import relax_gym
        CALLS = []
        def register_all():
            CALLS.append(1)
            relax_gym.register("acme/Guess-v0", "tests.core.envs_for_tests:GuessEnv")
    """))
    dist = tmp_path / "acme_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[relax_gym.envs]\nacme = acme_plugin:register_all\n")
    broken = tmp_path / "broken_plugin-1.0.dist-info"
    broken.mkdir()
    (broken / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 1.0\n")
    (broken / "entry_points.txt").write_text("[relax_gym.envs]\nbroken = no_such_plugin_mod:hook\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(reg, "_plugins_loaded", False)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            env = relax_gym.make("acme/Guess-v0")
        assert isinstance(env.unwrapped, GuessEnv)
        assert sys.modules["acme_plugin"].CALLS == [1]
        assert "broken" in reg.plugin_errors and "no_such_plugin_mod" in reg.plugin_errors["broken"]
        relax_gym.make("acme/Guess-v0")  # plugins load once
        assert sys.modules["acme_plugin"].CALLS == [1]
    finally:
        relax_gym.deregister("acme/Guess-v0")
        reg.plugin_errors.pop("broken", None)
        sys.modules.pop("acme_plugin", None)


def test_suites_are_deterministic_and_validated() -> None:
    relax_gym.register("st/Guess-v0", GuessEnv)
    try:
        suite = relax_gym.register_suite("st/suite-v0", ["st/Guess-v0", "relax/SenseCount-v0"], episodes_per_env=4, seed=7)
        made = relax_gym.make_suite("st/suite-v0")
        keys = list(made)
        assert len(keys) == len(made) == 8
        assert keys == list(relax_gym.make_suite("st/suite-v0"))
        assert len({k.seed for k in keys}) == 8
        assert [k.index for k in keys[:4]] == [0, 1, 2, 3]
        # an env's seeds depend only on (suite seed, env id, index)
        relax_gym.register_suite("st/solo-v0", ["relax/SenseCount-v0"], episodes_per_env=4, seed=7)
        solo = [k.seed for k in relax_gym.make_suite("st/solo-v0")]
        assert solo == [k.seed for k in keys if k.env_id == "relax/SenseCount-v0"]
        assert len(relax_gym.make_suite("st/suite-v0", episodes_per_env=2)) == 4
        assert suite.name in [s.name for s in relax_gym.list_suites()]
        relax_gym.register_suite("st/broken-v0", ["st/Missing-v0"])
        with pytest.raises(RegistrationError, match="no environment registered as 'st/Missing-v0'"):
            relax_gym.make_suite("st/broken-v0")
        with pytest.raises(RegistrationError, match="no suite registered as 'st/nope'"):
            relax_gym.make_suite("st/nope")
        with pytest.raises(RegistrationError, match="at least one env"):
            relax_gym.register_suite("st/empty-v0", [])
    finally:
        relax_gym.deregister("st/Guess-v0")
        for name in ("st/suite-v0", "st/solo-v0", "st/broken-v0"):
            reg.suites.pop(name, None)


def test_concurrent_first_lookups_all_see_the_plugins(monkeypatch) -> None:
    """Threads racing on the first lookup wait for the plugin load instead of missing envs."""
    import threading
    import time

    calls = []
    real_hooks = reg._run_plugin_hooks

    def slow_hooks() -> None:
        calls.append(1)
        time.sleep(0.2)
        real_hooks()

    monkeypatch.setattr(reg, "_run_plugin_hooks", slow_hooks)
    monkeypatch.setattr(reg, "_plugins_loaded", False)
    saved = reg.registry.pop("relax/SenseCount-v0")
    errors: list[BaseException] = []

    def lookup() -> None:
        try:
            relax_gym.spec("relax/SenseCount-v0")
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    try:
        threads = [threading.Thread(target=lookup) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert errors == [] and calls == [1]
    finally:
        reg.registry.setdefault("relax/SenseCount-v0", saved)
