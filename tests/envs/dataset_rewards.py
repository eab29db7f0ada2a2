"""A user reward given to dataset-env tests as 'tests.envs.dataset_rewards:starts_with'."""

from __future__ import annotations

from relax_gym.rewards import RewardInput


def starts_with(sample: RewardInput, bonus: float = 0.0) -> float:
    """1 (+ bonus) when the reply starts with the label; the row's metadata must carry lang."""
    assert sample.metadata["lang"] in ("en", "fr")
    return float(sample.response.startswith(str(sample.label))) * (1.0 + bonus)
