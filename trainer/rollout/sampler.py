"""Where episodes come from: a resumable sampler of (env, seed) for training, fixed held-out
episodes for evaluation.

Training draws an env by weight, then a seed from the training pool (``[seed_start, seed_start +
seed_count)``, always below :data:`EVAL_SEED_FLOOR`): uniformly (``random``), or the env's next
seed in turn (``sequential``, the default for dataset envs: a dataset env maps seed ``s`` to
position ``s % n`` of shuffled epoch ``s // n``, so consecutive seeds walk its rows in epochs
without repeats). The NumPy generator and the per-env counters are saved in checkpoints, so a
resumed run draws exactly the episodes the uninterrupted run would have drawn. Evaluation episodes are a fixed list: for the k-th eval
env, seeds ``eval.seed_start + k * EVAL_ENV_STRIDE + i`` -- disjoint from every training seed --
or a registered suite's own episodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from relax_gym.trainer.config import EnvEntry, is_dataset_env, load_entry_point
from relax_gym.trainer.rollout import EpisodeSpec

EVAL_ENV_STRIDE = 10_000_000


def register_entry_points(envs: Sequence[EnvEntry]) -> None:
    """Register every env that brings an ``entry_point`` and whose id is not registered yet."""
    import relax_gym

    for env in envs:
        if env.entry_point and env.id not in relax_gym.registry:
            relax_gym.register(env.id, entry_point=load_entry_point(env.entry_point))


def envs_of_suite(name: str) -> list[EnvEntry]:
    """A registered suite's envs (with its per-env kwargs) as config entries."""
    import relax_gym

    suite = relax_gym.make_suite(name)
    return [EnvEntry(id=env_id, kwargs=dict(suite.env_kwargs.get(env_id, {}))) for env_id in suite.env_ids]


@dataclass
class EpisodeSampler:
    """Draws training episodes; ``state_dict`` / ``load_state_dict`` make it resumable."""

    envs: Sequence[EnvEntry]
    seed: int = 0
    seed_start: int = 0
    seed_count: int = 10_000_000
    seed_order: Literal["auto", "random", "sequential"] = "random"
    drawn: int = 0
    _rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.envs:
            raise ValueError("EpisodeSampler needs at least one env")
        weights = np.array([e.weight for e in self.envs], dtype=np.float64)
        self._p = weights / weights.sum()
        self._rng = np.random.default_rng(np.random.SeedSequence([int(self.seed), 0x5EED]))
        self._sequential = [self.seed_order == "sequential"
                            or (self.seed_order == "auto" and is_dataset_env(e.id)) for e in self.envs]
        self._next_seed = [0] * len(self.envs)  # per env: how many sequential seeds it has used

    def _seed_for(self, k: int) -> int:
        if self._sequential[k]:
            offset = self._next_seed[k] % self.seed_count
            self._next_seed[k] += 1
            return self.seed_start + offset
        return self.seed_start + int(self._rng.integers(0, self.seed_count))

    def next(self, n: int, *, tag: str = "") -> list[EpisodeSpec]:
        """``n`` episode specs; each is its own group (``group_id`` is unique per draw)."""
        out = []
        for _ in range(n):
            k = int(self._rng.choice(len(self.envs), p=self._p)) if len(self.envs) > 1 else 0
            env = self.envs[k]
            seed = self._seed_for(k)
            self.drawn += 1
            out.append(EpisodeSpec(env_id=env.id, seed=seed, env_kwargs=dict(env.kwargs),
                                   group_id=f"{tag}{self.drawn}:{env.id}#{seed}",
                                   metadata={"draw": self.drawn}))
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"drawn": self.drawn, "bit_generator": self._rng.bit_generator.state,
                "next_seed": list(self._next_seed)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self.drawn = int(state["drawn"])
        self._rng.bit_generator.state = state["bit_generator"]
        saved = state.get("next_seed")  # absent in checkpoints from before seed_order existed
        if saved is not None and len(saved) == len(self._next_seed):
            self._next_seed = [int(x) for x in saved]


def eval_specs(envs: Sequence[EnvEntry], episodes: int, seed_start: int) -> list[EpisodeSpec]:
    """The fixed held-out episodes of a list of envs (see the module docstring)."""
    specs = []
    for k, env in enumerate(envs):
        for i in range(episodes):
            seed = seed_start + k * EVAL_ENV_STRIDE + i
            specs.append(EpisodeSpec(env_id=env.id, seed=seed, env_kwargs=dict(env.kwargs),
                                     group_id=f"eval:{env.id}#{seed}"))
    return specs


def suite_specs(name: str, episodes: int | None = None) -> list[EpisodeSpec]:
    """A registered suite's episodes (its own seeds) as specs."""
    import relax_gym

    suite = relax_gym.make_suite(name, episodes_per_env=episodes)
    return [EpisodeSpec(env_id=key.env_id, seed=key.seed, env_kwargs=dict(suite.env_kwargs.get(key.env_id, {})),
                        group_id=f"eval:{key.env_id}#{key.seed}") for key in suite.episodes()]


__all__ = ["EVAL_ENV_STRIDE", "EpisodeSampler", "envs_of_suite", "eval_specs", "is_dataset_env",
           "register_entry_points", "suite_specs"]
