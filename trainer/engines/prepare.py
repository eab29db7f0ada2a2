"""Turn a parsed ``/generate`` request into engine input, or say clearly why it is bad.

Everything that can fail on user input happens here, before the request reaches the scheduler:
tokenising text, checking token ids against the vocabulary, decoding images, expanding image
placeholders, checking the context length and the sampling parameters. Each failure is a
:class:`BadRequest` with a message a user can act on (the server answers 400).

Every check runs before the work it protects, because that work costs far more than the input:
tokenising takes about 100 B of memory and a microsecond per character, decoding a 100 KB PNG
can allocate gigabytes. So the raw JSON is checked first (:func:`check_raw_generate`: prompt
length in characters, ``input_ids`` length, image count and size), text is tokenised in pieces
that stop as soon as the count passes the context (:func:`tokenize_bounded`), images are refused
from their headers (:class:`relax_gym.media.MediaLimits`), and finally prompt tokens plus
``max_new_tokens`` are checked against the context length, as SGLang does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from PIL import Image

from relax_gym.errors import MediaError, RelaxGymError
from relax_gym.media import MediaLimits, load_image
from relax_gym.protocol import GenerateRequest, SamplingParams
from relax_gym.vision import VisionInputError, VisionInputs, prepare_vision_inputs

from relax_gym.trainer.engines.audio_inputs import NO_AUDIO_SUPPORT, audio_inputs
from relax_gym.trainer.engines.model_runner import ModelRunner
from relax_gym.trainer.engines.sampling import SamplingSpec

# SGLang sampling parameters the embedded engine does not implement, with their neutral values.
# A request may send the neutral value (clients often send defaults); anything else is refused.
UNSUPPORTED_SAMPLING: dict[str, Any] = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "n": 1,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "logit_bias": None,
}


# Stop conditions are checked on the engine thread after every token, for every request: a
# request must not be able to make that check expensive for everyone else.
MAX_STOP_STRINGS = 64
MAX_STOP_STRING_CHARS = 512
MAX_STOP_TOKEN_IDS = 1024
_TOKENIZE_PIECE_CHARS = 32_768  # long texts are counted in pieces of this many characters


class BadRequest(RelaxGymError, ValueError):
    """The request cannot be served as sent (HTTP 400)."""

    status = 400


class HTTPError(Exception):
    """A reply with this status and message; here, not in server.py, so chat.py needs no server."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


@dataclass(frozen=True, slots=True)
class InputLimits:
    """Per-request ceilings, each checked before the expensive step it protects."""

    max_prompt_chars: int | None = None  # None: chars_per_token * the model's context length
    chars_per_token: int = 32  # no real prompt averages this many characters per token
    max_images: int = 32
    max_image_bytes: int = 16 << 20  # encoded (PNG/JPEG) bytes per image, after base64
    max_image_pixels: int = 4096 * 4096  # width * height, read from the header before decoding
    allow_media_paths: bool = False  # let image_data name local files
    max_videos: int = 4
    max_video_bytes: int = 16 << 20  # encoded bytes per video, after base64
    max_video_frames: int = 64  # frames per video: the engine decodes every frame it is sent
    max_video_pixels: int = 1024 * 1024  # width * height per frame
    max_audios: int = 8
    max_audio_bytes: int = 16 << 20  # encoded bytes per clip, after base64
    max_audio_seconds: float = 60.0  # per clip, from the header

    def prompt_chars(self, max_context: int) -> int:
        """Most characters of prompt text accepted for tokenising."""
        if self.max_prompt_chars is not None:
            return self.max_prompt_chars
        return max_context * self.chars_per_token

    def media(self) -> MediaLimits:
        return MediaLimits(max_bytes=self.max_image_bytes, max_image_pixels=self.max_image_pixels)


@dataclass(slots=True)
class PreparedPrompt:
    input_ids: list[int]  # with image placeholders expanded
    vision: VisionInputs | None = None


