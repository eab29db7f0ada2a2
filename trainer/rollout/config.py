"""Every knob of the rollout manager in one typed config, each with its meaning beside it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class RolloutConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # scheduling
    concurrency: int = Field(default=64, ge=1, description="episodes running at once (each its own asyncio task)")
    group_size: int = Field(default=1, ge=1, description="samples per (env, seed): a GRPO group")
    scheduling: Literal["async", "turn_sync"] = Field(
        default="async", description="async: an episode that ends frees its slot at once; turn_sync (benchmark "
        "baseline only): cohorts of `concurrency` episodes advance one turn at a time")
    # episode bounds
    max_turns: int | None = Field(default=None, ge=1, description="turn limit; None = the env's own max_turns")
    max_total_tokens: int = Field(default=4096, ge=2, description="bound on a sample's token_ids (prompt included)")
    max_new_tokens: int = Field(default=512, ge=1, description="bound on one assistant turn")
    # sampling (sent as SGLang sampling_params)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = -1
    stop_token_ids: list[int] | None = None
    sampling_seed: int | None = Field(default=None, description="derive a per-request sampling_seed from this")
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


__all__ = ["RolloutConfig"]
