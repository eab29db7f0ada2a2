"""Tool calls out of generated text, for the OpenAI-compatible route (Qwen3 / Hermes format).

Qwen3 and Qwen3-VL write each call as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
Parsing goes through the tools package's ``hermes`` parser (``relax_gym.tools.get_parser``) when
it is installed, so the engine and the environments agree on what a call is. Without it, a
minimal JSON extraction of the same blocks is used (:func:`fallback_parse`). Either way the
message content is the text with the call blocks removed.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: dict[str, Any]


def fallback_parse(text: str) -> list[ParsedCall]:
    """Each well-formed ``<tool_call>`` JSON block as a call; malformed blocks are skipped."""
    calls = []
    for body in TOOL_CALL_BLOCK.findall(text):
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            continue
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                continue
        if isinstance(args, dict):
            calls.append(ParsedCall(obj["name"], args))
    return calls


def _hermes_parser() -> Any | None:
    try:
        from relax_gym.tools import get_parser

        return get_parser("hermes")
    except (ImportError, AttributeError, KeyError, ValueError):
        return None


def parse_tool_calls(text: str) -> tuple[list[ParsedCall], str]:
    """The calls in ``text`` and which parser found them (``"hermes"`` or ``"fallback"``)."""
    parser = _hermes_parser()
    if parser is not None:
        try:
            parse = parser.parse if hasattr(parser, "parse") else parser
            action = parse(text)
            return [ParsedCall(c.name, dict(c.arguments)) for c in action.tool_calls], "hermes"
        except Exception:
            pass
    return fallback_parse(text), "fallback"


def strip_tool_calls(text: str) -> str:
    """The text without its ``<tool_call>`` blocks."""
    return TOOL_CALL_BLOCK.sub("", text).strip()


def to_openai(calls: list[ParsedCall]) -> list[dict[str, Any]]:
    return [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
        }
        for c in calls
    ]


__all__ = ["ParsedCall", "fallback_parse", "parse_tool_calls", "strip_tool_calls", "to_openai"]
