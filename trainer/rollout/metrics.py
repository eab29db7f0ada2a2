"""Counters the rollout manager keeps: every failure, drift and retry is counted, none is silent."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class RolloutMetrics:
    episodes_started: int = 0
    episodes_finished: int = 0
    samples: int = 0  # trajectories produced (> episodes under think_policy="split")
    trainable_samples: int = 0
    turns: int = 0
    requests: int = 0
    sampled_tokens: int = 0
    context_tokens: int = 0  # prompt + observation + glue tokens (loss mask 0)
    stop_reasons: Counter[str] = field(default_factory=Counter)
    drift: Counter[str] = field(default_factory=Counter)  # by DriftReport.kind
    unexpected_drift: int = 0
    failovers: int = 0  # requests retried after an engine failure
    resumes: int = 0  # continuations of aborted (partial) segments
    engine_errors: Counter[str] = field(default_factory=Counter)  # by error type
    env_errors: int = 0
    template_errors: int = 0
    media_placeholders: int = 0  # media parts the model could not take, rendered as text
    media_errors: Counter[str] = field(default_factory=Counter)  # bad or over-budget clips, by reason
    video_reduced: Counter[str] = field(default_factory=Counter)  # clips sampled down: fps, frames, resolution
    tools_changed: int = 0  # observations whose tool list differs from the prompt's
    engine_prompt_mismatch: int = 0  # engine's prompt_tokens != our context length
    reserved_tokens_cut: int = 0  # segments cut before a vision placeholder the model emitted
    engine_time_s: float = 0.0  # summed wall time of generate requests
    env_time_s: float = 0.0  # summed wall time of env.reset/env.step

    def snapshot(self) -> dict[str, Any]:
        """A flat, JSON-ready view (counters become ``name/key`` entries)."""
        out: dict[str, Any] = {}
        for name in self.__slots__:
            value = getattr(self, name)
            if isinstance(value, Counter):
                for key, count in sorted(value.items()):
                    out[f"{name}/{key}"] = count
            else:
                out[name] = value
        return out

    def step_counters(self) -> dict[str, float]:
        """The failure and drift counters a training step logs as ``rollout/<name>`` (what the
        trajectories themselves cannot tell: engine errors, retries, template and codec drift)."""
        out: dict[str, float] = {}
        for name in STEP_COUNTERS:
            value = getattr(self, name)
            if isinstance(value, Counter):
                for key, count in sorted(value.items()):
                    out[f"rollout/{name}/{key}"] = float(count)
            else:
                out[f"rollout/{name}"] = float(value)
        return out

    def add(self, other: RolloutMetrics) -> None:
        """Fold ``other``'s counts into this one (a step that rolled out in several rounds)."""
        for name in self.__slots__:
            mine, theirs = getattr(self, name), getattr(other, name)
            if isinstance(mine, Counter):
                mine.update(theirs)
            else:
                setattr(self, name, mine + theirs)


#: the counters of :meth:`RolloutMetrics.step_counters`
STEP_COUNTERS = ("engine_errors", "failovers", "resumes", "template_errors", "media_placeholders", "drift",
                 "unexpected_drift", "engine_prompt_mismatch", "tools_changed", "reserved_tokens_cut")
#: those of them that are plain counts (the others count by kind)
SCALAR_STEP_COUNTERS = tuple(n for n in STEP_COUNTERS if n not in ("engine_errors", "drift"))


__all__ = ["SCALAR_STEP_COUNTERS", "STEP_COUNTERS", "RolloutMetrics"]
