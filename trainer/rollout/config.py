"""The rollout settings, in one place: the training config's ``rollout:`` section is this model,
and the rollout manager runs with it as it is.

Plain pydantic, no torch: validating a training config imports it. Defaults (docs/training.md
gives the reasons): groups of 8 samples, 8 groups per training step, 64 episodes at once,
512 new tokens per assistant turn and 4,096 tokens per sample, plain sampling at temperature 1,
env calls in worker threads, the drift check on.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class RolloutConfig(BaseModel):
    """Every rollout knob, with its meaning beside it."""

    # allow_inf_nan=False: a NaN temperature or an infinite timeout would pass `gt=0` and poison
    # the run instead of failing at validation
    model_config = ConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False)

    # batch
    group_size: int = Field(default=8, ge=1, description="samples per (env, seed): the GRPO group")
    prompts_per_step: int = Field(default=8, ge=1, description="groups per training step (read by the training "
                                  "modes; the manager runs whatever specs it is given)")
    # scheduling
    concurrency: int = Field(default=64, ge=1, description="episodes running at once (each its own asyncio task); "
                             "the async producer keeps concurrency // group_size groups in flight (at least one)")
    scheduling: Literal["async", "turn_sync"] = Field(
        default="async", description="async: an episode that ends frees its slot at once; turn_sync (benchmark "
        "baseline only): cohorts of `concurrency` episodes advance one turn at a time")
    # episode bounds
    max_turns: int | None = Field(default=None, ge=1, description="turn limit; None = the env's own max_turns")
    max_total_tokens: int = Field(default=4096, ge=2, description="bound on a sample's token_ids (prompt included)")
    max_new_tokens: int = Field(default=512, ge=1, description="bound on one assistant turn")
    # sampling (sent as SGLang sampling_params)
    temperature: float = Field(default=1.0, ge=0.0, description="sampling temperature (training needs > 0: the "
                               "trainer's logprobs use it too; 0 = greedy, for evaluation)")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="nucleus sampling (1 = off; <1 biases the logprobs)")
    top_k: int = Field(default=-1, description="top-k sampling (-1 = off; like top_p < 1 it biases the logprobs)")
    stop_token_ids: list[int] | None = Field(default=None, description="extra token ids that end a turn")
    sampling_seed: int | None = Field(
        default=None, description="derive a per-request sampling_seed from this (reproducible sampling); "
        "None: the engine's own randomness. In a training config, None means the run's `seed`")
    # tokenization
    system_prompt: str | None = Field(
        default=None, description="prepended when the first observation has no system message")
    think_policy: Literal["keep", "split"] = Field(
        default="keep", description="keep: one sample per episode keeping earlier <think> blocks the engine saw; "
        "split: a new sample at each user turn where the template would drop them")
    check_drift: bool = Field(
        default=True, description="compare the incremental tokens with a full re-render at the end")
    tool_parser: str | None = Field(
        default="hermes", description="relax_gym.tools parser used to *record* each turn's tool calls when the env's "
        "info does not list them (the env parses for itself; this never changes what it gets)")
    # failures
    request_timeout_s: float = Field(default=300.0, gt=0, description="one /generate request")
    max_failovers_per_turn: int = Field(default=3, ge=0, description="retries of a turn on other engines")
    max_resumes_per_turn: int = Field(default=32, ge=0, description="continuations of an aborted (paused) segment")
    env_timeout_s: float | None = Field(default=120.0, gt=0, description="one env.reset / env.step")
    env_in_thread: bool = Field(default=True, description="run env.reset/step in worker threads (env.areset/astep); "
                                "False calls them inline on the event loop (only for envs that never block)")
    max_env_error_rate: float = Field(
        default=0.5, ge=0, le=1,
        description="training: stop the run (exit 3) when more than this share of a step's episodes fail in the env "
        "(reset/step raised, timed out or returned garbage) instead of training on nothing; 1 = never stop",
    )

    @property
    def batch_size(self) -> int:
        """Samples per training step."""
        return self.group_size * self.prompts_per_step


__all__ = ["RolloutConfig"]
