"""Agents named by spec strings, as ``relax-gym eval --agent SPEC`` takes them.

=========================  ======================================================================
``random``                 the env's random baseline (``env.random_action``)
``oracle``                 the env's oracle (``env.oracle()``)
``openai:URL``             an OpenAI-compatible chat server (native tools, media as content parts)
``sglang:URL``             SGLang ``/generate``, token-in, chat template applied locally
``hf:PATH``                a local transformers model
``python:module:callable`` a custom :class:`Agent` subclass or policy function
=========================  ======================================================================
"""

from __future__ import annotations

from .base import (Agent, AgentError, AgentOptions, AgentSession, ContextExhausted, EpisodeInfo, FatalAgentError,
                   ModalityRejected, TurnResult, split_thinking)

AGENT_KINDS: tuple[str, ...] = ("random", "oracle", "openai:URL", "sglang:URL", "hf:PATH", "python:module:callable")


def make_agent(spec: str, options: AgentOptions | None = None) -> Agent:
    """Build the agent a spec string names (heavy imports happen only for the kind asked for)."""
    options = options or AgentOptions()
    kind, sep, rest = spec.partition(":")
    if spec == "random":
        from .simple import RandomAgent

        return RandomAgent()
    if spec == "oracle":
        from .simple import OracleAgent

        return OracleAgent()
    if sep and rest:
        if kind == "openai":
            from .openai_agent import OpenAIAgent

            return OpenAIAgent(spec, rest, options)
        if kind == "sglang":
            from .sglang_agent import SGLangAgent

            return SGLangAgent(spec, rest, options)
        if kind == "hf":
            from .hf_agent import HFAgent

            return HFAgent(spec, rest, options)
        if kind == "python":
            from .simple import make_python_agent

            return make_python_agent(spec, rest, options)
    raise FatalAgentError(f"unknown agent {spec!r}; expected one of: {', '.join(AGENT_KINDS)}")


__all__ = ["AGENT_KINDS", "Agent", "AgentError", "AgentOptions", "AgentSession", "ContextExhausted", "EpisodeInfo",
           "FatalAgentError", "ModalityRejected", "TurnResult", "make_agent", "split_thinking"]
