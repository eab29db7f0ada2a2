"""``sglang:URL`` -- SGLang's native ``/generate``, token-in, with the chat template applied here.

The conversation is rendered with the model's own template (``--tokenizer``, else ``--model``,
else the ``tokenizer_path`` / ``model_path`` the server reports when that folder exists on this
machine) and sent as ``input_ids``; images, audio and video go as ``image_data`` /
``audio_data`` / ``video_data`` data URLs in prompt order. Tool calls are parsed from the
generated text with a ``relax_gym.tools`` parser (``--tool-parser``, default ``hermes``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relax_gym.core import Env
from relax_gym.protocol import (
    EngineClient,
    EngineError,
    EngineTimeout,
    EngineUnavailable,
    GenerateRequest,
    SamplingParams,
)
from relax_gym.types import Message, Observation

from .base import (
    Agent,
    AgentError,
    AgentOptions,
    AgentSession,
    EpisodeInfo,
    FatalAgentError,
    ModalityRejected,
    TurnResult,
    count_media,
)
from .local_chat import Conversation, LocalChat, ToolCallParser, describe_template
from .openai_agent import _MODALITY_HINT, api_base


class SGLangAgent(Agent):
    uses_sampling = True

    def __init__(self, spec: str, url: str, options: AgentOptions) -> None:
        self.spec = spec
        self.url = api_base(url)
        self.options = options
        self.client = EngineClient(self.url, api_key=options.api_key, timeout_s=options.timeout_s)
        self.chat: LocalChat | None = None
        self._parser: ToolCallParser | None = None
        self._server: dict[str, Any] = {}

    async def start(self) -> None:
        if not await self.client.health(timeout_s=min(self.options.timeout_s, 30.0)):
            raise FatalAgentError(f"{self.url}: /health does not answer; is the SGLang server up?")
        try:
            info = await self.client.model_info()
            self._server = {"model_path": info.model_path, "weight_version": info.weight_version or ""}
        except EngineError:
            info = None
        path = self.options.tokenizer or self.options.model
        if path is None and info is not None:
            path = next((p for p in (info.tokenizer_path, info.model_path) if p and Path(p).exists()), None)
        if path is None:
            raise FatalAgentError(
                "sglang: needs the model's tokenizer to apply its chat template here: pass --tokenizer "
                "or --model with the model folder"
            )
        self.chat = LocalChat(path, self.options)

    def parser(self) -> ToolCallParser:
        if self._parser is None:
            self._parser = ToolCallParser(self.options.tool_parser)
        return self._parser

    def session(self, env: Env, episode: EpisodeInfo) -> AgentSession:
        if self.chat is None:
            raise FatalAgentError("sglang agent used before start()")
        return _SGLangSession(self, env, episode)

    async def aclose(self) -> None:
        await self.client.aclose()

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"spec": self.spec}
        if self.chat is not None:
            out.update(describe_template(self.chat))
        return out

    def versions(self) -> dict[str, str]:
        return {f"server_{k}": str(v) for k, v in self._server.items() if v}


class _SGLangSession(AgentSession):
    def __init__(self, agent: SGLangAgent, env: Env, episode: EpisodeInfo) -> None:
        assert agent.chat is not None
        self.agent, self.episode = agent, episode
        self.conv = Conversation(agent.chat, env)
        self.turn = 0

    async def act(self, observation: Observation) -> TurnResult:
        self.conv.add_observation(observation)
        chat = self.agent.chat
        assert chat is not None
        input_ids = chat.encode(self.conv.prompt())
        o = self.agent.options
        media = self.conv.media_payload()
        request = GenerateRequest(
            input_ids=input_ids,
            sampling_params=SamplingParams(
                max_new_tokens=o.max_tokens,
                temperature=o.temperature,
                top_p=o.top_p,
                top_k=o.top_k,
                min_p=o.min_p,
                sampling_seed=self.episode.turn_seed(self.turn),
            ),
            image_data=media.get("image_data"),
            audio_data=media.get("audio_data"),
            video_data=media.get("video_data"),
        )
        self.turn += 1
        try:
            reply = await self.agent.client.generate(request)
        except EngineTimeout as exc:
            raise AgentError(f"timed out: {exc}") from None
        except EngineUnavailable as exc:
            raise AgentError(f"server unavailable: {exc}") from None
        except EngineError as exc:
            kinds = sorted({k for k, _ in self.conv.media})
            if exc.status in (401, 403):
                raise FatalAgentError(f"the server refused the API key: {exc}") from None
            if exc.status and 400 <= exc.status < 500 and kinds and _MODALITY_HINT.search(str(exc)):
                named = [k for k in kinds if k in str(exc).lower()]
                raise ModalityRejected(named[0] if named else "/".join(kinds), self.agent.url, str(exc)) from None
            raise AgentError(str(exc)) from None
        parser = self.agent.parser() if self.conv.tools else None
        action, reasoning, calls = self.conv.add_reply(reply.text, parser, self.turn - 1)
        meta = reply.meta_info
        return TurnResult(
            action=action,
            message=Message.assistant(action.text, tool_calls=calls),
            prompt_tokens=meta.prompt_tokens or len(input_ids),
            completion_tokens=meta.completion_tokens or len(reply.output_ids or []),
            media_sent=count_media(observation.messages),
            reasoning=reasoning,
        )


__all__ = ["SGLangAgent"]
