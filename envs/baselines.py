"""Random-agent and oracle success of every shipped env, per difficulty: measure, store, load.

The random agent plays ``env.random_action`` (a uniformly random answer in the env's own
format), the oracle plays ``env.oracle()``, both on a fixed list of seeds, so the figures are
reproducible to the bit. Leaderboards use them to normalise scores::

    python -m relax_gym.envs.baselines --episodes 200 --write      # all envs -> baselines.json
    python -m relax_gym.envs.baselines --env relax/Sokoban-v0 --write   # re-measure one env
    python -m relax_gym.envs.baselines --check                     # exit 1 if the file is stale

    from relax_gym.envs.baselines import load_baselines, random_success
    random_success("relax/ShapeCount-v0", "easy")                  # -> 0.2 (for example)

``baselines.json`` stores, per env and difficulty, the success rates, and the random agent's
outcome on every seed as a string of ``0``/``1``, so a test can replay a few seeds and prove the
stored figures still describe the code. Each env also records a digest of its source (its own
module plus the shared helpers); ``--check`` and the tests flag an env whose code changed
since it was measured.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from relax_gym.core import Env
from relax_gym.registration import episode_seed, make

from . import SHIPPED
from ._base import DIFFICULTIES

DATA_FILE = Path(__file__).with_name("baselines.json")
BASELINE_SEED = 4_242
COMMAND = "python -m relax_gym.envs.baselines --episodes 200 --write"


@dataclass(frozen=True)
class Baseline:
    """Success of the random agent and of the oracle on ``episodes`` fixed seeds."""

    env_id: str
    difficulty: str
    episodes: int
    random_success: float
    oracle_success: float
    random_return: float
    oracle_turns: float
    random_outcomes: str  # "0110..." -- the random agent's success on each seed, in order

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        del out["env_id"], out["difficulty"]
        return out


def seeds_for(env_id: str, difficulty: str, episodes: int) -> list[int]:
    """The fixed seeds of an (env, difficulty): independent of every other env's."""
    return [episode_seed(BASELINE_SEED, f"{env_id}@{difficulty}", i) for i in range(episodes)]


def play(env: Env, seed: int, agent: str) -> tuple[bool, float, int]:
    """One episode with the ``"random"`` agent (its rng derived from ``seed``) or the ``"oracle"``;
    returns (success, return, turns)."""
    env.reset(seed=seed)
    # not default_rng(seed): that is the very stream the env draws its task from
    rng = np.random.default_rng([seed, 1])
    actions = iter(env.oracle()) if agent == "oracle" else None
    total, info = 0.0, {}
    for turn in range(1, env.max_turns + 1):
        action = next(actions, "") if actions is not None else env.random_action(rng)
        _, reward, terminated, truncated, info = env.step(action)
        total += float(reward)
        if terminated or truncated:
            return bool(info.get("success")), total, turn
    raise RuntimeError(f"episode of {env} did not end within max_turns={env.max_turns}")


def measure(env_id: str, difficulty: str, episodes: int) -> Baseline:
    env = make(env_id, difficulty=difficulty)
    try:
        random_runs = [play(env, s, "random") for s in seeds_for(env_id, difficulty, episodes)]
        oracle_runs = [play(env, s, "oracle") for s in seeds_for(env_id, difficulty, episodes)]
    finally:
        env.close()
    return Baseline(
        env_id=env_id,
        difficulty=difficulty,
        episodes=episodes,
        random_success=round(float(np.mean([r[0] for r in random_runs])), 4),
        oracle_success=round(float(np.mean([r[0] for r in oracle_runs])), 4),
        random_return=round(float(np.mean([r[1] for r in random_runs])), 4),
        oracle_turns=round(float(np.mean([r[2] for r in oracle_runs])), 2),
        random_outcomes="".join("1" if r[0] else "0" for r in random_runs),
    )


