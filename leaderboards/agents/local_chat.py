"""The conversation of the ``sglang:`` and ``hf:`` agents, encoded by the core's chat encoder.

An episode is a :class:`relax_gym.chat.ChatContext`: the token ids the rollout manager builds
when it trains on the same episode -- prompt, each reply as generated, the template's closing
glue, each observation as a delta -- so a model is evaluated on the prompts it is trained on.
Earlier replies stay as generated, ``<think>`` blocks included (see the ``relax_gym.chat`` module
docstring for why). The env gets the answer with the thinking split off, and tool calls are
parsed from that answer here.

A media part the encoder has no tokens for (:meth:`~relax_gym.chat.ChatCodec.takes`: audio except for the
Qwen3-Omni thinker;
video except for Qwen3-VL; images without the model's image processor) raises :class:`ModalityRejected` before
anything is sent, instead of evaluating a model that never saw the media.
"""

from __future__ import annotations

import abc
import hashlib
import json
from pathlib import Path
from typing import Any

from relax_gym.chat import MEDIA_KINDS, ChatCodec, ChatContext, TemplateError
from relax_gym.core import Env
from relax_gym.errors import MediaError
from relax_gym.types import Action, Message, Observation, ToolCall, ToolSpec

from .base import (Agent, AgentError, AgentOptions, AgentSession, ContextExhausted, EpisodeInfo, FatalAgentError,
                   ModalityRejected, TurnResult, count_media, split_thinking)


def load_codec(path: str, options: AgentOptions) -> ChatCodec:
    """The chat encoder of a model folder (tokenizer, chat template, image processor if any),
    with ``--thinking`` as the template's ``enable_thinking``."""
    if not Path(path).exists():
        raise FatalAgentError(
            f"tokenizer folder {path!r} does not exist (give the model folder with --model or --tokenizer)"
        )
    kwargs = {} if options.thinking is None else {"enable_thinking": options.thinking}
    try:
        return ChatCodec.from_pretrained(path, template_kwargs=kwargs)
    except ImportError as exc:  # pragma: no cover - transformers is in the train extra
        raise FatalAgentError(
            f"the local chat template needs transformers ({exc}); pip install 'relax-gym[train]'"
        ) from None
    except TemplateError as exc:
        raise FatalAgentError(f"the tokenizer in {path!r} has no usable chat template: {exc}") from None
    except (OSError, ValueError) as exc:
        raise FatalAgentError(f"cannot load a tokenizer from {path!r}: {exc}") from None


class ToolCallParser:
    """Reads tool calls out of generated text with a parser of ``relax_gym.tools``."""

    def __init__(self, name: str) -> None:
        try:
            from relax_gym.tools import get_parser
        except ImportError as exc:
            raise FatalAgentError(f"tool-call parser {name!r} needs relax_gym.tools ({exc})") from None
        try:
            self._parser = get_parser(name)
        except (KeyError, ValueError) as exc:
            raise FatalAgentError(f"unknown tool-call parser {name!r}: {exc}") from None
        self.name = name

    def parse(self, text: str, *, turn: int, tools: list[ToolSpec]) -> tuple[list[ToolCall], list[str]]:
        """The calls in ``text`` (ids ``call_{turn}_{i}``) and the parse errors; never raises."""
        action = self._parser.parse(text, turn=turn, tools=tools)
        return list(action.tool_calls), list(action.parse_errors)


class Conversation:
    """One episode's :class:`ChatContext`, fed with the env's observations and the model's replies."""

    def __init__(self, codec: ChatCodec, env: Env, options: AgentOptions) -> None:
        self.codec, self.env, self.options = codec, env, options
        self.context: ChatContext | None = None
        self.tools: list[ToolSpec] = []  # the latest observation's tools, for parsing
        self.media: list[str] = []  # modality of each media part sent, in prompt order
        self.media_errors: list[str] = []  # reasons of clips replaced by an error text, not yet reported

    def add_observation(self, observation: Observation) -> None:
        """Append the env's new messages; raise :class:`ModalityRejected` before anything is sent."""
        rendered = self.env.format_observation(observation, "hf")
        for msg in rendered:
            content = msg.get("content")
            for part in content if isinstance(content, list) else []:
                kind = part.get("type")
                if kind in MEDIA_KINDS and not self.codec.takes(kind):
                    raise ModalityRejected(
                        kind,
                        f"the chat encoder of {self.codec.source}",
                        f"it has no tokens for {kind} (text; images with the model's image processor; "
                        "video with Qwen3-VL)",
                    )
                if kind in MEDIA_KINDS:
                    self.media.append(kind)
        messages, _ = self.codec.adapt_messages(rendered)
        if observation.tools:
            self.tools = list(observation.tools)
        try:
            # a corrupt or over-budget clip: the model reads why in its place
            self.codec.build_screened(lambda msgs: self._extend(observation, msgs), messages,
                                      lambda errors: self.media_errors.extend(e.reason for e in errors))
        except TemplateError as exc:
            raise AgentError(f"chat template: {exc}") from None
        except MediaError as exc:  # no single clip at fault (too many clips): this episode fails
            raise AgentError(f"media: {exc}") from None

    def _extend(self, observation: Observation, messages: list[dict[str, Any]]) -> None:
        if self.context is None:
            tools = [t.to_openai() for t in observation.tools]
            self.context = ChatContext(self.codec, messages, tools, system_prompt=self.options.system_prompt)
        else:
            self.context.add_observation(messages)

    def take_media_errors(self) -> list[str]:
        """The clips replaced since the last call (reasons), for the turn's record."""
        out, self.media_errors = self.media_errors, []
        return out

    @property
    def ids(self) -> list[int]:
        """The context to generate from: every token so far, ending at a generation prompt."""
        if self.context is None:
            raise AgentError("no observation yet")
        return self.context.ids

    def add_reply(
        self, output_ids: list[int], parser: ToolCallParser | None, turn: int
    ) -> tuple[Action, str | None, list[ToolCall]]:
        """Append the generated tokens as they are and turn their text into the env's action.

        A vision marker the model emitted is cut off with what follows, as in training.
        """
        if self.context is None:
            raise AgentError("a reply before any observation")
        cut = self.codec.first_reserved(output_ids)
        reply = self.context.add_reply(output_ids if cut is None else output_ids[:cut])
        answer, reasoning = split_thinking(reply.action_text)
        calls: list[ToolCall] = []
        errors: list[str] = []
        if parser is not None and self.tools:
            calls, errors = parser.parse(answer, turn=turn, tools=self.tools)
        return Action(text=answer, tool_calls=calls, parse_errors=errors), reasoning, calls


