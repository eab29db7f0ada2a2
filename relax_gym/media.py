"""Reading and writing images, audio and video, with one error type for every failure.

Inputs may be raw bytes, a file path, base64 text or a ``data:`` URL. Any failure -- a truncated
file, the wrong kind of data, a video with no frames -- raises :class:`MediaError` naming the
input and the cause, never a decoder's internal exception.

Every loader checks :class:`MediaLimits` (encoded bytes, pixels, frames, duration, samples)
from the headers *before* decoding, so a decompression bomb, a huge-dimension header, a clip
with millions of frames or hours of audio is refused with a ``MediaError`` instead of
exhausting memory. Pass ``limits=`` to widen or tighten them.

Dependencies: images need only Pillow; WAV audio uses the standard library (``soundfile`` adds
FLAC and more, ``soxr`` better resampling: the ``audio`` extra); video needs PyAV or decord
(the ``video`` extra).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import math
import os
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from relax_gym.content_cache import ContentCache
from relax_gym.errors import MediaError, describe_source

MediaSource = bytes | bytearray | memoryview | str | os.PathLike[str]

_MIME_BY_FORMAT = {
    "png": "image/png",
    "jpeg": "image/jpeg",
    "jpg": "image/jpeg",
    "webp": "image/webp",
    "wav": "audio/wav",
    "flac": "audio/flac",
    "mp4": "video/mp4",
}


# ------------------------------------------------------------------------------------------------
# bytes, base64 and data URLs
# ------------------------------------------------------------------------------------------------
def frames_key(frames: np.ndarray, fps: float) -> bytes:
    """A content key of a clip (shape, fps and every pixel), for the caches that keep one
    encoding per clip: a GRPO group's samples and an episode's turns send the same frames."""
    arr = np.ascontiguousarray(frames, dtype=np.uint8)
    digest = hashlib.blake2b(repr((arr.shape, float(fps))).encode(), digest_size=20)
    digest.update(memoryview(arr).cast("B"))
    return digest.digest()


def to_data_url(data: bytes, fmt: str) -> str:
    """``data:<mime>;base64,<payload>`` for bytes in the given format (png, wav, mp4, ...)."""
    mime = _MIME_BY_FORMAT.get(fmt.lower(), f"application/{fmt.lower()}")
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


@dataclass(frozen=True)
class MediaLimits:
    """Ceilings every loader checks before (or while) decoding, so hostile input is refused
    with a ``MediaError`` instead of exhausting memory or CPU. The defaults fit any observation
    an environment renders; a server facing untrusted clients passes tighter ones."""

    max_bytes: int = 256 << 20  # the encoded input (file, bytes, decoded base64), per item
    max_image_pixels: int = 8192 * 8192  # width * height, read from the header
    image_formats: tuple[str, ...] = ("PNG", "JPEG", "WEBP", "GIF", "BMP")  # Pillow names
    max_audio_seconds: float = 600.0
    max_audio_samples: int = 64_000_000  # frames * channels (256 MB as float32)
    max_video_frames: int = 10_000  # frames in the stream, counted before decoding
    max_video_seconds: float = 600.0
    max_video_pixels: int = 4096 * 2160  # per frame
    max_video_decoded_bytes: int = 1 << 30  # RGB bytes of the frames returned


DEFAULT_LIMITS = MediaLimits()


def read_source(src: Any, kind: str, *, max_bytes: int | None = None) -> bytes:
    """Resolve any supported media input to bytes, or raise MediaError saying why not.

    At most ``max_bytes`` (default :data:`DEFAULT_LIMITS`) are ever read or decoded: the size of
    a base64 payload is known from its length and a file's from ``stat``, so an oversized input
    is refused before it is copied. Only regular files are read (never ``/dev/zero``, FIFOs).
    """
    limit = DEFAULT_LIMITS.max_bytes if max_bytes is None else max_bytes
    where = describe_source(src)
    if isinstance(src, (bytes, bytearray, memoryview)):
        _check_size(len(src), limit, kind, where)
        data = bytes(src)
    elif isinstance(src, os.PathLike) or (
        isinstance(src, str) and not src.startswith("data:") and len(src) < 4096 and os.path.exists(src)
    ):
        data = _read_file(Path(src), limit, kind, where)
    elif isinstance(src, str):
        payload = src
        if src.startswith("data:"):
            head, sep, payload = src.partition(",")
            if not sep or ";base64" not in head:
                raise MediaError(kind, where, "data URL is not base64-encoded")
        _check_size(len(payload) // 4 * 3, limit, kind, where)
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            if _looks_like_path(src):
                raise MediaError(kind, where, "no such file") from None
            raise MediaError(
                kind, where, "string is neither an existing file path nor valid base64"
            ) from None
    else:
        raise MediaError(kind, where, "expected bytes, a file path, base64 text or a data URL")
    if not data:
        raise MediaError(kind, where, "input is empty (0 bytes)")
    return data


def _check_size(size: int, limit: int, kind: str, where: str) -> None:
    if size > limit:
        raise MediaError(kind, where, f"input of {size} bytes exceeds the limit of {limit} bytes")


def _read_file(path: Path, limit: int, kind: str, where: str) -> bytes:
    """A regular file's bytes, refusing devices, FIFOs and files over ``limit`` before reading."""
    try:
        if not path.is_file():
            raise MediaError(kind, where, "not a regular file")
        _check_size(path.stat().st_size, limit, kind, where)
        with path.open("rb") as fh:
            data = fh.read(limit + 1)  # /proc files report size 0: bound the read itself
    except OSError as exc:
        raise MediaError(kind, where, f"cannot open file: {exc.strerror or exc}") from None
    _check_size(len(data), limit, kind, where)
    return data


