"""Rewards: a registry of reward functions, rule rewards, a GenRM judge, weighted composition.

Register your own::

    import relax_gym.rewards as R

    @R.reward("my_task")
    def score(sample: R.RewardInput) -> float | dict:
        return float(sample.response.strip() == sample.label)

and compose them from a config (per env, or per dataset row through
``sample.metadata["rewards"]``)::

    composer = R.RewardComposer([{"name": "math_equiv", "weight": 1.0},
                                 {"name": "format_tags", "weight": 0.1}])
    results = await composer.score(samples)          # list[RewardResult]
    metrics = R.summarize(results)                   # reward/<component>/mean, failures...

Every built-in is documented in docs/rewards.md.
"""

from relax_gym.rewards.compose import (
    RewardComposer,
    RewardEntry,
    evaluate_reward,
    parse_entries,
    score_samples,
)
from relax_gym.rewards.math_equiv import Equivalence, math_equal
from relax_gym.rewards.math_extract import extract_answer, extract_reference, find_boxed
from relax_gym.rewards.metrics import RewardStats, summarize
from relax_gym.rewards.registry import (
    RewardFn,
    Score,
    get_reward,
    list_rewards,
    register_reward,
    reward,
    unregister_reward,
)
from relax_gym.rewards.types import Failure, RewardError, RewardInput, RewardResult

from relax_gym.rewards.genrm import GenRMClient, JudgeConfig, Verdict, judge_client  # noqa: E402
from relax_gym.rewards.judge_templates import JudgeTemplate, VerdictError  # noqa: E402

# Built-in rule rewards register themselves on import.
from relax_gym.rewards import code as _code  # noqa: E402,F401
from relax_gym.rewards import grounding as _grounding  # noqa: E402,F401
from relax_gym.rewards import shaping as _shaping  # noqa: E402,F401
from relax_gym.rewards import text as _text  # noqa: E402,F401

__all__ = [
    "Equivalence",
    "Failure",
    "GenRMClient",
    "JudgeConfig",
    "JudgeTemplate",
    "RewardComposer",
    "RewardEntry",
    "RewardError",
    "RewardFn",
    "RewardInput",
    "RewardResult",
    "RewardStats",
    "Score",
    "Verdict",
    "VerdictError",
    "evaluate_reward",
    "extract_answer",
    "extract_reference",
    "find_boxed",
    "get_reward",
    "judge_client",
    "list_rewards",
    "math_equal",
    "parse_entries",
    "register_reward",
    "reward",
    "score_samples",
    "summarize",
    "unregister_reward",
]