def source_digest(env_id: str) -> str:
    """sha256 (12 hex digits) of the env's module and of the shared ``envs/_*.py`` helpers."""
    entry = next(e.entry_point for e in SHIPPED if e.id == env_id)
    module = importlib.import_module(entry.partition(":")[0])
    files = [Path(module.__file__ or "")] + sorted(Path(__file__).parent.glob("_*.py"))
    digest = hashlib.sha256()
    for f in files:
        if f.name != "__init__.py":
            digest.update(f.name.encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:12]


# ------------------------------------------------------------------------------------------------
# the data file
# ------------------------------------------------------------------------------------------------
def load_baselines(path: str | Path = DATA_FILE) -> dict[str, dict[str, Baseline]]:
    """``{env_id: {difficulty: Baseline}}`` from the shipped data file."""
    data = _read(Path(path))
    return {
        env_id: {d: Baseline(env_id=env_id, difficulty=d, **b) for d, b in entry["difficulties"].items()}
        for env_id, entry in data["envs"].items()
    }


def random_success(env_id: str, difficulty: str = "easy", path: str | Path = DATA_FILE) -> float:
    """The stored random-agent success rate (KeyError naming what is missing)."""
    table = load_baselines(path)
    if env_id not in table or difficulty not in table[env_id]:
        raise KeyError(f"no baseline for {env_id} at difficulty {difficulty!r}; run `{COMMAND}`")
    return table[env_id][difficulty].random_success


def stale_envs(path: str | Path = DATA_FILE) -> list[str]:
    """Shipped envs missing from the file, or whose source changed since they were measured."""
    data = _read(Path(path))
    out = []
    for e in SHIPPED:
        entry = data["envs"].get(e.id)
        if entry is None or entry.get("source") != source_digest(e.id) or set(entry["difficulties"]) != set(DIFFICULTIES):
            out.append(e.id)
    return out


def _read(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"command": COMMAND, "seed": BASELINE_SEED, "envs": {}}
    return json.loads(path.read_text())


def write(results: Iterable[Baseline], path: str | Path = DATA_FILE) -> None:
    """Merge ``results`` into the file (other envs' entries are kept), envs sorted by id."""
    path = Path(path)
    data = _read(path)
    for b in results:
        entry = data["envs"].setdefault(b.env_id, {"source": "", "difficulties": {}})
        entry["source"] = source_digest(b.env_id)
        entry["difficulties"][b.difficulty] = b.to_json()
    shipped_ids = {e.id for e in SHIPPED}
    data["envs"] = {k: data["envs"][k] for k in sorted(data["envs"]) if k in shipped_ids}
    data["command"], data["seed"] = COMMAND, BASELINE_SEED
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m relax_gym.envs.baselines", description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=200, help="episodes per env and difficulty (default 200)")
    parser.add_argument("--env", action="append", help="only this env id (repeatable; default: every shipped env)")
    parser.add_argument("--write", action="store_true", help=f"merge the results into {DATA_FILE.name}")
    parser.add_argument("--check", action="store_true", help="exit 1 if the file misses an env or is stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_envs()
        for env_id in stale:
            print(f"stale or missing: {env_id}")
        print("baselines are up to date" if not stale else f"re-run: {COMMAND}")
        return 1 if stale else 0
    known = {e.id for e in SHIPPED}
    env_ids = args.env or [e.id for e in SHIPPED]
    unknown = [e for e in env_ids if e not in known]
    if unknown:
        parser.error(f"not shipped envs: {', '.join(unknown)}")
    if args.episodes < 1:
        parser.error("--episodes must be >= 1")
    results = []
    print(f"{'env':<26} {'difficulty':<10} {'random':>7} {'oracle':>7}")
    for env_id in env_ids:
        for difficulty in DIFFICULTIES:
            b = measure(env_id, difficulty, args.episodes)
            results.append(b)
            print(f"{env_id:<26} {difficulty:<10} {b.random_success:>7.3f} {b.oracle_success:>7.3f}", flush=True)
    if args.write:
        write(results)
        print(f"wrote {DATA_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