def _looks_like_path(s: str) -> bool:
    """Used only to word the error for a string that is neither a file nor base64."""
    return len(s) < 4096 and (os.sep in s or Path(s).suffix.lower() in {
        ".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp", ".wav", ".flac", ".mp3", ".ogg",
        ".mp4", ".webm", ".avi", ".mov", ".mkv",
    })


# ------------------------------------------------------------------------------------------------
# images
# ------------------------------------------------------------------------------------------------
def load_image(src: Any, *, mode: str | None = "RGB", limits: MediaLimits | None = None) -> Image.Image:
    """Decode an image fully (so truncation is caught here) and convert it to ``mode``.

    The format and the pixel count come from the header and are checked before any pixel is
    decoded: a 100 KB PNG that claims 50000 x 50000 pixels is refused without allocating them.
    """
    if isinstance(src, Image.Image):
        return src.convert(mode) if mode and src.mode != mode else src
    lim = limits or DEFAULT_LIMITS
    data = read_source(src, "image", max_bytes=lim.max_bytes)
    where = describe_source(src)
    try:
        img = Image.open(io.BytesIO(data), formats=list(lim.image_formats))
        _check_pixels(img.width, img.height, lim.max_image_pixels, "image", where)
        img.load()
    except MediaError:
        raise
    except UnidentifiedImageError:
        raise MediaError(
            "image", where, f"not a recognised image format (accepted: {', '.join(lim.image_formats)})"
        ) from None
    except Image.DecompressionBombError as exc:
        raise MediaError("image", where, f"too many pixels ({exc})") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise MediaError("image", where, f"corrupt or truncated image ({exc})") from None
    if img.width == 0 or img.height == 0:
        raise MediaError("image", where, "image has zero width or height")
    return img.convert(mode) if mode and img.mode != mode else img


def _check_pixels(width: int, height: int, limit: int, kind: str, where: str) -> None:
    if width * height > limit:
        raise MediaError(kind, where, f"{width} x {height} pixels exceed the limit of {limit} pixels")


def encode_image(img: Image.Image, fmt: str = "PNG") -> bytes:
    """Encode a PIL image; PNG is lossless and byte-for-byte deterministic."""
    if not isinstance(img, Image.Image):
        raise MediaError("image", describe_source(img), "expected a PIL.Image to encode")
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def image_to_data_url(img: Image.Image, fmt: str = "PNG") -> str:
    return to_data_url(encode_image(img, fmt), fmt)


def image_to_base64(img: Image.Image, fmt: str = "PNG") -> str:
    return base64.b64encode(encode_image(img, fmt)).decode("ascii")


