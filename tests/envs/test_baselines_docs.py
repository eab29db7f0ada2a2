"""The stored baselines describe the current code, the random agent is strictly below the
oracle everywhere, and docs/envs.md is exactly what the generator prints."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import relax_gym
from relax_gym.envs import SHIPPED, baselines, docs
from relax_gym.envs._base import DIFFICULTIES

REPO = Path(__file__).resolve().parents[2]
REPLAYED = 8  # seeds per (env, difficulty) replayed against the stored outcomes


def test_stored_baselines_are_complete_and_current() -> None:
    assert baselines.stale_envs() == [], f"re-run: {baselines.COMMAND}"
    table = baselines.load_baselines()
    for e in SHIPPED:
        for d in DIFFICULTIES:
            b = table[e.id][d]
            assert b.episodes >= 200 and len(b.random_outcomes) == b.episodes
            assert b.oracle_success == 1.0
            assert b.random_success < b.oracle_success, (e.id, d)
            assert b.random_success == pytest.approx(b.random_outcomes.count("1") / b.episodes, abs=1e-4)


@pytest.mark.parametrize("env_id", [e.id for e in SHIPPED])
def test_stored_random_outcomes_replay_exactly(env_id: str) -> None:
    table = baselines.load_baselines()
    for d in DIFFICULTIES:
        env = relax_gym.make(env_id, difficulty=d)
        seeds = baselines.seeds_for(env_id, d, REPLAYED)
        replayed = "".join("1" if baselines.play(env, s, "random")[0] else "0" for s in seeds)
        assert replayed == table[env_id][d].random_outcomes[:REPLAYED], (env_id, d)


@pytest.mark.parametrize("env_id", [e.id for e in SHIPPED])
def test_random_agent_is_strictly_below_the_oracle(env_id: str) -> None:
    """Measured afresh on 24 deterministic seeds of the easiest level (where guessing pays most)."""
    env = relax_gym.make(env_id, difficulty="easy")
    seeds = [10_000 + i for i in range(24)]
    random_rate = np.mean([baselines.play(env, s, "random")[0] for s in seeds])
    oracle_rate = np.mean([baselines.play(env, s, "oracle")[0] for s in seeds])
    assert oracle_rate == 1.0 and random_rate < oracle_rate


def test_random_success_lookup(tmp_path: Path) -> None:
    table = baselines.load_baselines()
    assert baselines.random_success("relax/ToneCompare-v0", "easy") == table["relax/ToneCompare-v0"]["easy"].random_success
    with pytest.raises(KeyError, match="no baseline for relax/Nope-v0"):
        baselines.random_success("relax/Nope-v0")


def test_write_merges_and_check_flags_stale(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    b = baselines.measure("relax/ToneCompare-v0", "easy", 6)
    baselines.write([b], path)
    data = json.loads(path.read_text())
    assert list(data["envs"]) == ["relax/ToneCompare-v0"]
    assert data["envs"]["relax/ToneCompare-v0"]["source"] == baselines.source_digest("relax/ToneCompare-v0")
    baselines.write([baselines.measure("relax/MorseDecode-v0", "easy", 6)], path)
    loaded = baselines.load_baselines(path)
    assert set(loaded) == {"relax/ToneCompare-v0", "relax/MorseDecode-v0"} and loaded["relax/ToneCompare-v0"]["easy"] == b
    stale = baselines.stale_envs(path)  # only the easy level was written, and other envs are missing
    assert "relax/ToneCompare-v0" in stale and "relax/ShapeCount-v0" in stale
    data["envs"]["relax/ToneCompare-v0"]["source"] = "0" * 12
    path.write_text(json.dumps(data))
    assert "relax/ToneCompare-v0" in baselines.stale_envs(path)


def test_baselines_cli_check_and_partial_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert baselines.main(["--check"]) == 0
    assert baselines.main(["--env", "relax/ToneCompare-v0", "--episodes", "3"]) == 0  # no --write: file untouched
    out = capsys.readouterr().out
    assert "up to date" in out and out.count("relax/ToneCompare-v0") == 3
    with pytest.raises(SystemExit):
        baselines.main(["--env", "relax/Nope-v0"])


def test_docs_envs_md_is_up_to_date() -> None:
    expected = docs.render()
    actual = (REPO / "docs" / "envs.md").read_text()
    assert actual == expected, f"docs/envs.md is stale; run: {docs.COMMAND}"
    for e in SHIPPED:
        assert f"## {e.id}" in actual and f"[`{e.id}`]" in actual


@pytest.mark.slow
def test_full_baselines_reproduce_exactly() -> None:
    """Re-measure every env and difficulty on all stored seeds (about 1.5 min on 2 cores)."""
    table = baselines.load_baselines()
    for e in SHIPPED:
        for d in DIFFICULTIES:
            stored = table[e.id][d]
            assert baselines.measure(e.id, d, stored.episodes) == stored, (e.id, d)