def resolve_sampling(
    params: SamplingParams, runner: ModelRunner, *, max_new_tokens_cap: int | None = None
) -> SamplingSpec:
    """Validate SGLang ``sampling_params`` and resolve them for the sampler."""
    extra = params.model_extra or {}
    for key, neutral in UNSUPPORTED_SAMPLING.items():
        if key in extra and extra[key] != neutral and extra[key] not in (None, {}, []):
            raise BadRequest(f"sampling_params.{key}={extra[key]!r} is not supported by the embedded engine")
    if params.top_k == 0 or params.top_k < -1:
        raise BadRequest(f"sampling_params.top_k must be -1 (off) or >= 1, got {params.top_k}")
    stops: tuple[str, ...]
    if params.stop is None:
        stops = ()
    elif isinstance(params.stop, str):
        stops = (params.stop,) if params.stop else ()
    else:
        stops = tuple(s for s in params.stop if s)
    if len(stops) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_STRING_CHARS for s in stops):
        raise BadRequest(
            f"sampling_params.stop: at most {MAX_STOP_STRINGS} strings of at most {MAX_STOP_STRING_CHARS} characters"
        )
    if len(params.stop_token_ids or []) > MAX_STOP_TOKEN_IDS:
        raise BadRequest(f"sampling_params.stop_token_ids: at most {MAX_STOP_TOKEN_IDS} ids")
    stop_ids = frozenset(int(t) for t in (params.stop_token_ids or []))
    bad = [t for t in stop_ids if not 0 <= t < runner.vocab_size]
    if bad:
        raise BadRequest(f"stop_token_ids outside the vocabulary [0, {runner.vocab_size}): {sorted(bad)[:5]}")
    max_new = params.max_new_tokens
    if max_new_tokens_cap is not None and max_new > max_new_tokens_cap:
        raise BadRequest(f"max_new_tokens={max_new} exceeds this engine's limit of {max_new_tokens_cap}")
    return SamplingSpec(
        temperature=float(params.temperature),
        top_p=float(params.top_p),
        top_k=int(params.top_k),
        min_p=float(params.min_p),
        max_new_tokens=int(max_new),
        stop_strings=stops,
        stop_token_ids=stop_ids,
        ignore_eos=bool(params.ignore_eos),
        skip_special_tokens=bool(params.skip_special_tokens),
        no_stop_trim=bool(params.no_stop_trim),
    )


def check_prompt_chars(n_chars: int, runner: ModelRunner, limits: InputLimits, what: str = "the prompt") -> None:
    """Refuse text too long to fit the context before paying for tokenising it."""
    most = limits.prompt_chars(runner.max_context)
    if n_chars > most:
        raise BadRequest(
            f"{what} has {n_chars} characters; at most {most} are accepted "
            f"(the model's context is {runner.max_context} tokens)"
        )


def check_raw_generate(data: dict[str, Any], runner: ModelRunner, limits: InputLimits) -> None:
    """Size checks on a ``/generate`` body as parsed JSON, before it is validated and copied."""
    if data.get("audio_data") and getattr(runner, "audio_support", None) is None:
        raise BadRequest(NO_AUDIO_SUPPORT)
    check_raw_audios(data.get("audio_data"), limits)
    check_raw_videos(data.get("video_data"), limits)
    text, ids = data.get("text"), data.get("input_ids")
    if isinstance(text, str):
        check_prompt_chars(len(text), runner, limits)
    if isinstance(ids, list):
        check_context(len(ids), 0, runner)
    images = data.get("image_data")
    if isinstance(images, list):
        check_image_count(len(images), limits)
        check_encoded_sizes(images, "image_data", "image", limits.max_image_bytes)


def check_encoded_sizes(items: list[Any], field: str, noun: str, max_bytes: int) -> None:
    """Each base64 entry of a media list (``image_data``, ``video_data``, ``audio_data``) within
    ``max_bytes`` once decoded, checked on its length before anything is decoded."""
    b64_chars = max_bytes * 4 // 3 + 4096  # base64 plus a data-URL header
    for k, item in enumerate(items):
        if isinstance(item, str) and len(item) > b64_chars:
            raise BadRequest(f"{field}[{k}]: {len(item)} characters of base64 exceed the limit of "
                             f"{max_bytes} bytes per {noun}")


def check_raw_videos(videos: Any, limits: InputLimits) -> None:
    """Count and encoded-size checks on ``video_data`` before anything is decoded."""
    if not isinstance(videos, list) or not videos:
        return
    if len(videos) > limits.max_videos:
        raise BadRequest(f"{len(videos)} videos in one request; at most {limits.max_videos} are accepted")
    check_encoded_sizes(videos, "video_data", "video", limits.max_video_bytes)


def check_raw_audios(items: Any, limits: InputLimits) -> None:
    """Count and encoded-size checks on ``audio_data`` before anything is decoded."""
    if not isinstance(items, list) or not items:
        return
    if len(items) > limits.max_audios:
        raise BadRequest(f"{len(items)} audio clips in one request; at most {limits.max_audios} are accepted")
    check_encoded_sizes(items, "audio_data", "clip", limits.max_audio_bytes)


