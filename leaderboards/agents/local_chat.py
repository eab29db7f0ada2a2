"""A conversation rendered locally with the model's own chat template (for ``sglang:`` and ``hf:``).

Messages are kept in the form HF chat templates take: text-only content as a string, media as
``{"type": "image"}`` / ``{"type": "audio"}`` / ``{"type": "video"}`` placeholder parts whose
objects are kept aside, in prompt order, for the engine or the processor. Before a modality is
sent the first time, the template is probed: if rendering a media part adds no special token
(the template dropped it, or printed the part as text) the model has no slot for that modality,
and :class:`ModalityRejected` stops the run instead of evaluating a model that never saw the media.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from relax_gym.core import Env
from relax_gym.media import encode_audio, image_to_data_url, video_to_data_url
from relax_gym.types import Action, Observation, ToolCall, ToolSpec

from .base import AgentOptions, FatalAgentError, ModalityRejected, split_thinking

MEDIA_KINDS = ("image", "audio", "video")


def load_tokenizer(path: str) -> Any:
    """The tokenizer (with its chat template) saved in a model folder."""
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:  # pragma: no cover - transformers is in the train extra
        raise FatalAgentError(
            f"the local chat template needs transformers ({exc}); pip install 'relax-gym[train]'"
        ) from None
    if not Path(path).exists():
        raise FatalAgentError(
            f"tokenizer folder {path!r} does not exist (give the model folder with --model or --tokenizer)"
        )
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise FatalAgentError(f"cannot load a tokenizer from {path!r}: {exc}") from None
    if not getattr(tok, "chat_template", None):
        raise FatalAgentError(f"the tokenizer in {path!r} has no chat template")
    return tok


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


class LocalChat:
    """A model's tokenizer and chat template, with the per-modality probe."""

    def __init__(self, path: str, options: AgentOptions) -> None:
        self.path = path
        self.options = options
        self.tokenizer = load_tokenizer(path)
        self._probed: dict[str, bool] = {}

    def render(self, messages: list[dict[str, Any]], tools: list[ToolSpec]) -> str:
        kwargs: dict[str, Any] = {}
        if self.options.thinking is not None:
            kwargs["enable_thinking"] = self.options.thinking
        return str(
            self.tokenizer.apply_chat_template(
                messages,
                tools=[t.to_openai() for t in tools] or None,
                add_generation_prompt=True,
                tokenize=False,
                **kwargs,
            )
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def supports(self, modality: str) -> bool:
        """Does the template give a ``modality`` part a special-token slot?"""
        if modality not in self._probed:
            self._probed[modality] = self._probe(modality)
        return self._probed[modality]

    def require(self, modality: str) -> None:
        if not self.supports(modality):
            raise ModalityRejected(
                modality,
                f"the chat template of {self.path}",
                f"rendering {modality} content adds no special token for it",
            )

    def _probe(self, modality: str) -> bool:
        with_media = [
            {
                "role": "user",
                "content": [{"type": "text", "text": "A"}, {"type": modality}, {"type": "text", "text": "B"}],
            }
        ]
        without = [{"role": "user", "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]}]
        try:
            a = self.encode(self.render(with_media, []))
            b = self.encode(self.render(without, []))
        except Exception:  # noqa: BLE001 -- a template that cannot render content lists takes no media
            return False
        special = set(getattr(self.tokenizer, "all_special_ids", [])) | set(
            getattr(self.tokenizer, "added_tokens_decoder", {}) or {}
        )
        return bool((set(a) - set(b)) & special)


class Conversation:
    """The history of one episode in template form, plus its media in prompt order."""

    def __init__(self, chat: LocalChat, env: Env) -> None:
        self.chat, self.env = chat, env
        self.messages: list[dict[str, Any]] = []
        if chat.options.system_prompt:
            self.messages.append({"role": "system", "content": chat.options.system_prompt})
        self.media: list[tuple[str, Any]] = []  # (modality, hf-style part) in prompt order
        self.tools: list[ToolSpec] = []

    def add_observation(self, observation: Observation) -> None:
        """Append the env's new messages; raise :class:`ModalityRejected` before anything is sent."""
        rendered = self.env.format_observation(observation, "hf")
        for msg in rendered:
            content = msg.get("content")
            if isinstance(content, list):
                parts = []
                for part in content:
                    kind = part.get("type")
                    if kind in MEDIA_KINDS:
                        self.chat.require(kind)
                        self.media.append((kind, part))
                        parts.append({"type": kind})
                    else:
                        parts.append(part)
                msg = {**msg, "content": parts}
            self.messages.append(msg)
        if observation.tools:
            self.tools = list(observation.tools)

    def prompt(self) -> str:
        return self.chat.render(self.messages, self.tools)

    def add_reply(
        self, text: str, parser: ToolCallParser | None, turn: int
    ) -> tuple[Action, str | None, list[ToolCall]]:
        """Turn generated text into the env's action and append it to the history.

        The history keeps the answer as generated, tool-call blocks included and without a
        ``tool_calls`` field: the template re-renders exactly the tokens the model wrote
        (thinking aside, which templates drop from earlier turns anyway).
        """
        answer, reasoning = split_thinking(text)
        calls: list[ToolCall] = []
        errors: list[str] = []
        if parser is not None and self.tools:
            calls, errors = parser.parse(answer, turn=turn, tools=self.tools)
        self.messages.append({"role": "assistant", "content": answer})
        return Action(text=answer, tool_calls=calls, parse_errors=errors), reasoning, calls

    def media_payload(self) -> dict[str, list[str]]:
        """SGLang's ``image_data`` / ``audio_data`` / ``video_data`` lists (data URLs), in order."""
        out: dict[str, list[str]] = {}
        for kind, part in self.media:
            if kind == "image":
                out.setdefault("image_data", []).append(image_to_data_url(part["image"]))
            elif kind == "audio":
                import base64

                wav = encode_audio(part["audio"], int(part["sampling_rate"]), "wav")
                out.setdefault("audio_data", []).append(
                    "data:audio/wav;base64," + base64.b64encode(wav).decode("ascii")
                )
            elif kind == "video":
                out.setdefault("video_data", []).append(video_to_data_url(part["video"], float(part["fps"])))
        return out


def describe_template(chat: LocalChat) -> dict[str, Any]:
    """What identifies the local template (its hash goes into the run's config)."""
    import hashlib

    template = json.dumps(chat.tokenizer.chat_template, sort_keys=True)
    return {"tokenizer": chat.path, "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest()[:16]}


__all__ = ["Conversation", "LocalChat", "MEDIA_KINDS", "ToolCallParser", "describe_template", "load_tokenizer"]
