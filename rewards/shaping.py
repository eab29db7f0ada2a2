"""Format and length shaping rewards, and the env's own reward as a component.

* ``format_tags`` -- required ``<tag>...</tag>`` blocks, each exactly once, in order;
* ``format_boxed`` -- the response holds a ``\\boxed{}`` answer;
* ``tool_call_format`` -- every assistant turn's tool calls parse (the parser comes from
  ``relax_gym.tools``);
* ``dapo_overlong`` -- DAPO's soft overlong punishment;
* ``env`` / ``env_success`` -- the env's reward (and its named components) or its success bit.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from relax_gym.answers import scan_boxes
from relax_gym.rewards.registry import Score, reward
from relax_gym.rewards.types import RewardError, RewardInput, finite_float
from relax_gym.types import Message

_TAG_NAME = re.compile(r"^[A-Za-z_][\w\-.]*$")


# ------------------------------------------------------------------------------------------------
# format
# ------------------------------------------------------------------------------------------------
def _tag_block(text: str, tag: str) -> tuple[int, int] | None:
    """The span of the single ``<tag>...</tag>`` block, or None when the tag is missing,
    repeated, unclosed or closed before it opens."""
    open_t, close_t = f"<{tag}>", f"</{tag}>"
    if text.count(open_t) != 1 or text.count(close_t) != 1:
        return None
    start, end = text.index(open_t), text.index(close_t)
    return (start, end + len(close_t)) if start < end else None


@reward("format_tags")
def format_tags(
    sample: RewardInput,
    *,
    tags: Sequence[str] = ("think", "answer"),
    in_order: bool = True,
    partial: bool = False,
) -> Score:
    """1.0 when each tag appears as exactly one ``<tag>...</tag>`` block (no stray or extra
    tags) and, with ``in_order``, the blocks come in the given order without nesting; else 0.0. With
    ``partial=True`` the score is the fraction of tags that are well formed (order ignored)."""
    if isinstance(tags, str) or not tags or not all(isinstance(t, str) and _TAG_NAME.match(t) for t in tags):
        raise RewardError("config", f"tags must be a non-empty list of tag names, got {tags!r}")
    blocks = [_tag_block(sample.response, tag) for tag in tags]
    good = {tag: block is not None for tag, block in zip(tags, blocks)}
    details: dict[str, Any] = {"tags": good}
    if partial:
        return Score(sum(good.values()) / len(tags), details=details)
    ok = all(good.values())
    if ok and in_order:  # each block closes before the next one opens (no nesting, no overlap)
        spans = [b for b in blocks if b is not None]
        ok = all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    return Score(float(ok), details=details)


@reward("format_boxed")
def format_boxed(sample: RewardInput) -> Score:
    """1.0 when the response's final answer is a non-empty ``\\boxed{...}`` (the box that
    counts for ``math_equiv`` and the envs: the last one, closed), else 0.0."""
    scan = scan_boxes(sample.response)
    return Score(float(bool(scan.last)), details={"boxes": len(scan.complete)})


def _get_parser(name: str) -> Any:
    try:
        from relax_gym.tools import get_parser  # type: ignore[attr-defined]  # tools owns parsing
    except ImportError:
        try:
            from relax_gym.tools.parsers import get_parser
        except ImportError as exc:
            raise RewardError(
                "config", f"tool_call_format needs relax_gym.tools.get_parser, which is not available ({exc})"
            ) from None
    try:
        return get_parser(name)
    except (KeyError, ValueError) as exc:
        raise RewardError("config", f"unknown tool-call parser {name!r}: {exc}") from None


def _parse(parser: Any, text: str) -> tuple[list[Any], list[str]]:
    """(tool calls, parse errors) from a parser object with ``.parse`` or a plain callable."""
    out = parser.parse(text) if hasattr(parser, "parse") else parser(text)
    if isinstance(out, tuple) and len(out) == 2:
        calls, errors = out
    else:
        calls, errors = getattr(out, "tool_calls", []), getattr(out, "parse_errors", [])
    return list(calls), [str(e) for e in errors]


@reward("tool_call_format")
def tool_call_format(
    sample: RewardInput,
    *,
    parser: str = "hermes",
    require_call: bool = False,
    allowed_tools: Sequence[str] | None = None,
) -> Score:
    """1.0 when every assistant turn's tool calls parse with ``parser`` and name allowed tools
    (``allowed_tools``, else ``sample.metadata["tools"]`` when given); with ``require_call``
    at least one call must be made. Else 0.0; ``details["errors"]`` lists the problems."""
    p = _get_parser(parser)
    allowed = allowed_tools if allowed_tools is not None else sample.metadata.get("tools")
    allowed_set = {t if isinstance(t, str) else getattr(t, "name", str(t)) for t in allowed} if allowed else None
    turns = [m for m in sample.conversation if m.role == "assistant"] or [Message.assistant(sample.response)]
    errors: list[str] = []
    n_calls = 0
    for i, msg in enumerate(turns):
        calls, errs = _parse(p, msg.text)
        # a rollout may have moved the parsed calls out of the text into ``tool_calls``
        calls = calls if len(calls) >= len(msg.tool_calls) else list(msg.tool_calls)
        errors += [f"turn {i}: {e}" for e in errs]
        n_calls += len(calls)
        if allowed_set is not None:
            errors += [f"turn {i}: unknown tool {c.name!r}" for c in calls if getattr(c, "name", None) not in allowed_set]
    if require_call and n_calls == 0:
        errors.append("no tool call made")
    return Score(float(not errors), details={"calls": n_calls, "errors": errors[:20]})


# ------------------------------------------------------------------------------------------------
# length
# ------------------------------------------------------------------------------------------------
def dapo_overlong_penalty(length: int, max_length: int, buffer: int) -> float:
    """DAPO's soft overlong punishment: 0 up to ``max_length - buffer``, then falling linearly
    to -1 at ``max_length``, and -1 beyond."""
    if buffer <= 0 or buffer > max_length:
        raise ValueError("need 0 < buffer <= max_length")
    safe = max_length - buffer
    if length <= safe:
        return 0.0
    if length <= max_length:
        return (safe - length) / buffer
    return -1.0


@reward("dapo_overlong")
def dapo_overlong(sample: RewardInput, *, max_length: int, buffer: int, unit: str = "tokens") -> Score:
    """DAPO soft overlong punishment (0 to -1) on the response length, in ``tokens``
    (``sample.num_response_tokens``, required) or ``chars``."""
    if unit == "tokens":
        if sample.num_response_tokens is None:
            raise RewardError("config", "dapo_overlong with unit='tokens' needs sample.num_response_tokens")
        length = int(sample.num_response_tokens)
    elif unit == "chars":
        length = len(sample.response)
    else:
        raise RewardError("config", f"unit must be 'tokens' or 'chars', got {unit!r}")
    try:
        value = dapo_overlong_penalty(length, int(max_length), int(buffer))
    except ValueError as exc:
        raise RewardError("config", f"dapo_overlong: {exc}") from None
    return Score(value, details={"length": length, "truncated": sample.finish_reason == "length"})


# ------------------------------------------------------------------------------------------------
# the env's own reward
# ------------------------------------------------------------------------------------------------
@reward("env")
def env_reward(sample: RewardInput) -> Score:
    """The env's reward: ``sample.env_reward`` (else the sum of ``info["reward_components"]``),
    with each of the env's named components as a part (``env/<name>``)."""
    comps_raw = sample.info.get("reward_components") or {}
    if not isinstance(comps_raw, dict):
        raise RewardError("invalid", f"info['reward_components'] must be a dict, got {type(comps_raw).__name__}")
    parts = {str(k): finite_float(v, f"info['reward_components'][{k!r}]") for k, v in comps_raw.items()}
    if sample.env_reward is not None:
        return Score(finite_float(sample.env_reward, "sample.env_reward"), parts=parts)
    if parts:
        return Score(sum(parts.values()), parts=parts)
    raise RewardError("invalid", "sample has no env reward (env_reward is None and info has no reward_components)")


@reward("env_success")
def env_success(sample: RewardInput) -> float:
    """1.0 when the env reported ``info["success"]``, else 0.0; missing is a failure."""
    if "success" not in sample.info:
        raise RewardError("invalid", "info has no 'success' key")
    return float(bool(sample.info["success"]))


__all__ = [
    "dapo_overlong",
    "dapo_overlong_penalty",
    "env_reward",
    "env_success",
    "format_boxed",
    "format_tags",
    "tool_call_format",
]
