"""Reading and writing images, audio and video, with one error type for every failure.

Inputs may be raw bytes, a file path, base64 text or a ``data:`` URL. Any failure -- a truncated
file, the wrong kind of data, a video with no frames -- raises :class:`MediaError` naming the
input and the cause, never a decoder's internal exception.

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
import threading
import wave
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

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
def to_data_url(data: bytes, fmt: str) -> str:
    """``data:<mime>;base64,<payload>`` for bytes in the given format (png, wav, mp4, ...)."""
    mime = _MIME_BY_FORMAT.get(fmt.lower(), f"application/{fmt.lower()}")
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def read_source(src: Any, kind: str) -> bytes:
    """Resolve any supported media input to bytes, or raise MediaError saying why not."""
    where = describe_source(src)
    if isinstance(src, (bytes, bytearray, memoryview)):
        data = bytes(src)
    elif isinstance(src, os.PathLike) or (
        isinstance(src, str) and not src.startswith("data:") and len(src) < 4096 and os.path.exists(src)
    ):
        try:
            data = Path(src).read_bytes()
        except OSError as exc:
            raise MediaError(kind, where, f"cannot open file: {exc.strerror or exc}") from None
    elif isinstance(src, str):
        payload = src
        if src.startswith("data:"):
            head, sep, payload = src.partition(",")
            if not sep or ";base64" not in head:
                raise MediaError(kind, where, "data URL is not base64-encoded")
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


def _looks_like_path(s: str) -> bool:
    """Used only to word the error for a string that is neither a file nor base64."""
    return len(s) < 4096 and (os.sep in s or Path(s).suffix.lower() in {
        ".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp", ".wav", ".flac", ".mp3", ".ogg",
        ".mp4", ".webm", ".avi", ".mov", ".mkv",
    })


# ------------------------------------------------------------------------------------------------
# images
# ------------------------------------------------------------------------------------------------
def load_image(src: Any, *, mode: str | None = "RGB") -> Image.Image:
    """Decode an image fully (so truncation is caught here) and convert it to ``mode``."""
    if isinstance(src, Image.Image):
        return src.convert(mode) if mode and src.mode != mode else src
    data = read_source(src, "image")
    where = describe_source(src)
    try:
        img = Image.open(io.BytesIO(data))
        img.load()
    except UnidentifiedImageError:
        raise MediaError("image", where, "not a recognised image format") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise MediaError("image", where, f"corrupt or truncated image ({exc})") from None
    if img.width == 0 or img.height == 0:
        raise MediaError("image", where, "image has zero width or height")
    return img.convert(mode) if mode and img.mode != mode else img


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
def load_audio(src: Any, *, sample_rate: int | None = None) -> tuple[np.ndarray, int]:
    """Decode audio to a mono float32 waveform in [-1, 1]; resample if ``sample_rate`` is set."""
    data = read_source(src, "audio")
    where = describe_source(src)
    _check_wav_truncation(data, where)
    try:
        wave_arr, sr = _decode_audio_soundfile(data, where)
    except ImportError:
        wave_arr, sr = _decode_wav_stdlib(data, where)
    if wave_arr.size == 0:
        raise MediaError("audio", where, "audio holds zero samples")
    if not np.all(np.isfinite(wave_arr)):
        raise MediaError("audio", where, "audio holds NaN or infinite samples")
    if sample_rate is not None and sample_rate != sr:
        wave_arr = resample_audio(wave_arr, sr, sample_rate)
        sr = sample_rate
    return wave_arr, sr


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


def _decode_audio_soundfile(data: bytes, where: str) -> tuple[np.ndarray, int]:
    import soundfile as sf  # optional: the `audio` extra

    try:
        info = sf.info(io.BytesIO(data))
        arr, sr = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise MediaError("audio", where, f"not a readable audio file ({exc})") from None
    if info.frames > 0 and arr.shape[0] < info.frames:
        raise MediaError(
            "audio", where, f"truncated: header says {info.frames} frames, data holds {arr.shape[0]}"
        )
    return np.ascontiguousarray(arr.mean(axis=1), dtype=np.float32), int(sr)


def _decode_wav_stdlib(data: bytes, where: str) -> tuple[np.ndarray, int]:
    try:
        with wave.open(io.BytesIO(data), "rb") as wf:
            n_channels, width, sr, n_frames = (
                wf.getnchannels(),
                wf.getsampwidth(),
                wf.getframerate(),
                wf.getnframes(),
            )
            raw = wf.readframes(n_frames)
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
    src: Any, *, fps: float | None = None, max_frames: int | None = None
) -> tuple[np.ndarray, float]:
    """Decode a video to uint8 ``[T, H, W, 3]`` frames, sampled down to ``fps`` and at most
    ``max_frames``; returns the frames and their effective frame rate."""
    data = read_source(src, "video")
    where = describe_source(src)
    frames, source_fps = _decode_video(data, where)
    if frames.shape[0] == 0:
        raise MediaError("video", where, "video holds zero frames")
    idx = sample_frame_indices(frames.shape[0], source_fps, fps, max_frames)
    kept = frames[idx]
    duration = frames.shape[0] / source_fps if source_fps > 0 else float(len(idx))
    eff_fps = len(idx) / duration if duration > 0 else source_fps
    return np.ascontiguousarray(kept), float(eff_fps)


def _decode_video(data: bytes, where: str) -> tuple[np.ndarray, float]:
    try:
        import av
    except ImportError:
        av = None
    if av is not None:
        try:
            with av.open(io.BytesIO(data), mode="r") as container:
                if not container.streams.video:
                    raise MediaError("video", where, "file has no video stream")
                stream = container.streams.video[0]
                rate = float(stream.average_rate or stream.guessed_rate or 0) or 25.0
                frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
        except MediaError:
            raise
        except Exception as exc:  # PyAV raises many FFmpeg error subclasses
            raise MediaError("video", where, f"corrupt or unsupported video ({type(exc).__name__}: {exc})") from None
        if not frames:
            raise MediaError("video", where, "video holds zero frames")
        return np.stack(frames).astype(np.uint8), rate
    try:
        import decord
    except ImportError:
        raise MediaError(
            "video", where, "reading video needs PyAV or decord: pip install 'relax-gym[video]'"
        ) from None
    try:
        vr = decord.VideoReader(io.BytesIO(data))
        n = len(vr)
        if n == 0:
            raise MediaError("video", where, "video holds zero frames")
        arr = vr.get_batch(list(range(n))).asnumpy()
        return arr.astype(np.uint8), float(vr.get_avg_fps() or 25.0)
    except MediaError:
        raise
    except Exception as exc:
        raise MediaError("video", where, f"corrupt or unsupported video ({exc})") from None


_ENCODED_VIDEOS: OrderedDict[bytes, bytes] = OrderedDict()
_ENCODED_VIDEOS_MAX = 64  # clips; ours are a few KB each
_ENCODED_VIDEOS_LOCK = threading.Lock()


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
    digest = hashlib.blake2b(repr((arr.shape, float(fps))).encode(), digest_size=20)
    digest.update(memoryview(arr).cast("B"))
    key = digest.digest()
    with _ENCODED_VIDEOS_LOCK:
        cached = _ENCODED_VIDEOS.get(key)
        if cached is not None:
            _ENCODED_VIDEOS.move_to_end(key)
            return cached
    data = _encode_video(arr, fps)
    with _ENCODED_VIDEOS_LOCK:
        _ENCODED_VIDEOS[key] = data
        while len(_ENCODED_VIDEOS) > _ENCODED_VIDEOS_MAX:
            _ENCODED_VIDEOS.popitem(last=False)
    return data


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
        for frame in arr:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def video_to_data_url(frames: np.ndarray, fps: float) -> str:
    return to_data_url(encode_video(frames, fps), "mp4")
