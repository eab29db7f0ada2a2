"""Save conversations to JSON with media as files, and load them back.

Used wherever a conversation leaves the process: ``relax-gym play`` transcripts, trajectory
dumps, evaluation transcripts. Media is written once per distinct content (file names are
content hashes), so a JSONL of thousands of turns stays small and diffable.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from relax_gym.errors import MediaError
from relax_gym.media import encode_audio, encode_image, encode_video, load_audio, load_image, load_video
from relax_gym.types import AudioPart, ContentPart, ImagePart, Message, TextPart, ToolCall, VideoPart


class MediaWriter:
    """Writes media parts under ``folder`` and returns their paths relative to it."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.written: list[Path] = []

    def save(self, part: ContentPart) -> str:
        if isinstance(part, ImagePart):
            data, ext = encode_image(part.image, "PNG"), "png"
        elif isinstance(part, AudioPart):
            data, ext = encode_audio(part.waveform, part.sample_rate, "wav"), "wav"
        elif isinstance(part, VideoPart):
            try:
                data, ext = encode_video(part.frames, part.fps), "mp4"
            except MediaError:  # no PyAV: keep the exact frames instead
                data, ext = _npy_bytes(part.frames), "npy"
        else:
            raise TypeError(f"not a media part: {type(part).__name__}")
        name = f"{part.modality}-{hashlib.sha1(data).hexdigest()[:16]}.{ext}"
        path = self.folder / name
        if not path.exists():
            path.write_bytes(data)
            self.written.append(path)
        return name


def _npy_bytes(arr: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def message_to_record(msg: Message, writer: MediaWriter | None = None) -> dict[str, Any]:
    """A JSON-ready dict; media become ``{"type": ..., "path": ...}`` (or placeholders without
    a writer)."""
    content: list[dict[str, Any]] = []
    for part in msg.content:
        if isinstance(part, TextPart):
            content.append({"type": "text", "text": part.text})
            continue
        item: dict[str, Any] = {"type": part.modality}
        if part.id is not None:
            item["id"] = part.id
        if isinstance(part, AudioPart):
            item["sample_rate"] = part.sample_rate
        if isinstance(part, VideoPart):
            item["fps"] = part.fps
        if writer is not None:
            item["path"] = writer.save(part)
        content.append(item)
    rec: dict[str, Any] = {"role": msg.role, "content": content}
    if msg.tool_calls:
        rec["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in msg.tool_calls]
    if msg.tool_call_id is not None:
        rec["tool_call_id"] = msg.tool_call_id
    if msg.name is not None:
        rec["name"] = msg.name
    return rec


def message_from_record(rec: dict[str, Any], media_dir: str | Path | None = None) -> Message:
    """Inverse of :func:`message_to_record`; media are read from ``media_dir``."""
    parts: list[ContentPart] = []
    for item in rec.get("content", []):
        kind = item.get("type")
        if kind == "text":
            parts.append(TextPart(item["text"]))
            continue
        if "path" not in item or media_dir is None:
            raise MediaError(kind or "media", repr(item), "record has no media file to load")
        path = _media_path(media_dir, item["path"], kind or "media")
        if kind == "image":
            parts.append(ImagePart(load_image(path), id=item.get("id")))
        elif kind == "audio":
            wave, sr = load_audio(path)
            parts.append(AudioPart(wave, sr, id=item.get("id")))
        elif kind == "video":
            if path.suffix == ".npy":
                frames, fps = np.load(path, allow_pickle=False), float(item.get("fps", 1.0))
            else:
                frames, _ = load_video(path)
                fps = float(item.get("fps", 1.0))
            parts.append(VideoPart(frames, fps, id=item.get("id")))
        else:
            raise MediaError("media", repr(item), f"unknown content type {kind!r}")
    calls = [ToolCall(c["name"], dict(c.get("arguments") or {}), c.get("id", "")) for c in rec.get("tool_calls", [])]
    return Message(rec["role"], parts, tool_call_id=rec.get("tool_call_id"), name=rec.get("name"), tool_calls=calls)


def _media_path(media_dir: str | Path, name: Any, kind: str) -> Path:
    """The media file a record names, which must be a plain file name inside ``media_dir``
    (what :class:`MediaWriter` writes): a record is data, possibly from someone else's run, and
    ``"../../etc/shadow"`` or an absolute path must not read a file from outside the folder."""
    if not isinstance(name, str) or not name or name in {".", ".."} or Path(name).name != name or "\\" in name:
        raise MediaError(kind, repr(name)[:200], "a media path in a record must be a plain file name in its media folder")
    path = Path(media_dir) / name
    if path.is_symlink():
        raise MediaError(kind, name, "a media file in a record's folder must not be a symlink")
    return path


def render_transcript_line(rec: dict[str, Any]) -> str:
    """One readable line block for a message record (used by ``relax-gym play``)."""
    bits = []
    for item in rec["content"]:
        if item["type"] == "text":
            bits.append(item["text"])
        else:
            bits.append(f"[{item['type']}: {item.get('path', '(not saved)')}]")
    for call in rec.get("tool_calls", []):
        bits.append(f"-> {call['name']}({call['arguments']})")
    who = rec["role"] + (f" ({rec['name']})" if rec.get("name") else "")
    return f"[{who}] " + " ".join(bits)