def decode_videos(items: list[Any], limits: InputLimits) -> list[tuple[Any, float]]:
    """Decode ``video_data`` entries (data URLs or bare base64; never URLs or paths) to
    ``(frames, fps)``, every frame kept: the client sampled them. Limits are checked from the
    header before decoding."""
    from relax_gym.media import load_video

    check_raw_videos(items, limits)
    media_limits = MediaLimits(max_bytes=limits.max_video_bytes, max_video_frames=limits.max_video_frames,
                               max_video_pixels=limits.max_video_pixels,
                               max_video_decoded_bytes=limits.max_video_frames * limits.max_video_pixels * 3)
    out = []
    for k, item in enumerate(items):
        if not isinstance(item, str) or not item:
            raise BadRequest(f"video_data[{k}]: expected a non-empty base64 string or data URL")
        if _URL.match(item):
            raise BadRequest(f"video_data[{k}]: URLs are not fetched by the embedded engine; send base64 or a data URL")
        source = item if item.startswith("data:") else "data:application/octet-stream;base64," + item
        key = hashlib.blake2b(source.encode(), digest_size=20).digest()
        with _DECODED_LOCK:
            hit = _DECODED.get(key)
        if hit is None:
            try:
                hit = load_video(source, limits=media_limits)
            except MediaError as exc:
                raise BadRequest(f"video_data[{k}]: {exc.cause}") from None
            with _DECODED_LOCK:
                _DECODED[key] = hit
                while len(_DECODED) > _DECODED_MAX:
                    _DECODED.popitem(last=False)
        out.append(hit)
    return out


# Decoded clips by payload hash: a GRPO group's samples send the same clip (bounded: 16 clips of
# at most max_video_frames x max_video_pixels each; the frames are never written to).
_DECODED: OrderedDict[bytes, tuple[Any, float]] = OrderedDict()
_DECODED_MAX = 16
_DECODED_LOCK = threading.Lock()


def check_image_count(n: int, limits: InputLimits) -> None:
    if n > limits.max_images:
        raise BadRequest(f"{n} images in one request; at most {limits.max_images} are accepted")


def check_context(prompt_tokens: int, max_new_tokens: int, runner: ModelRunner) -> None:
    """SGLang's two context checks (same wording and bounds: the prompt must be shorter than the
    context, the prompt plus ``max_new_tokens`` at most the context), before the request is queued."""
    context = runner.max_context
    if prompt_tokens >= context:
        raise BadRequest(
            f"The input ({prompt_tokens} tokens) is longer than the model's context length ({context} tokens)."
        )
    if prompt_tokens + max_new_tokens > context:
        raise BadRequest(
            f"Requested token count exceeds the model's maximum context length of {context} tokens. "
            f"You requested a total of {prompt_tokens + max_new_tokens} tokens: {prompt_tokens} tokens from "
            f"the input messages and {max_new_tokens} tokens for the completion. Please reduce the number "
            "of tokens in the input messages or the completion to fit within the limit."
        )


