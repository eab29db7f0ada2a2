"""``sglang:URL`` -- SGLang's native ``/generate``, token-in, with the chat template applied here.

The episode is encoded by the core's chat encoder with the model's own template
(``--tokenizer``, else ``--model``, else the ``tokenizer_path`` / ``model_path`` the server
reports when that folder exists on this machine) -- the token ids the rollout manager sends when
it trains on the same episode -- and sent as ``input_ids``, images as ``image_data`` data URLs in
prompt order. Each reply's ``output_ids`` join the context as generated. Tool calls are parsed
from the generated text with a ``relax_gym.tools`` parser (``--tool-parser``, default ``hermes``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relax_gym.chat import ChatCodec
from relax_gym.core import Env
from relax_gym.protocol import EngineClient, EngineError, EngineTimeout, EngineUnavailable, GenerateRequest, SamplingParams
from relax_gym.types import Message, Observation

from .base import (Agent, AgentError, AgentOptions, AgentSession, EpisodeInfo, FatalAgentError, ModalityRejected,
                   TurnResult, count_media)
from .local_chat import Conversation, ToolCallParser, describe_template, load_codec
from .openai_agent import _MODALITY_HINT, api_base


class SGLangAgent(Agent):
    uses_sampling = True

    def __init__(self, spec: str, url: str, options: AgentOptions) -> None:
        self.spec = spec
        self.url = api_base(url)
        self.options = options
        self.client = EngineClient(self.url, api_key=options.api_key, timeout_s=options.timeout_s)
        self.codec: ChatCodec | None = None
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
        self.codec = load_codec(path, self.options)

    def parser(self) -> ToolCallParser:
        if self._parser is None:
            self._parser = ToolCallParser(self.options.tool_parser)
        return self._parser

    def session(self, env: Env, episode: EpisodeInfo) -> AgentSession:
        if self.codec is None:
            raise FatalAgentError("sglang agent used before start()")
        return _SGLangSession(self, env, episode)

    async def aclose(self) -> None:
        await self.client.aclose()

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"spec": self.spec}
        if self.codec is not None:
            out.update(describe_template(self.codec))
        return out

    def versions(self) -> dict[str, str]:
        return {f"server_{k}": str(v) for k, v in self._server.items() if v}


class _SGLangSession(AgentSession):
    def __init__(self, agent: SGLangAgent, env: Env, episode: EpisodeInfo) -> None:
        assert agent.codec is not None
        self.agent, self.episode = agent, episode
        self.conv = Conversation(agent.codec, env, agent.options)
        self.turn = 0

    def _request(self) -> GenerateRequest:
        o, codec = self.agent.options, self.conv.codec
        params = SamplingParams(max_new_tokens=o.max_tokens, temperature=o.temperature, top_p=o.top_p,
                                top_k=o.top_k, min_p=o.min_p, sampling_seed=self.episode.turn_seed(self.turn),
                                stop_token_ids=sorted(codec.reserved_ids) or None)
        payloads = self.conv.context.payloads if self.conv.context is not None else []
        return GenerateRequest(input_ids=list(self.conv.ids), sampling_params=params, image_data=payloads or None)

    async def act(self, observation: Observation) -> TurnResult:
        self.conv.add_observation(observation)
        request = self._request()
        self.turn += 1
        try:
            reply = await self.agent.client.generate(request)
            output_ids = reply.token_ids()
        except EngineTimeout as exc:
            raise AgentError(f"timed out: {exc}") from None
        except EngineUnavailable as exc:
            raise AgentError(f"server unavailable: {exc}") from None
        except EngineError as exc:
            raise self._refused(exc) from None
        parser = self.agent.parser() if self.conv.tools else None
        action, reasoning, calls = self.conv.add_reply(output_ids, parser, self.turn - 1)
        meta = reply.meta_info
        return TurnResult(
            action=action,
            message=Message.assistant(action.text, tool_calls=calls),
            prompt_tokens=meta.prompt_tokens or len(request.input_ids or []),
            completion_tokens=meta.completion_tokens or len(output_ids),
            media_sent=count_media(observation.messages),
            reasoning=reasoning,
        )

    def _refused(self, exc: EngineError) -> AgentError:
        """The error for a request the server refused: a modality it cannot take stops the run."""
        kinds = sorted(set(self.conv.media))
        if exc.status in (401, 403):
            return FatalAgentError(f"the server refused the API key: {exc}")
        if exc.status and 400 <= exc.status < 500 and kinds and _MODALITY_HINT.search(str(exc)):
            named = [k for k in kinds if k in str(exc).lower()]
            return ModalityRejected(named[0] if named else "/".join(kinds), self.agent.url, str(exc))
        return AgentError(str(exc))


__all__ = ["SGLangAgent"]
