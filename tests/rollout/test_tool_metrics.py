"""Tool-use counters reach the step metrics: calls, failed calls per tool, calls to unknown
tools, malformed calls (the MCP servers' own counters: tests/tools/test_mcp.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import relax_gym
from relax_gym.trainer.rollout.tool_metrics import UNKNOWN_TOOL, tool_metrics


def episode(actions: list[str], seed: int = 0) -> Any:
    """A real ToolEnv episode played with scripted actions, as the rollout records it."""
    env = relax_gym.make("relax/CalcArithmetic-v0")
    _, info = env.reset(seed=seed)
    turns = []
    for action in actions:
        _, _, term, trunc, info = env.step(action)
        turns.append(SimpleNamespace(info=info))
        if term or trunc:
            break
    return SimpleNamespace(turns=turns)


def test_tool_calls_and_failures_are_counted_per_tool() -> None:
    bad = episode(['<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
                   '<tool_call>{"name": "calculator", "arguments": {"expression": "1+"}}</tool_call>'
                   '<tool_call>{bad json</tool_call>'])
    good = episode(['<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>'], seed=1)
    plain = SimpleNamespace(turns=[SimpleNamespace(info={"success": True})])  # a text env: no tools
    m = tool_metrics([bad, good, plain])
    assert m["tools/episodes"] == 2.0
    assert m["tools/calls"] == 2.0 and m["tools/errors"] == 2.0 and m["tools/parse_errors"] == 1.0
    assert m["tools/errors/calculator"] == 1.0 and m[f"tools/errors/{UNKNOWN_TOOL}"] == 1.0
    assert m["tools/error_rate"] == pytest.approx(1.0)
    assert not any(k.startswith("tools/") for k in tool_metrics([plain]))