def _pieces(text: str, size: int) -> list[str]:
    """Split ``text`` into pieces of about ``size`` characters, at whitespace where there is some."""
    out, start = [], 0
    while start < len(text):
        end = min(len(text), start + size)
        if end < len(text):
            cut = max(text.rfind(" ", start + size // 2, end), text.rfind("\n", start + size // 2, end))
            end = cut if cut > start else end
        out.append(text[start:end])
        start = end
    return out


def tokenize_bounded(tokenizer: Any, text: str, max_tokens: int) -> list[int]:
    """Token ids of ``text``; a long text that clearly holds more than ``max_tokens`` tokens is
    refused after counting only enough of it, in pieces, to know (so memory and time stay
    bounded by the context length, not by the text)."""
    if len(text) > _TOKENIZE_PIECE_CHARS:
        counted, chars = 0, 0
        for n, piece in enumerate(_pieces(text, _TOKENIZE_PIECE_CHARS), start=1):
            counted += len(tokenizer(piece, add_special_tokens=False)["input_ids"])
            chars += len(piece)
            # Pieces split at whitespace tokenise almost exactly like the whole; the margin
            # only keeps a borderline prompt for the exact count below.
            if counted > max_tokens + max_tokens // 4 + 8 * n:
                raise BadRequest(
                    f"the prompt holds more than {counted} tokens (counted over its first {chars} "
                    f"characters); the model's context is {max_tokens} tokens"
                )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def decode_images(
    items: list[Any], *, limits: InputLimits | None = None, allow_paths: bool | None = None
) -> list[Image.Image]:
    """Decode ``image_data`` entries: data URLs or bare base64 (local file paths only if allowed),
    each within ``limits`` (encoded bytes, pixels from the header) before it is decoded.
    ``allow_paths`` (the older keyword) overrides ``limits.allow_media_paths``."""
    limits = _with_paths(limits or InputLimits(), allow_paths)
    check_image_count(len(items), limits)
    media_limits = limits.media()
    images = []
    for k, item in enumerate(items):
        if not isinstance(item, str) or not item:
            raise BadRequest(f"image_data[{k}]: expected a non-empty base64 string or data URL")
        if _URL.match(item):
            raise BadRequest(f"image_data[{k}]: URLs are not fetched by the embedded engine; send base64 or a data URL")
        if item.startswith("data:"):
            source = item
        elif limits.allow_media_paths and len(item) < 4096 and os.path.isfile(item):
            source = item
        else:  # bare base64: wrapped so the loader never reads it as a file path
            source = "data:application/octet-stream;base64," + item
        try:
            images.append(load_image(source, limits=media_limits))
        except MediaError as exc:
            if source is not item and exc.cause == "no such file":  # not base64, and looks like a path
                raise BadRequest(
                    f"image_data[{k}]: local file paths are not read by the embedded engine "
                    "(--allow-media-paths); send base64 or a data URL"
                ) from None
            raise BadRequest(f"image_data[{k}]: {exc.cause}") from None
    return images


def _with_paths(limits: InputLimits, allow_paths: bool | None) -> InputLimits:
    if allow_paths is None or allow_paths == limits.allow_media_paths:
        return limits
    return dataclasses.replace(limits, allow_media_paths=allow_paths)


def prepare_prompt(
    req: GenerateRequest,
    runner: ModelRunner,
    limits: InputLimits | None = None,
    *,
    allow_media_paths: bool | None = None,
) -> PreparedPrompt:
    """Token ids (and Qwen-VL image inputs) for a request; raises BadRequest."""
    limits = _with_paths(limits or InputLimits(), allow_media_paths)
    if req.audio_data and getattr(runner, "audio_support", None) is None:
        raise BadRequest(NO_AUDIO_SUPPORT)
    if req.video_data and getattr(runner, "video_support", None) is None:
        raise BadRequest("video_data was given but the served model takes no video (Qwen3-VL does)")
    if req.input_ids is not None:
        check_context(len(req.input_ids), 0, runner)
        ids = [int(t) for t in req.input_ids]
        bad = [t for t in ids if not 0 <= t < runner.vocab_size]
        if bad:
            raise BadRequest(
                f"input_ids hold {len(bad)} id(s) outside the vocabulary [0, {runner.vocab_size}): {bad[:5]}"
            )
    else:
        check_prompt_chars(len(req.text or ""), runner, limits)
        ids = tokenize_bounded(runner.tokenizer, req.text or "", runner.max_context)
    if not ids:
        raise BadRequest("the prompt is empty")
    vision = None
    if req.image_data:
        if not runner.is_vision:
            raise BadRequest("image_data was given but the served model has no vision encoder")
        images = decode_images(list(req.image_data), limits=limits)
    else:
        images = []
    if runner.is_vision:
        assert runner.image_processor is not None and runner.vision_tokens is not None
        videos = decode_videos(list(req.video_data), limits) if req.video_data else []
        try:
            vision = prepare_vision_inputs(ids, images, runner.image_processor, runner.vision_tokens, videos=videos,
                                           video=runner.video_support, encode=runner.encode_text)
        except VisionInputError as exc:
            raise BadRequest(str(exc)) from None
        except (ValueError, OSError) as exc:
            raise BadRequest(f"image_data: cannot process the image(s): {exc}") from None
        ids = vision.input_ids
    check_raw_audios(req.audio_data, limits)
    ids, audio = audio_inputs(ids, req.audio_data, getattr(runner, "audio_support", None), limits, BadRequest)
    if audio is not None and vision is not None:  # the omni thinker reads images and audio in one prompt
        image_id = runner.vision_tokens.image_token_id if runner.vision_tokens is not None else None
        vision = dataclasses.replace(vision, input_ids=ids, mm_token_type_ids=[int(t == image_id) for t in ids], **audio)
    check_context(len(ids), req.sampling_params.max_new_tokens, runner)
    has_media = vision is not None and (vision.num_images or vision.num_videos or vision.num_audios)
    return PreparedPrompt(input_ids=ids, vision=vision if has_media else None)


__all__ = [
    "MAX_STOP_STRINGS",
    "MAX_STOP_STRING_CHARS",
    "MAX_STOP_TOKEN_IDS",
    "UNSUPPORTED_SAMPLING",
    "BadRequest",
    "HTTPError",
    "InputLimits",
    "PreparedPrompt",
    "check_context",
    "check_prompt_chars",
    "check_raw_generate",
    "decode_images",
    "decode_videos",
    "prepare_prompt",
    "resolve_sampling",
    "tokenize_bounded",
]
