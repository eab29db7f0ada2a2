"""``openai:URL`` -- any OpenAI-compatible chat server (vLLM, SGLang, hosted APIs, the embedded engine).

Observations go out as Chat Completions messages with media as content parts (``image_url``,
``input_audio``, ``video_url`` data URLs); tools go out as native ``tools=`` and come back as
structured ``tool_calls``, never scraped from the text. When the server refuses a request
carrying a modality, the run stops with :class:`ModalityRejected` instead of quietly scoring a
text-only model.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from relax_gym.answers import loads_json
from relax_gym.core import Env
from relax_gym.protocol import ChatCompletionRequest, ChatToolCall, EngineClient, EngineError
from relax_gym.types import Action, Message, Observation, ToolCall, ToolSpec

from .base import (Agent, AgentError, AgentOptions, AgentSession, EpisodeInfo, FatalAgentError, TurnResult,
                   call_engine, count_media, refusal, split_thinking)


def api_base(url: str) -> str:
    """The server root: ``http://h:8000/v1`` and ``http://h:8000`` both name ``http://h:8000``."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def tool_calls_from_reply(calls: list[ChatToolCall] | None) -> tuple[list[ToolCall], list[str]]:
    """Structured tool calls to :class:`ToolCall`; arguments that are not a JSON object are
    parse errors (the env turns them into an error observation), not exceptions."""
    out: list[ToolCall] = []
    errors: list[str] = []
    for i, call in enumerate(calls or []):
        name = call.function.name
        raw = call.function.arguments or "{}"
        try:
            args = loads_json(raw)  # model text: bounded depth and digits, raises only ValueError
        except ValueError as exc:
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
            errors.append(f"tool call {i} ({name}): arguments are not valid JSON ({reason}): {raw[:200]}")
            continue
        if not isinstance(args, dict):
            errors.append(f"tool call {i} ({name}): arguments must be a JSON object, got {type(args).__name__}")
            continue
        out.append(ToolCall(name=name, arguments=args, id=call.id or f"call_{i}"))
    return out, errors


_REFUSABLE = ("max_tokens", "temperature", "top_p")


def _refused_field(exc: EngineError) -> str | None:
    """The sampling field a 400 says the model does not take ("Unsupported parameter: 'max_tokens'
    ...", "Unsupported value: 'temperature' does not support 0.0 ..."), or None."""
    text = str(exc).lower()
    if "unsupported" not in text and "not supported" not in text:
        return None
    return next((f for f in _REFUSABLE if f"'{f}'" in text or f'"{f}"' in text or f"`{f}`" in text), None)


