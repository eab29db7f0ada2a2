"""The values that flow between environments, tools, agents and the trainer.

A conversation is a list of :class:`Message`; each message holds typed content parts (text,
image, audio, video). An environment returns an :class:`Observation` holding only the *new*
messages of this turn plus the tools the model may call now; the model answers with an
:class:`Action` (its raw text plus any parsed tool calls and parse errors).

Media parts compare by value (pixels, samples, frames), so two observations rendered from the
same seed compare equal and the checker can prove determinism down to the bytes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

import numpy as np
from PIL import Image

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")
MODALITIES: tuple[str, ...] = ("text", "image", "audio", "video")


@dataclass(frozen=True, slots=True)
class TextPart:
    """Plain text."""

    text: str

    @property
    def modality(self) -> str:
        return "text"


@dataclass(frozen=True, slots=True, eq=False)
class ImagePart:
    """An image held as a PIL image; ``id`` lets tools refer to it (e.g. ``zoom(image_id=...)``)."""

    image: Image.Image
    id: str | None = None

    @property
    def modality(self) -> str:
        return "image"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ImagePart):
            return NotImplemented
        a, b = self.image, other.image
        return (
            self.id == other.id
            and a.mode == b.mode
            and a.size == b.size
            and a.tobytes() == b.tobytes()
        )

    def __hash__(self) -> int:
        return hash((self.id, self.image.mode, self.image.size))


@dataclass(frozen=True, slots=True, eq=False)
class AudioPart:
    """A mono float32 waveform in [-1, 1] and its sample rate in Hz."""

    waveform: np.ndarray
    sample_rate: int
    id: str | None = None

    def __post_init__(self) -> None:
        wave = np.asarray(self.waveform, dtype=np.float32)
        if wave.ndim != 1:
            raise ValueError(f"AudioPart.waveform must be 1-D mono, got shape {wave.shape}")
        if self.sample_rate <= 0:
            raise ValueError(f"AudioPart.sample_rate must be positive, got {self.sample_rate}")
        object.__setattr__(self, "waveform", wave)

    @property
    def modality(self) -> str:
        return "audio"

    @property
    def duration_s(self) -> float:
        return len(self.waveform) / self.sample_rate

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AudioPart):
            return NotImplemented
        return (
            self.id == other.id
            and self.sample_rate == other.sample_rate
            and np.array_equal(self.waveform, other.waveform)
        )

    def __hash__(self) -> int:
        return hash((self.id, self.sample_rate, len(self.waveform)))


@dataclass(frozen=True, slots=True, eq=False)
class VideoPart:
    """Video frames as uint8 ``[T, H, W, 3]`` RGB plus the frame rate they are sampled at."""

    frames: np.ndarray
    fps: float
    id: str | None = None

    def __post_init__(self) -> None:
        frames = np.asarray(self.frames)
        if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
            raise ValueError(
                f"VideoPart.frames must be uint8 [T, H, W, 3], got {frames.dtype} {frames.shape}"
            )
        if frames.shape[0] == 0:
            raise ValueError("VideoPart.frames must hold at least one frame")
        if self.fps <= 0:
            raise ValueError(f"VideoPart.fps must be positive, got {self.fps}")
        object.__setattr__(self, "frames", frames)

    @property
    def modality(self) -> str:
        return "video"

    @property
    def num_frames(self) -> int:
        return int(self.frames.shape[0])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, VideoPart):
            return NotImplemented
        return (
            self.id == other.id
            and self.fps == other.fps
            and np.array_equal(self.frames, other.frames)
        )

    def __hash__(self) -> int:
        return hash((self.id, self.fps, self.frames.shape))


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` with lone UTF-16 surrogates (``"\\ud800"``, which a JSON escape or a bad
    decoder can produce) replaced by U+FFFD: they cannot be encoded as UTF-8, so they would
    crash a tokenizer, a JSON writer or a subprocess pipe far from where they came in."""
    return text if text.isascii() else _LONE_SURROGATE.sub("\ufffd", text)


def action_text(value: Any) -> str:
    """The model's text as a clean ``str``: ``None`` (an OpenAI-style reply that only calls
    tools) is ``""``, ``bytes`` are decoded as UTF-8 with replacement; anything else raises a
    TypeError that names the type."""
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    if not isinstance(value, str):
        raise TypeError(f"Action.text must be str (or None / UTF-8 bytes), got {type(value).__name__}")
    return clean_text(str(value))


ContentPart: TypeAlias = TextPart | ImagePart | AudioPart | VideoPart
MEDIA_PART_TYPES = (ImagePart, AudioPart, VideoPart)


