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

from relax_gym.core import Env
from relax_gym.protocol import EngineClient, EngineError, GenerateRequest, SamplingParams
from relax_gym.audio import collapse_audio_tokens
from relax_gym.model_context import folder_context
from relax_gym.video import collapse_spans

from .base import AgentError, AgentOptions, EpisodeInfo, FatalAgentError, call_engine, refusal
from .local_chat import LocalChatAgent, LocalChatSession, load_codec
from .openai_agent import api_base


class SGLangAgent(LocalChatAgent):
    def __init__(self, spec: str, url: str, options: AgentOptions) -> None:
        super().__init__(spec, options)
        self.url = api_base(url)
        self.client = EngineClient(self.url, api_key=options.api_key, timeout_s=options.timeout_s)
        self._server: dict[str, Any] = {}

    async def start(self) -> None:
        if not await self.client.health(timeout_s=min(self.options.timeout_s, 30.0)):
            raise FatalAgentError(f"{self.url}: /health does not answer; is the SGLang server up?")
        try:
            info = await self.client.model_info()
            self._server = {"model_path": info.model_path, "weight_version": info.weight_version or ""}
        except EngineError as exc:
            if exc.status == 404:  # neither /model_info nor /get_model_info: not SGLang's native API
                raise FatalAgentError(f"{self.url} is not an SGLang server (no /model_info or /get_model_info; "
                                      "for an OpenAI-compatible server use openai:URL)") from None
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
        self.set_context_limit(await self.client.max_model_len() or folder_context(path))

    def session(self, env: Env, episode: EpisodeInfo) -> _SGLangSession:
        return _SGLangSession(self, env, episode)

    async def aclose(self) -> None:
        await self.client.aclose()

    def describe(self) -> dict[str, Any]:
        """The local encoder's identity, plus the model the server says it serves: the run's hash
        ignores the URL (a restarted server on another port resumes the run), not the model."""
        out = super().describe()
        if self._server.get("model_path"):
            out["server_model_path"] = self._server["model_path"]
        return out

    def versions(self) -> dict[str, str]:
        return {f"server_{k}": str(v) for k, v in self._server.items() if v}


class _SGLangSession(LocalChatSession):
    agent: SGLangAgent

    def _request(self, seed: int, max_new_tokens: int) -> GenerateRequest:
        o, codec = self.agent.options, self.conv.codec
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=o.temperature, top_p=o.top_p,
                                top_k=o.top_k, min_p=o.min_p, sampling_seed=seed,
                                stop_token_ids=sorted(codec.reserved_ids) or None)
        ctx = self.conv.context
        payloads = ctx.payloads if ctx is not None else []
        ids = list(self.conv.ids)
        videos = ctx.video_payloads if ctx is not None else []
        if videos and codec.vision is not None and codec.vision.video is not None:
            # one pad per video, as the template renders it (SGLang's processor expands it)
            ids = collapse_spans(ids, ctx.video_spans, codec.vision.video.video_token_id)  # type: ignore[union-attr]
        audios = ctx.audio_payloads if ctx is not None else []
        if audios and codec.audio is not None:  # one pad per clip, as rendered (SGLang expands it)
            ids = collapse_audio_tokens(ids, codec.audio.audio_token_id)
        return GenerateRequest(input_ids=ids, sampling_params=params, image_data=payloads or None,
                               video_data=videos or None, audio_data=audios or None)

    async def generate(self, seed: int, max_new_tokens: int) -> tuple[list[int], int, int]:
        request = self._request(seed, max_new_tokens)
        reply = await call_engine(self.agent.client.generate(request),
                                  lambda exc: refusal(exc, self.agent.url, self.conv.media))
        try:
            output_ids = reply.token_ids()
        except EngineError as exc:
            raise AgentError(f"{self.agent.url}: {exc}") from None
        meta = reply.meta_info
        return output_ids, meta.prompt_tokens or len(request.input_ids or []), meta.completion_tokens or len(output_ids)


__all__ = ["SGLangAgent"]