class OpenAIAgent(Agent):
    """Chat Completions over HTTP (httpx via :class:`relax_gym.protocol.EngineClient`)."""

    uses_sampling = True

    def __init__(self, spec: str, url: str, options: AgentOptions) -> None:
        self.spec = spec
        self.url = api_base(url)
        self.options = options
        self.model = options.model or "default"
        self.client = EngineClient(self.url, api_key=options.api_key, timeout_s=options.timeout_s)
        self._server_models: list[str] = []
        # fields a server refused once (hosted reasoning models take max_completion_tokens, and no
        # temperature/top_p): left out of later requests
        self.refused: set[str] = set()

    async def start(self) -> None:
        """Reach ``/v1/models`` once: a wrong URL or key stops the run before any episode."""
        headers = {"Authorization": f"Bearer {self.options.api_key}"} if self.options.api_key else {}
        try:
            async with httpx.AsyncClient(timeout=min(self.options.timeout_s, 30.0), headers=headers) as http:
                resp = await http.get(self.url + "/v1/models")
        except httpx.HTTPError as exc:
            raise FatalAgentError(f"{self.url}: cannot reach the server ({type(exc).__name__}: {exc})") from None
        if resp.status_code in (401, 403):
            raise FatalAgentError(f"{self.url}: the server refused the API key (HTTP {resp.status_code})")
        if resp.status_code == 200:
            try:
                self._server_models = [str(m.get("id")) for m in resp.json().get("data", [])]
            except (ValueError, AttributeError):
                self._server_models = []
        if self.options.model is None and len(self._server_models) == 1:
            # vLLM and hosted servers answer 404 to "default": use the one model the server lists
            self.model = self._server_models[0]

    def session(self, env: Env, episode: EpisodeInfo) -> AgentSession:
        return _OpenAISession(self, env, episode)

    async def aclose(self) -> None:
        await self.client.aclose()

    def describe(self) -> dict[str, Any]:
        return {"spec": self.spec, "model": self.model}

    def versions(self) -> dict[str, str]:
        return {"server_models": ",".join(self._server_models)} if self._server_models else {}

    def request(self, messages: list[dict[str, Any]], tools: list[ToolSpec], seed: int) -> ChatCompletionRequest:
        o = self.options
        extra: dict[str, Any] = {}
        if o.top_k > 0:
            extra["top_k"] = o.top_k
        if o.min_p > 0:
            extra["min_p"] = o.min_p
        if o.thinking is not None:
            extra["chat_template_kwargs"] = {"enable_thinking": o.thinking}
        sampling: dict[str, Any] = {"temperature": o.temperature, "top_p": o.top_p}
        if "max_tokens" in self.refused:
            sampling["max_completion_tokens"] = o.max_tokens
        else:
            sampling["max_tokens"] = o.max_tokens
        for name in self.refused:
            sampling.pop(name, None)
        return ChatCompletionRequest(
            model=self.model,
            messages=messages,
            tools=[t.to_openai() for t in tools] or None,
            seed=seed,
            **sampling,
            **extra,
        )

    async def chat(self, messages: list[dict[str, Any]], tools: list[ToolSpec], seed: int) -> Any:
        """One chat call; a 400 that refuses ``max_tokens``, ``temperature`` or ``top_p`` (hosted
        reasoning models) is retried once without it, and the field stays out from then on."""
        for _ in range(len(_REFUSABLE) + 1):
            request = self.request(messages, tools, seed)
            try:
                return await self.client.chat_completions(request)
            except EngineError as exc:
                refused = _refused_field(exc) if exc.status == 400 else None
                if refused is None or getattr(request, refused, None) is None:  # not ours to drop
                    raise
                self.refused.add(refused)
        raise AgentError(f"{self.url}: the server refused every sampling field")


class _OpenAISession(AgentSession):
    def __init__(self, agent: OpenAIAgent, env: Env, episode: EpisodeInfo) -> None:
        self.agent, self.env, self.episode = agent, env, episode
        self.messages: list[dict[str, Any]] = []
        if agent.options.system_prompt:
            self.messages.append({"role": "system", "content": agent.options.system_prompt})
        self.tools: list[ToolSpec] = []
        self.modalities_sent: set[str] = set()
        self.turn = 0

    async def act(self, observation: Observation) -> TurnResult:
        self.messages.extend(self.env.format_observation(observation, "openai"))
        if observation.tools:
            self.tools = list(observation.tools)
        media = count_media(observation.messages)
        self.modalities_sent |= set(media)
        seed = self.episode.turn_seed(self.turn)
        self.turn += 1
        reply = await call_engine(self.agent.chat(self.messages, self.tools, seed), self._classify)
        if not reply.choices:
            raise AgentError(f"{self.agent.url}: the reply has no choices")
        msg = reply.choices[0].message
        raw = msg.content or ""
        text, reasoning = split_thinking(raw)
        served = msg.reasoning_content or msg.reasoning  # SGLang's field, vLLM's field
        if served:
            reasoning = served if reasoning is None else f"{served}\n{reasoning}"
        calls, errors = tool_calls_from_reply(msg.tool_calls)
        history_item: dict[str, Any] = {"role": "assistant", "content": text}
        if msg.tool_calls:
            history_item["tool_calls"] = [c.model_dump(exclude_none=True) for c in msg.tool_calls]
        self.messages.append(history_item)
        usage = reply.usage
        return TurnResult(
            action=Action(text=text, tool_calls=calls, parse_errors=errors),
            message=Message.assistant(text, tool_calls=calls),
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
            media_sent=media,
            reasoning=reasoning,
        )

    def _classify(self, exc: EngineError) -> AgentError:
        if exc.status == 404:
            return FatalAgentError(f"no chat completions route or unknown model {self.agent.model!r}: {exc}")
        return refusal(exc, f"{self.agent.url} (model {self.agent.model!r})", self.modalities_sent)


__all__ = ["OpenAIAgent", "api_base", "tool_calls_from_reply"]