def as_part(value: Any) -> ContentPart:
    """Coerce a convenient value into a content part (``str`` -> text, PIL image -> image)."""
    if isinstance(value, (TextPart, ImagePart, AudioPart, VideoPart)):
        return value
    if isinstance(value, str):
        return TextPart(value)
    if isinstance(value, Image.Image):
        return ImagePart(value)
    raise TypeError(
        f"cannot use {type(value).__name__} as message content; "
        "pass str, PIL.Image, TextPart, ImagePart, AudioPart or VideoPart"
    )


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call the model asked for: a tool name and its (already JSON-decoded) arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"ToolCall.name must be str, got {type(self.name).__name__}")
        if self.arguments is None:
            object.__setattr__(self, "arguments", {})
        elif not isinstance(self.arguments, dict):
            raise TypeError(f"ToolCall.arguments must be a dict, got {type(self.arguments).__name__}")
        if self.id is None:
            object.__setattr__(self, "id", "")
        elif not isinstance(self.id, str):
            raise TypeError(f"ToolCall.id must be str, got {type(self.id).__name__}")

    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False, sort_keys=True)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ToolCall):
            return NotImplemented
        return (self.name, self.id, self.arguments_json()) == (
            other.name,
            other.id,
            other.arguments_json(),
        )

    def __hash__(self) -> int:
        return hash((self.name, self.id, self.arguments_json()))


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as the model sees it: an OpenAI function schema (name, description, parameters)."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}, "required": []}
    )

    def to_openai(self) -> dict[str, Any]:
        """The ``{"type": "function", "function": {...}}`` form used by chat APIs and templates."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ToolSpec):
            return NotImplemented
        return json.dumps(self.to_openai(), sort_keys=True) == json.dumps(
            other.to_openai(), sort_keys=True
        )

    def __hash__(self) -> int:
        return hash(self.name)


@dataclass(slots=True)
class Message:
    """One chat message. ``tool_calls`` is set on assistant messages that call tools;
    ``tool_call_id``/``name`` on the ``tool`` messages answering them."""

    role: Role
    content: list[ContentPart] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"unknown role {self.role!r}; expected one of {ROLES}")
        if isinstance(self.content, (str, TextPart, ImagePart, AudioPart, VideoPart)):
            self.content = [self.content]  # type: ignore[list-item]
        self.content = [as_part(p) for p in self.content]

    # -- constructors -------------------------------------------------------------------------
    @classmethod
    def system(cls, *parts: Any) -> Message:
        return cls("system", list(parts))

    @classmethod
    def user(cls, *parts: Any) -> Message:
        return cls("user", list(parts))

    @classmethod
    def assistant(cls, *parts: Any, tool_calls: list[ToolCall] | None = None) -> Message:
        return cls("assistant", list(parts), tool_calls=list(tool_calls or []))

    @classmethod
    def tool(cls, *parts: Any, tool_call_id: str | None = None, name: str | None = None) -> Message:
        return cls("tool", list(parts), tool_call_id=tool_call_id, name=name)

    # -- views ----------------------------------------------------------------------------------
    @property
    def text(self) -> str:
        """The concatenated text parts (media parts are skipped)."""
        return "".join(p.text for p in self.content if isinstance(p, TextPart))

    @property
    def media(self) -> list[ContentPart]:
        return [p for p in self.content if not isinstance(p, TextPart)]

    @property
    def modalities(self) -> set[str]:
        return {p.modality for p in self.content}


@dataclass(slots=True)
class Observation:
    """What the environment shows the model this turn: only the new messages, plus the tools
    callable now. An empty ``messages`` list is valid (e.g. the final observation)."""

    messages: list[Message] = field(default_factory=list)
    tools: list[ToolSpec] = field(default_factory=list)

    @classmethod
    def from_text(cls, text: str, role: Role = "user") -> Observation:
        return cls([Message(role, [TextPart(text)])])

    @property
    def text(self) -> str:
        return "\n".join(m.text for m in self.messages if m.text)

    @property
    def modalities(self) -> set[str]:
        out: set[str] = set()
        for m in self.messages:
            out |= m.modalities
        return out

    def parts(self, kind: type[Any] | None = None) -> list[ContentPart]:
        """Every content part in order, optionally only those of one type (e.g. ``ImagePart``)."""
        return [
            p for m in self.messages for p in m.content if kind is None or isinstance(p, kind)
        ]


@dataclass(slots=True)
class Action:
    """The model's turn: its raw text, the tool calls parsed from it, and what failed to parse.

    Parsing never raises; a malformed call becomes a string in ``parse_errors`` that the
    environment turns into an error observation for the model. Construction normalises what
    a client may hand over: ``text=None`` is ``""``, ``bytes`` are decoded as UTF-8, lone
    surrogates become U+FFFD, ``None`` lists are empty; any other type is a TypeError here,
    never a crash inside an env's ``step``.
    """

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    parse_errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.text = action_text(self.text)
        self.tool_calls = _typed_list(self.tool_calls, ToolCall, "tool_calls")
        self.parse_errors = [clean_text(e) for e in _typed_list(self.parse_errors, str, "parse_errors")]

    @classmethod
    def coerce(cls, action: Action | str | None) -> Action:
        """Accept a bare string (or ``None``: an empty turn, or UTF-8 bytes) as the model's
        text; anything else must already be an Action."""
        if isinstance(action, Action):
            return action
        if action is None or isinstance(action, (str, bytes, bytearray)):
            return cls(text=action)  # type: ignore[arg-type]  # normalised in __post_init__
        raise TypeError(f"an action must be relax_gym.Action or str, got {type(action).__name__}")

    @property
    def has_errors(self) -> bool:
        return bool(self.parse_errors)


def _typed_list(value: Any, kind: type, what: str) -> list[Any]:
    """``value`` as a list whose items are all ``kind`` (``None`` is empty); else a TypeError."""
    if value is None:
        return []
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        raise TypeError(f"Action.{what} must be a list of {kind.__name__}, got {type(value).__name__}")
    items = list(value)
    for item in items:
        if not isinstance(item, kind):
            raise TypeError(f"Action.{what} must hold {kind.__name__} items, got {type(item).__name__}")
    return items
