"""What an evaluation is: the config (hashed), and the planned episodes it expands to.

The config holds everything that changes results -- the agent and its sampling options, the
envs with their kwargs and versions, episodes, attempts, seeds, the turn limit -- and nothing
that does not (concurrency, output folder, progress bars, API keys). Its hash names the run:
``--resume`` refuses to mix episodes from two different configs in one folder.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict, Unpack

from relax_gym.registration import episode_seed, make, make_suite, spec

from .records import EpisodeKeyTuple

CONFIG_SCHEMA = 1


@dataclass(frozen=True)
class EnvInfo:
    """An env as evaluated: id, version, kwargs, and what it declares (for sub-scores)."""

    env_id: str
    version: int | None
    kwargs: dict[str, Any]
    difficulty: str | None
    modalities: tuple[str, ...]
    tags: tuple[str, ...]
    max_turns: int

    def comparable(self) -> dict[str, Any]:
        """What must match for two runs of this env to be ranked together."""
        return {
            "env_id": self.env_id,
            "version": self.version,
            "kwargs": self.kwargs,
            "difficulty": self.difficulty,
            "max_turns": self.max_turns,
        }


def describe_env(env_id: str, kwargs: dict[str, Any], max_turns: int | None) -> EnvInfo:
    """Build the env once to learn its difficulty and turn limit (and to fail early on bad kwargs)."""
    s = spec(env_id)
    env = make(env_id, max_turns=max_turns, **kwargs)
    try:
        difficulty = getattr(env.unwrapped, "difficulty", None)
        # an instance may narrow what its class declares (a game built with render="text")
        own = vars(env.unwrapped).get("modalities")
        modalities = tuple(own) if own else tuple(s.resolved_modalities())
        return EnvInfo(
            env_id=env_id,
            version=s.version,
            kwargs=dict(kwargs),
            difficulty=str(difficulty) if difficulty is not None else None,
            modalities=modalities,
            tags=tuple(s.resolved_tags()),
            max_turns=int(env.max_turns),
        )
    finally:
        env.close()


#: agent kinds whose spec is ``KIND:URL``: the URL says where the model is served, not what it is
SERVER_AGENT_KINDS = ("openai", "sglang")


def without_endpoint(spec: str) -> str:
    """``sglang:http://127.0.0.1:30000`` -> ``sglang``; any other spec unchanged."""
    kind, sep, _ = spec.partition(":")
    return kind if sep and kind in SERVER_AGENT_KINDS else spec


@dataclass
class EvalConfig:
    """One evaluation: the agent, the envs and how many episodes of each."""

    agent: dict[str, Any]
    sampling: dict[str, Any]
    suite: str | None
    envs: list[EnvInfo]
    episodes: int
    attempts: int
    seed: int
    max_turns: int | None = None
    schema: int = CONFIG_SCHEMA
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["envs"] = [asdict(e) | {"modalities": list(e.modalities), "tags": list(e.tags)} for e in self.envs]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EvalConfig:
        envs = [EnvInfo(**{**e, "modalities": tuple(e["modalities"]), "tags": tuple(e["tags"])}) for e in d["envs"]]
        return cls(**{**d, "envs": envs})

    def hash(self) -> str:
        """Hash of everything that changes results (``extra`` -- labels, notes -- does not, nor
        does the address of a server agent: a restarted engine on a new port serving the same
        model, which the agent's description names, resumes the same run)."""
        d = self.to_dict()
        d.pop("extra")
        d["agent"] = {**d["agent"], "spec": without_endpoint(str(d["agent"].get("spec", "")))}
        return canonical_hash(d)

    def comparability_key(self) -> str:
        """Runs with equal keys evaluated the same envs (ids, versions, kwargs) and may be ranked."""
        return canonical_hash(
            {"suite": self.suite, "envs": sorted((e.comparable() for e in self.envs), key=lambda c: c["env_id"])}
        )

    def env(self, env_id: str) -> EnvInfo:
        for e in self.envs:
            if e.env_id == env_id:
                return e
        raise KeyError(env_id)

    def keys(self) -> list[tuple[EpisodeKeyTuple, int]]:
        """Every planned episode as ``((env_id, seed, attempt), index)``, sorted by key."""
        out = []
        for e in self.envs:
            for i in range(self.episodes):
                seed = episode_seed(self.seed, e.env_id, i)
                for a in range(self.attempts):
                    out.append(((e.env_id, seed, a), i))
        return sorted(out)


def canonical_hash(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class EvalTarget(TypedDict, total=False):
    """What to evaluate: a suite or env ids, and how much (the keywords of :func:`plan`)."""

    suite: str | None
    env_ids: list[str] | None
    episodes: int | None  # per env (default: the suite's, else 10)
    attempts: int  # per episode (default 1)
    seed: int | None  # base seed (default: the suite's, else 0)
    max_turns: int | None  # cap on each env's turn limit
    env_kwargs: dict[str, dict[str, Any]] | None  # extra constructor kwargs by env id


def plan(*, agent: dict[str, Any], sampling: dict[str, Any], **target: Unpack[EvalTarget]) -> EvalConfig:
    """Resolve a suite (or a list of env ids) into a config: env versions, kwargs, seeds."""
    suite, episodes, seed = target.get("suite"), target.get("episodes"), target.get("seed")
    attempts, max_turns = target.get("attempts", 1), target.get("max_turns")
    if attempts < 1:
        raise ValueError("attempts must be >= 1")
    kwargs_by_env: dict[str, dict[str, Any]] = {}
    if suite is not None:
        s = make_suite(suite)
        ids = list(s.env_ids)
        kwargs_by_env.update({k: dict(v) for k, v in s.env_kwargs.items()})
        n = episodes if episodes is not None else s.episodes_per_env
        base_seed = s.seed if seed is None else seed
    else:
        env_ids = target.get("env_ids")
        if not env_ids:
            raise ValueError("give a suite or at least one env id")
        ids = list(dict.fromkeys(env_ids))
        n = episodes if episodes is not None else 10
        base_seed = seed or 0
    if n < 1:
        raise ValueError("episodes must be >= 1")
    for env_id, kw in (target.get("env_kwargs") or {}).items():
        kwargs_by_env.setdefault(env_id, {}).update(kw)
    envs = [describe_env(e, kwargs_by_env.get(e, {}), max_turns) for e in ids]
    return EvalConfig(
        agent=agent,
        sampling=sampling,
        suite=suite,
        envs=envs,
        episodes=n,
        attempts=attempts,
        seed=base_seed,
        max_turns=max_turns,
    )


__all__ = ["CONFIG_SCHEMA", "EnvInfo", "EvalConfig", "EvalTarget", "canonical_hash", "describe_env", "plan"]