# ------------------------------------------------------------------------------------------------
# audio
# ------------------------------------------------------------------------------------------------
def load_audio(
    src: Any, *, sample_rate: int | None = None, limits: MediaLimits | None = None
) -> tuple[np.ndarray, int]:
    """Decode audio to a mono float32 waveform in [-1, 1]; resample if ``sample_rate`` is set.

    The duration and sample count declared by the header are checked before decoding, and the
    decoder never reads past the limit (a streamed file may declare no length at all).
    """
    lim = limits or DEFAULT_LIMITS
    data = read_source(src, "audio", max_bytes=lim.max_bytes)
    where = describe_source(src)
    _check_wav_truncation(data, where)
    try:
        wave_arr, sr = _decode_audio_soundfile(data, where, lim)
    except ImportError:
        wave_arr, sr = _decode_wav_stdlib(data, where, lim)
    if wave_arr.size == 0:
        raise MediaError("audio", where, "audio holds zero samples")
    if not np.all(np.isfinite(wave_arr)):
        raise MediaError("audio", where, "audio holds NaN or infinite samples")
    if sample_rate is not None and sample_rate != sr:
        wave_arr = resample_audio(wave_arr, sr, sample_rate)
        sr = sample_rate
    return wave_arr, sr


def _audio_frame_budget(sr: int, channels: int, lim: MediaLimits, where: str) -> int:
    """Most frames (samples per channel) a clip with this header may hold under ``lim``."""
    if sr <= 0 or channels <= 0:
        raise MediaError("audio", where, f"invalid header: {sr} Hz, {channels} channel(s)")
    return max(0, min(int(lim.max_audio_seconds * sr), lim.max_audio_samples // channels))


def _check_audio_frames(frames: int, sr: int, budget: int, where: str) -> None:
    if frames > budget:
        raise MediaError(
            "audio",
            where,
            f"{frames} frames at {sr} Hz ({frames / sr:.1f} s) exceed the limit of {budget} frames "
            "(max_audio_seconds / max_audio_samples)",
        )


def _check_wav_truncation(data: bytes, where: str) -> None:
    """Decoders silently return the samples that are there; compare with the RIFF header."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return
    pos = 12
    while pos + 8 <= len(data):
        chunk_id, size = data[pos : pos + 4], int.from_bytes(data[pos + 4 : pos + 8], "little")
        if chunk_id == b"data":
            if size in (0, 0xFFFFFFFF):  # streamed WAV: length unknown by design
                return
            have = len(data) - pos - 8
            if have < size:
                raise MediaError("audio", where, f"truncated: header says {size} data bytes, file holds {have}")
            return
        pos += 8 + size + (size & 1)
    raise MediaError("audio", where, "truncated or malformed WAV: no complete data chunk")


def _decode_audio_soundfile(data: bytes, where: str, lim: MediaLimits) -> tuple[np.ndarray, int]:
    import soundfile as sf  # optional: the `audio` extra

    try:
        info = sf.info(io.BytesIO(data))
        budget = _audio_frame_budget(int(info.samplerate), int(info.channels), lim, where)
        if 0 < info.frames < (1 << 62):  # libsndfile reports a huge count for unknown lengths
            _check_audio_frames(int(info.frames), int(info.samplerate), budget, where)
        arr, sr = sf.read(io.BytesIO(data), frames=budget + 1, dtype="float32", always_2d=True)
    except MediaError:
        raise
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise MediaError("audio", where, f"not a readable audio file ({exc})") from None
    _check_audio_frames(arr.shape[0], int(sr), budget, where)
    if 0 < info.frames < (1 << 62) and arr.shape[0] < info.frames:
        raise MediaError(
            "audio", where, f"truncated: header says {info.frames} frames, data holds {arr.shape[0]}"
        )
    return np.ascontiguousarray(arr.mean(axis=1), dtype=np.float32), int(sr)


def _decode_wav_stdlib(data: bytes, where: str, lim: MediaLimits) -> tuple[np.ndarray, int]:
    try:
        with wave.open(io.BytesIO(data), "rb") as wf:
            n_channels, width, sr, n_frames = (
                wf.getnchannels(),
                wf.getsampwidth(),
                wf.getframerate(),
                wf.getnframes(),
            )
            _check_audio_frames(n_frames, sr, _audio_frame_budget(sr, n_channels, lim, where), where)
            raw = wf.readframes(n_frames)
    except MediaError:
        raise
    except (wave.Error, EOFError, ValueError) as exc:
        raise MediaError(
            "audio", where, f"not a readable PCM WAV file ({exc}); install relax-gym[audio] for other formats"
        ) from None
    expected = n_frames * n_channels * width
    if len(raw) < expected:
        got = len(raw) // max(1, n_channels * width)
        raise MediaError("audio", where, f"truncated: header says {n_frames} frames, data holds {got}")
    if width == 1:
        arr = (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 2:
        arr = np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
    elif width == 3:
        b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        ints = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        ints = np.where(ints >= 1 << 23, ints - (1 << 24), ints)
        arr = ints.astype(np.float32) / float(1 << 23)
    elif width == 4:
        arr = np.frombuffer(raw, dtype="<i4").astype(np.float32) / float(1 << 31)
    else:
        raise MediaError("audio", where, f"unsupported WAV sample width {width} bytes")
    arr = arr.reshape(-1, n_channels).mean(axis=1)
    return np.ascontiguousarray(arr, dtype=np.float32), int(sr)


def encode_audio(waveform: np.ndarray, sample_rate: int, fmt: str = "wav") -> bytes:
    """Encode a mono waveform; WAV (16-bit PCM) needs only the standard library, FLAC soundfile."""
    arr = np.asarray(waveform, dtype=np.float32)
    if arr.ndim != 1 or arr.size == 0:
        raise MediaError("audio", f"<array shape={arr.shape}>", "expected a non-empty 1-D waveform")
    fmt = fmt.lower()
    pcm = (np.clip(arr, -1.0, 1.0) * 32767.0).round().astype("<i2")
    if fmt == "wav":
        buf = io.BytesIO()
        with wave.open(buf, "wb") as wf:
            wf.setnchannels(1)
            wf.setsampwidth(2)
            wf.setframerate(int(sample_rate))
            wf.writeframes(pcm.tobytes())
        return buf.getvalue()
    try:
        import soundfile as sf
    except ImportError:
        raise MediaError(
            "audio", f"<array len={arr.size}>", f"writing {fmt} needs soundfile: pip install 'relax-gym[audio]'"
        ) from None
    buf = io.BytesIO()
    sf.write(buf, pcm, int(sample_rate), format=fmt.upper(), subtype="PCM_16")
    return buf.getvalue()


def audio_to_data_url(waveform: np.ndarray, sample_rate: int, fmt: str = "wav") -> str:
    return to_data_url(encode_audio(waveform, sample_rate, fmt), fmt)


def resample_audio(waveform: np.ndarray, orig_sr: int, target_sr: int) -> np.ndarray:
    """Resample with soxr when installed, else scipy's polyphase filter, else linear interpolation."""
    arr = np.asarray(waveform, dtype=np.float32)
    if orig_sr == target_sr or arr.size == 0:
        return arr
    try:
        import soxr

        return np.asarray(soxr.resample(arr, orig_sr, target_sr), dtype=np.float32)
    except ImportError:
        pass
    try:
        from scipy.signal import resample_poly

        g = math.gcd(orig_sr, target_sr)
        return np.asarray(resample_poly(arr, target_sr // g, orig_sr // g), dtype=np.float32)
    except ImportError:
        n_out = max(1, round(arr.size * target_sr / orig_sr))
        x_new = np.linspace(0, arr.size - 1, n_out)
        return np.interp(x_new, np.arange(arr.size), arr).astype(np.float32)


# ------------------------------------------------------------------------------------------------
# video
# ------------------------------------------------------------------------------------------------
def sample_frame_indices(
    total_frames: int, source_fps: float, fps: float | None = None, max_frames: int | None = None
) -> list[int]:
    """Which frames to keep: every ``source_fps / fps``-th frame, then at most ``max_frames``
    spread evenly over the clip (first and last kept)."""
    if total_frames <= 0:
        return []
    if fps is not None and fps > 0 and source_fps > 0 and fps < source_fps:
        step = source_fps / fps
        idx = [min(total_frames - 1, int(round(i * step))) for i in range(int(total_frames / step))]
        idx = sorted(set(idx)) or [0]
    else:
        idx = list(range(total_frames))
    if max_frames is not None and 0 < max_frames < len(idx):
        if max_frames == 1:
            return [idx[0]]
        pick = np.linspace(0, len(idx) - 1, max_frames).round().astype(int)
        idx = [idx[i] for i in pick]
    return idx


def load_video(
    src: Any, *, fps: float | None = None, max_frames: int | None = None, limits: MediaLimits | None = None
) -> tuple[np.ndarray, float]:
    """Decode a video to uint8 ``[T, H, W, 3]`` frames, sampled down to ``fps`` and at most
    ``max_frames``; returns the frames and their effective frame rate.

    The frame count (packets, counted without decoding), duration and frame size are checked
    against ``limits`` before any frame is decoded, and only the sampled frames are kept.
    """
    lim = limits or DEFAULT_LIMITS
    data = read_source(src, "video", max_bytes=lim.max_bytes)
    where = describe_source(src)
    try:
        import av  # noqa: F401
    except ImportError:
        return _load_video_decord(data, where, fps, max_frames, lim)
    return _load_video_av(data, where, fps, max_frames, lim)


@dataclass(frozen=True)
class _VideoPlan:
    """What a video header says, and which frames to keep."""

    total: int
    rate: float
    indices: list[int]

    @property
    def effective_fps(self) -> float:
        duration = self.total / self.rate if self.rate > 0 else float(len(self.indices))
        return len(self.indices) / duration if duration > 0 else self.rate


def _plan_video(
    total: int, rate: float, width: int, height: int, fps: float | None, max_frames: int | None,
    lim: MediaLimits, where: str,
) -> _VideoPlan:
    """Check the header against ``lim`` and pick the frames to keep; raises MediaError."""
    if total <= 0:
        raise MediaError("video", where, "video holds zero frames")
    if total > lim.max_video_frames:
        raise MediaError("video", where, f"{total} frames exceed the limit of {lim.max_video_frames}")
    if rate > 0 and total / rate > lim.max_video_seconds:
        raise MediaError(
            "video", where, f"{total / rate:.1f} s exceed the limit of {lim.max_video_seconds:g} s"
        )
    _check_pixels(width, height, lim.max_video_pixels, "video", where)
    indices = sample_frame_indices(total, rate, fps, max_frames)
    decoded = len(indices) * width * height * 3
    if decoded > lim.max_video_decoded_bytes:
        raise MediaError(
            "video",
            where,
            f"{len(indices)} frames of {width} x {height} would decode to {decoded} bytes, over the limit of "
            f"{lim.max_video_decoded_bytes} (sample fewer frames with fps= or max_frames=)",
        )
    return _VideoPlan(total, rate, indices)


def _load_video_av(
    data: bytes, where: str, fps: float | None, max_frames: int | None, lim: MediaLimits
) -> tuple[np.ndarray, float]:
    import av

    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.video:
                raise MediaError("video", where, "file has no video stream")
            stream = container.streams.video[0]
            rate = float(stream.average_rate or stream.guessed_rate or 0) or 25.0
            total = sum(1 for packet in container.demux(stream) if packet.size > 0)  # no decoding
            ctx = stream.codec_context
            plan = _plan_video(total, rate, ctx.width, ctx.height, fps, max_frames, lim, where)
            container.seek(0)
            kept = _decode_selected(container.decode(stream), set(plan.indices), plan.total, lim, where)
    except MediaError:
        raise
    except Exception as exc:  # PyAV raises many FFmpeg error subclasses
        raise MediaError("video", where, f"corrupt or unsupported video ({type(exc).__name__}: {exc})") from None
    if len(kept) < len(plan.indices):
        raise MediaError(
            "video", where, f"corrupt or truncated video: decoded {len(kept)} of the {len(plan.indices)} frames asked for"
        )
    return np.ascontiguousarray(np.stack(kept).astype(np.uint8)), float(plan.effective_fps)


def _decode_selected(frames: Any, wanted: set[int], total: int, lim: MediaLimits, where: str) -> list[np.ndarray]:
    """Keep the decoded frames whose index is wanted; never decode past ``total`` frames."""
    kept: list[np.ndarray] = []
    for i, frame in enumerate(frames):
        if i >= total:
            break
        _check_pixels(frame.width, frame.height, lim.max_video_pixels, "video", where)
        if i in wanted:
            kept.append(frame.to_ndarray(format="rgb24"))
    return kept


def _load_video_decord(
    data: bytes, where: str, fps: float | None, max_frames: int | None, lim: MediaLimits
) -> tuple[np.ndarray, float]:
    try:
        import decord
    except ImportError:
        raise MediaError(
            "video", where, "reading video needs PyAV or decord: pip install 'relax-gym[video]'"
        ) from None
    try:
        vr = decord.VideoReader(io.BytesIO(data))
        total = len(vr)
        if total == 0:
            raise MediaError("video", where, "video holds zero frames")
        height, width = vr[0].shape[:2]
        plan = _plan_video(total, float(vr.get_avg_fps() or 25.0), width, height, fps, max_frames, lim, where)
        arr = vr.get_batch(plan.indices).asnumpy()
    except MediaError:
        raise
    except Exception as exc:
        raise MediaError("video", where, f"corrupt or unsupported video ({exc})") from None
    return np.ascontiguousarray(arr.astype(np.uint8)), float(plan.effective_fps)


_ENCODED_VIDEOS: ContentCache[bytes] = ContentCache(64)  # clips; ours are a few KB each


def encode_video(frames: np.ndarray, fps: float) -> bytes:
    """Encode RGB frames to H.264 mp4 (odd sizes are padded to even for yuv420p).

    Results are memoised by content (shape, fps and a hash of the pixels), for two reasons:
    a multi-turn rollout re-renders the whole conversation every turn, so the same clip would be
    encoded again and again; and libx264 here is not byte-reproducible: identical frames
    encoded twice in one long test process (single encoder thread, identical settings) gave
    different bytes about once per full test run, which the checker's "same seed, same bytes"
    guarantee cannot allow. Within a process the same frames now always give the same bytes;
    across processes the mp4 bytes may differ while the decoded frames stay close.
    """
    arr = np.asarray(frames)
    if arr.ndim != 4 or arr.shape[-1] != 3 or arr.shape[0] == 0:
        raise MediaError("video", f"<array shape={arr.shape}>", "expected uint8 frames [T, H, W, 3], T >= 1")
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    return _ENCODED_VIDEOS.get_or_make(frames_key(arr, fps), lambda: _encode_video(arr, fps))


def _encode_video(arr: np.ndarray, fps: float) -> bytes:
    """The encoder behind :func:`encode_video` (no memo)."""
    try:
        import av
    except ImportError:
        raise MediaError(
            "video", f"<array shape={arr.shape}>", "writing mp4 needs PyAV: pip install 'relax-gym[video]'"
        ) from None
    arr = arr.astype(np.uint8)
    pad_h, pad_w = arr.shape[1] % 2, arr.shape[2] % 2
    if pad_h or pad_w:
        arr = np.pad(arr, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    from fractions import Fraction

    rate = Fraction(fps).limit_denominator(1000)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=rate)
        stream.width, stream.height = arr.shape[2], arr.shape[1]
        stream.pix_fmt = "yuv420p"
        # One encoder thread and no threaded lookahead: x264's threaded modes can change the
        # bitstream with scheduling, and the checker compares these bytes across runs.
        stream.options = {
            "crf": "18",
            "preset": "veryfast",
            "threads": "1",
            "x264-params": "threads=1:lookahead-threads=1:sliced-threads=0:sync-lookahead=0",
        }
        stream.thread_count = 1
        mux_frames(container, stream, arr)
    return buf.getvalue()


def mux_frames(container: Any, stream: Any, frames: np.ndarray) -> None:
    """Encode RGB ``frames`` [T, H, W, 3] on a PyAV ``stream`` into ``container``, flushing the
    encoder at the end (what every mp4 writer here does once its stream is configured)."""
    import av

    for frame in frames:
        for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
            container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)


def video_to_data_url(frames: np.ndarray, fps: float) -> str:
    return to_data_url(encode_video(frames, fps), "mp4")
