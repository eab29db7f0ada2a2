"""What a reward function reads (:class:`RewardInput`) and what scoring produces
(:class:`RewardResult`).

A reward that cannot be computed -- it raised, timed out, or a judge's verdict could not be
parsed -- is a :class:`Failure` recorded on the result (``failed=True``, ``total=None``), never a
silent 0: the trainer can drop or mask the sample and the metrics count it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from PIL import Image

from relax_gym.types import ImagePart, Message

FailureKind = Literal["exception", "timeout", "invalid", "unparseable", "http", "unavailable", "config"]


@dataclass(slots=True)
class RewardInput:
    """One finished sample as every reward function sees it.

    ``prompt`` is the conversation before the model's first turn, ``messages`` the whole
    conversation (prompt, model turns, tool results), ``response`` the model's final answer
    text. ``label`` is the dataset's reference (an answer string, a box, test cases...), ``info``
    the env's last ``info`` (``success``, ``reward_components``...), ``metadata`` free-form keys
    such as ``env_id``, ``seed``, ``group_id`` and, per dataset row, ``rewards`` (a reward config
    that overrides the composer's). ``env_reward`` is the env's own summed step reward, and
    ``num_response_tokens`` / ``finish_reason`` feed the length rewards.
    """

    prompt: list[Message]
    response: str
    messages: list[Message] = field(default_factory=list)
    label: Any = None
    info: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    env_reward: float | None = None
    num_response_tokens: int | None = None
    finish_reason: str | None = None

    @classmethod
    def from_text(cls, prompt: str, response: str, label: Any = None, **kwargs: Any) -> RewardInput:
        """A single-turn text sample: one user message and one assistant answer."""
        user = Message.user(prompt)
        return cls(
            prompt=[user], response=response, messages=[user, Message.assistant(response)],
            label=label, **kwargs,
        )

    @property
    def conversation(self) -> list[Message]:
        """The full conversation, falling back to prompt + response when ``messages`` is empty."""
        return self.messages or [*self.prompt, Message.assistant(self.response)]

    @property
    def images(self) -> list[Image.Image]:
        """Every image in the conversation, in order (what a GenRM judge may be shown)."""
        return [p.image for m in self.conversation for p in m.content if isinstance(p, ImagePart)]

    @property
    def prompt_text(self) -> str:
        return "\n".join(m.text for m in self.prompt if m.text)

    @property
    def group_id(self) -> Any:
        return self.metadata.get("group_id")


@dataclass(frozen=True, slots=True)
class Failure:
    """Why one reward component could not be computed."""

    kind: FailureKind
    message: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


@dataclass(slots=True)
class RewardResult:
    """The reward of one sample.

    ``components`` maps each component name (and ``name/part`` for dict results) to its raw,
    unweighted value; ``total`` is the weighted sum the trainer uses, or ``None`` when a required
    component failed (then ``failed`` is True and ``errors`` says why, per component).
    ``details`` keeps per-component extras for logs: the extracted answer, the judge's raw
    verdict, the number of HTTP attempts...
    """

    total: float | None
    components: dict[str, float] = field(default_factory=dict)
    failed: bool = False
    error: str | None = None
    errors: dict[str, Failure] = field(default_factory=dict)
    details: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def ok(cls, total: float, components: dict[str, float] | None = None,
           details: dict[str, dict[str, Any]] | None = None) -> RewardResult:
        return cls(total=float(total), components=dict(components or {}), details=dict(details or {}))

    @classmethod
    def failure(cls, kind: FailureKind, message: str, *, component: str = "reward",
                details: dict[str, Any] | None = None) -> RewardResult:
        fail = Failure(kind, message)
        return cls(
            total=None, failed=True, error=f"{component}: {fail}", errors={component: fail},
            details={component: dict(details)} if details else {},
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly view for logs and result files."""
        return {
            "total": self.total,
            "components": dict(self.components),
            "failed": self.failed,
            "error": self.error,
            "errors": {k: {"kind": v.kind, "message": v.message} for k, v in self.errors.items()},
            "details": {k: dict(v) for k, v in self.details.items()},
        }


class RewardError(Exception):
    """Raise inside a reward function to record a failure of a specific kind."""

    def __init__(self, kind: FailureKind, message: str, details: dict[str, Any] | None = None) -> None:
        self.kind = kind
        self.message = message
        self.details = dict(details or {})
        super().__init__(f"{kind}: {message}")


def finite_float(value: Any, what: str) -> float:
    """``float(value)`` for a real number (bool, int, float, numpy scalar); anything else, NaN or
    an infinity raises a RewardError naming ``what``."""
    if not isinstance(value, (bool, int, float, np.integer, np.floating)):
        raise RewardError("invalid", f"{what} must be a number, got {type(value).__name__}")
    out = float(value)
    if not math.isfinite(out):
        raise RewardError("invalid", f"{what} is not finite ({out})")
    return out


__all__ = ["Failure", "FailureKind", "RewardError", "RewardInput", "RewardResult", "finite_float"]