class LocalChatAgent(Agent):
    """Base of the agents that encode episodes here (``sglang:``, ``hf:``): they set ``codec`` in
    :meth:`start` and make :class:`LocalChatSession` subclasses."""

    uses_sampling = True

    def __init__(self, spec: str, options: AgentOptions) -> None:
        self.spec = spec
        self.options = options
        self.codec: ChatCodec | None = None
        self._parser: ToolCallParser | None = None
        self.context_limit: int | None = None  # tokens the model takes in all; set by start()

    def set_context_limit(self, reported: int | None) -> None:
        """The context every request must fit: the smaller of what the server or model reports and
        ``--max-context``; unknown (no clamp) when neither is given."""
        known = [int(n) for n in (reported, self.options.max_context) if n]
        self.context_limit = min(known) if known else None

    def parser(self) -> ToolCallParser:
        if self._parser is None:
            self._parser = ToolCallParser(self.options.tool_parser)
        return self._parser

    def conversation(self, env: Env) -> Conversation:
        if self.codec is None:
            raise FatalAgentError(f"{self.spec}: agent used before start()")
        return Conversation(self.codec, env, self.options)

    def describe(self) -> dict[str, Any]:
        """The spec, plus what identifies the local encoder (its hash goes into the run's config)."""
        out: dict[str, Any] = {"spec": self.spec}
        if self.codec is not None:
            template = json.dumps(self.codec.chat_template, sort_keys=True)
            out["tokenizer"] = self.codec.source
            out["chat_template_sha256"] = hashlib.sha256(template.encode()).hexdigest()[:16]
        return out


class LocalChatSession(AgentSession):
    """One episode of a :class:`LocalChatAgent`: observation in, generated ids appended, action out."""

    def __init__(self, agent: LocalChatAgent, env: Env, episode: EpisodeInfo) -> None:
        self.agent, self.episode = agent, episode
        self.conv = agent.conversation(env)
        self.turn = 0

    @abc.abstractmethod
    async def generate(self, seed: int, max_new_tokens: int) -> tuple[list[int], int, int]:
        """Generate from ``self.conv.ids``: (output ids, prompt tokens, completion tokens)."""

    def reply_budget(self) -> int:
        """``--max-tokens``, cut to the room the model's context has left: SGLang (and the embedded
        engine, with its bounds) refuses a request whose prompt plus ``max_new_tokens`` passes the
        context, so a long multi-turn episode would otherwise end in an engine error instead of a
        truncation. One token is kept spare, as SGLang may count reserved tokens with the prompt."""
        limit = self.agent.context_limit
        if limit is None:
            return self.agent.options.max_tokens
        room = limit - len(self.conv.ids) - 1
        if room < 1:
            raise ContextExhausted(
                f"the conversation holds {len(self.conv.ids)} tokens; the model's context is {limit}: "
                "no room is left for a reply"
            )
        return min(self.agent.options.max_tokens, room)

    async def act(self, observation: Observation) -> TurnResult:
        self.conv.add_observation(observation)
        budget = self.reply_budget()
        seed = self.episode.turn_seed(self.turn)
        self.turn += 1
        output_ids, prompt_tokens, completion_tokens = await self.generate(seed, budget)
        parser = self.agent.parser() if self.conv.tools else None
        action, reasoning, calls = self.conv.add_reply(output_ids, parser, self.turn - 1)
        return TurnResult(
            action=action,
            message=Message.assistant(action.text, tool_calls=calls),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            media_sent=count_media(observation.messages),
            reasoning=reasoning,
            media_errors=self.conv.take_media_errors(),
        )


__all__ = ["Conversation", "LocalChatAgent", "LocalChatSession", "ToolCallParser", "load_codec"]
