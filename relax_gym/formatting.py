"""Render messages for the three consumers of a conversation.

* ``"openai"`` -- Chat Completions messages: media become data URLs (``image_url``,
  ``input_audio``, ``video_url``), JSON-serialisable end to end.
* ``"hf"`` -- what Hugging Face chat templates and Qwen-VL processors take: media stay as
  objects (``{"type": "image", "image": PIL}``, ``{"type": "video", "video": frames}``,
  ``{"type": "audio", "audio": waveform}``).
* ``"text"`` -- a text-only fallback where each media part becomes a short placeholder.

Text-only content collapses to a plain string in every style: that is what text chat templates
(Qwen3's among them) and strict OpenAI servers accept for system and tool messages.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any, Literal

from relax_gym.media import encode_audio, image_to_data_url, video_to_data_url
from relax_gym.types import AudioPart, ContentPart, ImagePart, Message, TextPart, VideoPart

Style = Literal["openai", "hf", "text"]
STYLES: tuple[str, ...] = ("openai", "hf", "text")


def format_messages(messages: Iterable[Message], style: Style = "openai") -> list[dict[str, Any]]:
    """Render messages in one of :data:`STYLES`."""
    if style not in STYLES:
        raise ValueError(f"unknown observation style {style!r}; expected one of {STYLES}")
    render = _openai_part if style == "openai" else _hf_part
    out: list[dict[str, Any]] = []
    for msg in messages:
        if style == "text" or all(isinstance(p, TextPart) for p in msg.content):
            content: Any = "".join(
                p.text if isinstance(p, TextPart) else placeholder(p) for p in msg.content
            )
        else:
            content = [render(p) for p in msg.content]
        item: dict[str, Any] = {"role": msg.role, "content": content}
        if msg.tool_calls:
            item["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.name,
                        # OpenAI wants a JSON string; HF templates serialise a dict themselves.
                        "arguments": call.arguments_json() if style == "openai" else dict(call.arguments),
                    },
                }
                for call in msg.tool_calls
            ]
        if msg.tool_call_id is not None:
            item["tool_call_id"] = msg.tool_call_id
        if msg.name is not None:
            item["name"] = msg.name
        out.append(item)
    return out


def placeholder(part: ContentPart) -> str:
    """A one-line stand-in for a media part in text-only renderings."""
    label = f" {part.id}" if getattr(part, "id", None) else ""
    if isinstance(part, ImagePart):
        return f"[image{label}: {part.image.width}x{part.image.height}]"
    if isinstance(part, AudioPart):
        return f"[audio{label}: {part.duration_s:.2f} s at {part.sample_rate} Hz]"
    if isinstance(part, VideoPart):
        t, h, w, _ = part.frames.shape
        return f"[video{label}: {t} frames at {part.fps:g} fps, {w}x{h}]"
    if isinstance(part, TextPart):
        return part.text
    raise TypeError(f"unknown content part {type(part).__name__}")


def _openai_part(part: ContentPart) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if isinstance(part, ImagePart):
        return {"type": "image_url", "image_url": {"url": image_to_data_url(part.image)}}
    if isinstance(part, AudioPart):
        data = base64.b64encode(encode_audio(part.waveform, part.sample_rate, "wav")).decode("ascii")
        return {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}
    if isinstance(part, VideoPart):
        return {"type": "video_url", "video_url": {"url": video_to_data_url(part.frames, part.fps)}}
    raise TypeError(f"unknown content part {type(part).__name__}")


def _hf_part(part: ContentPart) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if isinstance(part, ImagePart):
        return {"type": "image", "image": part.image}
    if isinstance(part, AudioPart):
        return {"type": "audio", "audio": part.waveform, "sampling_rate": part.sample_rate}
    if isinstance(part, VideoPart):
        return {"type": "video", "video": part.frames, "fps": part.fps}
    raise TypeError(f"unknown content part {type(part).__name__}")


__all__ = ["STYLES", "Style", "format_messages", "placeholder"]
