"""Tool-use counters of a batch of episodes for the step metrics: calls, failed calls (a tool
that raised, timed out, or an MCP server that crashed, hung or answered garbage), malformed
calls, per tool; plus the MCP servers' own counters (calls, errors, timeouts, restarts) for the
servers this process started. Nothing about tools is silent in a training log."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

UNKNOWN_TOOL = "_unknown_tool"  # the per-tool key of calls to a name the env does not declare


def _episode_tool_stats(traj: Any) -> dict[str, Any] | None:
    """A ToolEnv episode's final ``info["tools"]`` (its counts so far), or None."""
    for turn in reversed(getattr(traj, "turns", None) or []):
        stats = (turn.info or {}).get("tools") if isinstance(turn.info, dict) else None
        if isinstance(stats, dict):
            return stats
    return None


def tool_metrics(trajectories: Iterable[Any]) -> dict[str, float]:
    """``tools/*`` metrics over the episodes that used tools; empty when none did."""
    calls = errors = parse_errors = episodes = 0
    per_tool: dict[str, int] = {}
    for traj in trajectories:
        stats = _episode_tool_stats(traj)
        if stats is None:
            continue
        episodes += 1
        episode_errors = int(stats.get("tool_errors", 0) or 0)
        calls += int(stats.get("tool_calls", 0) or 0)
        errors += episode_errors
        parse_errors += int(stats.get("parse_errors", 0) or 0)
        named = 0
        for name, counts in (stats.get("per_tool") or {}).items():
            if isinstance(counts, dict) and counts.get("errors"):
                per_tool[str(name)] = per_tool.get(str(name), 0) + int(counts["errors"])
                named += int(counts["errors"])
        other = episode_errors - named  # calls to tools the env does not have
        if other > 0:
            per_tool[UNKNOWN_TOOL] = per_tool.get(UNKNOWN_TOOL, 0) + other
    out: dict[str, float] = {}
    if episodes:
        out.update({"tools/episodes": float(episodes), "tools/calls": float(calls), "tools/errors": float(errors),
                    "tools/parse_errors": float(parse_errors),
                    "tools/error_rate": errors / calls if calls else 0.0})
        out.update({f"tools/errors/{name}": float(n) for name, n in sorted(per_tool.items())})
    out.update(mcp_metrics())
    return out


def mcp_metrics() -> dict[str, float]:
    """Cumulative counters of the MCP servers started in this process (none if MCP is unused:
    the module is only read when something already imported it)."""
    mcp = sys.modules.get("relax_gym.tools.mcp")
    if mcp is None:
        return {}
    try:
        servers = mcp.stats()
    except Exception:  # noqa: BLE001 - metrics never break a step
        return {}
    return {f"tools/mcp/{label}/{key}": float(value)
            for label, counts in sorted(servers.items()) for key, value in sorted(counts.items())}


__all__ = ["UNKNOWN_TOOL", "mcp_metrics", "tool_metrics"]
